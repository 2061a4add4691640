//! The mesh's packet filter, both directions (contract 3): a datagram is accepted only from a
//! peer in the directory, with a source that is the peer's (inside its pod CIDR, or its node
//! address) and a destination that is ours; a packet is sent only to the peer whose prefixes
//! hold its destination, and only with a source that is ours. Everything else is dropped and
//! counted by reason. Pure.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::packet::{self, Header};

/// Why a packet was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DropReason {
    /// Not an IPv4/IPv6 packet, or its length is inconsistent.
    Malformed,
    /// From a connection whose endpoint is no longer (or never was) in the directory.
    UnknownPeer,
    /// Source outside the sending side's pod CIDR.
    SpoofedSource,
    /// Arrived from a peer with a destination outside our pod CIDR.
    WrongDestination,
    /// Read from the TUN with a destination no peer's pod CIDR holds.
    NoRoute,
    /// Larger than the path's datagram size (answered with ICMP Packet Too Big).
    TooBig,
    /// The peer is known but its connection is not up.
    NoConnection,
    /// The QUIC connection refused the datagram (lost, or datagrams unsupported).
    SendFailed,
    /// Writing to the TUN device failed.
    TunWriteFailed,
}

impl DropReason {
    pub const ALL: [DropReason; 9] = [
        DropReason::Malformed,
        DropReason::UnknownPeer,
        DropReason::SpoofedSource,
        DropReason::WrongDestination,
        DropReason::NoRoute,
        DropReason::TooBig,
        DropReason::NoConnection,
        DropReason::SendFailed,
        DropReason::TunWriteFailed,
    ];

    pub fn index(self) -> usize {
        self as usize
    }
}

/// Checks a datagram that arrived from `peer`, for delivery to one of `own`'s addresses.
pub fn ingress(datagram: &[u8], peer: &NodeAddrs, own: &NodeAddrs) -> Result<Header, DropReason> {
    let h = packet::parse(datagram).ok_or(DropReason::Malformed)?;
    if !peer.holds(&h.src) {
        return Err(DropReason::SpoofedSource);
    }
    if !own.holds(&h.dst) {
        return Err(DropReason::WrongDestination);
    }
    Ok(h)
}

/// A node's addresses as the filter sees them: its pod CIDR and, when it has one, its node
/// address (the kubelet, NodePorts, hostNetwork Pods).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeAddrs {
    pub pod_cidr: IpNet,
    pub node_ip: Option<IpAddr>,
}

impl NodeAddrs {
    /// Pods only.
    pub fn pods(pod_cidr: IpNet) -> NodeAddrs {
        NodeAddrs {
            pod_cidr,
            node_ip: None,
        }
    }

    pub fn holds(&self, ip: &IpAddr) -> bool {
        self.pod_cidr.contains(ip) || self.node_ip.as_ref() == Some(ip)
    }
}

/// Routes to peers' pod CIDRs, longest prefix first.
#[derive(Debug, Clone)]
pub struct Routes<K> {
    entries: Vec<(IpNet, K)>,
}

impl<K> Default for Routes<K> {
    fn default() -> Self {
        Routes {
            entries: Vec::new(),
        }
    }
}

impl<K> Routes<K> {
    pub fn new(entries: impl IntoIterator<Item = (IpNet, K)>) -> Routes<K> {
        let mut entries: Vec<(IpNet, K)> = entries.into_iter().collect();
        entries.sort_by_key(|e| std::cmp::Reverse(e.0.prefix_len()));
        Routes { entries }
    }

    pub fn lookup(&self, dst: IpAddr) -> Option<&K> {
        self.entries
            .iter()
            .find(|(net, _)| net.contains(&dst))
            .map(|(_, k)| k)
    }

