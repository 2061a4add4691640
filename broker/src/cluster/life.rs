//! One cluster's life while the broker runs: awake periods and hibernation, until the broker
//! stops or the cluster is deleted (then the control plane is stopped; nodes and leases stay).
//!
//! Awake: its control plane brought up (adopted after a crash), the cluster mounted at the
//! front -- first as starting, so its requests are held, then with its apiserver -- and its
//! scale driver run, while [`Clusters::until_idle`] asks the core whether it may hibernate.
//! Hibernating (docs/hibernation.md): every component stopped, its ports kept, the store
//! saying so with since when, the front holding its first request and waking it.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Result;
use futures_util::FutureExt;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use socialweb_broker_core::hibernation::{Observed, Verdict, blockers, verdict};
use socialweb_broker_core::{ClusterPhase, millis};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::Clusters;
use super::ownership::{Acquired, Lease};
use crate::command::ClusterState;
use crate::control_plane::runner::{Files, Spec, stop_leftovers};
use crate::control_plane::up::{Progress, bring_up};
use crate::front::proxy::Upstream;
use crate::front::{Front, Mount, MountState};
use crate::provision::ClusterCtx;
use crate::scale::driver::Watches;
use crate::tunnel::controlplane::ControlPlaneEgress;
use crate::tunnel::egress::Egress;

/// How often an awake cluster is looked at for hibernation.
const IDLE_CHECK: Duration = Duration::from_secs(1);
/// How long Jobs and CronJobs (listed, not watched) that kept it awake are not listed again.
const RELIST_AFTER: Duration = Duration::from_secs(10);

/// Tells a bring-up's steps through the cluster's state, and opens the front to it as soon
/// as its apiserver answers.
struct Starting<'a> {
    state: &'a watch::Sender<ClusterState>,
    front: &'a Front,
    cluster: &'a str,
    /// When a wake began (`None`: not a wake).
    wake: Option<(Instant, &'a crate::metrics::Metrics)>,
    /// The lease this host runs it under (a fleet's).
    lease: Option<&'a Lease>,
}

impl Progress for Starting<'_> {
    fn fenced(&self) -> bool {
        self.lease.is_some_and(Lease::lost)
    }

    fn step(&self, detail: &str) {
        let _ = self.state.send(ClusterState::Starting {
            detail: detail.to_string(),
        });
    }

    fn apiserver_ready(&self, files: &Files) {
        // Only a wake opens the front this early: its cluster's RBAC and manifests are in its
        // datastore already. A new cluster's users wait until they are applied.
        let Some((t0, metrics)) = self.wake else {
            return;
        };
        crash_point("broker::wake_apiserver_ready");
        match upstream(files) {
            Ok(up) => self
                .front
                .set_state(self.cluster, MountState::Up(Box::new(up))),
            Err(e) => warn!(cluster = %self.cluster, "the front's upstream: {e:#}"),
        }
        let s = t0.elapsed().as_secs_f64();
        metrics.woke(s);
        info!(cluster = %self.cluster, seconds = s, "woken: the apiserver answers");
    }
}

/// The front's way to the apiserver: with a certificate only request-header authentication
/// accepts (its own CA, not the cluster's).
fn upstream(files: &Files) -> Result<Upstream> {
    Upstream::new(
        &files.url,
        files.ca_pem.as_bytes(),
        &std::fs::read(&files.front.cert)?,
        &std::fs::read(&files.front.key)?,
    )
}

/// A wake fails here when the failpoint `broker::wake` is set (the tests' failed wake).
fn wake_fail_point() -> Result<()> {
    #[cfg(feature = "failpoints")]
    fail::fail_point!("broker::wake", |_| Err(anyhow::anyhow!(
        "failpoint broker::wake"
    )));
    Ok(())
}

