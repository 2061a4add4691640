//! One awake period of a cluster on this host: its guard and egress first, its control
//! plane brought up (its steps told through the cluster's state, the front opened as soon as
//! a wake's apiserver answers), what the broker keeps up in it, its scale driver, until the
//! broker stops, it idles, this host is drained or its lease (a fleet's) is lost.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use anyhow::Result;
use socialweb_broker_core::life::{Event, Handover};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::Clusters;
use super::ownership::Lease;
use super::writer::{Writer, now_millis};
use crate::control_plane::runner::{Files, Spec};
use crate::control_plane::up::{Progress, bring_up};
use crate::front::proxy::Upstream;
use crate::provision::ClusterCtx;
use crate::scale::driver::Watches;
use crate::tunnel::controlplane::ControlPlaneEgress;
use crate::tunnel::egress::Egress;

/// How an awake period ended.
pub(super) enum Ended {
    /// The broker stops, or the cluster is being deleted.
    Stopped,
    /// Idle: the control plane is stopped and the store says it hibernates.
    Hibernated,
    /// This host lost the cluster's lease (a fleet): its control plane was killed; another
    /// host runs it, or this one will again once it may.
    Lost,
    /// This host was drained: its control plane was stopped, for another host to take.
    Moved,
    /// Its leaf certificates were due: its control plane was stopped to start again at once
    /// with new ones (the lease, a fleet's, kept).
    Renewed,
}

/// How an awake period begins.
#[derive(Debug, Clone, Copy)]
pub(super) enum Start {
    /// Created, the broker starting, or claimed from another host.
    Plain,
    /// A request at this host's front woke it, at that time.
    Woken(Instant),
    /// The previous period ended to renew its certificates.
    Renewal,
}

impl Start {
    pub(super) fn woke(self) -> Option<Instant> {
        match self {
            Start::Woken(t0) => Some(t0),
            _ => None,
        }
    }

    /// Asked for by a request or a period that ran: its lease is taken whether or not the
    /// store says it is awake, and a store out of reach is waited out with requests held.
    pub(super) fn wanted(self) -> bool {
        !matches!(self, Start::Plain)
    }
}

/// Tells a bring-up's steps through the cluster's state, and opens the front to it as soon
/// as its apiserver answers.
struct Starting<'a> {
    life: &'a Writer,
    cluster: &'a str,
    /// When a wake began (`None`: not a wake).
    wake: Option<(Instant, &'a crate::metrics::Metrics)>,
    /// The front passes requests as soon as the apiserver answers (a wake, a renewal:
    /// what the cluster gets is in its datastore already).
    early: bool,
    /// The lease this host runs it under (a fleet's).
    lease: Option<&'a Lease>,
    /// The front's way to the apiserver once made early (a wake, a renewal), for the period
    /// to serve on with rather than make again.
    early_upstream: std::sync::Mutex<Option<Upstream>>,
}

