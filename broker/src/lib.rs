//! `socialweb-broker`: the operator's daemon (docs/operations.md).
//!
//! - [`control_plane`]: how a tenant control plane is configured and supervised (its PKI, the
//!   component flags, the join manifests, bootstrap tokens); the test fixture shares it.
//! - [`scale`]: the scale decision (pure) and the driver that feeds it from watches.
//! - [`market`]: the market protocol, the client, and the local provider.
//! - [`provision`]: renting one node, step by step, crash-safe.
//! - [`store`]: SQLite or PostgreSQL, one schema.
//! - [`access`], [`auth`], [`front`], [`api`]: the way in for users: their certificates and
//!   kubeconfigs, service-auth tokens, the certificate front, the gateway API.
//! - [`daemon`], [`ctl`], [`config`], [`metrics`], [`relay`], [`tenant`], [`process`].

pub mod access;
pub mod api;
pub mod auth;
pub mod config;
pub mod control_plane;
pub mod ctl;
pub mod daemon;
pub mod front;
pub mod market;
pub mod metrics;
pub mod process;
pub mod provision;
pub mod relay;
pub mod scale;
pub mod store;
pub mod tenant;
