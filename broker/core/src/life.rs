//! A cluster's life on one broker host, as a transition function: given where the cluster is
//! ([`Phase`]) and what happened ([`Event`]), [`next`] says where it is now and what the
//! store must record first. The broker's one writer of a cluster's state carries it out: it
//! writes the record (and only then) the state the operator reads and the front's mount,
//! both derived from the one phase, so the three never disagree and no other code writes
//! them.
//!
//! The record is the one durable fact the life changes: whether the cluster hibernates and
//! since when (`clusters.state`, `hibernating_since`). It is written before the phase is
//! entered, so a crash after it finds the cluster as the record says: awake (brought up at
//! start) or hibernating (started by the first request).

use std::fmt;

/// Where a cluster is on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Being brought up (created, woken, taken over, or the broker starting), at a step
    /// named by `detail`. `serving`: a wake whose apiserver already answers, so the front
    /// passes requests while the rest comes up.
    Starting { detail: String, serving: bool },
    /// Its control plane runs and the front serves it.
    Ready,
    /// Idle: the front holds new requests while its control plane stops.
    Holding,
    /// Its control plane stopped while idle, since `since` (Unix milliseconds); the front
    /// holds the first request and wakes it. `wake_failed`: the last wake failed, and why
    /// (the requests that waited for it are answered with it).
    Hibernating {
        since: i64,
        wake_failed: Option<String>,
    },
    /// Another host of the fleet runs it (`None`: none yet, and this one takes no more).
    Elsewhere { host: Option<String> },
    /// Its control plane is going (the lease lost, or this host drained): requests wait for
    /// the host that runs it next.
    Handing { why: Handover },
    /// Its life on this host failed; `retry_secs`: a fleet host tries again then, holding
    /// requests meanwhile.
    Failed {
        error: String,
        retry_secs: Option<u64>,
    },
    /// Being deleted: nothing of it is served again.
    Deleting,
}

/// Why a cluster's control plane leaves this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handover {
    /// Another host holds its lease now: the control plane is killed at once.
    LeaseLost,
    /// This host is drained: the control plane stops with grace.
    Drained,
}

/// What happened to the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The broker starts the cluster's life (created, or at its own start) from its record:
    /// hibernating since then, or not.
    Begin { hibernating_since: Option<i64> },
    /// A bring-up step began (named).
    Step(String),
    /// A wake's apiserver answers: the front may pass requests.
    ApiserverAnswers,
    /// The control plane is up and everything the cluster gets is applied.
    Up,
    /// The cluster may hibernate: requests are held from now on.
    Idle,
    /// A request was in flight when requests were held: it stays up.
    Busy,
    /// Its control plane stopped for hibernation, at `at`.
    Stopped { at: i64 },
    /// A request asked for the hibernating cluster.
    WakeAsked,
    /// The wake failed, at `at`, for `why`: it hibernates again.
    WakeFailed { at: i64, why: String },
    /// Another host holds the cluster's lease (`None`: no host does, and this one takes no
    /// more).
    OwnedElsewhere { host: Option<String> },
    /// Looking for the lease, this host found the cluster hibernating since `since` (another
    /// host put it to rest): it waits for a request.
    FoundHibernating { since: i64 },
    /// This host holds the cluster's lease: it brings it up (a take-over when another ran it).
    Claimed,
    /// The lease was lost, or this host drained, while the control plane ran.
    Leaving(Handover),
    /// Its leaf certificates are due: the control plane restarts with new ones, the front
    /// holding requests until the apiserver answers again. It stays awake.
    Renew,
    /// The life failed (`retry_secs`: a fleet host tries again then).
    Failed {
        error: String,
        retry_secs: Option<u64>,
    },
    /// The cluster is being deleted.
    Delete,
}

/// The durable fact a transition records before its phase is entered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    /// The cluster is awake: a crash from here brings it up.
    Awake,
    /// The cluster hibernates since then (Unix milliseconds).
    Hibernating { since: i64 },
}

/// A transition: the phase entered, and the record written first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Next {
    pub phase: Phase,
    pub record: Option<Record>,
}

/// An event that does not happen in a phase: a bug in the caller's order, refused so that
/// the cluster's state never jumps where its life has not been.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unexpected {
    pub phase: Phase,
    pub event: Event,
}

impl fmt::Display for Unexpected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} does not happen while {:?}", self.event, self.phase)
    }
}

