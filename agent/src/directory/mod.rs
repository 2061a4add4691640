//! Sources of the peer directory. Each reports every node it knows (this one included) as a
//! list of [`NodeEntry`] on a watch channel; the mesh turns that into peers
//! (`socialweb_mesh_core::directory::view`).
//!
//! - [`static_file`]: a JSON file, re-read when it changes (the demo, machines without k3s).
//! - [`kube`]: Kubernetes Nodes: `spec.podCIDR` plus the annotations each agent writes on its
//!   own Node.

pub mod kube;
pub mod static_file;

pub use socialweb_mesh_core::directory::NodeEntry;
