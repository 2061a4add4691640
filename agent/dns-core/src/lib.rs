//! Node-local DNS, pure (contract 5; docs/dns.md): values in, values out. The agent's
//! `dns::server`, `dns::forward` and `dns::kube` do the I/O around it.
//!
//! - [`store`]: the cluster zone as records, built from Services and EndpointSlices.
//! - [`answer`]: what to answer, from a request and a snapshot of the zone.
//! - [`cache`]: upstream answers, with negative caching and serve-stale.
//! - [`wire`]: the hot path's reader of ordinary queries and its cache of finished answers.
//!
//! This crate may not depend on an async runtime, sockets, netlink or Kubernetes, and takes
//! the time as an argument where it needs one: the `tidy` test holds it to that.

pub mod answer;
pub mod cache;
pub mod store;
pub mod wire;
