//! The shape every multi-node test uses: one "host" namespace (the operator's machine, where
//! the relay and the control plane live) and N "node" namespaces, each joined to the host by
//! its own point-to-point veth, as guests behind user-mode NAT are joined to their host.
//!
//! ```text
//!              host (172.31.255.1 on lo: services, relay)
//!        n1 172.31.1.1/24     n2 172.31.2.1/24   ...
//!            |                    |
//!     eth0 172.31.1.2/24   eth0 172.31.2.2/24
//!        node 1               node 2             (pod CIDR 10.42.<i>.0/24)
//! ```
//!
//! Whether nodes reach each other is one switch: with [`Reach::Direct`] the host forwards
//! between its links (a flat underlay); with [`Reach::HostOnly`] it does not, so a node can
//! reach the host's addresses and nothing else, which forces the mesh through the relay.

use std::net::Ipv4Addr;

use anyhow::Result;

use crate::link;
use crate::netns::Netns;

/// Address on the host's loopback that every node can reach whatever the [`Reach`].
pub const HOST_SERVICE_ADDR: Ipv4Addr = Ipv4Addr::new(172, 31, 255, 1);

/// The cluster CIDR the control plane allocates node pod CIDRs from.
pub const CLUSTER_CIDR: &str = "10.42.0.0/16";

/// Whether node namespaces can reach each other directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// The host forwards between node links.
    Direct,
    /// The host does not forward: each node reaches only the host.
    HostOnly,
}

/// A node namespace and its addresses.
#[derive(Debug)]
pub struct Node {
    pub ns: Netns,
    /// 1-based; also the third octet of its addresses.
    pub index: u8,
    /// The node's own address on its link to the host.
    pub addr: Ipv4Addr,
    /// The host's end of that link, the node's default gateway.
    pub gateway: Ipv4Addr,
}

impl Node {
    /// The pod CIDR a test conventionally gives this node: 10.42.<index>.0/24.
    pub fn pod_cidr(&self) -> String {
        format!("10.42.{}.0/24", self.index)
    }

    /// The first address of the pod CIDR (the bridge's address).
    pub fn pod_gateway(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 42, self.index, 1)
    }
}

/// A pod namespace with one interface, `eth0`, behind its node's bridge.
#[derive(Debug)]
pub struct Pod {
    pub ns: Netns,
    pub addr: Ipv4Addr,
}

/// A host and its nodes.
#[derive(Debug)]
pub struct Topology {
    // Field order is drop order: nodes (and their interfaces) go before the host.
    pub nodes: Vec<Node>,
    pub host: Netns,
}

impl Topology {
    /// Builds a host and `n` nodes (at most 200).
    pub fn new(n: u8, reach: Reach) -> Result<Topology> {
        assert!((1..=200).contains(&n), "a topology has 1 to 200 nodes");
        let host = Netns::new("host")?;
        link::addr(&host, "lo", &format!("{HOST_SERVICE_ADDR}/32"))?;
        let forward = if reach == Reach::Direct { "1" } else { "0" };
        link::sysctl(&host, "net.ipv4.ip_forward", forward)?;
        let mut nodes = Vec::new();
        for index in 1..=n {
            let ns = Netns::new(&format!("node{index}"))?;
            let host_if = format!("n{index}");
            link::veth(&host, &host_if, &ns, "eth0")?;
            let gateway = Ipv4Addr::new(172, 31, index, 1);
            let addr = Ipv4Addr::new(172, 31, index, 2);
            link::addr(&host, &host_if, &format!("{gateway}/24"))?;
            link::addr(&ns, "eth0", &format!("{addr}/24"))?;
            link::route(&ns, "default", Some(&gateway.to_string()), None)?;
            link::sysctl(&ns, "net.ipv4.ip_forward", "1")?;
            nodes.push(Node {
                ns,
                index,
                addr,
                gateway,
            });
        }
        Ok(Topology { nodes, host })
    }

    pub fn node(&self, index: u8) -> &Node {
        &self.nodes[usize::from(index) - 1]
    }

    /// Plain kernel routing for pod CIDRs through the host, for tests of the harness itself
    /// (the product routes pod CIDRs with its mesh instead): each node routes every other
    /// node's pod CIDR via the host, and the host routes each pod CIDR to its node.
    pub fn route_pod_cidrs_via_host(&self) -> Result<()> {
        for node in &self.nodes {
            link::route(
                &self.host,
                &node.pod_cidr(),
                Some(&node.addr.to_string()),
                None,
            )?;
            for other in self.nodes.iter().filter(|o| o.index != node.index) {
                link::route(
                    &node.ns,
                    &other.pod_cidr(),
                    Some(&node.gateway.to_string()),
                    None,
                )?;
            }
        }
        Ok(())
    }
}

/// Puts a bridge `cni0` with the node's pod gateway address on the node, if missing, and a pod
/// behind it at `10.42.<node>.<host_octet>`, wired by hand with `ip` (the CNI plugin does this
/// for real pods; this is for tests of the harness and of the routing underneath).
pub fn manual_pod(node: &Node, host_octet: u8) -> Result<Pod> {
    if !link::links(&node.ns)?.iter().any(|l| l == "cni0") {
        link::bridge(
            &node.ns,
            "cni0",
            Some(&format!("{}/24", node.pod_gateway())),
        )?;
    }
    let ns = Netns::new(&format!("pod{}-{host_octet}", node.index))?;
    let host_if = format!("veth{host_octet}");
    link::veth(&node.ns, &host_if, &ns, "eth0")?;
    link::attach(&node.ns, &host_if, "cni0")?;
    let addr = Ipv4Addr::new(10, 42, node.index, host_octet);
    link::addr(&ns, "eth0", &format!("{addr}/24"))?;
    link::route(&ns, "default", Some(&node.pod_gateway().to_string()), None)?;
    Ok(Pod { ns, addr })
}
