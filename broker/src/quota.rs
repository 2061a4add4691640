//! The datastore quota of a cluster on kine (docs/security.md, "Budgets"), with etcd's
//! semantics: once its database holds the quota, the broker sets the cluster's admission
//! policy `socialweb-datastore-quota` (`broker/deploy/datastore-quota.yaml`) to refuse
//! tenants' creates and updates, and past the control plane's headroom beyond it
//! ([`headroom`]) everyone's but the broker's; reads and deletes are served, and writes come
//! back once deleted objects have been compacted away. etcd clusters have etcd's own quota (its default,
//! 2 GiB); this watch only publishes that they are not full.
//!
//! What counts is the pages SQLite has in use (pages less the free list): deleting and
//! compacting makes room, and the file never grows much past the quota because SQLite
//! reuses free pages before it grows. A cluster on PostgreSQL counts its database's size
//! on the server (`pg_database_size`): rows deleted and compacted are reused once vacuumed,
//! but the files do not shrink, so such a cluster stays full until its database is
//! `VACUUM FULL`ed (docs/operations.md).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use sqlx::ConnectOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The ConfigMap that says whether the cluster is full (`kube-system`, the broker's own).
pub const STATE: (&str, &str) = ("kube-system", "socialweb-datastore-quota");

/// How often the database is measured: a tenant may go past the quota by what it writes
/// in this time (a few MiB at the front's rates), as etcd's own check lags its writes.
const EVERY: Duration = Duration::from_secs(1);

/// How full a datastore is, and who may still write to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Below the quota: every write.
    Room,
    /// At the quota: the tenant's writes are refused; the control plane's own (nodes'
    /// heartbeats and Pods' status, the controller-manager's and scheduler's, and updates of
    /// objects being deleted: finalizers removed) go on, within [`headroom`] more.
    TenantsFull,
    /// At the quota and its headroom: every write but the broker's is refused. No writer is
    /// exempt without end: a node's Events or status, or updates of an object being deleted
    /// that grow it, stop here.
    Full,
}

/// The room the control plane's own writers have past the quota: an eighth of it, at least
/// 16 MiB (256 MiB of the default 2 GiB): more than a tenant can write past the quota in
/// the second between two measures, which would otherwise eat it.
pub fn headroom(quota: u64) -> u64 {
    (quota / 8).max(16 << 20)
}

/// The level of a database of `used` bytes under `quota`.
pub fn level(used: u64, quota: u64) -> Level {
    if used >= quota.saturating_add(headroom(quota)) {
        Level::Full
    } else if used >= quota {
        Level::TenantsFull
    } else {
        Level::Room
    }
}

/// The bytes SQLite's pages in use take: page size times (pages less free pages). Read
/// through a read-only connection, which sees the last commit, the write-ahead log's
/// included.
pub async fn used_bytes(conn: &mut SqliteConnection) -> Result<u64> {
    let pages: i64 = sqlx::query_scalar("PRAGMA page_count")
        .fetch_one(&mut *conn)
        .await?;
    let free: i64 = sqlx::query_scalar("PRAGMA freelist_count")
        .fetch_one(&mut *conn)
        .await?;
    let size: i64 = sqlx::query_scalar("PRAGMA page_size")
        .fetch_one(&mut *conn)
        .await?;
    Ok(u64::try_from((pages - free).max(0) * size)?)
}

/// A read-only connection to kine's database.
pub async fn open(db: &Path) -> Result<SqliteConnection> {
    SqliteConnectOptions::new()
        .filename(db)
        .read_only(true)
        .connect()
        .await
        .with_context(|| format!("opening {} to measure it", db.display()))
}

/// The cluster's admission policy (`broker/deploy/datastore-quota.yaml`).
pub const POLICY: &str = "socialweb-datastore-quota";

/// Sets the policy's validation for `level`, then writes the state to the ConfigMap for
/// those who read it (operators, `kubectl get`): the policy takes no parameter resource (the
/// manifest says why).
pub async fn publish(client: &kube::Client, level: Level, quota: Option<u64>) -> Result<()> {
    let quota_mib = quota
        .map(|q| (q >> 20).to_string())
        .unwrap_or_else(|| "none".into());
    let policy = serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": POLICY},
        "spec": {"validations": [validation(level, &quota_mib)]},
    });
    kube::Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .patch(
            POLICY,
            &kube::api::PatchParams::apply("socialweb-broker").force(),
            &kube::api::Patch::Apply(&policy),
        )
        .await
        .with_context(|| format!("writing the admission policy {POLICY}"))?;
    let data = serde_json::json!({
        "full": (level != Level::Room).to_string(),
        "control_plane_full": (level == Level::Full).to_string(),
        "quota_mib": quota_mib,
        "headroom_mib": quota.map(|q| (headroom(q) >> 20).to_string()).unwrap_or_else(|| "none".into()),
    });
    crate::tenant::apply_configmap(client, STATE, &data).await
}

