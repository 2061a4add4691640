//! The cluster service: creating, listing, showing and deleting tenant clusters, with the
//! rules both front doors share (a valid name, a name not taken, a user's clusters counted
//! against the per-DID limit), and every cluster's life while the broker runs ([`life`]).

mod authorities;
mod fleet;
mod idle;
mod life;
mod ownership;
mod period;
mod reach;
mod renewer;
mod rotate;
mod view;
mod writer;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use socialweb_broker_core::names::valid_cluster_name;
use socialweb_broker_core::scale::Knobs;
use socialweb_broker_core::{ClusterPhase, Step};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::access::service::Access;
use crate::command::{ClusterDetail, ClusterInfo, ClusterState, ServiceError};
use crate::config::{DatastoreKind, hibernate_after_ok};
use crate::control_plane::runner::{Datastore, PORT_PURPOSES, Ports, Spec};
use crate::front::Front;
use crate::provision::Provisioner;
use crate::store::Store;

/// What the cluster service is told (from `state_dir`, `kube_dir`, the `[clusters]` and
/// `[scale]` sections and `front.max_clusters_per_did`), and the tunnel it hands each
/// cluster's egress to.
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    /// This host's broker id: the holder its fleet leases name.
    pub host: String,
    /// `<state_dir>/clusters`: one directory per cluster.
    pub dir: PathBuf,
    /// The multicall `kube` binary.
    pub kube: PathBuf,
    /// The port range control planes lease from.
    pub port_base: u16,
    pub port_count: u16,
    /// How many clusters one DID may have.
    pub max_per_did: u32,
    /// How many clusters all users together may have.
    pub max_total: u32,
    /// The scale decision's knobs, for every cluster's driver.
    pub knobs: Knobs,
    /// The nodes are network namespaces on their provider's host (`market.isolation`):
    /// every cluster a DID owns gets the node isolation policy and no privileged containers,
    /// and the operator's own too unless `clusters.isolate_operators_clusters` is false.
    pub namespace_nodes: bool,
    pub isolate_operators_clusters: bool,
    /// `clusters.hibernate_after`: a cluster's idle time before its control plane stops,
    /// unless the cluster has its own (0: never).
    pub hibernate_after: Duration,
    /// `clusters.datastore`, and the kine binary.
    pub datastore: crate::config::DatastoreKind,
    pub kine_binary: PathBuf,
    /// The server `postgres` clusters' databases are on (`clusters.postgres_url`, else a
    /// PostgreSQL store's).
    pub postgres: Option<crate::control_plane::postgres::Server>,
    /// `store.key_file`'s key: the clusters' CA material is kept in the store, sealed.
    pub seal_key: Option<crate::vault::SealKey>,
    /// `fleet.enabled`: the lease times; awake clusters are run by the host holding their
    /// lease (`ownership`).
    pub fleet: Option<socialweb_broker_core::ownership::Timing>,
    /// The file saying this fleet host is drained (`<state_dir>/drained`).
    pub drain_marker: PathBuf,
    /// `fleet.max_awake`.
    pub max_awake: Option<u32>,
    /// `clusters.gogc`.
    pub gogc: u32,
    /// `clusters.memory_max_mib`, `pids_max`, `cpu_max`: each control plane's budget.
    pub budget: crate::control_plane::cgroup::Budget,
    /// `clusters.cgroup_parent`: where each control plane's cgroup is made.
    pub cgroup_parent: socialweb_proc::cgroup::Parent,
    /// `clusters.datastore_quota_mib`, in bytes.
    pub datastore_quota: Option<u64>,
    /// `clusters.webhook_egress_allow`: the public networks URL webhooks may reach.
    pub webhook_egress_allow: Vec<ipnet::IpNet>,
    /// `[disk]`: no create and no wake while the state directory's filesystem is low.
    pub disk: Arc<crate::disk::DiskGuard>,
    /// What the clusters' lives count (hibernations, wakes, a fleet's leases).
    pub metrics: crate::metrics::Metrics,
    /// `scale.schedulers`: the schedulers whose Pods rent nodes (and keep a cluster awake).
    pub schedulers: Arc<[String]>,
    /// `[certificates]`: what the clusters' authorities make, and when leaves are renewed.
    pub certificates: crate::pki::Lifetimes,
}

