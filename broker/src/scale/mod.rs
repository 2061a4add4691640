//! Contract 7, the scale decision (docs/scale.md): the decision itself is pure
//! (`socialweb_broker_core::scale`, re-exported here as [`decision`]); the [`driver`] feeds
//! it from the cluster's watches and acts on it, keeping of them what [`cache`] allows.

pub use socialweb_broker_core::scale as decision;

pub mod cache;
pub mod driver;
