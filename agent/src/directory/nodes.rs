//! What the cluster's Nodes and the broker's published nodes make of the peer directory
//! (contract 2), pure: the [`kube`](super::kube) source's watches feed it, and it decides
//! which entries exist and what each is made of.
//!
//! A node may edit its own Node object (the Node authorizer lets it), so in a broker's
//! cluster nothing that decides which node a peer *is* comes from there: its pod CIDR is the
//! control plane's (`spec.podCIDR`, which a node cannot change once set), its address and its
//! mesh endpoint id the broker's ([`NODE_ADDRESSES`]). What a node's annotations still say
//! is how to reach it (its direct UDP addresses): a wrong one reaches nothing, since QUIC
//! authenticates the endpoint id.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::core::v1::Node;
use socialweb_mesh_core::directory::NodeEntry;
#[cfg(doc)]
use socialweb_wire::mesh::NODE_ADDRESSES;
use socialweb_wire::mesh::{ADDRS_ANNOTATION, ENDPOINT_ANNOTATION, PublishedNodes};

/// Where peers' mesh endpoint ids come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trust {
    /// A broker's cluster: the ids the broker published, and nothing else. A Node the
    /// broker names no id for is no peer, whatever its annotation says: an id taken from a
    /// Node once let a node claim another's, and the directories that believed it gave the
    /// victim's place to the attacker (issue 58).
    Broker,
    /// A cluster without a broker (the test harness's own control plane): each Node's
    /// annotation, which its agent writes.
    Annotations,
}

impl Trust {
    /// From this node's identity: a broker's cluster is one whose identity names this node's
    /// address (`node_ip`), since the broker assigns every node one and publishes it with the
    /// node's endpoint id; the harness's identities name none. The identity is stricter than
    /// asking whether the ConfigMap exists: it is fixed before anything in the cluster is
    /// read, so nothing done in the cluster (the ConfigMap missing before the broker's first
    /// write, gone, or unreadable) turns a node back to trusting annotations; it fails closed
    /// (no ids, no peers) instead.
    pub fn of(identity_node_ip: Option<IpAddr>) -> Trust {
        match identity_node_ip {
            Some(_) => Trust::Broker,
            None => Trust::Annotations,
        }
    }
}

/// This node, as its identity and its mesh know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Me {
    pub node: String,
    /// Its endpoint id: its own, from its mesh key, whatever its Node says.
    pub endpoint: String,
    /// Its address, the identity's (the same the broker publishes).
    pub node_ip: Option<IpAddr>,
}

/// The directory entries of `nodes`, in node-name order (those that are no entry yet left
/// out).
pub fn entries<'a>(
    nodes: impl IntoIterator<Item = &'a Node>,
    me: &Me,
    published: &PublishedNodes,
    trust: Trust,
) -> Vec<NodeEntry> {
    let by_name: BTreeMap<String, NodeEntry> = nodes
        .into_iter()
        .filter_map(|n| entry_of(n, me, published, trust))
        .map(|e| (e.node.clone(), e))
        .collect();
    by_name.into_values().collect()
}

/// The directory entry a Node stands for, once it has a pod CIDR and an endpoint id (this
/// node always has its own).
pub fn entry_of(
    node: &Node,
    me: &Me,
    published: &PublishedNodes,
    trust: Trust,
) -> Option<NodeEntry> {
    let name = node.metadata.name.clone()?;
    let pod_cidr = node.spec.as_ref()?.pod_cidr.as_ref()?.parse().ok()?;
    let annotation = |key: &str| node.metadata.annotations.as_ref()?.get(key);
    let (endpoint, node_ip) = if name == me.node {
        (me.endpoint.clone(), me.node_ip)
    } else {
        let endpoint = match trust {
            Trust::Broker => published.endpoints.get(&name)?.clone(),
            Trust::Annotations => annotation(ENDPOINT_ANNOTATION)?.clone(),
        };
        (endpoint, published.addresses.get(&name).copied())
    };
    let addrs = annotation(ADDRS_ANNOTATION)
        .map(|s| {
            s.split(',')
                .filter_map(|a| a.trim().parse::<SocketAddr>().ok())
                .collect()
        })
        .unwrap_or_default();
    Some(NodeEntry {
        node: name,
        endpoint,
        pod_cidr,
        addrs,
        node_ip,
    })
}

#[cfg(test)]
mod tests {
    use socialweb_mesh_core::directory::view;

    use super::*;

