//! Node-local DNS (contract 5): 169.254.20.10 on this node answers the cluster zone itself,
//! from Services and EndpointSlices it watches, and forwards and caches everything else. DNS
//! never leaves the node for a cluster name. docs/dns.md.

pub mod answer;
pub mod bind;
pub mod cache;
pub mod forward;
pub mod kube;
pub mod server;
pub mod stats;
pub mod store;
pub mod wire;

pub use server::Dns;
