//! The one writer of a cluster's state on this host. Its life tells it what happened (a
//! [`life::Event`]); the pure core's [`life::next`] says which phase that enters and what
//! the store records first; the writer writes that record, then the state the operator
//! reads ([`ClusterState`]) and the front's mount ([`MountState`]), both derived here from
//! the one phase. Nothing else writes any of the three, so they cannot disagree, and the
//! fleet's fence has one place to guard.

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use anyhow::Result;
use socialweb_broker_core::life::{self, Event, Handover, Phase, Record};
use socialweb_broker_core::{from_millis, millis};
use tokio::sync::watch;
use tracing::{debug, error, warn};

use crate::command::ClusterState;
use crate::front::proxy::Upstream;
use crate::front::{Front, MountState};
use crate::store::{Fence, Store};

/// What a cluster with no host yet is told, on a fleet's host that takes no more.
const NO_HOST: &str = "none yet: this host takes no more (drained, or at fleet.max_awake)";

/// A cluster's state writer (one per cluster and life task).
#[derive(Debug)]
pub(super) struct Writer {
    name: String,
    phase: Mutex<Phase>,
    told: watch::Sender<ClusterState>,
    front: Arc<Front>,
    store: Store,
    /// The way to the apiserver of the awake period, once it answers.
    upstream: Mutex<Option<Upstream>>,
    /// The lease this host runs the cluster under (a fleet's): every record is conditional
    /// on it, so an owner that lost it (frozen, cut off) cannot record over the next one.
    fence: Mutex<Option<Fence>>,
    /// Asks the awake period to end and start again (`cluster rotate-ca`).
    restart: tokio::sync::Notify,
}

impl Writer {
    /// A writer for cluster `name`, starting; the receiver is what `cluster list` reads.
    pub fn new(
        name: &str,
        front: Arc<Front>,
        store: Store,
    ) -> (Writer, watch::Receiver<ClusterState>) {
        let phase = Phase::Starting {
            detail: "starting".into(),
            serving: false,
        };
        let (told, rx) = watch::channel(told(&phase));
        let w = Writer {
            name: name.to_string(),
            phase: Mutex::new(phase),
            told,
            front,
            store,
            upstream: Mutex::new(None),
            fence: Mutex::new(None),
            restart: tokio::sync::Notify::new(),
        };
        (w, rx)
    }

    /// The front's mount state for the phase now (a new mount's).
    pub fn mount_state(&self) -> MountState {
        let phase = self.phase.lock().expect("lock").clone();
        let up = self.upstream.lock().expect("lock").clone();
        mount_state(&phase, up.as_ref()).unwrap_or(MountState::Starting)
    }

    /// The awake period's way to its apiserver: what a serving phase mounts.
    pub fn serve(&self, upstream: Upstream) {
        *self.upstream.lock().expect("lock") = Some(upstream);
    }

    /// Asks the awake period, if there is one, to start the control plane again; a cluster
    /// not awake is not woken (nothing is kept for a later period).
    pub fn ask_restart(&self) {
        self.restart.notify_waiters();
    }

    /// Returns when [`ask_restart`](Self::ask_restart) is called after this started.
    pub fn restart_asked(&self) -> tokio::sync::futures::Notified<'_> {
        self.restart.notified()
    }

    /// The lease the cluster's records are conditional on from now on (`None`: no lease,
    /// outside a fleet or between its periods).
    pub fn fenced_by(&self, fence: Option<Fence>) {
        *self.fence.lock().expect("lock") = fence;
    }

    /// Carries out `event`: its record first -- an error leaves the phase as it was and is
    /// returned -- then the phase. `Ok(true)`: the phase changed.
    pub async fn on(&self, event: Event) -> Result<bool> {
        let Some(next) = self.next(event) else {
            return Ok(false);
        };
        if let Some(r) = next.record {
            self.record(r).await?;
        }
        Ok(self.enter(next.phase))
    }

    /// As [`Writer::on`], but the phase is entered even when its record fails (logged): a
    /// failed wake tells its waiting requests why though the store still says awake (the
    /// next start then brings the cluster up).
    pub async fn on_even_unrecorded(&self, event: Event) -> bool {
        let Some(next) = self.next(event) else {
            return false;
        };
        if let Some(r) = next.record
            && let Err(e) = self.record(r).await
        {
            warn!(cluster = %self.name, "recording {r:?}: {e:#}");
        }
        self.enter(next.phase)
    }

    /// Carries out an event that records nothing, from code that cannot wait (a bring-up's
    /// progress). `true`: the phase changed.
    pub fn now(&self, event: Event) -> bool {
        let Some(next) = self.next(event) else {
            return false;
        };
        if next.record.is_some() {
            error!(cluster = %self.name, "a transition that records was told without waiting: {next:?}");
            return false;
        }
        self.enter(next.phase)
    }

    fn next(&self, event: Event) -> Option<life::Next> {
        let phase = self.phase.lock().expect("lock").clone();
        match life::next(&phase, event) {
            Ok(n) => Some(n),
            Err(e) => {
                // A caller's order is wrong: the state stays where the life has been.
                error!(cluster = %self.name, "{e}");
                None
            }
        }
    }

    async fn record(&self, r: Record) -> Result<()> {
        let since = match r {
            Record::Awake => None,
            Record::Hibernating { since } => Some(from_millis(since)),
        };
        let fence = self.fence.lock().expect("lock").clone();
        self.store
            .set_hibernating(&self.name, since, fence.as_ref())
            .await
    }

    /// Enters `phase`: the operator's state and the front's mount, from it alone. `true`:
    /// it changed.
    fn enter(&self, phase: Phase) -> bool {
        let mut now = self.phase.lock().expect("lock");
        // A deletion entered while a record was written is the end: what the life does on
        // its way out is not shown.
        if *now == phase || *now == Phase::Deleting {
            return false;
        }
        debug!(cluster = %self.name, from = ?*now, to = ?phase, "cluster phase");
        if !matches!(
            phase,
            Phase::Starting { .. } | Phase::Ready | Phase::Holding
        ) {
            // The period's apiserver is gone with it.
            *self.upstream.lock().expect("lock") = None;
        }
        let up = self.upstream.lock().expect("lock").clone();
        if let Some(m) = mount_state(&phase, up.as_ref()) {
            self.front.set_state(&self.name, m);
        }
        self.told.send_replace(told(&phase));
        *now = phase;
        true
    }
}