/// A wake's look at the cluster's lease fails here when the failpoint `broker::wake_lease` is
/// set (the tests' store out of reach at a wake).
fn wake_lease_fail_point() -> Result<()> {
    #[cfg(feature = "failpoints")]
    fail::fail_point!("broker::wake_lease", |_| Err(anyhow::anyhow!(
        "failpoint broker::wake_lease"
    )));
    Ok(())
}

/// How long a fleet's host waits after the `failures`-th failure in a row before it tries
/// again: 2 s, doubled each failure, at most a minute.
fn retry_delay(failures: u32) -> Duration {
    Duration::from_secs(1 << failures.min(6)).min(Duration::from_secs(60))
}

/// Crashes the broker at `name` when that failpoint is set (the tests' SIGKILL mid-wake).
fn crash_point(name: &str) {
    #[cfg(feature = "failpoints")]
    fail::fail_point!(name, |_| {
        tracing::error!("failpoint {name}: killing the broker (SIGKILL)");
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    });
    let _ = name;
}

/// How an awake period ended.
enum Ended {
    /// The broker stops, or the cluster is being deleted.
    Stopped,
    /// Idle: the control plane is stopped and the store says it hibernates.
    Hibernated,
    /// This host lost the cluster's lease (a fleet): its control plane was killed; another
    /// host runs it, or this one will again once it may.
    Lost,
    /// This host was drained: its control plane was stopped, for another host to take.
    Moved,
}

/// How a hibernation ended.
enum Slept {
    /// A request at this host's front asked for it, at that time.
    Woken(Instant),
    /// Another host of the fleet woke it: this one waits to take it over if need be.
    Elsewhere,
    /// The broker stops.
    Stopped,
}

impl Clusters {
    /// Starts the cluster's guard and the apiserver's control-plane egress, its way to the
    /// guard (before the apiserver: it asks the guard from its first request on); the
    /// manifests the cluster gets besides the join configuration, and where the control-plane
    /// egress finds the cluster's once it is served ([`Clusters::served`]).
    async fn guarded(
        &self,
        spec: &Spec,
        stop: &CancellationToken,
    ) -> Result<(Vec<String>, Arc<OnceLock<Egress>>)> {
        let files = spec.prepare()?;
        crate::guard::serve(
            files.guard_addr,
            &files.guard.cert,
            &files.guard.key,
            stop.clone(),
        )
        .await?;
        let to_cluster = Arc::new(OnceLock::new());
        crate::tunnel::controlplane::serve(
            ControlPlaneEgress {
                cluster: spec.cluster.clone(),
                guard: files.guard_addr,
                networks: [
                    crate::control_plane::CLUSTER_CIDR,
                    crate::control_plane::SERVICE_CIDR,
                ]
                .iter()
                .map(|n| n.parse().expect("a CIDR"))
                .chain([socialweb_wire::mesh::node_range()])
                .collect(),
                allow: self.settings.webhook_egress_allow.clone(),
                to_cluster: to_cluster.clone(),
            },
            &spec.controlplane_egress_socket(),
            stop.clone(),
        )?;
        let mut extra = vec![
            crate::access::ACCESS_MANIFEST.to_string(),
            crate::control_plane::APISERVICES_MANIFEST.to_string(),
            crate::control_plane::DATASTORE_QUOTA_MANIFEST.to_string(),
            crate::control_plane::NODEPOOL_MANIFEST.to_string(),
        ];
        if spec.isolated {
            extra.push(crate::control_plane::NODE_ISOLATION_MANIFEST.to_string());
        }
        Ok((extra, to_cluster))
    }