/// A cluster to create.
#[derive(Debug, Clone, Copy)]
pub struct New<'a> {
    pub name: &'a str,
    /// The DID it is for (`None`: the operator's alone).
    pub owner: Option<&'a str>,
    /// A user's create: counted against the limits.
    pub user: bool,
    /// Its own `hibernate_after` (`None`: the broker's).
    pub hibernate_after_secs: Option<u64>,
    /// `etcd`, `kine` or `postgres` (`None`: `clusters.datastore`).
    pub datastore: Option<&'a str>,
}

#[derive(Debug)]
struct Handle {
    state: watch::Receiver<ClusterState>,
    /// The one writer of its state (the life task's).
    life: Arc<writer::Writer>,
    /// Stops the driver and the control plane (shutdown: nothing is released).
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

/// The cluster service.
#[derive(Debug)]
pub struct Clusters {
    settings: ClusterSettings,
    store: Store,
    provisioner: Arc<Provisioner>,
    front: Arc<Front>,
    access: Arc<Access>,
    tunnels: crate::tunnel::Tunnels,
    running: Mutex<HashMap<String, Handle>>,
    /// One lock per cluster name: a create, a delete and a kubeconfig of one cluster run
    /// one at a time (docs/security.md).
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// This fleet host gives its clusters up and claims none: it is drained or cut off.
    draining: tokio::sync::watch::Sender<bool>,
    /// The operator drained this host (`socialweb-broker drain`), kept across restarts by
    /// `ClusterSettings::drain_marker`.
    drained_by_operator: std::sync::atomic::AtomicBool,
    /// No peer of the fleet reaches this host (`reach`).
    cut_off: std::sync::atomic::AtomicBool,
    /// Held while a fleet host counts its leases and claims one (`ownership`).
    claiming: Arc<tokio::sync::Mutex<()>>,
    /// A fleet host's view of the store, read once a renewal period (`view`).
    view: watch::Sender<Arc<view::View>>,
    /// A fleet host's lease renewals, one batch a period (`renewer`).
    renewer: Arc<renewer::Renewer>,
    stop: CancellationToken,
}

/// Waits (at most `wait`) until the state is no longer one `state_is` matches.
async fn past(
    rx: &mut watch::Receiver<ClusterState>,
    wait: Duration,
    state_is: impl Fn(&ClusterState) -> bool,
) {
    let _ = tokio::time::timeout(wait, rx.wait_for(|s| !state_is(s))).await;
}

/// A cluster's own `hibernate_after`, checked, as the store keeps it (whole seconds).
fn own_idle_time(secs: u64) -> Result<i64, ServiceError> {
    hibernate_after_ok(Duration::from_secs(secs))
        .map_err(|e| ServiceError::Invalid(format!("hibernate_after: {e}")))?;
    // At most a year, so it fits.
    Ok(i64::try_from(secs).expect("a year of seconds fits an i64"))
}

fn not_found(name: &str) -> ServiceError {
    ServiceError::NotFound(format!("name: no cluster {name:?}"))
}

impl Clusters {
    pub fn new(
        settings: ClusterSettings,
        store: Store,
        provisioner: Arc<Provisioner>,
        front: Arc<Front>,
        access: Arc<Access>,
        tunnels: crate::tunnel::Tunnels,
        stop: CancellationToken,
    ) -> Clusters {
        Clusters {
            store,
            provisioner,
            front,
            access,
            tunnels,
            running: Mutex::new(HashMap::new()),
            locks: Mutex::new(HashMap::new()),
            draining: tokio::sync::watch::Sender::new(settings.drain_marker.exists()),
            drained_by_operator: settings.drain_marker.exists().into(),
            cut_off: false.into(),
            claiming: Arc::default(),
            view: watch::Sender::new(Arc::default()),
            renewer: Arc::default(),
            settings,
            stop,
        }
    }

