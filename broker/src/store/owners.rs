//! The store's part of a fleet's ownership (`crate::cluster::ownership`): one lease row per
//! owned cluster. Each statement is one atomic step, on SQLite (one writer) as on PostgreSQL
//! (the row's lock), so two hosts claiming at once cannot both win.

use anyhow::Result;
use sqlx::Row;

use super::Store;

/// A cluster's lease as the store has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub host: String,
    pub fence: i64,
    /// Unix ms.
    pub expires_at: i64,
}

impl Store {
    /// Claims cluster `cluster` for `host` until `expires_at`, when no one holds it, its
    /// lease expired before `expired_before`, or `host` holds it already; the fence grows
    /// by one. Returns the lease as it is after: `host`'s when the claim won.
    pub async fn claim_owner(
        &self,
        cluster: &str,
        host: &str,
        expires_at: i64,
        expired_before: i64,
    ) -> Result<Owner> {
        sqlx::query(
            "INSERT INTO owners (cluster, host, fence, expires_at) VALUES ($1, $2, 1, $3) \
             ON CONFLICT (cluster) DO UPDATE SET host = excluded.host, \
             fence = owners.fence + 1, expires_at = excluded.expires_at \
             WHERE owners.expires_at < $4 OR owners.host = excluded.host",
        )
        .bind(cluster)
        .bind(host)
        .bind(expires_at)
        .bind(expired_before)
        .execute(&self.pool)
        .await?;
        self.owner(cluster).await?.ok_or_else(|| {
            anyhow::anyhow!("cluster {cluster:?}'s lease vanished as it was claimed")
        })
    }

    /// Extends `host`'s lease of `cluster` (fence `fence`) to `expires_at`; `false` when
    /// that lease is no longer there (taken over, released, the cluster deleted).
    pub async fn renew_owner(
        &self,
        cluster: &str,
        host: &str,
        fence: i64,
        expires_at: i64,
    ) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE owners SET expires_at = $1 WHERE cluster = $2 AND host = $3 AND fence = $4",
        )
        .bind(expires_at)
        .bind(cluster)
        .bind(host)
        .bind(fence)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Gives up `host`'s lease of `cluster` (fence `fence`), if it still holds it: expired
    /// at once, the row kept so that the next claim's fence is still a new one.
    pub async fn release_owner(&self, cluster: &str, host: &str, fence: i64) -> Result<()> {
        sqlx::query(
            "UPDATE owners SET expires_at = 0 WHERE cluster = $1 AND host = $2 AND fence = $3",
        )
        .bind(cluster)
        .bind(host)
        .bind(fence)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Cluster `cluster`'s lease, if someone holds one.
    pub async fn owner(&self, cluster: &str) -> Result<Option<Owner>> {
        let row = sqlx::query("SELECT host, fence, expires_at FROM owners WHERE cluster = $1")
            .bind(cluster)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| {
            Ok(Owner {
                host: r.try_get("host")?,
                fence: r.try_get("fence")?,
                expires_at: r.try_get("expires_at")?,
            })
        })
        .transpose()
    }

    /// How many leases `host` holds that have not expired at `now` (Unix ms).
    pub async fn owned_by(&self, host: &str, now: i64) -> Result<i64> {
        Ok(
            sqlx::query("SELECT COUNT(*) AS n FROM owners WHERE host = $1 AND expires_at >= $2")
                .bind(host)
                .bind(now)
                .fetch_one(&self.pool)
                .await?
                .try_get("n")?,
        )
    }
}