    /// Runs the life of cluster `name` until `stop`.
    pub(super) async fn live(
        self: &Arc<Self>,
        name: &str,
        state: &watch::Sender<ClusterState>,
        stop: CancellationToken,
    ) -> Result<()> {
        let record = self
            .store
            .cluster(name)
            .await?
            .ok_or_else(|| anyhow::anyhow!("no cluster {name:?} in the store"))?;
        let spec = self.spec(&record, self.ports(name).await?);
        if !self.keep_authorities(&spec, &stop).await? {
            return Ok(());
        }
        self.front.mount(Mount {
            cluster: name.to_string(),
            account_hash: record
                .owner
                .as_deref()
                .map(socialweb_broker_core::names::account_hash),
            users_ca: self.access.users_ca_der(&self.dir_of(&record))?,
            state: MountState::Starting,
        });
        let mut asleep = record.state == ClusterPhase::Hibernating;
        if asleep || self.ownership().is_some() {
            // A hibernating cluster runs nothing, whatever a crash left; nor does a fleet's
            // cluster before this host holds its lease (another host may have taken it over
            // while this broker was down: no leftover is adopted).
            stop_leftovers(&spec).await;
        }
        if asleep {
            self.rest(name, state, record.hibernating_since);
        }
        let mut failures = 0;
        loop {
            match self.turn(&spec, state, &stop, asleep).await {
                Ok(Ended::Stopped) => return Ok(()),
                Ok(Ended::Hibernated) => asleep = true,
                Ok(Ended::Lost | Ended::Moved) => asleep = false,
                // A fleet's host tries again: the store may be out of reach for a while (its
                // lease lapses meanwhile, for another host), and ending here would leave the
                // cluster to the other hosts until this broker restarts -- or, after an outage
                // that every host saw, to none.
                Err(e) if self.ownership().is_some() => {
                    failures += 1;
                    if !self.try_again(name, state, &e, failures, &stop).await {
                        return Ok(());
                    }
                    // Whether it hibernates meanwhile, the lease's claim reads in the store.
                    asleep = false;
                    continue;
                }
                Err(e) => return Err(e),
            }
            failures = 0;
        }
    }

    /// One turn of the cluster's life: asleep (when `asleep`) until woken here or elsewhere,
    /// then an awake period. A failed wake leaves it hibernating; the next request tries
    /// again.
    async fn turn(
        self: &Arc<Self>,
        spec: &Spec,
        state: &watch::Sender<ClusterState>,
        stop: &CancellationToken,
        asleep: bool,
    ) -> Result<Ended> {
        let name = spec.cluster.as_str();
        let mut woke = None;
        if asleep {
            match self.sleep(name, state, stop).await? {
                Slept::Woken(t0) => woke = Some(t0),
                Slept::Elsewhere => {}
                Slept::Stopped => return Ok(Ended::Stopped),
            }
        }
        match self.owned(spec, state, stop, woke).await {
            Err(e) if woke.is_some() => {
                warn!(cluster = %name, "waking: {e:#}");
                self.provisioner.metrics().wake_failed();
                if let Err(e) = self
                    .store
                    .set_hibernating(name, Some(SystemTime::now()))
                    .await
                {
                    // The store still says awake: the next start brings it up.
                    warn!(cluster = %name, "recording the failed wake: {e:#}");
                }
                self.front
                    .set_state(name, MountState::WakeFailed(format!("{e:#}")));
                let _ = state.send(ClusterState::Hibernating {
                    since: millis(SystemTime::now()),
                });
                Ok(Ended::Hibernated)
            }
            other => other,
        }
    }

    /// After the `failures`-th failure in a row on a fleet's host: says so (the state is
    /// `failed`, with the error and when this host tries again), holds the front's requests,
    /// and waits 2 s, doubled each failure, at most a minute. `false`: stopped meanwhile.
    async fn try_again(
        &self,
        name: &str,
        state: &watch::Sender<ClusterState>,
        e: &anyhow::Error,
        failures: u32,
        stop: &CancellationToken,
    ) -> bool {
        let delay = retry_delay(failures);
        warn!(cluster = %name, "{e:#}; this host tries again in {delay:?}");
        self.front.set_state(name, MountState::Starting);
        let _ = state.send(ClusterState::Failed {
            error: format!("{e:#} (this host tries again in {}s)", delay.as_secs()),
        });
        tokio::select! {
            _ = tokio::time::sleep(delay) => true,
            _ = stop.cancelled() => false,
        }
    }

