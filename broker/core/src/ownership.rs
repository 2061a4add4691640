//! A fleet's ownership rules, as times: when an owner renews its lease, when it must have
//! stopped its control plane if renewals fail, and when another host may take the cluster
//! over. Pure: the broker's `cluster::ownership` carries them out against the store.
//!
//! The one failure to rule out is two control planes acting on one cluster's datastore. The
//! owner counts from the moment it *sent* its last successful renewal, by its monotonic
//! clock (the row's expiry is at least that moment plus the TTL, by the store's clock); it
//! kills its control plane at [`Timing::fence_after`] from then -- itself, or its watchdog
//! when it is frozen. A taker claims only a lease whose expiry is more than [`Timing::grace`]
//! behind the store's clock. Both expiry and comparison are the store's clock, so no host's
//! clock enters: the owner is down at least `ttl - fence_after + grace` before the taker
//! starts, minus the kill's own time and the rate at which the two clocks run apart (not
//! their offset): [`Timing::margin`].

use std::time::Duration;

/// The lease's times, all derived from its TTL (`fleet.lease_ttl`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub ttl: Duration,
}

/// What a host does about a cluster's lease, given the row (if any) and its clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// No one may hold it: claim it now.
    Now,
    /// Another host holds it; look again at the latest after this long.
    Wait(Duration),
}

impl Timing {
    pub fn new(ttl: Duration) -> Timing {
        Timing { ttl }
    }

    /// How often the owner renews: five tries within a lease.
    pub fn renew_every(&self) -> Duration {
        self.ttl / 5
    }

    /// How long after the sending of its last successful renewal an owner that could not
    /// renew since must have stopped its control plane: 7/10 of the TTL, so two renewals may
    /// fail in a row without it.
    pub fn fence_after(&self) -> Duration {
        self.ttl * 7 / 10
    }

    /// How far past the row's expiry (by the taker's clock) a lease may be taken over.
    pub fn grace(&self) -> Duration {
        self.ttl / 5
    }

    /// How long the old owner has been stopped, at the least, when a taker starts, before
    /// the clocks' difference and the kill's own time are taken off it (half the TTL).
    pub fn margin(&self) -> Duration {
        self.ttl - self.fence_after() + self.grace()
    }

    /// What a host that is not the holder does about a lease expiring at `expires_at` when
    /// the store's clock reads `now` (both Unix ms, the store's clock).
    pub fn claim(&self, expires_at: Option<i64>, now: i64) -> Claim {
        let grace = i64::try_from(self.grace().as_millis()).unwrap_or(i64::MAX);
        match expires_at {
            None => Claim::Now,
            Some(t) if now > t.saturating_add(grace) => Claim::Now,
            Some(t) => {
                let left = t.saturating_add(grace).saturating_sub(now).max(0) as u64 + 1;
                Claim::Wait(Duration::from_millis(left).min(self.renew_every()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_owner_is_down_before_anyone_may_take_over() {
        for secs in [3, 10, 15, 60] {
            let t = Timing::new(Duration::from_secs(secs));
            // The owner's kill comes before its own lease expires, let alone the grace.
            assert!(t.fence_after() < t.ttl);
            assert_eq!(t.margin(), t.ttl / 2, "{secs}s");
            // At least two renewals may fail before the owner kills its control plane.
            assert!(t.renew_every() * 2 < t.fence_after());
        }
    }

    #[test]
    fn a_lease_is_claimed_only_a_grace_after_it_expired() {
        let t = Timing::new(Duration::from_secs(10));
        assert_eq!(t.claim(None, 5), Claim::Now);
        // Expiry at 10,000; the grace is 2 s.
        assert_eq!(t.claim(Some(10_000), 12_001), Claim::Now);
        assert_eq!(
            t.claim(Some(10_000), 12_000),
            Claim::Wait(Duration::from_millis(1))
        );
        // Far from expiry: look again within a renewal period, not at expiry only (the
        // cluster may hibernate, or its owner release it, meanwhile).
        assert_eq!(t.claim(Some(10_000), 0), Claim::Wait(t.renew_every()));
        // No overflow at the edges.
        assert_eq!(
            t.claim(Some(i64::MAX), i64::MIN),
            Claim::Wait(t.renew_every())
        );
        assert_eq!(t.claim(Some(i64::MIN), i64::MAX), Claim::Now);
    }
}
