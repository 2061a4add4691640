//! Contracts 2 and 3: the peer directory's annotations and the mesh wire's constants
//! (docs/mesh.md).

/// ALPN of the mesh's QUIC connections; each datagram on them carries one raw IP packet.
pub const ALPN: &[u8] = b"socialweb/mesh/1";

/// Annotation an agent writes on its own Node: its mesh endpoint id (64 hex digits).
pub const ENDPOINT_ANNOTATION: &str = "socialweb.computer/mesh-endpoint";

/// Annotation an agent writes on its own Node: its direct UDP addresses, comma-separated
/// `ip:port` (may be empty: peers then reach it through the relay only).
pub const ADDRS_ANNOTATION: &str = "socialweb.computer/mesh-addrs";

/// Where every node's cluster address (`node_ip`, its Node's InternalIP) is published: a
/// ConfigMap in `kube-system` whose data maps node name to address, written by the broker,
/// which assigned the addresses, and readable (not writable) by nodes. Peers route a node's
/// address over the mesh only from here, never from anything a node writes about itself
/// (its Node object is the node's own to edit). A cluster without it (the test harness's,
/// nodes addressed on their underlay) reaches nodes for pods only.
pub const NODE_ADDRESSES: (&str, &str) = ("kube-system", "socialweb-node-addresses");

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
