//! The mesh, pure (contracts 2 and 3; docs/mesh.md): values in, values out. The agent's
//! `mesh::runtime` does the I/O around it (the TUN device, routes, the iroh endpoint).
//!
//! - [`packet`]: the IP header fields the filter needs.
//! - [`filter`]: which packets may enter the mesh from a pod and leave it towards one.
//! - [`icmp`]: ICMP Packet Too Big for packets larger than a peer's path carries.
//! - [`directory`]: the peers a node accepts from a directory source, and what changed.
//! - [`peers`]: what a new directory view does to the running peers (retire, add, dial).
//! - [`codel`], [`fq`], [`ecn`]: the queue where packets wait (FQ-CoDel), judged by how long
//!   they wait, signalling congestion with ECN marks where the inner packet takes them.
//! - [`refusals`]: connections refused before the directory listed their endpoint, sorted
//!   into early peers' and strangers'.
//! - [`sendbuf`]: the QUIC connection's datagram send buffer as it counts it, so a batch
//!   never makes it drop older datagrams.
//!
//! This crate may not depend on an async runtime, sockets, netlink or Kubernetes, and takes
//! the time as an argument where it needs one: the `tidy` test holds it to that.

pub mod codel;
pub mod directory;
pub mod ecn;
pub mod filter;
pub mod fq;
pub mod icmp;
pub mod packet;
pub mod peers;
pub mod refusals;
pub mod sendbuf;