    /// Cluster `name`'s lock, held until the guard drops.
    async fn lock(&self, name: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let m = self
            .locks
            .lock()
            .expect("lock")
            .entry(name.to_string())
            .or_default()
            .clone();
        m.lock_owned().await
    }

    /// Drops `name`'s lock from the map when no one else holds or waits for it.
    fn unlock_gone(&self, name: &str) {
        let mut locks = self.locks.lock().expect("lock");
        if locks.get(name).is_some_and(|m| Arc::strong_count(m) == 1) {
            locks.remove(name);
        }
    }

    /// Whether the cluster gets the node isolation policy.
    fn isolated(&self, c: &socialweb_broker_core::Cluster) -> bool {
        self.settings.namespace_nodes
            && (c.owner.is_some() || self.settings.isolate_operators_clusters)
    }

    /// The directory of a cluster's record.
    pub fn dir_of(&self, c: &socialweb_broker_core::Cluster) -> PathBuf {
        self.settings.dir.join(c.dir_name())
    }

    /// The record of cluster `name`.
    async fn record(&self, name: &str) -> Result<socialweb_broker_core::Cluster, ServiceError> {
        self.store
            .cluster(name)
            .await
            .map_err(ServiceError::internal)?
            .ok_or_else(|| not_found(name))
    }

    /// Runs every cluster of the store: the live ones' lives, the deletions a crash cut
    /// short to their end.
    pub async fn resume(self: &Arc<Self>) -> Result<()> {
        // A fleet's lives start from a view of the store, not an empty one (every lease
        // would look free, and every cluster try a claim).
        let all = match self.ownership() {
            Some(own) => {
                tokio::spawn(self.renewer.clone().run(
                    self.store.clone(),
                    own.host.clone(),
                    own.timing,
                    own.metrics.clone(),
                    self.stop.clone(),
                ));
                self.read_view().await?
            }
            None => self.store.clusters().await?,
        };
        for c in all {
            match c.state {
                ClusterPhase::Deleting => {
                    let me = self.clone();
                    tokio::spawn(async move {
                        if let Err(e) = me.finish_delete(&c.name).await {
                            error!(cluster = %c.name, "finishing the deletion: {e:#}");
                        }
                    });
                }
                ClusterPhase::Active | ClusterPhase::Hibernating => self.spawn(&c.name),
            }
        }
        tokio::spawn(self.clone().follow_store());
        tokio::spawn(self.clone().watch_reach());
        Ok(())
    }

    /// The clusters `owner` has (every cluster with `None`).
    async fn names_of(&self, owner: Option<&str>) -> Result<Vec<String>, ServiceError> {
        Ok(self
            .store
            .clusters()
            .await
            .map_err(ServiceError::internal)?
            .into_iter()
            .filter(|c| owner.is_none() || c.owner.as_deref() == owner)
            .map(|c| c.name)
            .collect())
    }

    /// Checks that `did` may create `name`: a valid name, not taken (the limits are taken
    /// with the record, atomically).
    pub async fn may_create(&self, did: &str, name: &str) -> Result<(), ServiceError> {
        valid_cluster_name(name).map_err(|e| ServiceError::Invalid(format!("name: {e}")))?;
        if let Some(c) = self
            .store
            .cluster(name)
            .await
            .map_err(ServiceError::internal)?
        {
            return Err(ServiceError::Conflict(if c.owner.as_deref() == Some(did) {
                format!("name: you have a cluster {name:?} already")
            } else {
                format!("name: the cluster name {name:?} is taken; choose another")
            }));
        }
        Ok(())
    }

