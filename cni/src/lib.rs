//! `socialweb-cni`: a CNI 1.1 plugin that attaches pods to the node's bridge and owns their
//! addresses.
//!
//! Pure core: [`spec`] (the protocol), [`config`] (the network configuration), [`ipam`] (the
//! allocation table and its decisions). Edges: [`store`] (the table on disk under a lock),
//! [`world`] (boot id, process liveness); the kernel through `socialweb-netlink`, the node
//! side's one netlink implementation, which the agent shares.
//! [`plugin`] runs the verbs.

pub mod config;
pub mod ipam;
pub mod plugin;
pub mod spec;
pub mod store;
pub mod world;
