//! Node-local DNS (contract 5): 169.254.20.10 on this node answers the cluster zone itself,
//! from Services and EndpointSlices it watches, and forwards and caches everything else. DNS
//! never leaves the node for a cluster name. docs/dns.md.
//!
//! The pure core (the zone, the answers, the cache, the query reader) is the crate
//! `socialweb-dns-core`; these modules are the edges: sockets, upstreams, watches, the address.

pub mod bind;
pub mod forward;
pub mod kube;
pub mod server;
pub mod stats;

pub use server::Dns;
