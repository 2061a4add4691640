//! Contracts 2 and 3: the peer directory's annotations and the mesh wire's constants
//! (docs/mesh.md).

/// ALPN of the mesh's QUIC connections; each datagram on them carries one raw IP packet.
pub const ALPN: &[u8] = b"socialweb/mesh/1";

/// Annotation an agent writes on its own Node: its mesh endpoint id (64 hex digits).
pub const ENDPOINT_ANNOTATION: &str = "socialweb.computer/mesh-endpoint";

/// Annotation an agent writes on its own Node: its direct UDP addresses, comma-separated
/// `ip:port` (may be empty: peers then reach it through the relay only).
pub const ADDRS_ANNOTATION: &str = "socialweb.computer/mesh-addrs";

/// Annotation an agent writes on its own Node when its identity gives it a cluster address
/// (`node_ip`): peers then route that address to it over the mesh, like its pod CIDR. A node
/// without it (the test harness's, addressed on its underlay) is reached for pods only.
pub const NODE_IP_ANNOTATION: &str = "socialweb.computer/mesh-node-ip";

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
