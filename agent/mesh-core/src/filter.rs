//! The mesh's packet filter, both directions (contract 3): a datagram is accepted only from a
//! peer in the directory, with a source inside that peer's pod CIDR and a destination inside
//! ours; a packet is sent only to the peer whose pod CIDR holds its destination, and only with
//! a source inside ours. Everything else is dropped and counted by reason. Pure.

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

/// Checks a datagram that arrived from a peer owning `peer_cidr`, for delivery into our
/// `own_cidr`.
pub fn ingress(datagram: &[u8], peer_cidr: &IpNet, own_cidr: &IpNet) -> Result<Header, DropReason> {
    let h = packet::parse(datagram).ok_or(DropReason::Malformed)?;
    if !peer_cidr.contains(&h.src) {
        return Err(DropReason::SpoofedSource);
    }
    if !own_cidr.contains(&h.dst) {
        return Err(DropReason::WrongDestination);
    }
    Ok(h)
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
    own_cidr: &IpNet,
    routes: &'r Routes<K>,
) -> Result<(Header, &'r K), DropReason> {
    let h = packet::parse(packet).ok_or(DropReason::Malformed)?;
    if !own_cidr.contains(&h.src) {
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
        let (peer, ours) = (net("10.42.1.0/24"), net("10.42.2.0/24"));
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
        let ours = net("10.42.1.0/24");
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

    proptest::proptest! {
        /// The filter never panics and never accepts what violates the contract.
        #[test]
        fn arbitrary_bytes(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..1500)) {
            let (peer, ours) = (net("10.42.1.0/24"), net("10.42.2.0/24"));
            if let Ok(h) = ingress(&bytes, &peer, &ours) {
                proptest::prop_assert!(peer.contains(&h.src) && ours.contains(&h.dst));
                proptest::prop_assert!(h.len <= bytes.len());
            }
            let routes = Routes::new([(peer, 1u8)]);
            if let Ok((h, _)) = egress(&bytes, &ours, &routes) {
                proptest::prop_assert!(ours.contains(&h.src) && peer.contains(&h.dst));
            }
        }

        /// Well-formed packets with arbitrary addresses: accepted exactly when both rules hold.
        #[test]
        fn addresses(src in proptest::prelude::any::<u32>(), dst in proptest::prelude::any::<u32>()) {
            let (peer, ours) = (net("10.42.1.0/24"), net("10.42.2.0/24"));
            let (s, d) = (Ipv4Addr::from(src), Ipv4Addr::from(dst));
            let ok = ingress(&udp4(s, d, 20), &peer, &ours).is_ok();
            proptest::prop_assert_eq!(ok, peer.contains(&IpAddr::V4(s)) && ours.contains(&IpAddr::V4(d)));
        }
    }
}