    /// Creates a cluster: its record, its users CA, its life. Answers once it is ready or
    /// `wait` passes.
    pub async fn create(
        self: &Arc<Self>,
        new: &New<'_>,
        wait: Duration,
    ) -> Result<ClusterInfo, ServiceError> {
        let New {
            name, owner, user, ..
        } = *new;
        valid_cluster_name(name).map_err(|e| ServiceError::Invalid(format!("name: {e}")))?;
        let hibernate_after_secs = new.hibernate_after_secs.map(own_idle_time).transpose()?;
        let datastore = match new.datastore {
            None => self.settings.datastore,
            Some(d) => DatastoreKind::parse(d)
                .map_err(|e| ServiceError::Invalid(format!("datastore: {e}")))?,
        };
        if datastore.uses_kine() && !self.settings.kine_binary.is_file() {
            return Err(ServiceError::Invalid(format!(
                "datastore: {} needs kine, which is not installed at {} (clusters.kine_binary)",
                datastore.as_str(),
                self.settings.kine_binary.display()
            )));
        }
        if self.settings.fleet.is_some() && datastore != DatastoreKind::Postgres {
            return Err(ServiceError::Invalid(format!(
                "datastore: {} keeps a cluster's objects on one host's disk; the hosts of a \
                 fleet (fleet.enabled) keep them in PostgreSQL (postgres)",
                datastore.as_str()
            )));
        }
        if datastore == DatastoreKind::Postgres && self.settings.postgres.is_none() {
            return Err(ServiceError::Invalid(
                "datastore: postgres needs a server: set clusters.postgres_url (or use a \
                 PostgreSQL store.url)"
                    .into(),
            ));
        }
        if let Some(why) = self.settings.disk.refuse("no new cluster") {
            return Err(ServiceError::Unavailable(why));
        }
        let lock = self.lock(name).await;
        // Never a directory an earlier cluster of this name had: its CA keys are not this
        // cluster's.
        let dir = format!("{name}-{:08x}", rand::random::<u32>());
        // Its users CA first, sealed into the store with its row: a host of the fleet that
        // follows the cluster finds it whole, whatever becomes of this one.
        let path = self.settings.dir.join(&dir);
        let sealed = self.users_ca_for(name, &path).map_err(|e| {
            let _ = std::fs::remove_dir_all(&path);
            ServiceError::internal(e)
        })?;
        let limits = user.then_some((self.settings.max_per_did, self.settings.max_total));
        let new = crate::store::NewCluster {
            name,
            owner,
            dir: &dir,
            limits,
            hibernate_after_secs,
            datastore: datastore.as_str(),
        };
        let record = self.insert_record(&new, &path, &sealed).await?;
        debug_assert_eq!(self.dir_of(&record), path);
        info!(cluster = %name, dir = %dir, "cluster created");
        self.spawn(name);
        drop(lock);
        if let Some(mut rx) = self.state_of(name) {
            past(&mut rx, wait, |s| {
                matches!(s, ClusterState::Starting { .. })
            })
            .await;
        }
        self.info(name).await
    }

    /// What cluster `name`'s life says, while it runs.
    fn state_of(&self, name: &str) -> Option<watch::Receiver<ClusterState>> {
        self.running
            .lock()
            .expect("lock")
            .get(name)
            .map(|h| h.state.clone())
    }

    /// Sets cluster `name`'s own `hibernate_after` (`None`: the broker's); the cluster's
    /// life reads it on its next look.
    pub async fn set_hibernate_after(
        &self,
        name: &str,
        secs: Option<u64>,
    ) -> Result<ClusterInfo, ServiceError> {
        let secs = secs.map(own_idle_time).transpose()?;
        let _lock = self.lock(name).await;
        self.record(name).await?;
        self.store
            .set_hibernate_after(name, secs)
            .await
            .map_err(ServiceError::internal)?;
        self.info(name).await
    }