impl Progress for Starting<'_> {
    fn fenced(&self) -> bool {
        self.lease.is_some_and(Lease::lost)
    }

    fn step(&self, detail: &str) {
        self.life.now(Event::Step(detail.to_string()));
    }

    fn apiserver_ready(&self, files: &Files) {
        // Only a wake or a renewal opens the front this early: its cluster's RBAC and
        // manifests are in its datastore already. A new cluster's users wait until they are
        // applied.
        if !self.early {
            return;
        }
        crash_point("broker::wake_apiserver_ready");
        match upstream(files) {
            Ok(up) => {
                *self.early_upstream.lock().expect("lock") = Some(up.clone());
                self.life.serve(up);
                self.life.now(Event::ApiserverAnswers);
            }
            Err(e) => warn!(cluster = %self.cluster, "the front's upstream: {e:#}"),
        }
        let Some((t0, metrics)) = self.wake else {
            info!(cluster = %self.cluster, "renewed: the apiserver answers with its new certificates");
            return;
        };
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

/// Crashes the broker at `name` when that failpoint is set (the tests' SIGKILL mid-wake).
fn crash_point(name: &str) {
    #[cfg(feature = "failpoints")]
    fail::fail_point!(name, |_| {
        tracing::error!("failpoint {name}: killing the broker (SIGKILL)");
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    });
    let _ = name;
}

impl Clusters {
    /// Prepares the cluster's files (once: the bring-up starts the components with them),
    /// starts its guard and the apiserver's control-plane egress, its way to the guard
    /// (before the apiserver: it asks the guard from its first request on); the files, the
    /// manifests the cluster gets besides the join configuration, and where the control-plane
    /// egress finds the cluster's once it is served ([`Clusters::served`]).
    async fn guarded(
        &self,
        spec: &Spec,
        stop: &CancellationToken,
    ) -> Result<(Files, Vec<String>, Arc<OnceLock<Egress>>)> {
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
        Ok((files, extra, to_cluster))
    }

    /// One awake period: the control plane up, the driver run, until `stop`, idle, or the
    /// lease (a fleet's) lost.
    pub(super) async fn awake(
        self: &Arc<Self>,
        spec: &Spec,
        life: &Writer,
        stop: &CancellationToken,
        start: Start,
        lease: Option<&Lease>,
    ) -> Result<Ended> {
        let name = spec.cluster.as_str();
        // Everything of this period (guard, approver, watches, egress, driver) ends with it,
        // and so does the lease's renewal; a lost lease ends the period.
        let period = stop.child_token();
        let _end = period.clone().drop_guard();
        if let Some(l) = lease {
            l.keep(
                period.clone(),
                spec.dir.join(crate::watchdog::DEADLINE_FILE),
            );
        }
        if start.woke().is_some() {
            wake_fail_point()?;
        }
        let (files, extra, to_cluster) = self.guarded(spec, &period).await?;
        let progress = Starting {
            life,
            cluster: name,
            wake: start.woke().map(|t| (t, &self.settings.metrics)),
            early: start.wanted(),
            lease,
            early_upstream: std::sync::Mutex::new(None),
        };
        let Some(up) = bring_up(spec.clone(), files, &extra, &progress, &period).await? else {
            return Ok(Ended::Stopped);
        };
        let files = up.running.files.clone();
        self.keep_up(spec, &up.client, &period).await;
        let watches = Watches::start(&up.client, &period);
        let early = progress.early_upstream.lock().expect("lock").take();
        let (ctx, upstream) = match self.served(spec, &up, &watches, &to_cluster, &period, early) {
            Ok(s) => s,
            Err(e) => {
                // Nothing runs past the period: a lease's renewal ends with it.
                up.running.kill().await;
                return Err(e);
            }
        };
        life.serve(upstream.clone());
        life.now(Event::Up);
        info!(cluster = %name, url = %files.url, kubeconfig = %files.admin_kubeconfig.display(), "cluster ready");
        let driver = tokio::spawn(crate::scale::driver::run(
            self.provisioner.clone(),
            crate::scale::driver::Handles {
                store: self.store.clone(),
                metrics: self.settings.metrics.clone(),
                schedulers: self.settings.schedulers.clone(),
            },
            ctx,
            self.settings.knobs,
            watches.clone(),
            period.clone(),
        ));
        let mut drained = self.drained();
        self.settings.metrics.certificates.seen(name, spec.expiry());
        let why = tokio::select! {
            _ = period.cancelled() => Ended::Stopped,
            _ = drained.wait_for(|d| *d), if lease.is_some() => Ended::Moved,
            () = self.until_idle(name, life, &up.client, &watches) => Ended::Hibernated,
            () = renewal(spec) => Ended::Renewed,
            () = rotation(spec, life) => Ended::Renewed,
            () = super::rotate::retirement(&spec.dir, &up.client) => Ended::Renewed,
        };
        period.cancel();
        self.end_period(name, life, why, lease, up.running, driver)
            .await
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

    /// What an awake period serves once its control plane is up: the apiserver's egress to
    /// the nodes, and the scale driver's and the front's way to the apiserver (`early`: made
    /// already, when the apiserver first answered).
    fn served(
        &self,
        spec: &Spec,
        up: &crate::control_plane::up::Up,
        watches: &Watches,
        to_cluster: &OnceLock<Egress>,
        period: &CancellationToken,
        early: Option<Upstream>,
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
        let upstream = match early {
            Some(u) => u,
            None => upstream(files)?,
        };
        Ok((ctx, upstream))
    }

    /// Ends an awake period for `why` (the period cancelled): a lost lease kills the control
    /// plane at once; otherwise the driver ends, then the control plane stops with grace.
    async fn end_period<T>(
        &self,
        name: &str,
        life: &Writer,
        why: Ended,
        lease: Option<&Lease>,
        running: crate::control_plane::runner::Running,
        driver: tokio::task::JoinHandle<T>,
    ) -> Result<Ended> {
        if lease.is_some_and(Lease::lost) {
            running.kill().await;
            life.now(Event::Leaving(Handover::LeaseLost));
            let _ = driver.await;
            return Ok(Ended::Lost);
        }
        match why {
            // Requests arriving now wait for the next owner instead of meeting an
            // apiserver that is going; those in flight finish.
            Ended::Moved => {
                life.now(Event::Leaving(Handover::Drained));
            }
            // They wait for the next period's apiserver, which starts at once.
            Ended::Renewed => {
                life.now(Event::Renew);
            }
            _ => {}
        }
        let _ = driver.await;
        running.stop().await;
        match why {
            Ended::Hibernated => self.hibernated(name, life).await,
            Ended::Moved => {
                info!(cluster = %name, "this host is drained or cut off: the cluster goes to another host");
                Ok(Ended::Moved)
            }
            Ended::Renewed => {
                info!(cluster = %name, "certificates due: its control plane restarts with new ones");
                Ok(Ended::Renewed)
            }
            other => Ok(other),
        }
    }

    /// Records and tells that the cluster hibernates, its control plane stopped.
    async fn hibernated(&self, name: &str, life: &Writer) -> Result<Ended> {
        life.on(Event::Stopped { at: now_millis() }).await?;
        self.settings.metrics.hibernated();
        info!(cluster = %name, "hibernating: its control plane is stopped, its ports kept");
        Ok(Ended::Hibernated)
    }
}

/// Resolves when `cluster rotate-ca` asks for new CAs (`control_plane::rotate`): at once if
/// it asked while this period was starting, after its start had looked.
async fn rotation(spec: &Spec, life: &Writer) {
    let asked = life.restart_asked();
    tokio::pin!(asked);
    asked.as_mut().enable();
    if crate::control_plane::rotate::asked(&spec.dir) {
        return;
    }
    asked.await;
}

/// Resolves once the earliest of the cluster's leaf certificates is due to be issued again
/// (`certificates.renew_before` ahead of its end), looking again at least hourly (a clock
/// set forward). A leaf already due when the period began was not one its start renews (a
/// file left in its `pki` directory): it is said once and does not end period after period.
async fn renewal(spec: &Spec) {
    use std::time::{Duration, SystemTime};
    const LOOK_EVERY: Duration = Duration::from_secs(3600);
    let began = SystemTime::now();
    loop {
        let now = SystemTime::now();
        let wait = match spec.renewal_due_at() {
            Some(due) if due <= began => {
                warn!(cluster = %spec.cluster, "a certificate in {} is due and its start did not renew it", spec.dir.join("pki").display());
                std::future::pending::<()>().await;
                return;
            }
            Some(due) => due.duration_since(now).unwrap_or_default(),
            None => LOOK_EVERY,
        };
        if wait.is_zero() {
            return;
        }
        tokio::time::sleep(wait.min(LOOK_EVERY)).await;
    }
}
