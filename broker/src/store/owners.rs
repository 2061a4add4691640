//! The store's part of a fleet's ownership (`crate::cluster::ownership`): one lease row per
//! owned cluster. Each statement is one atomic step (the row's lock), so two hosts claiming
//! at once cannot both win. Time is PostgreSQL's (`clock_timestamp()`), never a host's: a
//! lease's expiry is written and compared by the one clock every host shares, so a host whose
//! clock runs ahead cannot take a live lease (a fleet's store is always PostgreSQL).

use anyhow::Result;
use sqlx::Row;

use super::Store;

/// The datastore's clock now, Unix ms, in its own SQL: PostgreSQL's `clock_timestamp()` (the
/// statement's moment, not its transaction's), SQLite's `julianday('now')`.
fn db_now_ms(backend: &str) -> &'static str {
    match backend {
        "sqlite" => "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
        _ => "(extract(epoch from clock_timestamp()) * 1000)::bigint",
    }
}

/// A cluster's lease as the store has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub host: String,
    pub fence: i64,
    /// Unix ms, by the store's clock.
    pub expires_at: i64,
}

/// A lease as its holder names it: what the holder's writes about the cluster are
/// conditional on (the fencing token, checked by the store).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub host: String,
    pub fence: i64,
}

/// A lease row read together with the store's clock at the reading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub owner: Option<Owner>,
    /// Unix ms, by the store's clock.
    pub now: i64,
}

impl Store {
    /// The store's clock now, in its own SQL (Unix ms).
    pub(super) fn now_sql(&self) -> &'static str {
        db_now_ms(self.backend())
    }

    /// Claims cluster `cluster` for `host` for `ttl_ms` from the store's now, when no one
    /// holds it, its lease expired more than `grace_ms` ago, or `host` holds it already; the
    /// fence grows by one. Returns the lease as it is after: `host`'s when the claim won.
    pub async fn claim_owner(
        &self,
        cluster: &str,
        host: &str,
        ttl_ms: i64,
        grace_ms: i64,
    ) -> Result<Owner> {
        let now = self.now_sql();
        sqlx::query(&format!(
            "INSERT INTO owners (cluster, host, fence, expires_at) \
             VALUES ($1, $2, 1, {now} + $3) \
             ON CONFLICT (cluster) DO UPDATE SET host = excluded.host, \
             fence = owners.fence + 1, expires_at = excluded.expires_at \
             WHERE owners.expires_at + $4 < {now} OR owners.host = excluded.host"
        ))
        .bind(cluster)
        .bind(host)
        .bind(ttl_ms)
        .bind(grace_ms)
        .execute(&self.pool)
        .await?;
        self.owner(cluster).await?.owner.ok_or_else(|| {
            anyhow::anyhow!("cluster {cluster:?}'s lease vanished as it was claimed")
        })
    }

    /// Extends each of `host`'s `leases` (cluster, fence) to `ttl_ms` from the store's now,
    /// in one statement per thousand: a fleet host's renewals, batched. The clusters whose
    /// lease was extended; the others are no longer `host`'s under that fence (taken over,
    /// or released: a released lease is never extended again).
    pub async fn renew_owners(
        &self,
        host: &str,
        leases: &[(String, i64)],
        ttl_ms: i64,
    ) -> Result<std::collections::HashSet<String>> {
        let now = self.now_sql();
        let mut renewed = std::collections::HashSet::new();
        for chunk in leases.chunks(1000) {
            let pairs: Vec<String> = (0..chunk.len())
                .map(|i| format!("(${}, ${})", 3 + 2 * i, 4 + 2 * i))
                .collect();
            let sql = format!(
                "UPDATE owners SET expires_at = {now} + $1 \
                 WHERE host = $2 AND expires_at > 0 AND (cluster, fence) IN (VALUES {}) \
                 RETURNING cluster",
                pairs.join(", ")
            );
            let mut q = sqlx::query(&sql).bind(ttl_ms).bind(host);
            for (cluster, fence) in chunk {
                q = q.bind(cluster.clone()).bind(*fence);
            }
            for r in q.fetch_all(&self.pool).await? {
                renewed.insert(r.try_get("cluster")?);
            }
        }
        Ok(renewed)
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

    /// Cluster `cluster`'s lease, if someone holds one, and the store's clock.
    pub async fn owner(&self, cluster: &str) -> Result<Seen> {
        let now = self.now_sql();
        let row = sqlx::query(&format!(
            "SELECT o.host, o.fence, o.expires_at, {now} AS now \
             FROM (SELECT 1) AS one LEFT JOIN owners o ON o.cluster = $1"
        ))
        .bind(cluster)
        .fetch_one(&self.pool)
        .await?;
        let host: Option<String> = row.try_get("host")?;
        let owner = match host {
            Some(host) => Some(Owner {
                host,
                fence: row.try_get("fence")?,
                expires_at: row.try_get("expires_at")?,
            }),
            None => None,
        };
        Ok(Seen {
            owner,
            now: row.try_get("now")?,
        })
    }

    /// How many leases `host` holds that have not expired by the store's clock.
    pub async fn owned_by(&self, host: &str) -> Result<i64> {
        let now = self.now_sql();
        Ok(sqlx::query(&format!(
            "SELECT COUNT(*) AS n FROM owners WHERE host = $1 AND expires_at >= {now}"
        ))
        .bind(host)
        .fetch_one(&self.pool)
        .await?
        .try_get("n")?)
    }

    /// Every lease row, and the store's clock at the reading: what a fleet host reads once a
    /// renewal period for all its clusters (`crate::cluster::view`), instead of one read per
    /// cluster.
    pub async fn owners(&self) -> Result<(Vec<(String, Owner)>, i64)> {
        let now = self.now_sql();
        let rows = sqlx::query(&format!(
            "SELECT o.cluster, o.host, o.fence, o.expires_at, n.now \
             FROM (SELECT {now} AS now) AS n LEFT JOIN owners o ON 1 = 1"
        ))
        .fetch_all(&self.pool)
        .await?;
        let mut owners = Vec::with_capacity(rows.len());
        let mut at = 0;
        for r in &rows {
            at = r.try_get("now")?;
            let cluster: Option<String> = r.try_get("cluster")?;
            if let Some(cluster) = cluster {
                owners.push((
                    cluster,
                    Owner {
                        host: r.try_get("host")?,
                        fence: r.try_get("fence")?,
                        expires_at: r.try_get("expires_at")?,
                    },
                ));
            }
        }
        Ok((owners, at))
    }
}
