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
    /// Keys `key_file` replaces, during a rotation: what they sealed still opens, nothing is
    /// sealed under them. Put the new key in `key_file` and the old one here on every host,
    /// run `socialweb-broker store-rekey` (it re-seals everything under the new key), then
    /// remove them (docs/operations.md, "Rotating store.key_file").
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub previous_key_files: Vec<PathBuf>,
}

impl Store {
    /// `key_file`'s key, opening what `previous_key_files` sealed too; `None`: no key.
    pub fn seal_key(&self) -> anyhow::Result<Option<crate::vault::SealKey>> {
        use anyhow::Context;
        let Some(file) = &self.key_file else {
            return Ok(None);
        };
        let key = crate::vault::SealKey::load(file).context("store.key_file")?;
        let mut previous = Vec::new();
        for (i, p) in self.previous_key_files.iter().enumerate() {
            previous.push(
                crate::vault::SealKey::load(p)
                    .with_context(|| format!("store.previous_key_files[{i}]"))?,
            );
        }
        Ok(Some(key.with_previous(previous)))
    }

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
        if self.key_file.is_none() && !self.previous_key_files.is_empty() {
            return Err(err(
                &o("store.previous_key_files"),
                "needs store.key_file: the key that replaces them",
            ));
        }
        Ok(())
    }
}