impl std::error::Error for Unexpected {}

fn to(phase: Phase) -> Result<Next, Unexpected> {
    Ok(Next {
        phase,
        record: None,
    })
}

fn recorded(phase: Phase, record: Record) -> Result<Next, Unexpected> {
    Ok(Next {
        phase,
        record: Some(record),
    })
}

fn starting(detail: impl Into<String>) -> Phase {
    Phase::Starting {
        detail: detail.into(),
        serving: false,
    }
}

/// Where `event` takes a cluster that is at `phase`, and what is recorded first.
pub fn next(phase: &Phase, event: Event) -> Result<Next, Unexpected> {
    use Event as E;
    use Phase as P;
    match (phase, event) {
        // Deleting is the end: nothing else is entered (the life's tasks may still say
        // they stopped or failed on the way out).
        (P::Deleting, _) | (_, E::Delete) => to(P::Deleting),
        (_, E::Begin { hibernating_since }) => to(match hibernating_since {
            Some(since) => P::Hibernating {
                since,
                wake_failed: None,
            },
            None => starting("starting"),
        }),
        // A failure can end any phase: the error is what the operator reads.
        (_, E::Failed { error, retry_secs }) => to(P::Failed { error, retry_secs }),
        // A wake fails wherever its period got to (its bring-up, or a store write at its
        // end): it hibernates again.
        (_, E::WakeFailed { at, why }) => recorded(
            P::Hibernating {
                since: at,
                wake_failed: Some(why),
            },
            Record::Hibernating { since: at },
        ),
        (
            phase,
            event @ (E::OwnedElsewhere { .. }
            | E::FoundHibernating { .. }
            | E::Claimed
            | E::Leaving(_)),
        ) => fleet(phase, event),
        (phase, event) => period(phase, event),
    }
}

/// An awake period and hibernation: bring-up, ready, idle, stopped, woken.
fn period(phase: &Phase, event: Event) -> Result<Next, Unexpected> {
    use Event as E;
    use Phase as P;
    match (phase, event) {
        (P::Starting { serving, .. }, E::Step(detail)) => to(P::Starting {
            detail,
            serving: *serving,
        }),
        (P::Failed { .. } | P::Elsewhere { .. } | P::Handing { .. }, E::Step(detail)) => {
            to(starting(detail))
        }
        (P::Starting { detail, .. }, E::ApiserverAnswers) => to(P::Starting {
            detail: detail.clone(),
            serving: true,
        }),
        (P::Starting { .. }, E::Up) => to(P::Ready),
        (P::Ready, E::Idle) => to(P::Holding),
        (P::Holding, E::Busy) => to(P::Ready),
        // Idle or not, the period ends for new certificates and the next one begins at once.
        (P::Ready | P::Holding, E::Renew) => to(starting("renewing its certificates")),
        (P::Holding, E::Stopped { at }) => recorded(
            P::Hibernating {
                since: at,
                wake_failed: None,
            },
            Record::Hibernating { since: at },
        ),
        (P::Hibernating { .. }, E::WakeAsked) => recorded(starting("waking"), Record::Awake),
        (phase, event) => unexpected(phase, event),
    }
}

/// A fleet's host: the lease held elsewhere, claimed here, or lost.
fn fleet(phase: &Phase, event: Event) -> Result<Next, Unexpected> {
    use Event as E;
    use Phase as P;
    // A fleet host waits for the lease from its start, a failure, a hand-over, a wake
    // another host took, or a rest another host's period ended in.
    let waiting = matches!(
        phase,
        P::Starting { .. }
            | P::Elsewhere { .. }
            | P::Failed { .. }
            | P::Handing { .. }
            | P::Hibernating { .. }
    );
    match (phase, event) {
        (_, E::OwnedElsewhere { host }) if waiting => to(P::Elsewhere { host }),
        (_, E::FoundHibernating { since }) if waiting => to(P::Hibernating {
            since,
            wake_failed: None,
        }),
        (P::Starting { detail, serving }, E::Claimed) => to(P::Starting {
            detail: detail.clone(),
            serving: *serving,
        }),
        (_, E::Claimed) if waiting => to(starting("claimed: taking the cluster over")),
        (P::Starting { .. } | P::Ready | P::Holding, E::Leaving(why)) => to(P::Handing { why }),
        (phase, event) => unexpected(phase, event),
    }
}

