//! The peer directory (contract 2), pure: which nodes exist, their pod CIDRs and mesh
//! endpoints, as a source reports them; which of them this node accepts as peers; and what
//! changed between two views. The sources (Kubernetes Nodes, a static file) are the agent's
//! `directory` module.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// One node as a source reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeEntry {
    pub node: String,
    /// Mesh endpoint id: 64 hex digits.
    pub endpoint: String,
    pub pod_cidr: IpNet,
    /// Direct UDP addresses; empty means relay only.
    #[serde(default)]
    pub addrs: Vec<SocketAddr>,
    /// The node's own address (its Node's InternalIP), reached over the mesh like its pods:
    /// the kubelet, NodePorts and hostNetwork Pods. `None`: pods only.
    #[serde(default)]
    pub node_ip: Option<IpAddr>,
}

impl NodeEntry {
    /// The first host address of the pod CIDR: the node's bridge address and the source this
    /// node uses for packets it originates into the mesh.
    pub fn gateway(&self) -> IpAddr {
        first_host(&self.pod_cidr)
    }

    /// Whether `ip` is one of this node's: inside its pod CIDR, or its node address.
    pub fn holds(&self, ip: &IpAddr) -> bool {
        self.pod_cidr.contains(ip) || self.node_ip.as_ref() == Some(ip)
    }

    /// What the mesh routes to this node: its pod CIDR, and its node address as a host route.
    pub fn prefixes(&self) -> Vec<IpNet> {
        let mut out = vec![self.pod_cidr];
        if let Some(ip) = self.node_ip {
            out.push(IpNet::from(ip));
        }
        out
    }
}

pub fn first_host(net: &IpNet) -> IpAddr {
    match net {
        IpNet::V4(n) => IpAddr::V4(std::net::Ipv4Addr::from(u32::from(n.network()) + 1)),
        IpNet::V6(n) => IpAddr::V6(std::net::Ipv6Addr::from(u128::from(n.network()) + 1)),
    }
}

/// What this node makes of a source's report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct View {
    /// This node's own entry, once the source has it (its pod CIDR is allocated).
    pub own: Option<NodeEntry>,
    /// Accepted peers by node name.
    pub peers: BTreeMap<String, NodeEntry>,
    /// Entries refused, with the reason (logged and shown by `mesh status`).
    pub rejected: Vec<(String, String)>,
}

