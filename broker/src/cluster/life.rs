//! One cluster's life while the broker runs: awake periods and hibernation, until the broker
//! stops or the cluster is deleted (then the control plane is stopped; nodes and leases stay).
//!
//! Awake: one period ([`super::period`]): its control plane brought up (adopted after a
//! crash), the cluster mounted at the front -- first as starting, so its requests are held,
//! then with its apiserver -- and its scale driver run, while [`super::idle`] asks the core
//! whether it may hibernate. Hibernating (docs/hibernation.md): every component stopped, its
//! ports kept, the store saying so with since when, the front holding its first request and
//! waking it. A fleet's host runs a period only under the cluster's lease
//! ([`super::ownership`]). Every change of the cluster's state goes through its one writer
//! ([`super::writer`]), as the pure core's [`socialweb_broker_core::life`] says.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use socialweb_broker_core::ClusterPhase;
use socialweb_broker_core::life::Event;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::Clusters;
use super::ownership::{Acquired, elsewhere, fence_out_datastore, wake_lease_fail_point};
use super::period::{Ended, Start};
use super::writer::{Writer, now_millis};
use crate::control_plane::runner::{Spec, stop_leftovers};
use crate::front::Mount;

/// How long a fleet's host waits after the `failures`-th failure in a row before it tries
/// again: 2 s, doubled each failure, at most a minute.
fn retry_delay(failures: u32) -> Duration {
    Duration::from_secs(1 << failures.min(6)).min(Duration::from_secs(60))
}

