//! The store's part of who may have clusters (docs/security.md): the per-DID and global
//! counts, taken in the same transaction as the cluster's row by conditional UPDATEs (on
//! PostgreSQL the row lock makes a second concurrent create re-check the condition; SQLite
//! has one connection, so transactions are serial), and the operator's invites.

use std::time::SystemTime;

use anyhow::{Context, Result};
use socialweb_broker_core::{Cluster, millis};
use sqlx::any::AnyRow;
use sqlx::{Any, Row, Transaction};

use super::{Exists, Store};

/// A cluster to create, and the limits its owner is held to.
#[derive(Debug, Clone)]
pub struct NewCluster<'a> {
    pub name: &'a str,
    pub owner: Option<&'a str>,
    /// Its directory's name under `<state_dir>/clusters`.
    pub dir: &'a str,
    /// `Some((per_did, total))`: a user's create, refused past either; `None`: the
    /// operator's (counted, never refused).
    pub limits: Option<(u32, u32)>,
    /// Its own `hibernate_after` in seconds (`None`: the broker's).
    pub hibernate_after_secs: Option<i64>,
    /// `etcd` or `kine`.
    pub datastore: &'a str,
}

/// Which limit a create would pass.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Limit {
    #[error("you have {0} clusters, the most this broker allows one DID; delete one first")]
    PerDid(u32),
    #[error(
        "this broker has {0} users' clusters, the most it runs; try again later or ask its operator"
    )]
    Total(u32),
}

/// An invite, as `invite list` shows it (its secret is never kept).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Invite {
    pub id: String,
    pub note: String,
    pub created_at: i64,
    pub expires_at: i64,
    pub used_by: Option<String>,
    pub used_at: Option<i64>,
    pub revoked_at: Option<i64>,
}

fn invite_of(r: &AnyRow) -> Result<Invite> {
    Ok(Invite {
        id: r.try_get("id")?,
        note: r.try_get("note")?,
        created_at: r.try_get("created_at")?,
        expires_at: r.try_get("expires_at")?,
        used_by: r.try_get("used_by")?,
        used_at: r.try_get("used_at")?,
        revoked_at: r.try_get("revoked_at")?,
    })
}

