//! The way in for users (docs/api.md): who a cluster belongs to, the client certificates the
//! broker signs for a DID, the kubeconfigs that carry them, and the records the front admits
//! them by.
//!
//! - [`service`]: the access service the front doors call.
//! - [`certs`]: lifetimes, issuing a client certificate from a cluster's users CA.
//! - [`kubeconfig`]: the file a user gets.
//! - [`registration`]: who may have a cluster (the operator's policy) and invites.
//! - [`records`]: the in-memory view of the certificate records the front checks on every
//!   request, and the signal that cuts connections when one is revoked.
//! - [`names`]: a DID's account hash and a cluster's mount path (the core's).

pub mod certs;
pub mod kubeconfig;
pub mod records;
pub mod registration;
pub mod service;
pub mod users_trust;

pub use socialweb_broker_core::names;

/// The group every user certificate carries; bound to the tenant's role
/// (deploy/access.yaml, `crate::rights`).
pub const OWNERS_GROUP: &str = "socialweb.computer:cluster-owners";

/// RBAC every tenant cluster gets for the way in: the owners' group holds the tenant's role.
pub const ACCESS_MANIFEST: &str = include_str!("../../deploy/access.yaml");