    /// Wakes cluster `name` (nothing when it is awake); answers once it is ready or `wait`
    /// passes.
    pub async fn wake(&self, name: &str, wait: Duration) -> Result<ClusterInfo, ServiceError> {
        self.record(name).await?;
        if let Some(mut rx) = self.state_of(name) {
            if matches!(*rx.borrow(), ClusterState::Hibernating { .. }) {
                if let Some(why) = self.settings.disk.refuse("not woken") {
                    return Err(ServiceError::Unavailable(format!("cluster {name}: {why}")));
                }
                self.front.wake(name);
                // Past the hibernating state first, then to where the wake ends.
                past(&mut rx, wait, |s| {
                    matches!(s, ClusterState::Hibernating { .. })
                })
                .await;
            }
            past(&mut rx, wait, |s| {
                matches!(s, ClusterState::Starting { .. })
            })
            .await;
        }
        self.info(name).await
    }

    /// A kubeconfig for `did` on its cluster `name`: under the cluster's lock, only while
    /// the cluster is active (never while it is being deleted).
    pub async fn kubeconfig(
        &self,
        did: &str,
        name: &str,
        lifetime: crate::access::certs::Lifetime,
    ) -> Result<crate::command::IssuedKubeconfig, ServiceError> {
        let _lock = self.lock(name).await;
        let c = self.record(name).await?;
        if c.owner.as_deref() != Some(did) {
            return Err(ServiceError::NotFound(format!(
                "name: you have no cluster {name:?}"
            )));
        }
        if c.state == ClusterPhase::Deleting {
            return Err(ServiceError::Conflict(format!(
                "name: cluster {name:?} is being deleted"
            )));
        }
        self.access
            .kubeconfig(did, name, &self.dir_of(&c), lifetime)
            .await
    }

    fn spawn(self: &Arc<Self>, name: &str) {
        let (life, rx) = writer::Writer::new(name, self.front.clone(), self.store.clone());
        let life = Arc::new(life);
        let stop = self.stop.child_token();
        let (me, n, s, l) = (self.clone(), name.to_string(), stop.clone(), life.clone());
        let task = tokio::spawn(async move {
            if let Err(e) = me.live(&n, &l, s).await {
                error!(cluster = %n, "{e:#}");
                l.now(socialweb_broker_core::life::Event::Failed {
                    error: format!("{e:#}"),
                    retry_secs: None,
                });
            }
        });
        self.running.lock().expect("lock").insert(
            name.to_string(),
            Handle {
                state: rx,
                life,
                stop,
                task,
            },
        );
    }

    /// This host's part in a fleet, when it is one's.
    fn ownership(&self) -> Option<ownership::Ownership> {
        self.settings.fleet.map(|timing| ownership::Ownership {
            store: self.store.clone(),
            host: self.settings.host.clone(),
            timing,
            max_awake: self.settings.max_awake,
            claiming: self.claiming.clone(),
            metrics: self.settings.metrics.fleet.clone(),
            view: self.view.subscribe(),
            renewer: self.renewer.clone(),
        })
    }

    /// A new cluster's row, with its sealed users CA; its directory `dir` removed if refused.
    async fn insert_record(
        &self,
        new: &crate::store::NewCluster<'_>,
        dir: &std::path::Path,
        sealed: &[crate::vault::Sealed],
    ) -> Result<socialweb_broker_core::Cluster, ServiceError> {
        let rows = crate::vault::as_rows(sealed);
        self.store
            .create_cluster_sealed(new, SystemTime::now(), &rows)
            .await
            .map_err(|e| {
                let _ = std::fs::remove_dir_all(dir);
                if let Some(x) = e.downcast_ref::<crate::store::Exists>() {
                    ServiceError::Conflict(format!("name: {x}"))
                } else if let Some(l) = e.downcast_ref::<crate::store::Limit>() {
                    ServiceError::Conflict(l.to_string())
                } else {
                    ServiceError::internal(e)
                }
            })
    }

    /// Makes a new cluster's users CA in its directory `dir`: sealed, with a vault.
    fn users_ca_for(&self, name: &str, dir: &std::path::Path) -> Result<Vec<crate::vault::Sealed>> {
        self.access.create_users_ca(dir, name)?;
        match self.vault() {
            Some(v) => v.seal_users_ca(name, dir),
            None => Ok(Vec::new()),
        }
    }

