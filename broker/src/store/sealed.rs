//! The store's part of the vault (`crate::vault`): sealed files, written once per cluster
//! and path, never replaced (a CA is not replaced; the first host to seal one wins) -- only
//! sealed again, the same bytes under a new key, when the operator rotates it.
//! Files that only work together (a certificate and its key) are sealed as one group, all or
//! none, so that two hosts sealing at once cannot leave one's certificate beside the other's
//! key.

use anyhow::Result;
use sqlx::{Any, Row, Transaction};

use super::Store;

impl Store {
    /// The key id and sealed text of cluster `cluster`'s file `path`, if kept.
    pub async fn sealed_file(&self, cluster: &str, path: &str) -> Result<Option<(String, String)>> {
        let row =
            sqlx::query("SELECT key_id, sealed FROM sealed_files WHERE cluster = $1 AND path = $2")
                .bind(cluster)
                .bind(path)
                .fetch_optional(&self.pool)
                .await?;
        row.map(|r| Ok((r.try_get("key_id")?, r.try_get("sealed")?)))
            .transpose()
    }

    /// The key id and sealed text of each of cluster `cluster`'s files `paths`, if kept, read
    /// in one statement: a group another host seals meanwhile is seen whole or not at all.
    pub async fn sealed_group(
        &self,
        cluster: &str,
        paths: &[String; 2],
    ) -> Result<[Option<(String, String)>; 2]> {
        let rows = sqlx::query(
            "SELECT path, key_id, sealed FROM sealed_files \
             WHERE cluster = $1 AND (path = $2 OR path = $3)",
        )
        .bind(cluster)
        .bind(&paths[0])
        .bind(&paths[1])
        .fetch_all(&self.pool)
        .await?;
        let mut found = [None, None];
        for r in rows {
            let path: String = r.try_get("path")?;
            let i = usize::from(path == paths[1]);
            found[i] = Some((r.try_get("key_id")?, r.try_get("sealed")?));
        }
        Ok(found)
    }

    /// Keeps a sealed file unless the cluster has one at `path` already (that one stays): a
    /// group of one.
    pub async fn insert_sealed_file(
        &self,
        cluster: &str,
        path: &str,
        key_id: &str,
        sealed: &str,
        at: i64,
    ) -> Result<()> {
        self.insert_sealed_group(cluster, &[(path, key_id, sealed)], at)
            .await
            .map(|_| ())
    }

    /// Keeps the sealed files `files` (path, key id, sealed text) of cluster `cluster` all
    /// together, or none of them when the cluster has any of those paths already (the
    /// group in the store stays whole). Whether they were kept. In PostgreSQL a second
    /// host's insert of the same path waits for the first's transaction, then finds the row.
    pub async fn insert_sealed_group(
        &self,
        cluster: &str,
        files: &[(&str, &str, &str)],
        at: i64,
    ) -> Result<bool> {
        let mut tx = self.pool.begin().await?;
        if insert_sealed(&mut tx, cluster, files, at).await? != files.len() {
            tx.rollback().await?;
            return Ok(false);
        }
        tx.commit().await?;
        Ok(true)
    }

    /// Every sealed row not sealed under key `key_id`: (cluster, path, key id, sealed text).
    pub async fn sealed_not_under(&self, key_id: &str) -> Result<Vec<[String; 4]>> {
        let rows = sqlx::query(
            "SELECT cluster, path, key_id, sealed FROM sealed_files WHERE key_id <> $1 \
             ORDER BY cluster, path",
        )
        .bind(key_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok([
                    r.try_get("cluster")?,
                    r.try_get("path")?,
                    r.try_get("key_id")?,
                    r.try_get("sealed")?,
                ])
            })
            .collect()
    }

    /// Replaces the sealed text of cluster `cluster`'s file `path` with `new` (the same
    /// bytes sealed under key `new_key_id`), unless the row changed since it read `was`
    /// (key id, sealed text): whether it did. The one update of a sealed row, for a key's
    /// rotation.
    pub async fn reseal(
        &self,
        cluster: &str,
        path: &str,
        was: (&str, &str),
        new: (&str, &str),
    ) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE sealed_files SET key_id = $1, sealed = $2 \
             WHERE cluster = $3 AND path = $4 AND key_id = $5 AND sealed = $6",
        )
        .bind(new.0)
        .bind(new.1)
        .bind(cluster)
        .bind(path)
        .bind(was.0)
        .bind(was.1)
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(done == 1)
    }

    /// How many sealed rows the store has, of every cluster and the fleet's.
    pub async fn sealed_count(&self) -> Result<usize> {
        let n: i64 = sqlx::query("SELECT COUNT(*) AS n FROM sealed_files")
            .fetch_one(&self.pool)
            .await?
            .try_get("n")?;
        Ok(usize::try_from(n)?)
    }

    /// How many files cluster `cluster` has sealed in the store.
    pub async fn sealed_files(&self, cluster: &str) -> Result<i64> {
        Ok(
            sqlx::query("SELECT COUNT(*) AS n FROM sealed_files WHERE cluster = $1")
                .bind(cluster)
                .fetch_one(&self.pool)
                .await?
                .try_get("n")?,
        )
    }
}

/// Inserts the sealed files `files` (path, key id, sealed text) of cluster `cluster` in
/// `tx`, each unless the cluster has that path already: how many were inserted.
pub(super) async fn insert_sealed(
    tx: &mut Transaction<'static, Any>,
    cluster: &str,
    files: &[(&str, &str, &str)],
    at: i64,
) -> Result<usize> {
    let mut inserted = 0;
    for (path, key_id, sealed) in files {
        inserted += sqlx::query(
            "INSERT INTO sealed_files (cluster, path, key_id, sealed, created_at) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (cluster, path) DO NOTHING",
        )
        .bind(cluster)
        .bind(*path)
        .bind(*key_id)
        .bind(*sealed)
        .bind(at)
        .execute(&mut **tx)
        .await?
        .rows_affected();
    }
    Ok(usize::try_from(inserted)?)
}