    pub fn iter(&self) -> impl Iterator<Item = &(IpNet, K)> {
        self.entries.iter()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Checks a packet read from the TUN device: its source must be ours, its destination some
/// peer's. Returns the header and the peer's key.
pub fn egress<'r, K>(
    packet: &[u8],
    own: &NodeAddrs,
    routes: &'r Routes<K>,
) -> Result<(Header, &'r K), DropReason> {
    let h = packet::parse(packet).ok_or(DropReason::Malformed)?;
    if !own.holds(&h.src) {
        return Err(DropReason::SpoofedSource);
    }
    let peer = routes.lookup(h.dst).ok_or(DropReason::NoRoute)?;
    Ok((h, peer))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::build::udp4;
    use std::net::Ipv4Addr;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    const A: Ipv4Addr = Ipv4Addr::new(10, 42, 1, 5);
    const B: Ipv4Addr = Ipv4Addr::new(10, 42, 2, 7);

    #[test]
    fn ingress_accepts_only_peer_source_and_our_destination() {
        let (peer, ours) = (
            NodeAddrs::pods(net("10.42.1.0/24")),
            NodeAddrs::pods(net("10.42.2.0/24")),
        );
        assert!(ingress(&udp4(A, B, 10), &peer, &ours).is_ok());
        let spoofed = udp4(Ipv4Addr::new(10, 42, 3, 1), B, 10);
        assert_eq!(
            ingress(&spoofed, &peer, &ours),
            Err(DropReason::SpoofedSource)
        );
        let elsewhere = udp4(A, Ipv4Addr::new(8, 8, 8, 8), 10);
        assert_eq!(
            ingress(&elsewhere, &peer, &ours),
            Err(DropReason::WrongDestination)
        );
        assert_eq!(
            ingress(b"garbage", &peer, &ours),
            Err(DropReason::Malformed)
        );
    }

    #[test]
    fn egress_routes_by_longest_prefix_and_checks_the_source() {
        let routes = Routes::new([
            (net("10.42.0.0/16"), "wide"),
            (net("10.42.2.0/24"), "node-2"),
        ]);
        let ours = NodeAddrs::pods(net("10.42.1.0/24"));
        assert_eq!(
            *egress(&udp4(A, B, 10), &ours, &routes).unwrap().1,
            "node-2"
        );
        assert_eq!(
            *egress(&udp4(A, Ipv4Addr::new(10, 42, 9, 1), 10), &ours, &routes)
                .unwrap()
                .1,
            "wide"
        );
        assert_eq!(
            egress(&udp4(A, Ipv4Addr::new(1, 1, 1, 1), 10), &ours, &routes).unwrap_err(),
            DropReason::NoRoute
        );
        assert_eq!(
            egress(&udp4(Ipv4Addr::new(10, 42, 7, 7), B, 10), &ours, &routes).unwrap_err(),
            DropReason::SpoofedSource
        );
    }

    #[test]
    fn node_addresses_are_sources_and_destinations_like_pods() {
        let (na, nb) = (Ipv4Addr::new(10, 41, 0, 1), Ipv4Addr::new(10, 41, 0, 2));
        let peer = NodeAddrs {
            pod_cidr: net("10.42.1.0/24"),
            node_ip: Some(IpAddr::V4(na)),
        };
        let ours = NodeAddrs {
            pod_cidr: net("10.42.2.0/24"),
            node_ip: Some(IpAddr::V4(nb)),
        };
        // A hostNetwork client on the peer to our NodePort, and its pod to our kubelet.
        assert!(ingress(&udp4(na, nb, 10), &peer, &ours).is_ok());
        assert!(ingress(&udp4(A, nb, 10), &peer, &ours).is_ok());
        assert!(ingress(&udp4(na, B, 10), &peer, &ours).is_ok());
        let other = Ipv4Addr::new(10, 41, 0, 3);
        assert_eq!(
            ingress(&udp4(other, nb, 10), &peer, &ours),
            Err(DropReason::SpoofedSource)
        );
        assert_eq!(
            ingress(&udp4(na, other, 10), &peer, &ours),
            Err(DropReason::WrongDestination)
        );
        let routes = Routes::new([(IpNet::from(IpAddr::V4(na)), "peer")]);
        assert_eq!(
            *egress(&udp4(nb, na, 10), &ours, &routes).unwrap().1,
            "peer"
        );
    }

    proptest::proptest! {
        /// The filter never panics and never accepts what violates the contract.
        #[test]
        fn arbitrary_bytes(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..1500)) {
            let (peer, ours) = (net("10.42.1.0/24"), net("10.42.2.0/24"));
            let (pa, oa) = (NodeAddrs::pods(peer), NodeAddrs::pods(ours));
            if let Ok(h) = ingress(&bytes, &pa, &oa) {
                proptest::prop_assert!(peer.contains(&h.src) && ours.contains(&h.dst));
                proptest::prop_assert!(h.len <= bytes.len());
            }
            let routes = Routes::new([(peer, 1u8)]);
            if let Ok((h, _)) = egress(&bytes, &oa, &routes) {
                proptest::prop_assert!(ours.contains(&h.src) && peer.contains(&h.dst));
            }
        }

        /// Well-formed packets with arbitrary addresses: accepted exactly when both rules hold.
        #[test]
        fn addresses(src in proptest::prelude::any::<u32>(), dst in proptest::prelude::any::<u32>()) {
            let (peer, ours) = (net("10.42.1.0/24"), net("10.42.2.0/24"));
            let (s, d) = (Ipv4Addr::from(src), Ipv4Addr::from(dst));
            let ok = ingress(&udp4(s, d, 20), &NodeAddrs::pods(peer), &NodeAddrs::pods(ours)).is_ok();
            proptest::prop_assert_eq!(ok, peer.contains(&IpAddr::V4(s)) && ours.contains(&IpAddr::V4(d)));
        }
    }
}
