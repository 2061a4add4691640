//! The broker's store: SQLite by default (a file in the state directory), PostgreSQL when the
//! operator gives a URL; one set of migrations (`broker/migrations`) and one set of queries
//! for both, through sqlx's `Any` driver. Every provisioning step is written here before it is
//! acted on (docs/operations.md). The records' types are the core's
//! (`socialweb_broker_core::records`); this module only reads and writes them.

use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use socialweb_broker_core::{Cluster, ClusterPhase, DecisionRow, Provision, Step, millis};
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Row};

mod access;
mod accounts;
mod hosts;
mod owners;
mod sealed;

pub use accounts::{Invite, Limit, NewCluster};
pub use hosts::Reach;
pub use owners::{Fence, Owner, Seen};

/// A cluster of that name exists already.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cluster {0:?} exists already")]
pub struct Exists(pub String);

/// The store.
#[derive(Debug, Clone)]
pub struct Store {
    pool: AnyPool,
    backend: &'static str,
}

fn cluster_of(r: &AnyRow) -> Result<Cluster> {
    let state: String = r.try_get("state")?;
    Ok(Cluster {
        name: r.try_get("name")?,
        state: ClusterPhase::parse(&state)
            .with_context(|| format!("unknown cluster state {state:?}"))?,
        created_at: r.try_get("created_at")?,
        last_intent_at: r.try_get("last_intent_at")?,
        next_node: r.try_get("next_node")?,
        owner: r.try_get("owner")?,
        dir: r.try_get("dir")?,
        hibernating_since: r.try_get("hibernating_since")?,
        hibernate_after_secs: r.try_get("hibernate_after_secs")?,
        datastore: r.try_get("datastore")?,
    })
}

fn provision_of(r: &AnyRow) -> Result<Provision> {
    let state: String = r.try_get("state")?;
    Ok(Provision {
        id: r.try_get("id")?,
        cluster: r.try_get("cluster")?,
        node: r.try_get("node")?,
        state: Step::parse(&state).with_context(|| format!("unknown provision state {state:?}"))?,
        rfp_id: r.try_get("rfp_id")?,
        bid_id: r.try_get("bid_id")?,
        lease_id: r.try_get("lease_id")?,
        provider: r.try_get("provider")?,
        token_id: r.try_get("token_id")?,
        token_secret: r.try_get("token_secret")?,
        mesh_key: r.try_get("mesh_key")?,
        endpoint: r.try_get("endpoint")?,
        node_ip: r
            .try_get::<Option<String>, _>("node_ip")?
            .map(|s| s.parse())
            .transpose()
            .context("a provision's node_ip")?,
        spec: r
            .try_get::<Option<String>, _>("spec")?
            .map(|s| serde_json::from_str(&s))
            .transpose()
            .context("a provision's spec")?,
        topology: r
            .try_get::<Option<String>, _>("topology")?
            .map(|s| serde_json::from_str(&s))
            .transpose()
            .context("a provision's topology")?
            .unwrap_or_default(),
        reason: r.try_get("reason")?,
        attempts: r.try_get("attempts")?,
        created_at: r.try_get("created_at")?,
        updated_at: r.try_get("updated_at")?,
    })
}

