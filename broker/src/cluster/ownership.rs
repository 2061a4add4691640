//! A fleet's ownership of awake clusters (`fleet.enabled`), carried out: a host claims a
//! cluster's lease before it starts the control plane, renews it while it runs, kills the
//! control plane when it could not renew in time (fencing: it is down before anyone may
//! take over), and releases the lease when the cluster hibernates or the host stops. The
//! times are `socialweb_broker_core::ownership`'s; the lease is a row of the store, its
//! expiry the store's clock (no host's). The owner's own deadline is its monotonic clock,
//! written for the watchdog ([`crate::watchdog`]) too, which kills the control plane when
//! the broker itself is frozen past it. What a life shows while it waits for a lease, and
//! the storage fence at each start under one, are here too.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Result;
use socialweb_broker_core::ClusterPhase;
use socialweb_broker_core::life::Event;
use socialweb_broker_core::ownership::{Claim, Timing};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::renewer::Renewal;
use super::writer::Writer;
use crate::control_plane::runner::Spec;
use crate::store::Store;

/// This host's part in a fleet.
#[derive(Debug, Clone)]
pub struct Ownership {
    pub store: Store,
    /// This host's broker id: what the lease rows name.
    pub host: String,
    pub timing: Timing,
    /// `fleet.max_awake`.
    pub max_awake: Option<u32>,
    /// Held while this host counts its leases and claims one: two of its clusters claiming
    /// at once must not both pass the limit.
    pub claiming: Arc<tokio::sync::Mutex<()>>,
    pub metrics: crate::metrics::Fleet,
    /// The store as this host last read it, once a renewal period for all its clusters.
    pub view: tokio::sync::watch::Receiver<Arc<super::view::View>>,
    /// This host's batched renewals.
    pub renewer: Arc<super::renewer::Renewer>,
}

/// What waiting for a lease came to.
#[derive(Debug)]
pub enum Acquired {
    /// This host holds the cluster's lease.
    Lease(Box<Lease>),
    /// The cluster hibernates (or is being deleted) and no request asked this host to wake
    /// it: no one runs it.
    Hibernating,
    /// The broker stops.
    Stopped,
}

/// A lease this host holds.
#[derive(Debug)]
pub struct Lease {
    pub fence: i64,
    cluster: String,
    own: Ownership,
    /// When the winning claim's statement was sent: the row's expiry is at least that
    /// plus the TTL.
    claimed_at: Instant,
    /// Set when the lease was lost: the control plane must be killed, not stopped.
    lost: Arc<AtomicBool>,
}