    /// The cluster's authorities made where missing and, with a vault (`store.key_file`),
    /// the same as the store's: restored from it onto an empty disk, sealed into it when
    /// made here. Before anything is served or signed. `Ok(false)`: stopped first.
    ///
    /// The users CA is the one authority this never makes: the host that creates the cluster
    /// makes it and seals it with the cluster's row (`Clusters::create`), and signs users'
    /// certificates with it. A follower finds it there; for a cluster an older broker
    /// created, it waits for the creator to seal it rather than make one of its own that no
    /// user's certificate would match.
    async fn keep_authorities(&self, spec: &Spec, stop: &CancellationToken) -> Result<bool> {
        let Some(v) = self.vault() else {
            spec.ensure_authorities()?;
            return Ok(true);
        };
        let users_ca = spec.dir.join("users/ca.key");
        let mut told = false;
        loop {
            logged(&spec.cluster, v.sync(&spec.cluster, &spec.dir).await?);
            // Outside a fleet no other host can seal it: on without it, to the error that
            // names it.
            if users_ca.exists() || self.ownership().is_none() {
                break;
            }
            if !told {
                info!(cluster = %spec.cluster, "waiting for the creating host to seal the cluster's users CA");
                told = true;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                _ = stop.cancelled() => return Ok(false),
            }
        }
        spec.ensure_authorities()?;
        logged(&spec.cluster, v.sync(&spec.cluster, &spec.dir).await?);
        Ok(true)
    }

    /// Mounts and tells the cluster as hibernating (since `since`, or now).
    fn rest(&self, name: &str, state: &watch::Sender<ClusterState>, since: Option<i64>) {
        self.front.set_state(name, MountState::Hibernating);
        let _ = state.send(ClusterState::Hibernating {
            since: since.unwrap_or_else(|| millis(SystemTime::now())),
        });
    }

    /// Sleeps until a wake is asked for (when, `Some`) or `stop` (`None`). The store says
    /// the cluster is awake before anything starts: a crash from there on brings it up.
    async fn sleep(
        &self,
        name: &str,
        state: &watch::Sender<ClusterState>,
        stop: &CancellationToken,
    ) -> Result<Slept> {
        let metrics = self.provisioner.metrics();
        metrics.asleep(true);
        let signal = self.front.wake_signal(name);
        let asked = tokio::select! {
            _ = signal.notified() => Some(true),
            () = self.woken_elsewhere(name) => Some(false),
            _ = stop.cancelled() => None,
        };
        metrics.asleep(false);
        match asked {
            None => return Ok(Slept::Stopped),
            Some(false) => return Ok(Slept::Elsewhere),
            Some(true) => {}
        }
        let t0 = Instant::now();
        info!(cluster = %name, "waking");
        metrics.waking();
        self.store.set_hibernating(name, None).await?;
        self.front.set_state(name, MountState::Starting);
        let _ = state.send(ClusterState::Starting {
            detail: "waking".into(),
        });
        Ok(Slept::Woken(t0))
    }

    /// Returns when another host of the fleet has woken the cluster (the store no longer
    /// says it hibernates); never outside a fleet.
    async fn woken_elsewhere(&self, name: &str) {
        let Some(own) = self.ownership() else {
            return std::future::pending().await;
        };
        loop {
            tokio::time::sleep(own.timing.renew_every()).await;
            if let Ok(Some(c)) = self.store.cluster(name).await
                && c.state == ClusterPhase::Active
            {
                return;
            }
        }
    }

