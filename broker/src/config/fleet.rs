//! `[fleet]`: several broker hosts sharing one PostgreSQL store (docs/operations.md, "A
//! fleet"). What a fleet asks of the store and the clusters' datastore is checked with
//! [`super::Config`], which has those sections too.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::durations::{HumanDuration, humantime_serde_compat};
use super::{ConfigError, err};

/// `[fleet]`: this host is one of several sharing the store. Each awake cluster is run by
/// the one host holding its lease (a row of the store it renews); a host that sees the
/// lease of a cluster that is not hibernating expire takes the cluster over and starts its
/// control plane from PostgreSQL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Fleet {
    /// Run as one host of a fleet. Needs a PostgreSQL `store.url`, `store.key_file` (the same
    /// key on every host) and `clusters.datastore = "postgres"`: nothing a cluster needs
    /// may be on one host's disk.
    pub enabled: bool,
    /// How long a cluster's lease lasts unless renewed (at least 3 s). Its owner renews it
    /// every fifth of this and stops the control plane when three tenths of it are left
    /// unrenewed; another host takes the cluster over a fifth of it after the expiry. A
    /// lost host's clusters are started elsewhere about 1.2 times this after its last
    /// renewal, plus a control plane's start.
    #[serde(with = "humantime_serde_compat")]
    #[schemars(with = "HumanDuration")]
    pub lease_ttl: Duration,
    /// The most clusters this host runs awake at once. A host at it claims no other: a
    /// cluster created or woken here is then taken by another host of the fleet, and a lost
    /// host's clusters go to hosts below theirs. Hosts with fewer claims first (each claim of
    /// a cluster no request asked of this host waits a tenth of a second per cluster it runs).
    /// Unset: no limit.
    pub max_awake: Option<u32>,
    /// The port of this host's link, on `service_addr` (told to the other hosts at
    /// `advertise_addr`): where they carry the requests their fronts admit for the clusters
    /// this host runs. Mutual TLS under the fleet's own CA, kept in the store like the
    /// clusters' CAs; it admits the fleet's hosts and no one else.
    pub link_port: u16,
}

impl Fleet {
    /// Not a fleet, and nothing else set: what need not be written.
    pub fn is_off(&self) -> bool {
        *self == Fleet::default()
    }

    /// Its own bounds, when on: a lease long enough to be renewed, a port for the link.
    pub(super) fn check(&self, o: &impl Fn(&str) -> String) -> Result<(), ConfigError> {
        if !self.enabled {
            return Ok(());
        }
        if self.lease_ttl < Duration::from_secs(3) {
            return Err(err(&o("fleet.lease_ttl"), "must be at least 3s"));
        }
        if self.link_port == 0 {
            return Err(err(
                &o("fleet.link_port"),
                "must be a port: the other hosts reach this one's clusters through it",
            ));
        }
        Ok(())
    }
}

impl Default for Fleet {
    fn default() -> Fleet {
        Fleet {
            enabled: false,
            lease_ttl: Duration::from_secs(10),
            max_awake: None,
            link_port: 6445,
        }
    }
}
