//! Renting one node, as a transition function: given a provision's step and what the
//! executor saw at it, [`next`] says whether to advance, look again later, accept bids,
//! accept again, or fail, and why. The executor (`socialweb-broker`'s `provision`) does the
//! I/O of each step -- writes the join token, posts the RFP, reads the lease, looks at the
//! Node -- and writes every step to the store before it acts on it, so a broker that crashes
//! anywhere repeats the step's call and never guesses.

use std::time::Duration;

use socialweb_market::{Bid, Lease, LeaseState};

use crate::bids;
use crate::records::{Provision, Step};
use crate::scale::go_duration;

/// The timing a provision runs by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// How long to wait for bids on an RFP.
    pub bid_deadline: Duration,
    /// Bids are taken once none new came for this long.
    pub bid_settle: Duration,
    /// How often the RFP is read while bids come in.
    pub bid_poll: Duration,
    /// How long a lease may boot, and then its Node take to join.
    pub boot_timeout: Duration,
    /// How often the lease and the Node are read while they come up.
    pub poll: Duration,
}

impl Limits {
    /// The defaults around the configured bid deadline and boot timeout.
    pub fn new(bid_deadline: Duration, boot_timeout: Duration) -> Limits {
        Limits {
            bid_deadline,
            bid_settle: Duration::from_millis(300),
            bid_poll: Duration::from_millis(100),
            boot_timeout,
            poll: Duration::from_millis(250),
        }
    }

    /// The bid window these limits give.
    pub fn bids(&self) -> bids::Window {
        bids::Window {
            deadline: self.bid_deadline,
            settle: self.bid_settle,
            poll: self.bid_poll,
        }
    }
}

/// What the executor saw at a step.
#[derive(Debug, Clone, Copy)]
pub enum Seen<'a> {
    /// `planned`: the join token is written into the cluster.
    TokenWritten,
    /// `rfp_sent`: the RFP is posted (again, after a crash: its id makes it the same); the
    /// bids so far, how long they have been waited for, and how long since a new one came.
    Bids {
        bids: &'a [Bid],
        waited: Duration,
        quiet: Duration,
    },
    /// `accepted` and `booting`: the lease as the provider has it.
    Lease(Option<&'a Lease>),
    /// `running`: whether the Node is Ready.
    Node { ready: bool },
    /// `releasing`: cordoned, released at the provider, forgotten in the cluster.
    Released,
}

/// What to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Write this step and go on from it.
    Advance(Step),
    /// Stay, and look again after this long.
    PollAfter(Duration),
    /// Accept these bids, best first, until one takes (writing `accepted` before each).
    Accept(Vec<Bid>),
    /// The provider has no lease for our acceptance: send the same acceptance again.
    Reaccept,
    /// Fail the provision with this reason (releasing a lease that may exist first).
    Fail(String),
}

fn lease_ended(l: &Lease) -> String {
    format!(
        "lease {} {}: {}",
        l.id,
        l.state.as_str(),
        l.reason.as_deref().unwrap_or_default()
    )
}

/// The transition of `p` at its step, given what was `seen` there, `in_step` after the
/// executor came to it.
pub fn next(p: &Provision, seen: Seen<'_>, in_step: Duration, l: &Limits) -> Next {
    match (p.state, seen) {
        (Step::Planned, Seen::TokenWritten) => Next::Advance(Step::RfpSent),
        (
            Step::RfpSent,
            Seen::Bids {
                bids,
                waited,
                quiet,
            },
        ) => match bids::wait(bids.len(), waited, quiet, &l.bids()) {
            bids::Wait::More(after) => Next::PollAfter(after),
            bids::Wait::Done if bids.is_empty() => Next::Fail(format!(
                "no bid before the deadline ({})",
                go_duration(l.bid_deadline)
            )),
            bids::Wait::Done => Next::Accept(bids::choose(bids.to_vec())),
        },
        (Step::Accepted, Seen::Lease(None)) => Next::Reaccept,
        (Step::Accepted | Step::Booting, Seen::Lease(Some(lease))) => match lease.state {
            LeaseState::Running => Next::Advance(Step::Running),
            LeaseState::Booting if p.state == Step::Accepted => Next::Advance(Step::Booting),
            LeaseState::Booting if in_step > l.boot_timeout => Next::Fail(format!(
                "still booting after {}",
                go_duration(l.boot_timeout)
            )),
            LeaseState::Booting => Next::PollAfter(l.poll),
            LeaseState::Failed | LeaseState::Released => Next::Fail(lease_ended(lease)),
        },
        (Step::Booting, Seen::Lease(None)) => {
            Next::Fail(format!("the provider does not have lease {}", p.lease_id))
        }
        (Step::Running, Seen::Node { ready: true }) => Next::Advance(Step::Joined),
        (Step::Running, Seen::Node { ready: false }) if in_step > l.boot_timeout => {
            Next::Fail(format!(
                "the node did not join within {}",
                go_duration(l.boot_timeout)
            ))
        }
        (Step::Running, Seen::Node { ready: false }) => Next::PollAfter(l.poll),
        (Step::Releasing, Seen::Released) => Next::Advance(Step::Released),
        (step, seen) => Next::Fail(format!(
            "internal error: step {} cannot follow from {seen:?}",
            step.as_str()
        )),
    }
}