    /// One awake period on this host. In a fleet, it first waits for the cluster's lease
    /// (the front and the state saying which host runs it meanwhile), keeps it renewed
    /// while the control plane runs, and gives it up when the cluster hibernates or the
    /// broker stops; a lost lease kills the control plane.
    async fn owned(
        self: &Arc<Self>,
        spec: &Spec,
        state: &watch::Sender<ClusterState>,
        stop: &CancellationToken,
        woke: Option<Instant>,
    ) -> Result<Ended> {
        let Some(own) = self.ownership() else {
            return self.awake(spec, state, stop, woke, None).await;
        };
        let name = spec.cluster.as_str();
        let waiting = |host: Option<&str>| self.elsewhere(name, state, host);
        let drained = self.drained();
        let mut failures = 0;
        let acquired = loop {
            let looked = match woke.map(|_| wake_lease_fail_point()) {
                Some(Err(e)) => Err(e),
                _ => {
                    own.acquire(name, woke.is_some(), &drained, waiting, stop)
                        .await
                }
            };
            match looked {
                Ok(a) => break a,
                // A wake keeps its request through a store out of reach: failing it would
                // record the cluster as hibernating while another host may run it, and if
                // that host died then, no host would take the cluster over (a hibernating
                // cluster waits for a request). The front holds the request meanwhile.
                Err(e) if woke.is_some() => {
                    failures += 1;
                    let delay = retry_delay(failures);
                    warn!(cluster = %name, "waking: looking at its lease: {e:#}; this host tries again in {delay:?}");
                    let _ = state.send(ClusterState::Starting {
                        detail: format!("waking: waiting for the store ({e:#})"),
                    });
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = stop.cancelled() => return Ok(Ended::Stopped),
                    }
                }
                Err(e) => return Err(e),
            }
        };
        let lease = match acquired {
            Acquired::Lease(l) => l,
            Acquired::Hibernating => {
                self.rest(name, state, None);
                return Ok(Ended::Hibernated);
            }
            Acquired::Stopped => return Ok(Ended::Stopped),
        };
        self.front.set_state(name, MountState::Starting);
        let ended = self.awake(spec, state, stop, woke, Some(&lease)).await;
        // Its nodes go to find the host that runs it next.
        self.tunnels.close_cluster(name);
        if lease.lost() {
            return Ok(Ended::Lost);
        }
        // A failed period left nothing running (a bring-up stops what it started, and a
        // failure after it kills the control plane): another host may try at once, rather
        // than after the lease's TTL while this one keeps claiming it back.
        if ended.is_err() || matches!(ended, Ok(Ended::Stopped | Ended::Hibernated | Ended::Moved))
        {
            lease.release().await;
        }
        ended
    }

    /// Says that host `host` runs the cluster (none: no host yet, and this one takes no
    /// more), once per change.
    fn elsewhere(&self, name: &str, state: &watch::Sender<ClusterState>, owner: Option<&str>) {
        let host =
            owner.unwrap_or("none yet: this host takes no more (drained, or at fleet.max_awake)");
        let now = ClusterState::Elsewhere {
            host: host.to_string(),
        };
        if state.send_if_modified(|s| {
            let changed = *s != now;
            *s = now.clone();
            changed
        }) {
            info!(cluster = %name, %host, "another host runs the cluster");
            self.front
                .set_state(name, MountState::Elsewhere(owner.map(str::to_string)));
        }
    }

    /// What the broker keeps up in the cluster for the period: the tenant's role, nodes'
    /// certificates approved by the store's plan, their cluster addresses published from it,
    /// and the datastore quota's state (the role and the quota written once before this
    /// returns, so before the front serves the cluster).
    async fn keep_up(&self, spec: &Spec, client: &kube::Client, period: &CancellationToken) {
        let name = spec.cluster.as_str();
        crate::rights::keep(client.clone(), name.to_string(), period.clone()).await;
        tokio::spawn(crate::approver::run(
            client.clone(),
            name.to_string(),
            self.store.clone(),
            period.clone(),
        ));
        tokio::spawn(crate::node_addresses::run(
            client.clone(),
            name.to_string(),
            self.store.clone(),
            period.clone(),
        ));
        crate::quota::Watch {
            cluster: name.to_string(),
            kine_db: spec.kine_db(),
            postgres: spec
                .datastore
                .postgres()
                .and_then(|(s, db)| s.map(|s| (s.clone(), db.to_string()))),
            quota: spec.datastore_quota,
        }
        .start(client.clone(), period.clone())
        .await;
    }

    /// One awake period: the control plane up, the driver run, until `stop`, idle, or the
    /// lease (a fleet's) lost.
    async fn awake(
        self: &Arc<Self>,
        spec: &Spec,
        state: &watch::Sender<ClusterState>,
        stop: &CancellationToken,
        woke: Option<Instant>,
        lease: Option<&Lease>,
    ) -> Result<Ended> {
        let name = spec.cluster.as_str();
        // Everything of this period (guard, approver, watches, egress, driver) ends with it,
        // and so does the lease's renewal; a lost lease ends the period.
        let period = stop.child_token();
        let _end = period.clone().drop_guard();
        if let Some(l) = lease {
            l.keep(period.clone());
        }
        if woke.is_some() {
            wake_fail_point()?;
        }
        let (extra, to_cluster) = self.guarded(spec, &period).await?;
        let progress = Starting {
            state,
            front: &self.front,
            cluster: name,
            wake: woke.map(|t| (t, self.provisioner.metrics())),
            lease,
        };
        let Some(up) = bring_up(spec.clone(), &extra, &progress, &period).await? else {
            return Ok(Ended::Stopped);
        };
        let files = up.running.files.clone();
        self.keep_up(spec, &up.client, &period).await;
        let watches = Watches::start(&up.client, &period);
        let (ctx, upstream) = match self.served(spec, &up, &watches, &to_cluster, &period) {
            Ok(s) => s,
            Err(e) => {
                // Nothing runs past the period: a lease's renewal ends with it.
                up.running.kill().await;
                return Err(e);
            }
        };
        self.front
            .set_state(name, MountState::Up(Box::new(upstream.clone())));
        let _ = state.send(ClusterState::Ready);
        info!(cluster = %name, url = %files.url, kubeconfig = %files.admin_kubeconfig.display(), "cluster ready");
        let driver = tokio::spawn(crate::scale::driver::run(
            self.provisioner.clone(),
            ctx,
            self.settings.knobs,
            watches.clone(),
            period.clone(),
        ));
        let mut drained = self.drained();
        let why = tokio::select! {
            _ = period.cancelled() => Ended::Stopped,
            _ = drained.wait_for(|d| *d), if lease.is_some() => Ended::Moved,
            () = self.until_idle(name, &up.client, &watches, &upstream) => Ended::Hibernated,
        };
        period.cancel();
        self.end_period(name, state, why, lease, up.running, driver)
            .await
    }

    /// What an awake period serves once its control plane is up: the apiserver's egress to
    /// the nodes, and the scale driver's and the front's way to the apiserver.
    fn served(
        &self,
        spec: &Spec,
        up: &crate::control_plane::up::Up,
        watches: &Watches,
        to_cluster: &OnceLock<Egress>,
        period: &CancellationToken,
    ) -> Result<(ClusterCtx, Upstream)> {
        let files = &up.running.files;
        let egress = Egress {
            cluster: spec.cluster.clone(),
            tunnels: self.tunnels.clone(),
            store: self.store.clone(),
            nodes: watches.nodes.clone(),
            service_cidr: crate::control_plane::SERVICE_CIDR.parse()?,
        };
        crate::tunnel::egress::serve(egress.clone(), &up.running.egress_socket, period.clone())?;
        let _ = to_cluster.set(egress);
        let ctx = ClusterCtx {
            name: spec.cluster.clone(),
            server_url: files.node_url.clone(),
            ca_pin: socialweb_wire::ca::pin(files.ca_pem.as_bytes()).map_err(anyhow::Error::msg)?,
            client: up.client.clone(),
        };
        Ok((ctx, upstream(files)?))
    }

    /// Ends an awake period for `why` (the period cancelled): a lost lease kills the control
    /// plane at once; otherwise the driver ends, then the control plane stops with grace.
    async fn end_period<T>(
        &self,
        name: &str,
        state: &watch::Sender<ClusterState>,
        why: Ended,
        lease: Option<&Lease>,
        running: crate::control_plane::runner::Running,
        driver: tokio::task::JoinHandle<T>,
    ) -> Result<Ended> {
        if lease.is_some_and(Lease::lost) {
            running.kill().await;
            self.front.set_state(name, MountState::Starting);
            let _ = driver.await;
            return Ok(Ended::Lost);
        }
        if matches!(why, Ended::Moved) {
            // Requests arriving now wait for the next owner instead of meeting an
            // apiserver that is going; those in flight finish.
            self.front.set_state(name, MountState::Starting);
        }
        let _ = driver.await;
        running.stop().await;
        match why {
            Ended::Hibernated => self.hibernated(name, state).await,
            Ended::Moved => {
                info!(cluster = %name, "this host is drained: the cluster goes to another host");
                self.front.set_state(name, MountState::Starting);
                Ok(Ended::Moved)
            }
            other => Ok(other),
        }
    }

    /// Records and tells that the cluster hibernates, its control plane stopped.
    async fn hibernated(&self, name: &str, state: &watch::Sender<ClusterState>) -> Result<Ended> {
        let since = SystemTime::now();
        self.store.set_hibernating(name, Some(since)).await?;
        self.provisioner.metrics().hibernated();
        let _ = state.send(ClusterState::Hibernating {
            since: millis(since),
        });
        info!(cluster = %name, "hibernating: its control plane is stopped, its ports kept");
        Ok(Ended::Hibernated)
    }

    /// Returns once the cluster may hibernate, with the front already holding its requests
    /// (the mount says hibernating; a request that slips in before that keeps it awake).
    async fn until_idle(
        &self,
        name: &str,
        client: &kube::Client,
        watches: &Watches,
        upstream: &Upstream,
    ) {
        let activity = self.front.activity(name);
        let mut last_busy = Instant::now();
        let mut said = String::new();
        let mut listed: Option<(Instant, Vec<String>, Vec<String>)> = None;
        loop {
            tokio::time::sleep(IDLE_CHECK).await;
            let Some((after, mut o)) = self.observe(name, watches, &activity).await else {
                continue;
            };
            let cutoff = self.settings.knobs.expendable_priority_cutoff;
            let seen = blockers(&o, cutoff);
            if !seen.is_empty() {
                last_busy = Instant::now();
            }
            let quiet = activity
                .idle_for()
                .unwrap_or_default()
                .min(last_busy.elapsed());
            let mut v = verdict(after, quiet, &seen);
            if v == Verdict::Hibernate {
                // What is only listed, when it matters: Jobs and CronJobs (a list kept for
                // a while, so a CronJob does not cost a list a second).
                if listed
                    .as_ref()
                    .is_none_or(|(t, ..)| t.elapsed() > RELIST_AFTER)
                {
                    let (jobs, crons) = jobs_and_cron_jobs(client)
                        .await
                        .unwrap_or_else(|e| (vec![format!("(unlisted: {e})")], Vec::new()));
                    listed = Some((Instant::now(), jobs, crons));
                }
                let (_, jobs, crons) = listed.clone().expect("listed");
                (o.unfinished_jobs, o.cron_jobs) = (jobs, crons);
                v = verdict(after, quiet, &blockers(&o, cutoff));
            }
            match v {
                Verdict::Hibernate if self.hold_requests(name, &activity, upstream) => return,
                Verdict::Hibernate => last_busy = Instant::now(),
                Verdict::After(_) => {}
                Verdict::Stay(why) => {
                    if why != said {
                        info!(cluster = %name, "stays awake: {why}");
                    }
                    said = why;
                }
            }
        }
    }

    /// The cluster's `hibernate_after` and what it has now (`None`: the store did not answer).
    async fn observe(
        &self,
        name: &str,
        watches: &Watches,
        activity: &crate::front::listener::Activity,
    ) -> Option<(Duration, Observed)> {
        let record = match self.store.cluster(name).await {
            Ok(Some(r)) => r,
            Ok(None) => return None,
            Err(e) => {
                warn!(cluster = %name, "reading the cluster: {e:#}");
                return None;
            }
        };
        let after = record
            .hibernate_after_secs
            .map(|s| Duration::from_secs(s.max(0) as u64))
            .unwrap_or(self.settings.hibernate_after);
        let provisions = self.store.provisions(Some(name)).await.ok()?;
        Some((
            after,
            Observed {
                nodes: watches.nodes.state().len(),
                live_leases: provisions.iter().filter(|p| p.state.live()).count(),
                front_in_flight: activity.in_flight(),
                pods: watches
                    .pods
                    .state()
                    .iter()
                    .map(|p| crate::tenant::pod_view(p, &self.provisioner.settings().schedulers))
                    .collect(),
                unfinished_jobs: Vec::new(),
                cron_jobs: Vec::new(),
            },
        ))
    }

    /// Mounts the cluster as hibernating so that requests are held from now on; `false`
    /// (and mounted up again) when one was in flight already.
    fn hold_requests(
        &self,
        name: &str,
        activity: &crate::front::listener::Activity,
        upstream: &Upstream,
    ) -> bool {
        // A wake asked before now is for the cluster as it is: awake.
        let _ = self.front.wake_signal(name).notified().now_or_never();
        self.front.set_state(name, MountState::Hibernating);
        if activity.in_flight() > 0 {
            self.front
                .set_state(name, MountState::Up(Box::new(upstream.clone())));
            return false;
        }
        true
    }
}