    /// The vault, when the operator gave a key.
    fn vault(&self) -> Option<crate::vault::Vault> {
        self.settings
            .seal_key
            .clone()
            .map(|k| crate::vault::Vault::new(self.store.clone(), k))
    }

    /// What runs cluster `c`. Its datastore is the one its record names (NULL: made before
    /// there was a choice, etcd); a name the broker does not know is an error, never a
    /// datastore it was not made with (an empty etcd in place of its kine data).
    fn spec(&self, c: &socialweb_broker_core::Cluster, ports: Ports) -> Result<Spec> {
        let kind = DatastoreKind::parse(c.datastore.as_deref().unwrap_or("etcd")).map_err(|e| {
            anyhow::anyhow!(
                "cluster {}: its record's datastore {e}; not started on another",
                c.name
            )
        })?;
        let kine = || self.settings.kine_binary.clone();
        let datastore = match kind {
            DatastoreKind::Etcd => Datastore::Etcd,
            DatastoreKind::Kine => Datastore::Kine { binary: kine() },
            DatastoreKind::Postgres => Datastore::KinePostgres {
                binary: kine(),
                server: self.settings.postgres.clone(),
                database: crate::control_plane::postgres::database_name(c.dir_name()),
            },
        };
        Ok(Spec {
            cluster: c.name.clone(),
            dir: self.dir_of(c),
            kube: self.settings.kube.clone(),
            ports,
            isolated: self.isolated(c),
            datastore,
            gogc: self.settings.gogc,
            budget: self.settings.budget,
            cgroup_parent: self.settings.cgroup_parent,
            datastore_quota: self.settings.datastore_quota,
            metrics: self.settings.metrics.clone(),
            tied: self.settings.fleet.is_some(),
            certificates: self.settings.certificates,
        })
    }

    /// The cluster's ports, leased once and kept (free on loopback, where the components
    /// listen).
    async fn ports(&self, name: &str) -> Result<Ports> {
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let leased = self
            .store
            .lease_ports(
                name,
                &PORT_PURPOSES,
                self.settings.port_base,
                self.settings.port_count,
                |p| crate::process::port_free(lo, p),
            )
            .await?;
        Ports::from_leased(&leased)
    }

    /// Deletes a cluster: its life stops, every lease is released, its files and records go.
    pub async fn delete(&self, name: &str) -> Result<(), ServiceError> {
        let lock = self.lock(name).await;
        self.record(name).await?;
        self.store
            .set_cluster_state(name, ClusterPhase::Deleting)
            .await
            .map_err(ServiceError::internal)?;
        self.front.unmount(name);
        self.access.forget_cluster(name);
        let handle = self.running.lock().expect("lock").remove(name);
        if let Some(h) = handle {
            // Its life ends here: nothing it does on the way out is entered or recorded.
            h.life.now(socialweb_broker_core::life::Event::Delete);
            h.stop.cancel();
            let _ = h.task.await;
        }
        let done = self
            .finish_delete(name)
            .await
            .map_err(ServiceError::internal);
        drop(lock);
        self.unlock_gone(name);
        done
    }

    /// The rest of a deletion (also after a crash): every provision ended, its lease released
    /// first, then the cluster's directory and records removed.
    async fn finish_delete(&self, name: &str) -> Result<()> {
        for mut prov in self.store.provisions(Some(name)).await? {
            if prov.state.ended() {
                continue;
            }
            if prov.state.may_hold_lease() {
                self.provisioner
                    .release_own(&prov, "cluster deleted")
                    .await
                    .with_context(|| {
                        format!("releasing lease {} of {}", prov.lease_id, prov.node)
                    })?;
            }
            self.provisioner
                .end(&mut prov, Step::Released, "cluster deleted")
                .await?;
        }
        let Some(c) = self.store.cluster(name).await? else {
            return Ok(());
        };
        if c.datastore.as_deref() == Some("postgres") {
            let server = self.settings.postgres.as_ref().with_context(|| {
                format!("cluster {name}'s database is in PostgreSQL, and clusters.postgres_url is not set")
            })?;
            server
                .drop_database(&crate::control_plane::postgres::database_name(c.dir_name()))
                .await?;
        }
        let dir = self.dir_of(&c);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
        }
        self.store.delete_cluster(name).await?;
        info!(cluster = %name, "cluster deleted");
        Ok(())
    }

