//! Sources of the peer directory. Each reports every node it knows (this one included) as a
//! list of [`NodeEntry`] on a watch channel; the mesh turns that into peers
//! (`socialweb_mesh_core::directory::view`).
//!
//! - [`static_file`]: a JSON file, re-read when it changes (the demo, machines without k3s).
//! - [`kube`]: Kubernetes Nodes (`spec.podCIDR`, and each agent's annotations on its own
//!   Node) and the nodes the broker publishes (addresses, endpoint ids); [`nodes`] is what
//!   they make of the directory, pure.

pub mod kube;
pub mod nodes;
pub mod static_file;

pub use socialweb_mesh_core::directory::NodeEntry;
