//! `[store]`: where the broker keeps its own records, and the key that seals the clusters'
//! CA keys into them.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ConfigError, err};

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Store {
    /// `sqlite://<path>` (default: `<state_dir>/broker.db`) or `postgres://...`.
    pub url: Option<String>,
    /// A file holding the key (64 hexadecimal characters, owner-only; `socialweb-broker
    /// store-key FILE` makes one) that seals each cluster's CA keys into the store: the
    /// store becomes their home and this host's disk keeps copies, so a host with an empty
    /// disk, the store and this key serves the same clusters, and the store alone cannot
    /// sign for them. Back it up apart from the store. Unset: CA keys live on this disk only.
    pub key_file: Option<PathBuf>,
}

impl Store {
    /// `url` names a store the broker can open: SQLite or PostgreSQL.
    pub(super) fn check(&self, o: &impl Fn(&str) -> String) -> Result<(), ConfigError> {
        if let Some(url) = &self.url
            && !(url.starts_with("sqlite:")
                || url.starts_with("postgres://")
                || url.starts_with("postgresql://"))
        {
            return Err(err(
                &o("store.url"),
                format!("{url:?} is neither sqlite:<path> nor postgres://..."),
            ));
        }
        Ok(())
    }
}