/// When the cluster hibernates since now.
pub(super) fn now_millis() -> i64 {
    millis(SystemTime::now())
}

/// The state the operator reads, for `phase`.
fn told(phase: &Phase) -> ClusterState {
    match phase {
        Phase::Starting { detail, .. } => ClusterState::Starting {
            detail: detail.clone(),
        },
        // Holding requests while it stops is still ready until it has stopped.
        Phase::Ready | Phase::Holding => ClusterState::Ready,
        Phase::Hibernating { since, .. } => ClusterState::Hibernating { since: *since },
        Phase::Elsewhere { host } => ClusterState::Elsewhere {
            host: host.clone().unwrap_or_else(|| NO_HOST.to_string()),
        },
        Phase::Handing { why } => ClusterState::Starting {
            detail: match why {
                Handover::LeaseLost => "handing over: another host holds its lease",
                Handover::Drained => "handing over: this host is drained",
            }
            .into(),
        },
        Phase::Failed {
            error,
            retry_secs: None,
        } => ClusterState::Failed {
            error: error.clone(),
        },
        Phase::Failed {
            error,
            retry_secs: Some(s),
        } => ClusterState::Failed {
            error: format!("{error} (this host tries again in {s}s)"),
        },
        Phase::Deleting => ClusterState::Deleting,
    }
}

/// The front's mount state for `phase`, with the awake period's apiserver (`None`: the
/// mount is left as it is -- a deletion unmounts it).
fn mount_state(phase: &Phase, up: Option<&Upstream>) -> Option<MountState> {
    let serving = || {
        Some(match up {
            Some(u) => MountState::Up(Box::new(u.clone())),
            None => MountState::Starting,
        })
    };
    match phase {
        Phase::Starting { serving: true, .. } | Phase::Ready => serving(),
        // Requests wait: for the bring-up, for the next owner.
        Phase::Starting { serving: false, .. } | Phase::Handing { .. } => {
            Some(MountState::Starting)
        }
        // Not for a failure: the store out of reach, say, holds for nothing (another host
        // may run it meanwhile, and this one cannot even say which). Answered at once, for
        // the client to retry, here or at another host.
        Phase::Failed { .. } => Some(MountState::Unavailable(match told(phase) {
            ClusterState::Failed { error } => error,
            _ => "failed".into(),
        })),
        Phase::Holding
        | Phase::Hibernating {
            wake_failed: None, ..
        } => Some(MountState::Hibernating),
        Phase::Hibernating {
            wake_failed: Some(why),
            ..
        } => Some(MountState::WakeFailed(why.clone())),
        Phase::Elsewhere { host } => Some(MountState::Elsewhere(host.clone())),
        Phase::Deleting => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two enums, derived from one phase, agree on every phase.
    #[test]
    fn the_state_and_the_mount_agree() {
        let cases = [
            (
                Phase::Starting {
                    detail: "kine".into(),
                    serving: false,
                },
                "starting",
                Some("starting"),
            ),
            (Phase::Ready, "ready", Some("starting")), // no upstream known: held
            (Phase::Holding, "ready", Some("hibernating")),
            (
                Phase::Hibernating {
                    since: 1,
                    wake_failed: None,
                },
                "hibernating",
                Some("hibernating"),
            ),
            (
                Phase::Hibernating {
                    since: 1,
                    wake_failed: Some("x".into()),
                },
                "hibernating",
                Some("wake_failed"),
            ),
            (
                Phase::Elsewhere { host: None },
                "elsewhere",
                Some("elsewhere"),
            ),
            (
                Phase::Handing {
                    why: Handover::Drained,
                },
                "starting",
                Some("starting"),
            ),
            (
                Phase::Failed {
                    error: "e".into(),
                    retry_secs: Some(4),
                },
                "failed",
                Some("unavailable"),
            ),
            (Phase::Deleting, "deleting", None),
        ];
        for (phase, state, mount) in cases {
            let s = serde_json::to_value(told(&phase)).unwrap();
            assert_eq!(s["state"], state, "{phase:?}");
            let m = mount_state(&phase, None).map(|m| match m {
                MountState::Starting => "starting",
                MountState::Up(_) => "up",
                MountState::Hibernating => "hibernating",
                MountState::WakeFailed(_) => "wake_failed",
                MountState::Elsewhere(_) => "elsewhere",
                MountState::Unavailable(_) => "unavailable",
            });
            assert_eq!(m, mount, "{phase:?}");
        }
        let f = told(&Phase::Failed {
            error: "e".into(),
            retry_secs: Some(4),
        });
        assert_eq!(
            f,
            ClusterState::Failed {
                error: "e (this host tries again in 4s)".into()
            }
        );
        assert_eq!(
            told(&Phase::Elsewhere { host: None }),
            ClusterState::Elsewhere {
                host: NO_HOST.into()
            }
        );
    }
}