/// Takes one from `owner`'s count and the users' count, in a deletion's transaction.
/// `did`'s account row, made at `t` (in milliseconds) if it has none.
async fn ensure_account(tx: &mut Transaction<'static, Any>, did: &str, t: i64) -> Result<()> {
    sqlx::query(
        "INSERT INTO accounts (did, clusters, created_at) VALUES ($1, 0, $2) \
         ON CONFLICT (did) DO NOTHING",
    )
    .bind(did)
    .bind(t)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

pub(super) async fn uncount(tx: &mut Transaction<'static, Any>, cluster: &str) -> Result<()> {
    let owner: Option<String> = sqlx::query("SELECT owner FROM clusters WHERE name = $1")
        .bind(cluster)
        .fetch_optional(&mut **tx)
        .await?
        .map(|r| r.try_get("owner"))
        .transpose()?
        .flatten();
    let Some(owner) = owner else { return Ok(()) };
    sqlx::query("UPDATE accounts SET clusters = clusters - 1 WHERE did = $1 AND clusters > 0")
        .bind(&owner)
        .execute(&mut **tx)
        .await?;
    sqlx::query("UPDATE counters SET n = n - 1 WHERE name = 'user_clusters' AND n > 0")
        .execute(&mut **tx)
        .await?;
    Ok(())
}

impl Store {
    /// Creates a cluster record, counted against its owner's and the global limits in the
    /// same transaction. Errors: [`Exists`], [`Limit`].
    pub async fn create_cluster(&self, c: &NewCluster<'_>, now: SystemTime) -> Result<Cluster> {
        self.create_cluster_sealed(c, now, &[]).await
    }

    /// [`create_cluster`](Self::create_cluster), with the cluster's first sealed files
    /// (path, key id, sealed text: `crate::vault`, its users CA) in the same transaction:
    /// no host of a fleet ever sees the cluster without them, even if its creator dies
    /// right after.
    pub async fn create_cluster_sealed(
        &self,
        c: &NewCluster<'_>,
        now: SystemTime,
        sealed: &[(&str, &str, &str)],
    ) -> Result<Cluster> {
        let t = millis(now);
        let mut tx = self.pool.begin().await?;
        if let Some(owner) = c.owner {
            let (per_did, total) = c
                .limits
                .map(|(p, t)| (i64::from(p), i64::from(t)))
                .unwrap_or((i64::MAX, i64::MAX));
            ensure_account(&mut tx, owner, t).await?;
            let r = sqlx::query(
                "UPDATE accounts SET clusters = clusters + 1 WHERE did = $1 AND clusters < $2",
            )
            .bind(owner)
            .bind(per_did)
            .execute(&mut *tx)
            .await?;
            if r.rows_affected() == 0 {
                return Err(Limit::PerDid(c.limits.map(|l| l.0).unwrap_or(0)).into());
            }
            let r = sqlx::query(
                "UPDATE counters SET n = n + 1 WHERE name = 'user_clusters' AND n < $1",
            )
            .bind(total)
            .execute(&mut *tx)
            .await?;
            if r.rows_affected() == 0 {
                return Err(Limit::Total(c.limits.map(|l| l.1).unwrap_or(0)).into());
            }
        }
        let r = sqlx::query(
            "INSERT INTO clusters \
             (name, state, created_at, last_intent_at, next_node, owner, dir, hibernate_after_secs, \
              datastore) \
             VALUES ($1, 'active', $2, $3, 1, $4, $5, $6, $7) ON CONFLICT (name) DO NOTHING",
        )
        .bind(c.name)
        .bind(t)
        .bind(t)
        .bind(c.owner.map(str::to_string))
        .bind(c.dir)
        .bind(c.hibernate_after_secs)
        .bind(c.datastore)
        .execute(&mut *tx)
        .await?;
        if r.rows_affected() == 0 {
            return Err(Exists(c.name.to_string()).into());
        }
        // A deletion removes a cluster's sealed files with its row: any left would be a
        // store altered by hand.
        if super::sealed::insert_sealed(&mut tx, c.name, sealed, t).await? != sealed.len() {
            anyhow::bail!(
                "the store holds sealed files for a cluster named {:?} that has no record: \
                 remove them (sealed_files) or restore the store from a backup",
                c.name
            );
        }
        tx.commit().await?;
        self.cluster(c.name)
            .await?
            .context("the cluster just created")
    }

    /// Whether `did` was admitted by an invite.
    pub async fn admitted(&self, did: &str) -> Result<bool> {
        Ok(
            sqlx::query("SELECT admitted_via FROM accounts WHERE did = $1")
                .bind(did)
                .fetch_optional(&self.pool)
                .await?
                .map(|r| r.try_get::<Option<String>, _>("admitted_via"))
                .transpose()?
                .flatten()
                .is_some(),
        )
    }

    /// Records a new invite.
    pub async fn create_invite(
        &self,
        id: &str,
        secret_sha256: &str,
        note: &str,
        expires_at: i64,
        now: SystemTime,
    ) -> Result<Invite> {
        sqlx::query(
            "INSERT INTO invites (id, secret_sha256, note, created_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(id)
        .bind(secret_sha256)
        .bind(note)
        .bind(millis(now))
        .bind(expires_at)
        .execute(&self.pool)
        .await?;
        self.invite(id).await?.context("the invite just made")
    }

    pub async fn invite(&self, id: &str) -> Result<Option<Invite>> {
        sqlx::query("SELECT * FROM invites WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .as_ref()
            .map(invite_of)
            .transpose()
    }

    /// Every invite, newest first.
    pub async fn invites(&self) -> Result<Vec<Invite>> {
        sqlx::query("SELECT * FROM invites ORDER BY created_at DESC, id")
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(invite_of)
            .collect()
    }

    /// Revokes an unused invite; `None` when there is no such invite.
    pub async fn revoke_invite(&self, id: &str, now: SystemTime) -> Result<Option<Invite>> {
        sqlx::query(
            "UPDATE invites SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL \
             AND used_by IS NULL",
        )
        .bind(millis(now))
        .bind(id)
        .execute(&self.pool)
        .await?;
        self.invite(id).await
    }

    /// Spends invite `id` for `did` when `secret_sha256` is its secret's and it is unused,
    /// unrevoked and unexpired, and admits `did`; `false` otherwise (one UPDATE: an invite
    /// is spent once however many use it at once).
    pub async fn redeem_invite(
        &self,
        did: &str,
        id: &str,
        secret_sha256: &str,
        now: SystemTime,
    ) -> Result<bool> {
        let t = millis(now);
        let mut tx = self.pool.begin().await?;
        let r = sqlx::query(
            "UPDATE invites SET used_by = $1, used_at = $2 WHERE id = $3 AND secret_sha256 = $4 \
             AND used_by IS NULL AND revoked_at IS NULL AND expires_at > $5",
        )
        .bind(did)
        .bind(t)
        .bind(id)
        .bind(secret_sha256)
        .bind(t)
        .execute(&mut *tx)
        .await?;
        if r.rows_affected() == 0 {
            return Ok(false);
        }
        ensure_account(&mut tx, did, t).await?;
        sqlx::query("UPDATE accounts SET admitted_via = $1 WHERE did = $2")
            .bind(format!("invite:{id}"))
            .bind(did)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// How many clusters users own now (the global cap's count).
    pub async fn user_clusters(&self) -> Result<i64> {
        Ok(
            sqlx::query("SELECT n FROM counters WHERE name = 'user_clusters'")
                .fetch_one(&self.pool)
                .await?
                .try_get("n")?,
        )
    }
}