fn unexpected(phase: &Phase, event: Event) -> Result<Next, Unexpected> {
    Err(Unexpected {
        phase: phase.clone(),
        event,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hib(since: i64) -> Phase {
        Phase::Hibernating {
            since,
            wake_failed: None,
        }
    }

    fn go(phase: &Phase, event: Event) -> Next {
        next(phase, event.clone()).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Walks `events` from `start`, giving each phase entered and each record written.
    fn walk(start: Phase, events: Vec<Event>) -> (Phase, Vec<Record>) {
        let mut records = Vec::new();
        let mut phase = start;
        for e in events {
            let n = go(&phase, e);
            records.extend(n.record);
            phase = n.phase;
        }
        (phase, records)
    }

    #[test]
    fn create_start_ready_idle_hibernate_wake() {
        let (p, r) = walk(
            starting("x"),
            vec![
                Event::Begin {
                    hibernating_since: None,
                },
                Event::Step("kine".into()),
                Event::Step("apiserver".into()),
                Event::Up,
                Event::Idle,
                Event::Stopped { at: 10 },
            ],
        );
        assert_eq!(p, hib(10));
        assert_eq!(r, vec![Record::Hibernating { since: 10 }]);
        let (p, r) = walk(
            p,
            vec![
                Event::WakeAsked,
                Event::Step("apiserver".into()),
                Event::ApiserverAnswers,
                Event::Step("controllers".into()),
            ],
        );
        assert_eq!(
            p,
            Phase::Starting {
                detail: "controllers".into(),
                serving: true
            },
            "a wake's front stays open through its later steps"
        );
        assert_eq!(
            r,
            vec![Record::Awake],
            "awake is recorded before anything starts"
        );
        assert_eq!(go(&p, Event::Up).phase, Phase::Ready);
    }

    #[test]
    fn a_renewal_holds_requests_and_keeps_it_awake() {
        for from in [Phase::Ready, Phase::Holding] {
            let n = go(&from, Event::Renew);
            assert_eq!(n.phase, starting("renewing its certificates"));
            assert_eq!(n.record, None, "it stays awake: nothing to record");
        }
        let (p, r) = walk(
            Phase::Ready,
            vec![
                Event::Renew,
                Event::Claimed,
                Event::ApiserverAnswers,
                Event::Up,
            ],
        );
        assert_eq!((p, r), (Phase::Ready, vec![]));
        assert!(
            next(&starting("x"), Event::Renew).is_err(),
            "not mid bring-up"
        );
        assert!(
            next(&hib(1), Event::Renew).is_err(),
            "nothing runs to renew"
        );
    }

    #[test]
    fn a_request_in_flight_keeps_it_up_and_a_failed_wake_rests_again() {
        assert_eq!(go(&Phase::Holding, Event::Busy).phase, Phase::Ready);
        let n = go(
            &starting("waking"),
            Event::WakeFailed {
                at: 7,
                why: "no ports".into(),
            },
        );
        assert_eq!(
            n,
            Next {
                phase: Phase::Hibernating {
                    since: 7,
                    wake_failed: Some("no ports".into())
                },
                record: Some(Record::Hibernating { since: 7 }),
            }
        );
        // The next request tries again.
        assert_eq!(go(&n.phase, Event::WakeAsked).record, Some(Record::Awake));
    }

    #[test]
    fn a_cluster_at_rest_at_start_is_not_recorded_again() {
        let n = go(
            &starting("starting"),
            Event::Begin {
                hibernating_since: Some(3),
            },
        );
        assert_eq!(
            n,
            Next {
                phase: hib(3),
                record: None
            }
        );
    }

    #[test]
    fn fleet_lease_lost_drain_take_over_and_rest_found() {
        // Lost while ready: going, then another host runs it, then this one takes it back.
        let (p, r) = walk(
            Phase::Ready,
            vec![
                Event::Leaving(Handover::LeaseLost),
                Event::OwnedElsewhere {
                    host: Some("h2".into()),
                },
            ],
        );
        assert_eq!(
            p,
            Phase::Elsewhere {
                host: Some("h2".into())
            }
        );
        assert!(
            r.is_empty(),
            "a lost lease records nothing: another host owns the row"
        );
        let n = go(&p, Event::Claimed);
        assert_eq!(n.phase, starting("claimed: taking the cluster over"));
        assert_eq!(n.record, None);
        // Drained while starting.
        assert_eq!(
            go(&starting("kine"), Event::Leaving(Handover::Drained)).phase,
            Phase::Handing {
                why: Handover::Drained
            }
        );
        // Another host put it to rest: found so, not recorded again.
        let n = go(
            &Phase::Elsewhere { host: None },
            Event::FoundHibernating { since: 5 },
        );
        assert_eq!(
            n,
            Next {
                phase: hib(5),
                record: None
            }
        );
        // A wake another host took: this one waits for its lease.
        assert_eq!(
            go(&hib(5), Event::OwnedElsewhere { host: None }).phase,
            Phase::Elsewhere { host: None }
        );
    }

    #[test]
    fn a_failure_is_told_and_a_retry_starts_again() {
        let f = go(
            &Phase::Ready,
            Event::Failed {
                error: "store".into(),
                retry_secs: Some(2),
            },
        );
        assert_eq!(
            f.phase,
            Phase::Failed {
                error: "store".into(),
                retry_secs: Some(2)
            }
        );
        assert_eq!(
            go(&f.phase, Event::Claimed).phase,
            starting("claimed: taking the cluster over")
        );
        assert_eq!(
            go(&f.phase, Event::Step("kine".into())).phase,
            starting("kine")
        );
    }

    #[test]
    fn deleting_is_the_end() {
        for p in [
            Phase::Ready,
            hib(1),
            Phase::Elsewhere { host: None },
            Phase::Holding,
        ] {
            assert_eq!(
                go(&p, Event::Delete),
                Next {
                    phase: Phase::Deleting,
                    record: None
                }
            );
        }
        for e in [
            Event::Up,
            Event::WakeAsked,
            Event::Claimed,
            Event::Stopped { at: 1 },
        ] {
            assert_eq!(go(&Phase::Deleting, e).phase, Phase::Deleting);
        }
    }

    #[test]
    fn events_out_of_order_are_refused() {
        for (p, e) in [
            (hib(1), Event::Up),
            (hib(1), Event::Stopped { at: 2 }),
            (Phase::Ready, Event::WakeAsked),
            (Phase::Ready, Event::Stopped { at: 2 }),
            (Phase::Elsewhere { host: None }, Event::Up),
            (Phase::Holding, Event::ApiserverAnswers),
            (hib(1), Event::Leaving(Handover::Drained)),
        ] {
            let r = next(&p, e.clone());
            assert_eq!(
                r,
                Err(Unexpected {
                    phase: p.clone(),
                    event: e
                })
            );
        }
    }

    /// Only three transitions record, and each records what its phase says.
    #[test]
    fn records_follow_the_phase_entered() {
        let phases = [
            starting("s"),
            Phase::Ready,
            Phase::Holding,
            hib(1),
            Phase::Elsewhere { host: None },
            Phase::Handing {
                why: Handover::Drained,
            },
            Phase::Failed {
                error: "e".into(),
                retry_secs: None,
            },
            Phase::Deleting,
        ];
        let events = [
            Event::Begin {
                hibernating_since: None,
            },
            Event::Begin {
                hibernating_since: Some(1),
            },
            Event::Step("s".into()),
            Event::ApiserverAnswers,
            Event::Up,
            Event::Idle,
            Event::Busy,
            Event::Stopped { at: 9 },
            Event::WakeAsked,
            Event::WakeFailed {
                at: 9,
                why: "w".into(),
            },
            Event::OwnedElsewhere { host: None },
            Event::FoundHibernating { since: 9 },
            Event::Claimed,
            Event::Leaving(Handover::LeaseLost),
            Event::Renew,
            Event::Failed {
                error: "e".into(),
                retry_secs: None,
            },
            Event::Delete,
        ];
        for p in &phases {
            for e in &events {
                let Ok(n) = next(p, e.clone()) else { continue };
                match n.record {
                    Some(Record::Hibernating { since }) => assert!(
                        matches!(n.phase, Phase::Hibernating { since: s, .. } if s == since),
                        "{p:?} {e:?} -> {n:?}"
                    ),
                    Some(Record::Awake) => assert!(
                        matches!(n.phase, Phase::Starting { .. }),
                        "{p:?} {e:?} -> {n:?}"
                    ),
                    None => {}
                }
            }
        }
    }
}
