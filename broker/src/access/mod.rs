//! The way in for users (docs/api.md): who a cluster belongs to, the client certificates the
//! broker signs for a DID, the kubeconfigs that carry them, and the records the front admits
//! them by.
//!
//! - [`names`]: a DID's account hash and a cluster's mount path, as the seeds' gateway makes
//!   them.
//! - [`certs`]: lifetimes, issuing a client certificate from a cluster's users CA.
//! - [`kubeconfig`]: the file a user gets.
//! - [`records`]: the in-memory view of the certificate records the front checks on every
//!   request, and the signal that cuts connections when one is revoked.

pub mod certs;
pub mod kubeconfig;
pub mod names;
pub mod records;

/// The group every user certificate carries; the tenant binds it to cluster-admin
/// (deploy/access.yaml).
pub const OWNERS_GROUP: &str = "socialweb.computer:cluster-owners";

/// RBAC every tenant cluster gets for the way in: the owners' group is cluster-admin.
pub const ACCESS_MANIFEST: &str = include_str!("../../deploy/access.yaml");