    fn node(name: &str, cidr: Option<&str>, endpoint: Option<&str>, addrs: Option<&str>) -> Node {
        let mut annotations = BTreeMap::new();
        // What a node may write about itself does not decide its address.
        annotations.insert(
            "socialweb.computer/mesh-node-ip".to_string(),
            "203.0.113.1".to_string(),
        );
        if let Some(e) = endpoint {
            annotations.insert(ENDPOINT_ANNOTATION.to_string(), e.to_string());
        }
        if let Some(a) = addrs {
            annotations.insert(ADDRS_ANNOTATION.to_string(), a.to_string());
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"podCIDR": cidr},
        }))
        .unwrap()
    }

    fn id(c: char) -> String {
        c.to_string().repeat(64)
    }

    fn me(node: &str, endpoint: &str, node_ip: Option<&str>) -> Me {
        Me {
            node: node.into(),
            endpoint: endpoint.into(),
            node_ip: node_ip.map(|ip| ip.parse().unwrap()),
        }
    }

    /// What the broker publishes for nodes `c-1`..`c-3`: addresses 10.41.0.n, ids of `n`s.
    fn published() -> PublishedNodes {
        let data: BTreeMap<String, String> = (1..=3)
            .flat_map(|n| {
                let ep = n.to_string().repeat(64);
                [
                    (format!("c-{n}"), format!("10.41.0.{n}")),
                    (format!("endpoint_c-{n}"), ep),
                ]
            })
            .collect();
        PublishedNodes::from_data(&data)
    }

    #[test]
    fn a_brokers_cluster_is_one_whose_identity_names_this_nodes_address() {
        assert_eq!(Trust::of(Some("10.41.0.1".parse().unwrap())), Trust::Broker);
        assert_eq!(Trust::of(None), Trust::Annotations);
    }

    #[test]
    fn in_a_brokers_cluster_a_peers_id_and_address_are_the_brokers_alone() {
        let p = published();
        let me = me("c-1", &id('1'), Some("10.41.0.1"));
        // c-2 names c-3's id: it keeps its own, the broker's.
        let c2 = node(
            "c-2",
            Some("10.42.2.0/24"),
            Some(&id('3')),
            Some("172.31.2.2:7443, bad"),
        );
        let e = entry_of(&c2, &me, &p, Trust::Broker).unwrap();
        assert_eq!(e.endpoint, id('2'), "the broker's id, not the annotation's");
        assert_eq!(e.node_ip, Some("10.41.0.2".parse().unwrap()));
        assert_eq!(
            e.addrs,
            vec!["172.31.2.2:7443".parse().unwrap()],
            "how to reach it is still the node's word"
        );
        // A node the broker publishes no id for is no peer, annotated or not.
        let c9 = node("c-9", Some("10.42.9.0/24"), Some(&id('9')), None);
        assert_eq!(entry_of(&c9, &me, &p, Trust::Broker), None);
        // This node is its own key's, whatever its Node says, with its identity's address.
        let own = node("c-1", Some("10.42.1.0/24"), Some(&id('3')), None);
        let own = entry_of(&own, &me, &p, Trust::Broker).unwrap();
        assert_eq!(
            (own.endpoint, own.node_ip),
            (id('1'), Some("10.41.0.1".parse().unwrap()))
        );
        assert_eq!(
            entry_of(&node("c-2", None, None, None), &me, &p, Trust::Broker),
            None,
            "no pod CIDR yet"
        );
    }

    #[test]
    fn without_a_broker_ids_come_from_the_annotations() {
        let me = me("n1", "x", None);
        let none = PublishedNodes::default();
        let n2 = node("n2", Some("10.42.2.0/24"), Some(&id('a')), None);
        let e = entry_of(&n2, &me, &none, Trust::Annotations).unwrap();
        assert_eq!((e.endpoint, e.node_ip), (id('a'), None));
        let bare = node("n2", Some("10.42.2.0/24"), None, None);
        assert_eq!(
            entry_of(&bare, &me, &none, Trust::Annotations),
            None,
            "no agent yet"
        );
        let own = node("n1", Some("10.42.1.0/24"), None, None);
        let own = entry_of(&own, &me, &none, Trust::Annotations).unwrap();
        assert_eq!(own.endpoint, "x", "this node before it annotated itself");
    }

    /// Issue 58, attack 4, as the third node sees it: c-1 names c-2's id on its Node. Taken
    /// from the annotations (as every agent once did, and the harness's still do), c-1 came
    /// first in name order with c-2's id and c-2 was refused as a duplicate: c-3 lost c-2's
    /// Pods. Taken from the broker, nothing changes.
    #[test]
    fn a_node_claiming_anothers_id_cuts_no_one_off_in_a_brokers_cluster() {
        let nodes: Vec<Node> = (1..=3)
            .map(|n| {
                let claimed = if n == 1 { 2 } else { n };
                let ep = claimed.to_string().repeat(64);
                node(
                    &format!("c-{n}"),
                    Some(&format!("10.42.{n}.0/24")),
                    Some(&ep),
                    None,
                )
            })
            .collect();
        let me = me("c-3", &id('3'), Some("10.41.0.3"));
        let (cluster, range) = (
            "10.42.0.0/16".parse().unwrap(),
            socialweb_wire::mesh::node_range(),
        );
        let v = view(
            &entries(&nodes, &me, &published(), Trust::Broker),
            "c-3",
            &cluster,
            &range,
        );
        let peers: Vec<(&str, &str)> = v
            .peers
            .values()
            .map(|p| (p.node.as_str(), p.endpoint.as_str()))
            .collect();
        assert_eq!(peers, [("c-1", &*id('1')), ("c-2", &*id('2'))]);
        assert!(v.rejected.is_empty(), "{:?}", v.rejected);

        let believed = entries(&nodes, &me, &PublishedNodes::default(), Trust::Annotations);
        let v = view(&believed, "c-3", &cluster, &range);
        assert_eq!(v.peers["c-1"].endpoint, id('2'));
        assert_eq!(
            v.rejected,
            [("c-2".to_string(), "endpoint id is also c-1's".to_string())]
        );
    }
}