/// A duration in ms, for the store's statements.
fn ms(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Ownership {
    /// Waits until this host holds `cluster`'s lease. Without `woken` (a request at this
    /// host's front), a hibernating cluster is left to sleep; while `drained`, nothing is
    /// claimed. `waiting` is told the holder (if any) each time this host waits. Who holds
    /// the lease is read from the host's view of the store, not from the store per cluster;
    /// the claim itself is the store's decision.
    pub async fn acquire(
        &self,
        cluster: &str,
        woken: bool,
        drained: &tokio::sync::watch::Receiver<bool>,
        waiting: impl Fn(Option<&str>),
        stop: &CancellationToken,
    ) -> Result<Acquired> {
        let mut view = self.view.clone();
        loop {
            if stop.is_cancelled() {
                return Ok(Acquired::Stopped);
            }
            let seen = view.borrow_and_update().lease(cluster);
            let theirs = seen.owner.as_ref().filter(|o| o.host != self.host);
            let wait = match self.timing.claim(theirs.map(|o| o.expires_at), seen.now) {
                _ if *drained.borrow() => {
                    waiting(theirs.map(|o| o.host.as_str()));
                    self.timing.renew_every()
                }
                Claim::Now if !woken && !self.active(cluster).await? => {
                    return Ok(Acquired::Hibernating);
                }
                Claim::Now => {
                    if !woken && !self.first_to_claim(stop).await? {
                        return Ok(Acquired::Stopped);
                    }
                    let claiming = self.claiming.lock().await;
                    if self.full().await? {
                        drop(claiming);
                        waiting(theirs.map(|o| o.host.as_str()));
                        tokio::select! {
                            _ = tokio::time::sleep(self.timing.renew_every()) => {}
                            _ = stop.cancelled() => return Ok(Acquired::Stopped),
                        }
                        continue;
                    }
                    let sent = Instant::now();
                    let got = self
                        .store
                        .claim_owner(
                            cluster,
                            &self.host,
                            ms(self.timing.ttl),
                            ms(self.timing.grace()),
                        )
                        .await?;
                    drop(claiming);
                    if got.host == self.host {
                        self.metrics
                            .claimed(theirs.is_some_and(|o| o.expires_at > 0));
                        info!(%cluster, fence = got.fence, took_over_from = ?theirs.map(|o| &o.host), "this host owns the cluster");
                        return Ok(Acquired::Lease(Box::new(Lease {
                            fence: got.fence,
                            cluster: cluster.to_string(),
                            own: self.clone(),
                            claimed_at: sent,
                            lost: Arc::default(),
                        })));
                    }
                    waiting(Some(&got.host));
                    self.timing.renew_every()
                }
                Claim::Wait(d) => {
                    waiting(theirs.map(|o| o.host.as_str()));
                    d
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                Ok(()) = view.changed() => {}
                _ = stop.cancelled() => return Ok(Acquired::Stopped),
            }
        }
    }

    /// Whether this host runs `fleet.max_awake` clusters already.
    async fn full(&self) -> Result<bool> {
        let Some(max) = self.max_awake else {
            return Ok(false);
        };
        Ok(self.store.owned_by(&self.host).await? >= i64::from(max))
    }

    /// Lets hosts running fewer clusters claim first: waits a tenth of a second per cluster
    /// this host runs (at most half a renewal period); `false` when stopped meanwhile.
    async fn first_to_claim(&self, stop: &CancellationToken) -> Result<bool> {
        let load = u32::try_from(self.store.owned_by(&self.host).await?).unwrap_or(u32::MAX);
        let wait =
            (std::time::Duration::from_millis(100) * load).min(self.timing.renew_every() / 2);
        tokio::select! {
            _ = tokio::time::sleep(wait) => Ok(true),
            _ = stop.cancelled() => Ok(false),
        }
    }

    /// Whether the store says the cluster should run (not hibernating, not being deleted,
    /// not gone).
    async fn active(&self, cluster: &str) -> Result<bool> {
        Ok(self
            .store
            .cluster(cluster)
            .await?
            .is_some_and(|c| c.state == ClusterPhase::Active))
    }
}

impl Lease {
    /// Renews the lease until `period` ends. When it cannot (taken over, or no renewal
    /// got through for `fence_after`), it marks the lease lost and cancels `period`, so
    /// the control plane is killed before the lease may be taken over. Each deadline is
    /// written to `deadline_file` (the first before this returns), for the watchdog that
    /// kills the control plane when this broker is frozen past it; the file stays until
    /// the owner clears it, its control plane down.
    pub fn keep(&self, period: CancellationToken, deadline_file: PathBuf) {
        let told = move |cluster: &str, deadline: Instant| {
            if let Err(e) = crate::watchdog::write_deadline(&deadline_file, deadline) {
                warn!(%cluster, "telling the watchdog the lease's deadline: {e:#}");
            }
        };
        told(
            &self.cluster,
            self.claimed_at + self.own.timing.fence_after(),
        );
        let (own, cluster, fence, lost, mut last_ok) = (
            self.own.clone(),
            self.cluster.clone(),
            self.fence,
            self.lost.clone(),
            self.claimed_at,
        );
        // Renewed by the host's one batch a period (`super::renewer`), from now on.
        let mut registered = own.renewer.register(&cluster, fence);
        tokio::spawn(async move {
            let t = own.timing;
            let why = loop {
                let deadline = last_ok + t.fence_after();
                told(&cluster, deadline);
                tokio::select! {
                    _ = tokio::time::sleep_until(deadline) => break "no renewal got through in time",
                    changed = registered.told.changed() => {
                        if changed.is_err() {
                            break "this host stopped renewing";
                        }
                        match *registered.told.borrow_and_update() {
                            Renewal::Sent(sent) => last_ok = last_ok.max(sent),
                            Renewal::Gone => break "another host holds it now, or it was released",
                            Renewal::Pending => {}
                        }
                    }
                    _ = period.cancelled() => return,
                }
            };
            drop(registered);
            warn!(%cluster, fence, "lost the cluster's lease ({why}): killing its control plane");
            lost.store(true, Ordering::SeqCst);
            period.cancel();
        });
    }

    /// The host and fence this lease was claimed as: what an owner's writes are
    /// conditional on.
    pub fn fence(&self) -> crate::store::Fence {
        crate::store::Fence {
            host: self.own.host.clone(),
            fence: self.fence,
        }
    }

    /// Whether the lease was lost.
    pub fn lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// Gives the lease up (the control plane is stopped): another host may claim it at once.
    pub async fn release(self) {
        if let Err(e) = self
            .own
            .store
            .release_owner(&self.cluster, &self.own.host, self.fence)
            .await
        {
            warn!(cluster = %self.cluster, "releasing its lease (it expires by itself): {e:#}");
        }
    }
}

impl Drop for Lease {
    /// Released, lost or dropped on an error path: this host no longer holds it.
    fn drop(&mut self) {
        self.own.metrics.ended(self.lost());
    }
}

/// Says that host `host` runs the cluster (none: no host yet, and this one takes no more),
/// once per change.
pub(super) fn elsewhere(name: &str, life: &Writer, host: Option<&str>) {
    if life.now(Event::OwnedElsewhere {
        host: host.map(str::to_string),
    }) {
        info!(cluster = %name, host = host.unwrap_or("none yet"), "another host runs the cluster");
    }
}

/// Closes whatever still connects to the cluster's database before this host's kine does
/// (`Server::fence_out`): a former owner that did not die is cut off at the storage.
pub(super) async fn fence_out_datastore(
    spec: &Spec,
    metrics: &crate::metrics::Fleet,
) -> Result<()> {
    if let Some((Some(server), db)) = spec.datastore.postgres() {
        let closed = server.fence_out(db).await?;
        metrics.fenced(closed);
        if closed > 0 {
            warn!(cluster = %spec.cluster, closed, "closed connections to the cluster's database that were not this host's: a former owner's");
        }
    }
    Ok(())
}

/// A wake's look at the cluster's lease fails here when the failpoint `broker::wake_lease` is
/// set (the tests' store out of reach at a wake).
pub(super) fn wake_lease_fail_point() -> Result<()> {
    #[cfg(feature = "failpoints")]
    fail::fail_point!("broker::wake_lease", |_| Err(anyhow::anyhow!(
        "failpoint broker::wake_lease"
    )));
    Ok(())
}
