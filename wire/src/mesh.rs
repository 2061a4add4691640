//! Contracts 2 and 3: the peer directory's annotations and the mesh wire's constants
//! (docs/mesh.md).

use std::collections::BTreeMap;
use std::net::IpAddr;

/// ALPN of the mesh's QUIC connections; each datagram on them carries one raw IP packet.
pub const ALPN: &[u8] = b"socialweb/mesh/1";

/// Annotation an agent writes on its own Node: its mesh endpoint id (64 hex digits).
pub const ENDPOINT_ANNOTATION: &str = "socialweb.computer/mesh-endpoint";

/// Annotation an agent writes on its own Node: its direct UDP addresses, comma-separated
/// `ip:port` (may be empty: peers then reach it through the relay only).
pub const ADDRS_ANNOTATION: &str = "socialweb.computer/mesh-addrs";

/// Where the broker publishes what it assigned each live node: its cluster address
/// (`node_ip`, its Node's InternalIP) and its mesh endpoint id ([`PublishedNodes`] has the
/// keys). A ConfigMap in `kube-system`, written by the broker and readable (not writable) by
/// nodes. In a broker's cluster peers take a node's address and endpoint id from here only,
/// never from anything a node writes about itself (its Node object is the node's own to
/// edit). A cluster without it (the test harness's, nodes addressed on their underlay)
/// reaches nodes for pods only, at the endpoints their annotations name.
pub const NODE_ADDRESSES: (&str, &str) = ("kube-system", "socialweb-node-addresses");

/// Prefix of [`NODE_ADDRESSES`]' keys that carry a node's mesh endpoint id:
/// `endpoint_<node>`. A node name is a DNS subdomain (lowercase letters, digits, `-`, `.`),
/// so a key with `_` is never a node's address entry; agents of v0.1.0, which read every
/// entry as `<node>: <address>` and skip a value that is not an address, skip these.
pub const ENDPOINT_KEY_PREFIX: &str = "endpoint_";

/// What [`NODE_ADDRESSES`] holds, one entry per fact: `<node>: <address>` and
/// `endpoint_<node>: <endpoint id, 64 lowercase hex digits>`. The broker writes it with
/// [`PublishedNodes::to_data`] and agents read it with [`PublishedNodes::from_data`], so the
/// two sides cannot disagree on the keys.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishedNodes {
    /// Each node's cluster address, by node name.
    pub addresses: BTreeMap<String, IpAddr>,
    /// Each node's mesh endpoint id (64 lowercase hex digits), by node name.
    pub endpoints: BTreeMap<String, String>,
}

impl PublishedNodes {
    /// The ConfigMap's data.
    pub fn to_data(&self) -> BTreeMap<String, String> {
        let addresses = self
            .addresses
            .iter()
            .map(|(node, ip)| (node.clone(), ip.to_string()));
        let endpoints = self
            .endpoints
            .iter()
            .map(|(node, id)| (format!("{ENDPOINT_KEY_PREFIX}{node}"), id.clone()));
        addresses.chain(endpoints).collect()
    }

    /// Reads the ConfigMap's data. An entry that is neither form, or whose value does not
    /// parse, is left out: a newer broker may publish more, and what this code cannot read
    /// must not become a route.
    pub fn from_data<'a>(data: impl IntoIterator<Item = (&'a String, &'a String)>) -> Self {
        let mut out = PublishedNodes::default();
        for (key, value) in data {
            let value = value.trim();
            if let Some(node) = key.strip_prefix(ENDPOINT_KEY_PREFIX) {
                if !node.is_empty() && is_endpoint_id(value) {
                    let id = value.to_ascii_lowercase();
                    out.endpoints.insert(node.to_string(), id);
                }
            } else if !key.contains('_')
                && let Ok(ip) = value.parse()
            {
                out.addresses.insert(key.clone(), ip);
            }
        }
        out
    }
}

/// Whether `s` has the form of a mesh endpoint id: 64 hex digits.
pub fn is_endpoint_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The range nodes' cluster addresses come from (the broker's `names::NODE_RANGE`, beside
/// the cluster CIDR 10.42.0.0/16 and the service CIDR 10.43.0.0/16). An address outside it is
/// never routed into the mesh, whoever names it.
pub const NODE_RANGE: (std::net::Ipv4Addr, u8) = (std::net::Ipv4Addr::new(10, 41, 0, 0), 16);

/// [`NODE_RANGE`] as a network.
pub fn node_range() -> ipnet::IpNet {
    ipnet::IpNet::V4(
        ipnet::Ipv4Net::new(NODE_RANGE.0, NODE_RANGE.1).expect("a /16 is a valid prefix"),
    )
}

/// Label the agent puts on its Node once node-local DNS serves (contract 5).
pub const NODE_LOCAL_DNS_LABEL: &str = "socialweb.computer/node-local-dns";

/// Node-local DNS address (contract 5).
pub const NODE_LOCAL_DNS_ADDR: std::net::Ipv4Addr = std::net::Ipv4Addr::new(169, 254, 20, 10);

/// Default MTU of the mesh's TUN device and of pods: the IPv6 minimum, which a QUIC datagram
/// on any sane path carries.
pub const DEFAULT_MTU: u16 = 1280;

/// Application close code an agent uses to refuse a connection from an endpoint that is not
/// in its peer directory.
pub const CLOSE_NOT_A_PEER: u32 = 0x5157_0001;

#[cfg(test)]
mod tests {
    use super::*;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn what_the_broker_publishes_an_agent_reads_back() {
        let published = PublishedNodes {
            addresses: [("c-1".to_string(), "10.41.0.1".parse().unwrap())].into(),
            endpoints: [("c-1".to_string(), "ab".repeat(32))].into(),
        };
        let d = published.to_data();
        assert_eq!(
            d,
            data(&[("c-1", "10.41.0.1"), ("endpoint_c-1", &"ab".repeat(32))])
        );
        assert_eq!(PublishedNodes::from_data(&d), published);
    }

    #[test]
    fn no_endpoint_key_is_a_node_name_and_no_endpoint_id_an_address() {
        // What an agent of v0.1.0 does with the data: every entry a node's address, those
        // that do not parse skipped. An endpoint id never parses as one.
        let d = PublishedNodes {
            endpoints: [("c-1".to_string(), "0".repeat(64))].into(),
            ..Default::default()
        }
        .to_data();
        assert!(d.values().all(|v| v.parse::<IpAddr>().is_err()), "{d:?}");
        // Keys must match [-._a-zA-Z0-9]+ (a ConfigMap's), and have a `_` no node name has.
        assert!(d.keys().all(|k| {
            k.contains('_')
                && k.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
        }));
    }

    #[test]
    fn what_does_not_parse_is_left_out() {
        let ep = "AB".repeat(32);
        let d = data(&[
            ("c-1", "10.41.0.1"),
            ("c-2", "not an address"),
            ("endpoint_c-1", &ep),
            ("endpoint_c-2", "abc"),
            ("endpoint_", &ep),
            ("later_c-1", "10.41.0.9"),
        ]);
        let p = PublishedNodes::from_data(&d);
        assert_eq!(
            p.addresses,
            [("c-1".to_string(), "10.41.0.1".parse().unwrap())].into()
        );
        assert_eq!(
            p.endpoints,
            [("c-1".to_string(), ep.to_ascii_lowercase())].into(),
            "ids are compared as text: lowercase, as iroh writes them"
        );
    }
}
