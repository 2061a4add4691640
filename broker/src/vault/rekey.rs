//! Rotating `store.key_file`: every row the store keeps sealed under a previous key is
//! opened and sealed again under the current one, row by row, each update conditional on the
//! row being as read (a host sealing meanwhile seals under the current key already). What a
//! previous key sealed opens meanwhile on every host given it in `store.previous_key_files`.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use serde::Serialize;

use super::SealKey;
use crate::store::Store;

/// What a rekey did.
#[derive(Debug, Default, Serialize, PartialEq, Eq)]
pub struct Rekeyed {
    /// The key everything is sealed under now.
    pub key_id: String,
    /// Rows sealed again, by the key they were sealed under.
    pub resealed: BTreeMap<String, usize>,
    /// Rows under the current key already.
    pub current: usize,
}

/// Seals again under `key` every row sealed under one of its previous keys. A row under a
/// key it was not given fails the whole run before anything is written, naming the row and
/// its key.
pub async fn rekey(store: &Store, key: &SealKey) -> Result<Rekeyed> {
    let total = store.sealed_count().await?;
    let rows = store.sealed_not_under(key.id()).await?;
    let unknown: Vec<String> = rows
        .iter()
        .filter(|[_, _, id, _]| !key.previous_ids().any(|p| p == id))
        .map(|[c, p, id, _]| format!("{c}/{p} (key {id})"))
        .collect();
    if !unknown.is_empty() {
        anyhow::bail!(
            "{} sealed row(s) under a key neither store.key_file nor store.previous_key_files \
             holds: {}; nothing was sealed again",
            unknown.len(),
            unknown.join(", ")
        );
    }
    let mut done = Rekeyed {
        key_id: key.id().to_string(),
        resealed: BTreeMap::new(),
        current: total - rows.len(),
    };
    for [cluster, path, id, text] in &rows {
        let place = format!("{cluster}/{path}");
        let plain = key
            .open(&place, id, text)
            .with_context(|| format!("{place} in the store"))?;
        let again = key.seal(&place, &plain);
        if store
            .reseal(cluster, path, (id, text), (key.id(), &again))
            .await?
        {
            *done.resealed.entry(id.clone()).or_default() += 1;
        }
    }
    Ok(done)
}
