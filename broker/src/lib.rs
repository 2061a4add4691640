//! `socialweb-broker`: the operator's daemon (docs/operations.md). Its decisions are in the
//! pure `socialweb-broker-core`; the market protocol's types in `socialweb-market`; the
//! provider it embeds by default in `socialweb-provider`. This crate observes, calls the
//! core, and acts. Layers, from the outside in (docs/architecture.md):
//!
//! - Front doors: [`api`] (the gateway API, for users) and [`ctl`] (the control socket, for
//!   the operator). Both translate their wire into [`command`]s and nothing else.
//! - Services: [`services`] executes a [`command`] on [`cluster`] (the cluster service: the
//!   rules, each cluster's life) and [`access`] (users CAs, certificates, revocation), with
//!   the same rules whichever door it came through.
//! - Subsystems the services use: [`control_plane`] (a tenant control plane, supervised),
//!   [`scale`] (the driver that feeds the core's decision), [`provision`] (the executor of
//!   the core's provisioning transitions), [`market`] (the protocol's HTTP client), [`front`]
//!   (the certificate front), [`auth`] (service-auth tokens), [`tenant`] (what the broker
//!   does inside a cluster), [`tunnel`] (the way between nodes and their control plane),
//!   [`rights`] (the tenant's role), [`guard`] (the authorization webhook: what RBAC cannot
//!   say),
//!   [`approver`] (nodes' certificate requests), [`node_addresses`] (nodes' cluster
//!   addresses, for the mesh), [`quota`] (the datastore quota on kine),
//!   [`store`], [`relay`], [`metrics`], [`process`], [`pki`] (CAs and what they issue, for
//!   the control planes, the front and the fleet).
//! - [`backup`]: `backup` and `restore` of the state directory (the CLI's), and
//!   [`backup_schedule`], the daemon's backups on a schedule (`[backup]`).
//! - [`daemon`]: the composition root: builds each subsystem from its own [`config`]
//!   section, wires them, and shuts them down.

/// This build's version, as `--version`, the backups' manifests and the logs name it.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("SOCIALWEB_COMMIT"),
    ")"
);

pub mod access;
pub mod api;
pub mod approver;
pub mod auth;
pub mod backup;
pub mod backup_schedule;
pub mod cluster;
pub mod command;
pub mod config;
pub mod control_plane;
pub mod ctl;
pub mod daemon;
pub mod disk;
pub mod fleet_host;
pub mod front;
pub mod guard;
pub mod host;
pub mod market;
pub mod metrics;
pub mod node_addresses;
pub mod notify;
pub mod pki;
pub mod process;
pub mod provision;
pub mod quota;
pub mod relay;
pub mod rights;
pub mod scale;
pub mod services;
pub mod store;
pub mod tenant;
pub mod tunnel;
pub mod vault;
pub mod watchdog;

/// One TLS crypto provider for the process (ring, as kube's); with more than one linked in,
/// rustls refuses to guess. Every part that makes a TLS client or server calls this first.
pub fn crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