/// The policy's one validation: `true` while there is room; the control plane's writers
/// only (`variables.control_plane`, in the manifest) at the quota; nothing past its headroom.
fn validation(level: Level, quota_mib: &str) -> serde_json::Value {
    let (expression, whom) = match level {
        Level::Room => return serde_json::json!({"expression": "true"}),
        Level::TenantsFull => ("variables.control_plane", "writes are refused"),
        Level::Full => (
            "false",
            "it is past the room the control plane's own writers have beyond it too, and every \
             write is refused",
        ),
    };
    serde_json::json!({
        "expression": expression,
        "reason": "Forbidden",
        "message": format!(
            "this cluster has filled its datastore quota: it is at its quota of {quota_mib} \
             MiB, and {whom} until objects are deleted and the datastore has compacted them \
             away (kine compacts every 5 minutes and keeps the last 1000 revisions); reads and \
             deletes are served (docs/security.md, Budgets)"
        ),
    })
}

/// The cluster's quota as the broker keeps it.
#[derive(Debug, Clone)]
pub struct Watch {
    pub cluster: String,
    /// kine's SQLite database; `None`: the datastore keeps its own quota (etcd), or it is
    /// in PostgreSQL.
    pub kine_db: Option<PathBuf>,
    /// The server and database, for a cluster on PostgreSQL.
    pub postgres: Option<(crate::control_plane::postgres::Server, String)>,
    pub quota: Option<u64>,
}

impl Watch {
    /// Publishes the state once (before the cluster is served: each start applies the
    /// manifest, whose policy refuses nothing), then keeps it current until `stop`.
    pub async fn start(self, client: kube::Client, stop: CancellationToken) {
        let mut was = None;
        let mut conn = None;
        self.step(&client, &mut conn, &mut was).await;
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(EVERY) => {}
                    _ = stop.cancelled() => return,
                }
                self.step(&client, &mut conn, &mut was).await;
            }
        });
    }

    /// Measures, and publishes when the state is not what was published.
    async fn step(
        &self,
        client: &kube::Client,
        conn: &mut Option<SqliteConnection>,
        was: &mut Option<Level>,
    ) {
        let cluster = &self.cluster;
        let now = match (&self.kine_db, &self.postgres, self.quota) {
            (_, Some((server, db)), Some(quota)) => match server.size(db).await {
                Ok(used) => level(used, quota),
                Err(e) => return warn!(%cluster, "measuring the datastore: {e:#}"),
            },
            (Some(db), None, Some(quota)) => {
                if conn.is_none() {
                    match open(db).await {
                        Ok(c) => *conn = Some(c),
                        Err(e) => return warn!(%cluster, "{e:#}"),
                    }
                }
                match used_bytes(conn.as_mut().expect("opened above")).await {
                    Ok(used) => {
                        let now = level(used, quota);
                        if *was != Some(now) {
                            info!(%cluster, used_mib = used >> 20, quota_mib = quota >> 20,
                                  level = ?now, "datastore quota");
                        }
                        now
                    }
                    Err(e) => {
                        *conn = None;
                        return warn!(%cluster, "measuring the datastore: {e:#}");
                    }
                }
            }
            _ => Level::Room,
        };
        if *was != Some(now) {
            match publish(client, now, self.quota).await {
                Ok(()) => *was = Some(now),
                Err(e) => warn!(%cluster, "{e:#}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_refuses_tenants_at_the_quota_and_everyone_past_its_headroom() {
        assert_eq!(validation(Level::Room, "64")["expression"], "true");
        let v = validation(Level::TenantsFull, "64");
        assert_eq!(v["expression"], "variables.control_plane");
        assert_eq!(v["reason"], "Forbidden");
        assert!(
            v["message"]
                .as_str()
                .unwrap()
                .contains("at its quota of 64 MiB")
        );
        let v = validation(Level::Full, "64");
        assert_eq!(v["expression"], "false");
        assert!(
            v["message"]
                .as_str()
                .unwrap()
                .contains("every write is refused")
        );
        // The manifest defines the variable the validation reads.
        assert!(crate::control_plane::DATASTORE_QUOTA_MANIFEST.contains("- name: control_plane"));
    }

    #[test]
    fn levels_at_the_quota_and_its_headroom() {
        let q = 64 << 20;
        assert_eq!(headroom(q), 16 << 20);
        assert_eq!(headroom(2048 << 20), 256 << 20);
        assert_eq!(level(0, q), Level::Room);
        assert_eq!(level(q - 1, q), Level::Room);
        assert_eq!(level(q, q), Level::TenantsFull);
        assert_eq!(level(q + (16 << 20) - 1, q), Level::TenantsFull);
        assert_eq!(level(q + (16 << 20), q), Level::Full);
    }

    #[tokio::test]
    async fn used_bytes_grow_with_rows_and_shrink_with_deletes() {
        let dir = std::env::temp_dir().join(format!("sw-quota-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let db = dir.join("state.db");
        let mut w = SqliteConnectOptions::new()
            .filename(&db)
            .create_if_missing(true)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .connect()
            .await
            .unwrap();
        sqlx::query("CREATE TABLE kine (v BLOB)")
            .execute(&mut w)
            .await
            .unwrap();
        let mut r = open(&db).await.unwrap();
        let empty = used_bytes(&mut r).await.unwrap();
        for _ in 0..8 {
            sqlx::query("INSERT INTO kine VALUES (zeroblob(1048576))")
                .execute(&mut w)
                .await
                .unwrap();
        }
        let written = used_bytes(&mut r).await.unwrap();
        assert!(written >= empty + (8 << 20), "{empty} then {written}");
        sqlx::query("DELETE FROM kine")
            .execute(&mut w)
            .await
            .unwrap();
        let deleted = used_bytes(&mut r).await.unwrap();
        assert!(deleted < empty + (1 << 20), "{written} then {deleted}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
