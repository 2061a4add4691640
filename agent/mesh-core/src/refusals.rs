//! Connections refused because the directory did not list their endpoint, sorted into real
//! peers that dialled before this node's directory caught up with theirs and strangers.
//!
//! At the moment of refusal the two look alike. So a refusal waits, for [`Refusals`]'s
//! window, for the directory to list its endpoint: if it does, the refusal was an early
//! peer's; if the window passes first, a stranger's. Pure: the time is passed in.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The counts `mesh status` shows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Refusals of endpoints the directory listed within the window after.
    pub early_peers: u64,
    /// Refusals of endpoints it did not list within the window.
    pub strangers: u64,
    /// Refusals still inside their window.
    pub pending: u64,
}

/// The refusals of one node.
#[derive(Debug, Clone)]
pub struct Refusals {
    window: Duration,
    capacity: usize,
    /// Oldest first.
    pending: VecDeque<([u8; 32], Instant)>,
    early_peers: u64,
    strangers: u64,
}

impl Refusals {
    /// Refusals wait `window` to be sorted; at most `capacity` wait at once (beyond that the
    /// oldest is counted a stranger's at once, so a flood of strangers costs no memory).
    pub fn new(window: Duration, capacity: usize) -> Refusals {
        Refusals {
            window,
            capacity: capacity.max(1),
            pending: VecDeque::new(),
            early_peers: 0,
            strangers: 0,
        }
    }

    /// A connection from `endpoint` was refused at `now`.
    pub fn refused(&mut self, endpoint: [u8; 32], now: Instant) {
        self.settle(now);
        if self.pending.len() == self.capacity {
            self.pending.pop_front();
            self.strangers += 1;
        }
        self.pending.push_back((endpoint, now));
    }

    /// The directory lists `endpoints` as of `now`: pending refusals of any of them were early
    /// peers'.
    pub fn listed<'a>(&mut self, endpoints: impl IntoIterator<Item = &'a [u8; 32]>, now: Instant) {
        self.settle(now);
        let listed: Vec<&[u8; 32]> = endpoints.into_iter().collect();
        let before = self.pending.len();
        self.pending.retain(|(ep, _)| !listed.contains(&ep));
        self.early_peers += (before - self.pending.len()) as u64;
    }

    /// Counts refusals whose window has passed by `now` as strangers'.
    pub fn settle(&mut self, now: Instant) {
        while let Some((_, at)) = self.pending.front() {
            if now.saturating_duration_since(*at) < self.window {
                break;
            }
            self.pending.pop_front();
            self.strangers += 1;
        }
    }

    pub fn counts(&self) -> Counts {
        Counts {
            early_peers: self.early_peers,
            strangers: self.strangers,
            pending: self.pending.len() as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(10);

    #[test]
    fn a_peer_listed_within_the_window_was_early_not_a_stranger() {
        let t0 = Instant::now();
        let mut r = Refusals::new(WINDOW, 100);
        r.refused([1; 32], t0);
        r.refused([1; 32], t0 + Duration::from_secs(1)); // it dials again
        r.refused([2; 32], t0 + Duration::from_secs(2));
        assert_eq!(
            r.counts(),
            Counts {
                early_peers: 0,
                strangers: 0,
                pending: 3
            }
        );
        r.listed([&[1; 32]], t0 + Duration::from_secs(3));
        assert_eq!(r.counts().early_peers, 2);
        assert_eq!(r.counts().pending, 1);
        r.settle(t0 + Duration::from_secs(12));
        assert_eq!(
            r.counts(),
            Counts {
                early_peers: 2,
                strangers: 1,
                pending: 0
            }
        );
    }

    #[test]
    fn a_listing_after_the_window_does_not_make_a_stranger_a_peer() {
        let t0 = Instant::now();
        let mut r = Refusals::new(WINDOW, 100);
        r.refused([1; 32], t0);
        r.listed([&[1; 32]], t0 + WINDOW);
        assert_eq!(r.counts().strangers, 1);
        assert_eq!(r.counts().early_peers, 0);
    }

    #[test]
    fn a_flood_of_strangers_is_bounded() {
        let t0 = Instant::now();
        let mut r = Refusals::new(WINDOW, 8);
        for i in 0..1000u32 {
            let mut ep = [0u8; 32];
            ep[..4].copy_from_slice(&i.to_be_bytes());
            r.refused(ep, t0);
        }
        assert_eq!(
            r.counts(),
            Counts {
                early_peers: 0,
                strangers: 992,
                pending: 8
            }
        );
    }
}