/// Failed provisions since the last one that joined or was released: while provisions keep
/// failing the market may be refusing us, and planning backs off ([`plan_backoff`]).
pub fn recent_failures(provisions: &[Provision]) -> u32 {
    provisions
        .iter()
        .rev()
        .take_while(|x| x.state != Step::Joined && x.state != Step::Released)
        .filter(|x| x.state == Step::Failed)
        .count() as u32
}

/// How long to wait before planning again after `failures` in a row: 1 s, doubling, at most
/// 64 s.
pub fn plan_backoff(failures: u32) -> Duration {
    Duration::from_secs(1 << failures.min(6))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn limits() -> Limits {
        Limits::new(Duration::from_secs(5), Duration::from_secs(120))
    }

    fn at(step: Step) -> Provision {
        Provision {
            id: "p1".into(),
            cluster: "c".into(),
            node: "c-1".into(),
            state: step,
            rfp_id: "r1".into(),
            bid_id: None,
            lease_id: "l1".into(),
            provider: None,
            token_id: "abcdef".into(),
            token_secret: String::new(),
            mesh_key: String::new(),
            endpoint: String::new(),
            node_ip: None,
            spec: None,
            topology: Default::default(),
            reason: None,
            attempts: 0,
            created_at: 0,
            updated_at: 0,
        }
    }

    fn bid(id: &str, price: u64) -> Bid {
        Bid {
            id: id.into(),
            rfp_id: "r1".into(),
            provider: "p".into(),
            price_micros_per_hour: price,
            eta_ms: 1000,
            expires_at: String::new(),
            machine: None,
        }
    }

    fn lease(state: LeaseState, reason: Option<&str>) -> Lease {
        Lease {
            id: "l1".into(),
            rfp_id: "r1".into(),
            bid_id: "b".into(),
            state,
            reason: reason.map(str::to_string),
            tags: BTreeMap::new(),
            node_addr: None,
            created_at: String::new(),
            updated_at: String::new(),
        }
    }

    const S: fn(u64) -> Duration = Duration::from_secs;
    const MS: fn(u64) -> Duration = Duration::from_millis;

    /// Every step with what can be seen there, and what follows.
    #[test]
    fn the_transition_table() {
        let l = limits();
        let two = [bid("b-dear", 9), bid("b-cheap", 3)];
        let booting = lease(LeaseState::Booting, None);
        let running = lease(LeaseState::Running, None);
        let failed = lease(LeaseState::Failed, Some("boot failed: no disk"));
        let released = lease(LeaseState::Released, Some("released by the client"));
        let rows: Vec<(Step, Seen<'_>, Duration, Next)> = vec![
            (
                Step::Planned,
                Seen::TokenWritten,
                S(0),
                Next::Advance(Step::RfpSent),
            ),
            // Bids: keep waiting while none came and the deadline is ahead...
            (
                Step::RfpSent,
                Seen::Bids {
                    bids: &[],
                    waited: S(1),
                    quiet: S(1),
                },
                S(1),
                Next::PollAfter(MS(100)),
            ),
            // ... and while new ones keep coming ...
            (
                Step::RfpSent,
                Seen::Bids {
                    bids: &two,
                    waited: S(1),
                    quiet: MS(100),
                },
                S(1),
                Next::PollAfter(MS(100)),
            ),
            // ... take them once they settle, cheapest first ...
            (
                Step::RfpSent,
                Seen::Bids {
                    bids: &two,
                    waited: S(1),
                    quiet: MS(300),
                },
                S(1),
                Next::Accept(vec![bid("b-cheap", 3), bid("b-dear", 9)]),
            ),
            // ... or at the deadline, whatever there is ...
            (
                Step::RfpSent,
                Seen::Bids {
                    bids: &two,
                    waited: S(5),
                    quiet: MS(10),
                },
                S(5),
                Next::Accept(vec![bid("b-cheap", 3), bid("b-dear", 9)]),
            ),
            // ... and with none at the deadline, fail with the deadline named.
            (
                Step::RfpSent,
                Seen::Bids {
                    bids: &[],
                    waited: S(5),
                    quiet: S(5),
                },
                S(5),
                Next::Fail("no bid before the deadline (5s)".into()),
            ),
            (Step::Accepted, Seen::Lease(None), S(0), Next::Reaccept),
            (
                Step::Accepted,
                Seen::Lease(Some(&booting)),
                S(0),
                Next::Advance(Step::Booting),
            ),
            (
                Step::Accepted,
                Seen::Lease(Some(&running)),
                S(0),
                Next::Advance(Step::Running),
            ),
            (
                Step::Accepted,
                Seen::Lease(Some(&failed)),
                S(0),
                Next::Fail("lease l1 failed: boot failed: no disk".into()),
            ),
            (
                Step::Booting,
                Seen::Lease(Some(&booting)),
                S(10),
                Next::PollAfter(MS(250)),
            ),
            (
                Step::Booting,
                Seen::Lease(Some(&booting)),
                S(121),
                Next::Fail("still booting after 2m0s".into()),
            ),
            (
                Step::Booting,
                Seen::Lease(Some(&running)),
                S(10),
                Next::Advance(Step::Running),
            ),
            (
                Step::Booting,
                Seen::Lease(Some(&released)),
                S(10),
                Next::Fail("lease l1 released: released by the client".into()),
            ),
            (
                Step::Booting,
                Seen::Lease(None),
                S(10),
                Next::Fail("the provider does not have lease l1".into()),
            ),
            (
                Step::Running,
                Seen::Node { ready: false },
                S(10),
                Next::PollAfter(MS(250)),
            ),
            (
                Step::Running,
                Seen::Node { ready: false },
                S(121),
                Next::Fail("the node did not join within 2m0s".into()),
            ),
            (
                Step::Running,
                Seen::Node { ready: true },
                S(121),
                Next::Advance(Step::Joined),
            ),
            (
                Step::Releasing,
                Seen::Released,
                S(0),
                Next::Advance(Step::Released),
            ),
        ];
        for (step, seen, in_step, want) in rows {
            assert_eq!(
                next(&at(step), seen, in_step, &l),
                want,
                "{step:?} seeing {seen:?}"
            );
        }
    }

    #[test]
    fn a_sighting_that_does_not_belong_to_the_step_is_an_error_not_a_move() {
        let n = next(
            &at(Step::Joined),
            Seen::Node { ready: true },
            S(0),
            &limits(),
        );
        assert!(
            matches!(&n, Next::Fail(m) if m.starts_with("internal error: step joined")),
            "{n:?}"
        );
        let n = next(&at(Step::Planned), Seen::Released, S(0), &limits());
        assert!(matches!(n, Next::Fail(_)));
    }

    #[test]
    fn planning_backs_off_while_provisions_keep_failing() {
        let mut ps = vec![at(Step::Joined), at(Step::Failed), at(Step::Failed)];
        assert_eq!(recent_failures(&ps), 2);
        ps.push(at(Step::Released));
        assert_eq!(recent_failures(&ps), 0);
        assert_eq!(plan_backoff(0), S(1));
        assert_eq!(plan_backoff(3), S(8));
        assert_eq!(plan_backoff(40), S(64));
    }
}
