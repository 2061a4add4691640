//! `testbed`: the harness socialweb's integration tests run on.
//!
//! Hosts, nodes and pods are network namespaces on this machine, linked with veth pairs and
//! bridges. Everything a test creates is named with the `swt-<pid>-` prefix, removed when its
//! handle drops (also on panic), and swept by the next run if the process was killed. The
//! harness never changes the root namespace's interfaces, routes or nftables: every command it
//! issues names the namespace it acts in.
//!
//! Tests that use it need root; without root they fail with a message that says so.

pub mod broker;
pub mod cache;
pub mod cni;
pub mod fleet;
pub mod images;
pub mod k8s;
pub mod link;
pub mod machine;
pub mod mesh;
pub mod natmesh;
pub mod netns;
pub mod nodeimage;
pub mod package;
pub mod postgres;
pub mod probe;
pub mod process;
pub mod quickstart;
pub mod release;
pub mod resolver;
pub mod root;
pub mod runs;
pub mod scale_trace;
pub mod stats;
pub mod ticker;
pub mod tmp;
pub mod topology;
pub mod user;
pub mod wait;
pub mod world;

pub use netns::Netns;
pub use topology::{Node, Pod, Reach, Topology};