/// What a turn of the life begins with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    /// Asleep until woken (here or elsewhere).
    Sleep,
    /// An awake period.
    Run,
    /// An awake period after one that ended for new certificates.
    Renew,
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
    /// Runs the life of cluster `name` until `stop`.
    pub(super) async fn live(
        self: &Arc<Self>,
        name: &str,
        life: &Writer,
        stop: CancellationToken,
    ) -> Result<()> {
        let record = self
            .store
            .cluster(name)
            .await?
            .ok_or_else(|| anyhow::anyhow!("no cluster {name:?} in the store"))?;
        let spec = self.spec(&record, self.ports(name).await?)?;
        if !self.keep_authorities(&spec, &stop).await? {
            return Ok(());
        }
        self.front.mount(Mount {
            cluster: name.to_string(),
            account_hash: record
                .owner
                .as_deref()
                .map(socialweb_broker_core::names::account_hash),
            users: self.access.users_trust(&self.dir_of(&record))?,
            state: life.mount_state(),
        });
        let asleep = record.state == ClusterPhase::Hibernating;
        if asleep || self.ownership().is_some() {
            // A hibernating cluster runs nothing, whatever a crash left; nor does a fleet's
            // cluster before this host holds its lease (another host may have taken it over
            // while this broker was down: no leftover is adopted).
            stop_leftovers(&spec).await;
        }
        if asleep {
            life.now(Event::Begin {
                hibernating_since: Some(record.hibernating_since.unwrap_or_else(now_millis)),
            });
        }
        let mut failures = 0;
        let mut then = if asleep { Then::Sleep } else { Then::Run };
        loop {
            match self.turn(&spec, life, &stop, then).await {
                Ok(Ended::Stopped) => return Ok(()),
                Ok(Ended::Hibernated) => then = Then::Sleep,
                Ok(Ended::Lost | Ended::Moved) => then = Then::Run,
                Ok(Ended::Renewed) => then = Then::Renew,
                // A fleet's host tries again: the store may be out of reach for a while (its
                // lease lapses meanwhile, for another host), and ending here would leave the
                // cluster to the other hosts until this broker restarts -- or, after an outage
                // that every host saw, to none.
                Err(e) if self.ownership().is_some() => {
                    failures += 1;
                    if !self.try_again(name, life, &e, failures, &stop).await {
                        return Ok(());
                    }
                    // Whether it hibernates meanwhile, the lease's claim reads in the store.
                    then = Then::Run;
                    continue;
                }
                Err(e) => return Err(e),
            }
            failures = 0;
        }
    }

    /// One turn of the cluster's life: asleep (`Then::Sleep`) until woken here or
    /// elsewhere, then an awake period. A failed wake leaves it hibernating; the next
    /// request tries again.
    async fn turn(
        self: &Arc<Self>,
        spec: &Spec,
        life: &Writer,
        stop: &CancellationToken,
        then: Then,
    ) -> Result<Ended> {
        let name = spec.cluster.as_str();
        let start = match then {
            Then::Run => Start::Plain,
            Then::Renew => Start::Renewal,
            Then::Sleep => match self.sleep(name, life, stop).await? {
                Slept::Woken(t0) => Start::Woken(t0),
                Slept::Elsewhere => Start::Plain,
                Slept::Stopped => return Ok(Ended::Stopped),
            },
        };
        match self.owned(spec, life, stop, start).await {
            Err(e) if start.woke().is_some() => {
                warn!(cluster = %name, "waking: {e:#}");
                self.settings.metrics.wake_failed();
                life.on_even_unrecorded(Event::WakeFailed {
                    at: now_millis(),
                    why: format!("{e:#}"),
                })
                .await;
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
        life: &Writer,
        e: &anyhow::Error,
        failures: u32,
        stop: &CancellationToken,
    ) -> bool {
        let delay = retry_delay(failures);
        warn!(cluster = %name, "{e:#}; this host tries again in {delay:?}");
        life.now(Event::Failed {
            error: format!("{e:#}"),
            retry_secs: Some(delay.as_secs()),
        });
        tokio::select! {
            _ = tokio::time::sleep(delay) => true,
            _ = stop.cancelled() => false,
        }
    }

    /// Sleeps until a wake is asked for (when, `Some`) or `stop` (`None`). The store says
    /// the cluster is awake before anything starts: a crash from there on brings it up.
    async fn sleep(&self, name: &str, life: &Writer, stop: &CancellationToken) -> Result<Slept> {
        let metrics = &self.settings.metrics;
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
        life.on(Event::WakeAsked).await?;
        Ok(Slept::Woken(t0))
    }

    /// The lease this host writes cluster `name` under from now on (`None`: none), for its
    /// state's writer and its provisions alike: every write of either is conditional on it.
    fn fenced_by(&self, name: &str, life: &Writer, fence: Option<crate::store::Fence>) {
        life.fenced_by(fence.clone());
        self.provisioner.fenced_by(name, fence);
    }

    /// One awake period on this host. In a fleet, it first waits for the cluster's lease
    /// (the front and the state saying which host runs it meanwhile), keeps it renewed
    /// while the control plane runs, and gives it up when the cluster hibernates or the
    /// broker stops; a lost lease kills the control plane.
    async fn owned(
        self: &Arc<Self>,
        spec: &Spec,
        life: &Writer,
        stop: &CancellationToken,
        start: Start,
    ) -> Result<Ended> {
        let Some(own) = self.ownership() else {
            return self.awake(spec, life, stop, start, None).await;
        };
        let name = spec.cluster.as_str();
        let waiting = |host: Option<&str>| elsewhere(name, life, host);
        let drained = self.drained();
        let mut failures = 0;
        let acquired = loop {
            let looked = match start.woke().map(|_| wake_lease_fail_point()) {
                Some(Err(e)) => Err(e),
                _ => {
                    own.acquire(name, start.wanted(), &drained, waiting, stop)
                        .await
                }
            };
            match looked {
                Ok(a) => break a,
                // A wake keeps its request through a store out of reach: failing it would
                // record the cluster as hibernating while another host may run it, and if
                // that host died then, no host would take the cluster over (a hibernating
                // cluster waits for a request). The front holds the request meanwhile.
                Err(e) if start.wanted() => {
                    failures += 1;
                    let delay = retry_delay(failures);
                    warn!(cluster = %name, "waking: looking at its lease: {e:#}; this host tries again in {delay:?}");
                    life.now(Event::Step(format!(
                        "waking: waiting for the store ({e:#})"
                    )));
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
                life.now(Event::FoundHibernating {
                    since: now_millis(),
                });
                return Ok(Ended::Hibernated);
            }
            Acquired::Stopped => return Ok(Ended::Stopped),
        };
        life.now(Event::Claimed);
        self.fenced_by(name, life, Some(lease.fence()));
        if let Err(e) = fence_out_datastore(spec, &self.settings.metrics.fleet).await {
            self.fenced_by(name, life, None);
            lease.release().await;
            return Err(e);
        }
        let ended = self.awake(spec, life, stop, start, Some(&lease)).await;
        self.fenced_by(name, life, None);
        // Its control plane is down: nothing left for the watchdog to kill.
        crate::watchdog::clear(&spec.dir.join(crate::watchdog::DEADLINE_FILE));
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
}
