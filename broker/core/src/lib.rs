//! The broker's pure core: what the broker decides, as values in and values out. The daemon
//! (`socialweb-broker`) observes -- the store, the tenant cluster's watches, the provider's
//! leases -- calls these, and carries out what they return, as `socialweb-mesh-core`'s peer
//! plan is carried out by the agent. Nothing here does I/O or reads a clock: times are
//! arguments, so every rule is tested as a table (and `tests/tests/tidy.rs` keeps it so).
//!
//! - [`records`]: the domain types the store keeps (clusters, provisions and their [`Step`],
//!   decisions, certificate records) and the store's time (`millis`).
//! - [`scale`]: contract 7, the scale decision; [`offers`]: what it rents, and where.
//! - [`provision`]: a provision's steps as a transition function.
//! - [`backups`]: which scheduled backups go when a new one is finished.
//! - [`bids`]: which bids to take, and when to stop waiting for more.
//! - [`csr`]: which node certificate requests the broker approves.
//! - [`disk`]: whether the state directory's filesystem has room for new work.
//! - [`egress`]: which node an apiserver CONNECT goes to.
//! - [`guard`]: what RBAC cannot say: the control plane's namespaces and names, whom a
//!   tenant may impersonate.
//! - [`rights`]: what a tenant may do in its own cluster, as the ClusterRole it is bound to.
//! - [`reconcile`]: the store's view against the provider's, as a list of fixes.
//! - [`names`]: cluster names, account hashes and mount paths.
//! - [`hibernation`]: when an idle cluster's control plane may stop.
//! - [`life`]: a cluster's life on one host (start, ready, idle, hibernate, wake, hand-over,
//!   take-over, delete) as a transition function, with the record each writes first.
//! - [`source`]: what counts as one source address for the limits per address.
//! - [`reach`]: whether a fleet host is cut off from its users, from its peers' probes.

pub mod backups;
pub mod bids;
pub mod csr;
pub mod disk;
pub mod egress;
pub mod guard;
pub mod hibernation;
pub mod life;
pub mod names;
pub mod offers;
pub mod ownership;
pub mod placement;
pub mod provision;
pub mod reach;
pub mod reconcile;
pub mod records;
pub mod requests;
pub mod rights;
pub mod scale;
pub mod source;

pub use records::{
    CertRecord, Cluster, ClusterPhase, DecisionRow, Provision, Step, from_millis, millis,
};