fn valid_endpoint(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Builds the view of `entries` for node `me` in a cluster whose pod CIDRs come from
/// `cluster_cidr` and node addresses from `node_range`. A peer is refused if its endpoint is
/// malformed or is ours, or its pod CIDR lies outside the cluster CIDR or overlaps ours or an
/// already accepted peer's, or its node address lies outside the node range or is ours or
/// another's (entries are taken in node-name order, so every node decides alike). The node
/// range is what keeps a wrong address from being routed into the mesh at all: whatever a
/// source says, no peer takes the broker's, a provider's or the internet's addresses.
pub fn view(entries: &[NodeEntry], me: &str, cluster_cidr: &IpNet, node_range: &IpNet) -> View {
    let mut sorted: Vec<&NodeEntry> = entries.iter().collect();
    sorted.sort_by(|a, b| a.node.cmp(&b.node));
    let own = sorted.iter().find(|e| e.node == me).map(|e| (*e).clone());
    let mut v = View {
        own: own.clone(),
        ..View::default()
    };
    for e in sorted.into_iter().filter(|e| e.node != me) {
        match refusal(e, own.as_ref(), &v.peers, cluster_cidr, node_range) {
            Some(r) => v.rejected.push((e.node.clone(), r)),
            None => {
                v.peers.insert(e.node.clone(), e.clone());
            }
        }
    }
    v
}

/// Why `e` cannot be a peer, if it cannot.
fn refusal(
    e: &NodeEntry,
    own: Option<&NodeEntry>,
    accepted: &BTreeMap<String, NodeEntry>,
    cluster_cidr: &IpNet,
    node_range: &IpNet,
) -> Option<String> {
    if !valid_endpoint(&e.endpoint) {
        return Some("endpoint id is not 64 hex digits".to_string());
    }
    if own.is_some_and(|o| o.endpoint.eq_ignore_ascii_case(&e.endpoint)) {
        return Some("endpoint id is this node's".to_string());
    }
    if !cluster_cidr.contains(&e.pod_cidr) {
        return Some(format!(
            "pod CIDR {} is outside the cluster CIDR {cluster_cidr}",
            e.pod_cidr
        ));
    }
    if let Some(o) = own.filter(|o| overlaps(&o.pod_cidr, &e.pod_cidr)) {
        return Some(format!(
            "pod CIDR {} overlaps this node's {}",
            e.pod_cidr, o.pod_cidr
        ));
    }
    if let Some(ip) = e.node_ip {
        if !node_range.contains(&ip) {
            return Some(format!(
                "node address {ip} is outside the node range {node_range}"
            ));
        }
        if own.is_some_and(|o| o.node_ip == Some(ip)) {
            return Some(format!("node address {ip} is this node's"));
        }
        if let Some(p) = accepted.values().find(|p| p.node_ip == Some(ip)) {
            return Some(format!("node address {ip} is also {}'s", p.node));
        }
    }
    for p in accepted.values() {
        if overlaps(&p.pod_cidr, &e.pod_cidr) {
            return Some(format!(
                "pod CIDR {} overlaps {}'s {}",
                e.pod_cidr, p.node, p.pod_cidr
            ));
        }
        if p.endpoint.eq_ignore_ascii_case(&e.endpoint) {
            return Some(format!("endpoint id is also {}'s", p.node));
        }
    }
    None
}

fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// A difference between two sets of peers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Added(NodeEntry),
    Removed(NodeEntry),
    /// Same node, something else changed (CIDR, endpoint or addresses).
    Updated {
        old: NodeEntry,
        new: NodeEntry,
    },
}

/// What turns `old` into `new`, in node-name order.
pub fn diff(old: &BTreeMap<String, NodeEntry>, new: &BTreeMap<String, NodeEntry>) -> Vec<Change> {
    let mut out = Vec::new();
    for (name, o) in old {
        match new.get(name) {
            None => out.push(Change::Removed(o.clone())),
            Some(n) if n != o => out.push(Change::Updated {
                old: o.clone(),
                new: n.clone(),
            }),
            Some(_) => {}
        }
    }
    for (name, n) in new {
        if !old.contains_key(name) {
            out.push(Change::Added(n.clone()));
        }
    }
    out
}