impl Store {
    /// Connects to `url` (`sqlite://...` or `postgres://...`) and brings the schema up to date.
    pub async fn open(url: &str) -> Result<Store> {
        sqlx::any::install_default_drivers();
        let backend = if url.starts_with("sqlite:") {
            "sqlite"
        } else {
            "postgres"
        };
        if backend == "sqlite"
            && let Some(path) = url
                .strip_prefix("sqlite://")
                .map(|p| p.split('?').next().unwrap_or(p))
            && let Some(dir) = std::path::Path::new(path).parent()
        {
            // Bootstrap-token secrets, mesh keys: owner-only before SQLite opens it (its
            // WAL and shared-memory files take the database file's mode).
            socialweb_proc::owner_only::dir(dir)
                .with_context(|| format!("creating {}", dir.display()))?;
            socialweb_proc::owner_only::file(std::path::Path::new(path))
                .with_context(|| format!("creating {} owner-only", path))?;
        }
        let sqlite = backend == "sqlite";
        let pool = AnyPoolOptions::new()
            // SQLite allows one writer; one connection keeps every write in order. Every
            // query waits its turn on it: under a slow disk (each write is fsynced) a burst
            // of them, a broker's start with nodes reconnecting, queued past 10 s once and
            // the start failed; a queue is what one connection means, so it waits longer.
            .max_connections(if sqlite { 1 } else { 5 })
            .acquire_timeout(Duration::from_secs(if sqlite { 60 } else { 10 }))
            .connect(url)
            .await
            .with_context(|| format!("opening the store {}", redact(url)))?;
        if sqlite {
            // Nothing written is lost to a crash (the default journal would also do, WAL is
            // faster and lets the CLI read while the daemon writes).
            sqlx::query("PRAGMA journal_mode=WAL")
                .execute(&pool)
                .await?;
            sqlx::query("PRAGMA synchronous=FULL")
                .execute(&pool)
                .await?;
        }
        sqlx::migrate!("./migrations")
            .run(&pool)
            .await
            .context("migrating the store")?;
        Ok(Store { pool, backend })
    }

    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// One query that reaches the database (the broker's `/readyz`).
    pub async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .context("the store did not answer SELECT 1")?;
        Ok(())
    }

    pub async fn cluster(&self, name: &str) -> Result<Option<Cluster>> {
        sqlx::query("SELECT * FROM clusters WHERE name = $1")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?
            .as_ref()
            .map(cluster_of)
            .transpose()
    }

    pub async fn clusters(&self) -> Result<Vec<Cluster>> {
        sqlx::query("SELECT * FROM clusters ORDER BY name")
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(cluster_of)
            .collect()
    }

    pub async fn set_cluster_state(&self, name: &str, state: ClusterPhase) -> Result<()> {
        sqlx::query("UPDATE clusters SET state = $1 WHERE name = $2")
            .bind(state.as_str())
            .bind(name)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Hibernating since `since`, or awake (`None`): the state and its time in one write.
    /// Under a fleet's lease (`fence`), only while that lease is still the row's: a host
    /// that lost the cluster to another (frozen, cut off) records nothing over it, and says
    /// so with an error.
    pub async fn set_hibernating(
        &self,
        name: &str,
        since: Option<SystemTime>,
        fence: Option<&Fence>,
    ) -> Result<()> {
        let (state, at) = match since {
            Some(t) => (ClusterPhase::Hibernating, Some(millis(t))),
            None => (ClusterPhase::Active, None),
        };
        // Never over a deletion: a delete that began wins.
        let q = sqlx::query(match fence {
            None => {
                "UPDATE clusters SET state = $1, hibernating_since = $2 \
                 WHERE name = $3 AND state <> 'deleting'"
            }
            Some(_) => {
                "UPDATE clusters SET state = $1, hibernating_since = $2 \
                 WHERE name = $3 AND state <> 'deleting' AND EXISTS (SELECT 1 FROM owners \
                 WHERE owners.cluster = $3 AND owners.host = $4 AND owners.fence = $5)"
            }
        })
        .bind(state.as_str())
        .bind(at)
        .bind(name);
        let written = fenced(q, fence).execute(&self.pool).await?.rows_affected();
        self.refused_unless(written, name, fence).await
    }

    /// The cluster's own `hibernate_after` (`None`: the broker's).
    pub async fn set_hibernate_after(&self, name: &str, secs: Option<i64>) -> Result<()> {
        sqlx::query("UPDATE clusters SET hibernate_after_secs = $1 WHERE name = $2")
            .bind(secs)
            .bind(name)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn set_last_intent(&self, name: &str, at: SystemTime) -> Result<()> {
        sqlx::query(
            "UPDATE clusters SET last_intent_at = $1 WHERE name = $2 AND last_intent_at < $3",
        )
        .bind(millis(at))
        .bind(name)
        .bind(millis(at))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The next node name of a cluster, `<cluster>-<n>`; never handed out twice (one
    /// UPDATE ... RETURNING: two brokers' calls on PostgreSQL cannot read the same n).
    pub async fn next_node_name(&self, cluster: &str) -> Result<String> {
        let n: i64 = sqlx::query(
            "UPDATE clusters SET next_node = next_node + 1 WHERE name = $1 RETURNING next_node",
        )
        .bind(cluster)
        .fetch_one(&self.pool)
        .await
        .with_context(|| format!("no cluster {cluster:?}"))?
        .try_get("next_node")?;
        Ok(format!("{cluster}-{}", n - 1))
    }

    /// Removes a cluster and everything the store holds for it.
    pub async fn delete_cluster(&self, name: &str) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        accounts::uncount(&mut tx, name).await?;
        for table in [
            "ports",
            "provisions",
            "decisions",
            "certificates",
            "sealed_files",
            "owners",
            "bootstrap_uses",
        ] {
            sqlx::query(&format!("DELETE FROM {table} WHERE cluster = $1"))
                .bind(name)
                .execute(&mut *tx)
                .await?;
        }
        sqlx::query("DELETE FROM clusters WHERE name = $1")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The cluster's ports by purpose, leasing free ones from `[base, base + count)` for
    /// purposes it has none for. `free` says whether a port can be bound now.
    ///
    /// Hosts of a fleet may lease for one cluster at once: a purpose holds one port
    /// (a unique index), and a host that loses the race for a purpose takes the winner's.
    pub async fn lease_ports(
        &self,
        cluster: &str,
        purposes: &[&str],
        base: u16,
        count: u16,
        free: impl Fn(u16) -> bool,
    ) -> Result<Vec<(String, u16)>> {
        let mut have = self.ports(cluster).await?;
        if purposes.iter().all(|p| have.iter().any(|(h, _)| h == p)) {
            return Ok(have);
        }
        // Ports other clusters hold are skipped without a try: an INSERT (and the look
        // after a refused one) is only spent where a race is possible.
        let mut taken: std::collections::HashSet<i64> = sqlx::query("SELECT port FROM ports")
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|r| r.try_get("port"))
            .collect::<Result<_, _>>()?;
        for purpose in purposes {
            if have.iter().any(|(p, _)| p == purpose) {
                continue;
            }
            let mut got = None;
            for port in base..base.saturating_add(count) {
                if taken.contains(&i64::from(port)) || !free(port) {
                    continue;
                }
                // Refused if the port is another's, or if another host leased this
                // purpose meanwhile (then that one is the cluster's).
                let r = sqlx::query(
                    "INSERT INTO ports (port, cluster, purpose) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                )
                .bind(i64::from(port))
                .bind(cluster)
                .bind(*purpose)
                .execute(&self.pool)
                .await?;
                if r.rows_affected() == 1 {
                    got = Some(port);
                    break;
                }
                if let Some(theirs) = self.port(cluster, purpose).await? {
                    got = Some(theirs);
                    break;
                }
            }
            let port = match got {
                Some(p) => p,
                // None free here, but another host may have leased it meanwhile.
                None => self.port(cluster, purpose).await?.with_context(|| {
                    format!(
                        "no free port left in {base}-{} for cluster {cluster}",
                        base as u32 + count as u32 - 1
                    )
                })?,
            };
            taken.insert(i64::from(port));
            have.push((purpose.to_string(), port));
        }
        Ok(have)
    }

    /// The cluster's port for `purpose`, if it has one.
    async fn port(&self, cluster: &str, purpose: &str) -> Result<Option<u16>> {
        let row = sqlx::query("SELECT port FROM ports WHERE cluster = $1 AND purpose = $2")
            .bind(cluster)
            .bind(purpose)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| Ok(u16::try_from(r.try_get::<i64, _>("port")?)?))
            .transpose()
    }

    pub async fn ports(&self, cluster: &str) -> Result<Vec<(String, u16)>> {
        sqlx::query("SELECT purpose, port FROM ports WHERE cluster = $1 ORDER BY port")
            .bind(cluster)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|r| {
                let port: i64 = r.try_get("port")?;
                Ok((r.try_get("purpose")?, u16::try_from(port)?))
            })
            .collect()
    }

    /// Writes a new provision. Under a fleet's lease (`fence`), only while that lease is
    /// still the cluster's ([`fenced`]).
    pub async fn insert_provision(&self, p: &Provision, fence: Option<&Fence>) -> Result<()> {
        let q = sqlx::query(match fence {
            None => {
                "INSERT INTO provisions (id, cluster, node, state, rfp_id, bid_id, lease_id, \
                 provider, token_id, token_secret, mesh_key, endpoint, reason, attempts, \
                 created_at, updated_at, node_ip, spec, topology) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, \
                 $17, $18, $19)"
            }
            Some(_) => {
                "INSERT INTO provisions (id, cluster, node, state, rfp_id, bid_id, lease_id, \
                 provider, token_id, token_secret, mesh_key, endpoint, reason, attempts, \
                 created_at, updated_at, node_ip, spec, topology) \
                 SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, \
                 $17, $18, $19 WHERE EXISTS (SELECT 1 FROM owners \
                 WHERE owners.cluster = $2 AND owners.host = $20 AND owners.fence = $21)"
            }
        })
        .bind(&p.id)
        .bind(&p.cluster)
        .bind(&p.node)
        .bind(p.state.as_str())
        .bind(&p.rfp_id)
        .bind(p.bid_id.clone())
        .bind(&p.lease_id)
        .bind(p.provider.clone())
        .bind(&p.token_id)
        .bind(&p.token_secret)
        .bind(&p.mesh_key)
        .bind(&p.endpoint)
        .bind(p.reason.clone())
        .bind(p.attempts)
        .bind(p.created_at)
        .bind(p.updated_at)
        .bind(p.node_ip.map(|ip| ip.to_string()))
        .bind(
            p.spec
                .map(|s| serde_json::to_string(&s).expect("a spec serializes")),
        )
        .bind(
            (!p.topology.is_empty())
                .then(|| serde_json::to_string(&p.topology).expect("a topology serializes")),
        );
        let written = fenced(q, fence).execute(&self.pool).await?.rows_affected();
        self.refused_unless(written, &p.cluster, fence).await
    }

    /// Writes a provision's state and what goes with it. Under a fleet's lease (`fence`),
    /// only while that lease is still the cluster's ([`fenced`]).
    pub async fn update_provision(&self, p: &Provision, fence: Option<&Fence>) -> Result<()> {
        let q = sqlx::query(match fence {
            None => {
                "UPDATE provisions SET state = $1, rfp_id = $2, bid_id = $3, lease_id = $4, \
                 provider = $5, reason = $6, attempts = $7, updated_at = $8 WHERE id = $9"
            }
            Some(_) => {
                "UPDATE provisions SET state = $1, rfp_id = $2, bid_id = $3, lease_id = $4, \
                 provider = $5, reason = $6, attempts = $7, updated_at = $8 WHERE id = $9 \
                 AND EXISTS (SELECT 1 FROM owners WHERE owners.cluster = provisions.cluster \
                 AND owners.host = $10 AND owners.fence = $11)"
            }
        })
        .bind(p.state.as_str())
        .bind(&p.rfp_id)
        .bind(p.bid_id.clone())
        .bind(&p.lease_id)
        .bind(p.provider.clone())
        .bind(p.reason.clone())
        .bind(p.attempts)
        .bind(p.updated_at)
        .bind(&p.id);
        let written = fenced(q, fence).execute(&self.pool).await?.rows_affected();
        self.refused_unless(written, &p.cluster, fence).await
    }

    /// A fenced write of cluster `cluster` that wrote nothing while the cluster is still
    /// there: another host holds its lease now (this one was frozen or cut off past it and
    /// writes on as if it still ran the cluster).
    async fn refused_unless(
        &self,
        written: u64,
        cluster: &str,
        fence: Option<&Fence>,
    ) -> Result<()> {
        let Some(f) = fence.filter(|_| written == 0) else {
            return Ok(());
        };
        if self
            .cluster(cluster)
            .await?
            .is_some_and(|c| c.state != ClusterPhase::Deleting)
        {
            anyhow::bail!(
                "not recorded: cluster {cluster:?}'s lease is no longer this host's (fence {}): \
                 another host runs it",
                f.fence
            );
        }
        Ok(())
    }

    /// Whether `fence` is still cluster `cluster`'s lease: asked right before what the
    /// store cannot make conditional (a release at a provider).
    pub async fn holds(&self, cluster: &str, fence: &Fence) -> Result<bool> {
        let row = sqlx::query(
            "SELECT 1 AS one FROM owners WHERE cluster = $1 AND host = $2 AND fence = $3",
        )
        .bind(cluster)
        .bind(fence.host.clone())
        .bind(fence.fence)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.is_some())
    }

    /// A cluster's provisions (every cluster's with `None`), oldest first.
    pub async fn provisions(&self, cluster: Option<&str>) -> Result<Vec<Provision>> {
        let rows = match cluster {
            Some(c) => {
                sqlx::query("SELECT * FROM provisions WHERE cluster = $1 ORDER BY created_at, id")
                    .bind(c)
                    .fetch_all(&self.pool)
                    .await?
            }
            None => {
                sqlx::query("SELECT * FROM provisions ORDER BY created_at, id")
                    .fetch_all(&self.pool)
                    .await?
            }
        };
        rows.iter().map(provision_of).collect()
    }

    /// Claims `token_id`'s one use for CSR `csr` of `node`: `None` when it is this CSR's (now,
    /// or by an earlier claim a crash left before its approval), else the CSR that used it.
    pub async fn claim_bootstrap(
        &self,
        cluster: &str,
        node: &str,
        token_id: &str,
        csr: &str,
        at: i64,
    ) -> Result<Option<String>> {
        sqlx::query(
            "INSERT INTO bootstrap_uses (cluster, token_id, node, csr, at)              VALUES ($1, $2, $3, $4, $5) ON CONFLICT (cluster, token_id) DO NOTHING",
        )
        .bind(cluster)
        .bind(token_id)
        .bind(node)
        .bind(csr)
        .bind(at)
        .execute(&self.pool)
        .await?;
        let holder: String = sqlx::query_scalar(
            "SELECT csr FROM bootstrap_uses WHERE cluster = $1 AND token_id = $2",
        )
        .bind(cluster)
        .bind(token_id)
        .fetch_one(&self.pool)
        .await?;
        Ok((holder != csr).then_some(holder))
    }

    /// The mesh endpoint ids of every live provision, whichever host rented it: who a
    /// fleet host's relay admits.
    pub async fn live_endpoints(&self) -> Result<Vec<String>> {
        let ended: Vec<String> = Step::ALL
            .into_iter()
            .filter(|s| !s.live())
            .map(|s| format!("'{}'", s.as_str()))
            .collect();
        let sql = format!(
            "SELECT endpoint FROM provisions WHERE state NOT IN ({})",
            ended.join(", ")
        );
        Ok(sqlx::query(&sql)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|r| r.get::<String, _>("endpoint"))
            .collect())
    }

    pub async fn record_decision(&self, d: &DecisionRow) -> Result<()> {
        sqlx::query(
            "INSERT INTO decisions (id, cluster, at, action, target, nodes, intent, reason) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(uuid::Uuid::new_v4().to_string())
        .bind(&d.cluster)
        .bind(d.at)
        .bind(&d.action)
        .bind(d.target)
        .bind(d.nodes)
        .bind(d.intent)
        .bind(&d.reason)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// A cluster's decisions, oldest first.
    pub async fn decisions(&self, cluster: &str) -> Result<Vec<DecisionRow>> {
        sqlx::query("SELECT * FROM decisions WHERE cluster = $1 ORDER BY at, id")
            .bind(cluster)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|r| {
                Ok(DecisionRow {
                    cluster: r.try_get("cluster")?,
                    at: r.try_get("at")?,
                    action: r.try_get("action")?,
                    target: r.try_get("target")?,
                    nodes: r.try_get("nodes")?,
                    intent: r.try_get("intent")?,
                    reason: r.try_get("reason")?,
                })
            })
            .collect()
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// `q` with the fence's host and number bound after its own parameters, if there is one.
fn fenced<'q>(
    q: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>,
    fence: Option<&Fence>,
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>> {
    match fence {
        Some(f) => q.bind(f.host.clone()).bind(f.fence),
        None => q,
    }
}

/// A URL without its password, for messages.
pub fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        _ => url.to_string(),
    }
}