    /// A cluster's record and state, as the operator sees it.
    pub async fn info(&self, name: &str) -> Result<ClusterInfo, ServiceError> {
        let c = self
            .store
            .cluster(name)
            .await
            .map_err(ServiceError::internal)?
            .ok_or_else(|| not_found(name))?;
        let state = if c.state == ClusterPhase::Deleting {
            ClusterState::Deleting
        } else {
            self.running
                .lock()
                .expect("lock")
                .get(name)
                .map(|h| h.state.borrow().clone())
                .unwrap_or(ClusterState::Starting {
                    detail: "not running".into(),
                })
        };
        let api = self
            .store
            .ports(name)
            .await
            .map_err(ServiceError::internal)?
            .iter()
            .find(|(p, _)| p == "api")
            .map(|(_, p)| *p)
            .unwrap_or(0);
        let nodes = self
            .store
            .provisions(Some(name))
            .await
            .map_err(ServiceError::internal)?
            .iter()
            .filter(|p| p.state.live())
            .count();
        Ok(ClusterInfo {
            name: name.to_string(),
            state,
            server: format!("https://127.0.0.1:{api}"),
            kubeconfig: self.dir_of(&c).join("pki/admin.kubeconfig"),
            dir: self.dir_of(&c),
            nodes,
            datastore: c.datastore.clone().unwrap_or_else(|| "etcd".into()),
            hibernate_after_secs: c
                .hibernate_after_secs
                .map(|s| s.max(0) as u64)
                .unwrap_or(self.settings.hibernate_after.as_secs()),
            owner: c.owner,
        })
    }

    /// The clusters `owner` has (every cluster with `None`).
    pub async fn list(&self, owner: Option<&str>) -> Result<Vec<ClusterInfo>, ServiceError> {
        let mut out = Vec::new();
        for name in self.names_of(owner).await? {
            out.push(self.info(&name).await?);
        }
        Ok(out)
    }

    /// Whether `did` owns `name` (an answer of not found when not, which tells no one else's
    /// cluster apart from one that does not exist).
    pub async fn owned_by(&self, did: &str, name: &str) -> Result<(), ServiceError> {
        match self
            .store
            .cluster(name)
            .await
            .map_err(ServiceError::internal)?
        {
            Some(c) if c.owner.as_deref() == Some(did) => Ok(()),
            _ => Err(ServiceError::NotFound(format!(
                "name: you have no cluster {name:?}"
            ))),
        }
    }

    /// A cluster's decisions and provisions.
    pub async fn show(&self, name: &str) -> Result<ClusterDetail, ServiceError> {
        let cluster = self.info(name).await?;
        Ok(ClusterDetail {
            cluster,
            decisions: self
                .store
                .decisions(name)
                .await
                .map_err(ServiceError::internal)?,
            provisions: self
                .store
                .provisions(Some(name))
                .await
                .map_err(ServiceError::internal)?,
        })
    }

    /// Stops every cluster's life; nodes keep running and their leases stay (the next start
    /// picks them up).
    pub async fn shutdown(&self) {
        let handles: Vec<Handle> = self
            .running
            .lock()
            .expect("lock")
            .drain()
            .map(|(_, h)| h)
            .collect();
        for h in &handles {
            h.stop.cancel();
        }
        for h in handles {
            if let Err(e) = h.task.await {
                warn!("a cluster's life ended badly: {e}");
            }
        }
    }
}
