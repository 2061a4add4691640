//! Sources of the peer directory. Each reports every node it knows (this one included) as a
//! list of [`NodeEntry`] on a watch channel; the mesh turns that into peers
//! ([`crate::mesh::directory::view`]).
//!
//! - [`static_file`]: a JSON file, re-read when it changes (the demo, machines without k3s).
//! - Kubernetes Nodes (with the k3s join): `spec.podCIDR` plus the annotations the agent writes.

pub mod static_file;

pub use crate::mesh::directory::NodeEntry;
