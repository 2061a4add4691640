//! The mesh: every other node's pod CIDR routed through a TUN device as QUIC datagrams over
//! iroh, directly where a path exists and through the operator's relay where none does
//! (contracts 2 and 3; docs/mesh.md).
//!
//! The pure core (packets, the filter, ICMP, the directory, the peer plan) is the crate
//! `socialweb-mesh-core`; these modules are the edges and the running mesh.

pub mod egress;
pub mod queue;
pub mod routes;
pub mod runtime;
pub mod stats;
pub mod thread;
pub mod transport;
pub mod tun;

pub use runtime::{Mesh, MeshConfig, path_of};