/// The static directory file: `{"nodes": [NodeEntry, ...]}`, the same file on every node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticFile {
    pub nodes: Vec<NodeEntry>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(node: &str, ep: char, cidr: &str) -> NodeEntry {
        NodeEntry {
            node: node.into(),
            endpoint: ep.to_string().repeat(64),
            pod_cidr: cidr.parse().unwrap(),
            addrs: vec![],
            node_ip: None,
        }
    }

    #[test]
    fn node_addresses_are_a_nodes_own_and_unique() {
        let with = |n: &str, ep: char, cidr: &str, ip: &str| NodeEntry {
            node_ip: Some(ip.parse().unwrap()),
            ..e(n, ep, cidr)
        };
        let entries = [
            with("a", '1', "10.42.1.0/24", "10.41.0.1"),
            with("b", '2', "10.42.2.0/24", "10.41.0.2"),
            with("c", '3', "10.42.3.0/24", "10.41.0.1"), // a's
            with("d", '4', "10.42.4.0/24", "10.41.0.2"), // b's
            with("f", '6', "10.42.6.0/24", "10.42.9.9"), // inside the cluster CIDR
            with("g", '7', "10.42.7.0/24", "203.0.113.1"), // the broker's public address
        ];
        let v = view(&entries, "a", &cluster(), &nodes());
        assert_eq!(v.peers.keys().collect::<Vec<_>>(), ["b"]);
        let reasons: BTreeMap<_, _> = v.rejected.into_iter().collect();
        assert!(reasons["c"].contains("this node's"), "{reasons:?}");
        assert!(reasons["d"].contains("also b's"), "{reasons:?}");
        for n in ["f", "g"] {
            assert!(
                reasons[n].contains("outside the node range 10.41.0.0/16"),
                "{reasons:?}"
            );
        }
        let b = &v.peers["b"];
        assert!(b.holds(&"10.41.0.2".parse().unwrap()) && b.holds(&"10.42.2.7".parse().unwrap()));
        assert!(!b.holds(&"10.41.0.1".parse().unwrap()));
        assert_eq!(
            b.prefixes()
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>(),
            ["10.42.2.0/24", "10.41.0.2/32"]
        );
    }

    fn cluster() -> IpNet {
        "10.42.0.0/16".parse().unwrap()
    }

    fn nodes() -> IpNet {
        "10.41.0.0/16".parse().unwrap()
    }

    #[test]
    fn own_entry_and_peers_are_told_apart() {
        let v = view(
            &[e("a", '1', "10.42.1.0/24"), e("b", '2', "10.42.2.0/24")],
            "a",
            &cluster(),
            &nodes(),
        );
        assert_eq!(v.own.unwrap().node, "a");
        assert_eq!(v.peers.keys().collect::<Vec<_>>(), ["b"]);
        assert!(v.rejected.is_empty());
        assert_eq!(
            e("x", '1', "10.42.7.0/24").gateway().to_string(),
            "10.42.7.1"
        );
    }

    #[test]
    fn bad_peers_are_refused_with_a_reason() {
        let entries = [
            e("a", '1', "10.42.1.0/24"),
            e("b", '2', "10.42.1.128/25"), // overlaps a
            e("c", '3', "192.168.0.0/24"), // outside
            e("d", '1', "10.42.4.0/24"),   // a's endpoint
            e("e", '5', "10.42.5.0/24"),
            e("f", '6', "10.42.5.0/24"), // overlaps e
            NodeEntry {
                endpoint: "zz".into(),
                ..e("g", '7', "10.42.7.0/24")
            },
        ];
        let v = view(&entries, "a", &cluster(), &nodes());
        assert_eq!(v.peers.keys().collect::<Vec<_>>(), ["e"]);
        let reasons: BTreeMap<_, _> = v.rejected.into_iter().collect();
        assert!(reasons["b"].contains("overlaps this node"));
        assert!(reasons["c"].contains("outside"));
        assert!(reasons["d"].contains("this node's"));
        assert!(reasons["f"].contains("overlaps e"));
        assert!(reasons["g"].contains("64 hex"));
    }

    #[test]
    fn diffs_name_added_removed_and_updated_peers() {
        let old: BTreeMap<_, _> = [e("b", '2', "10.42.2.0/24"), e("c", '3', "10.42.3.0/24")]
            .into_iter()
            .map(|p| (p.node.clone(), p))
            .collect();
        let mut new = old.clone();
        new.remove("b");
        new.insert("c".into(), e("c", '3', "10.42.33.0/24"));
        new.insert("d".into(), e("d", '4', "10.42.4.0/24"));
        let d = diff(&old, &new);
        assert!(matches!(&d[0], Change::Removed(p) if p.node == "b"));
        assert!(
            matches!(&d[1], Change::Updated { new, .. } if new.pod_cidr.to_string() == "10.42.33.0/24")
        );
        assert!(matches!(&d[2], Change::Added(p) if p.node == "d"));
        assert!(diff(&new, &new).is_empty());
    }

    #[test]
    fn the_static_file_refuses_unknown_fields() {
        let ok: StaticFile = serde_json::from_str(
            r#"{"nodes":[{"node":"a","endpoint":"x","pod_cidr":"10.42.1.0/24"}]}"#,
        )
        .unwrap();
        assert_eq!(ok.nodes[0].addrs, vec![]);
        assert!(serde_json::from_str::<StaticFile>(r#"{"nodes":[],"extra":1}"#).is_err());
    }
}