/// How many Jobs or CronJobs a look for idleness reads per request, and the most names it
/// keeps of each (the verdict needs one; its reason names a few): a tenant's thousands of
/// finished Jobs are read a page at a time, never held whole.
const JOBS_PAGE: u32 = 250;
const JOBS_KEPT: usize = 16;

/// Up to [`JOBS_KEPT`] names (`ns/name`) of the `K`s that `keep` selects, read in pages.
async fn some_of<K>(client: &kube::Client, keep: impl Fn(&K) -> bool) -> Result<Vec<String>>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
    K::DynamicType: Default,
{
    let api = kube::Api::<K>::all(client.clone());
    let mut lp = kube::api::ListParams::default().limit(JOBS_PAGE);
    let mut out = Vec::new();
    loop {
        let page = api.list(&lp).await?;
        for k in page.items.iter().filter(|k| keep(k)) {
            let m = k.meta();
            out.push(format!(
                "{}/{}",
                m.namespace.as_deref().unwrap_or(""),
                m.name.as_deref().unwrap_or("")
            ));
            if out.len() >= JOBS_KEPT {
                return Ok(out);
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = lp.continue_token(&c),
            None => return Ok(out),
        }
    }
}

/// Some of the Jobs not finished and the CronJobs not suspended, as `ns/name`.
async fn jobs_and_cron_jobs(client: &kube::Client) -> Result<(Vec<String>, Vec<String>)> {
    let unfinished = some_of::<Job>(client, |j| {
        !j.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
            })
    })
    .await?;
    let active = some_of::<CronJob>(client, |c| {
        !c.spec.as_ref().and_then(|s| s.suspend).unwrap_or(false)
    })
    .await?;
    Ok((unfinished, active))
}

/// Says what a vault sync changed, if anything.
fn logged(cluster: &str, synced: crate::vault::Synced) {
    if !(synced.restored.is_empty() && synced.sealed.is_empty()) {
        info!(%cluster, restored = ?synced.restored, sealed = ?synced.sealed, "CA material kept in the store");
    }
}
