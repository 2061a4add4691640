//! A fleet's set-up as the fleet tests and benchmarks share it (`tests/tests/fleet.rs`,
//! `bench/fleet`): a new `store.key_file`, and each host's broker options on one PostgreSQL
//! store, the clusters' datastore there too.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;

use crate::broker::BrokerOptions;
use crate::postgres::Postgres;

/// A new key for `store.key_file`, written owner-only as `dir/store.key`.
pub fn store_key(dir: &Path) -> Result<PathBuf> {
    let key = dir.join("store.key");
    std::fs::write(
        &key,
        format!("{}\n", socialweb_broker::vault::SealKey::generate()),
    )?;
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    Ok(key)
}

/// Host `host`'s options in a fleet on `pg`'s store with the key in `key`: `lease_ttl`, and
/// clusters that hibernate after `hibernate_after` (zero: never).
pub fn host(
    pg: &Postgres,
    key: &Path,
    host: u8,
    lease_ttl: Duration,
    hibernate_after: Duration,
) -> BrokerOptions {
    BrokerOptions {
        on_host: Some(host),
        store_url: Some(pg.url.clone()),
        store_key_file: Some(key.to_path_buf()),
        fleet_lease_ttl: Some(lease_ttl),
        clusters: socialweb_broker::config::ClusterDefaults {
            datastore: socialweb_broker::config::DatastoreKind::Postgres,
            hibernate_after,
            ..Default::default()
        },
        ..Default::default()
    }
}
