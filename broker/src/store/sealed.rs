//! The store's part of the vault (`crate::vault`): sealed files, written once per cluster
//! and path, never updated (a CA is not replaced; the first host to seal one wins).

use anyhow::Result;
use sqlx::Row;

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

    /// Keeps a sealed file unless the cluster has one at `path` already (that one stays).
    pub async fn insert_sealed_file(
        &self,
        cluster: &str,
        path: &str,
        key_id: &str,
        sealed: &str,
        at: i64,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO sealed_files (cluster, path, key_id, sealed, created_at) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (cluster, path) DO NOTHING",
        )
        .bind(cluster)
        .bind(path)
        .bind(key_id)
        .bind(sealed)
        .bind(at)
        .execute(&self.pool)
        .await?;
        Ok(())
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
