//! CoDel (RFC 8289): a queue is judged by how long its packets waited (their sojourn time),
//! not by how many bytes it holds. While the sojourn stays above `target` for a whole
//! `interval`, the queue signals congestion -- marks the packet CE if it is ECN-capable,
//! otherwise drops it -- and signals again after `interval / sqrt(count)`, faster while the
//! queue stays standing, until the sojourn falls below `target`. A burst that drains within
//! an interval is never touched. Pure: the caller gives the time.
//!
//! The state machine follows the RFC's pseudocode (section 5) and Linux's `codel_dequeue`
//! (ECN marking delivers the packet and schedules the next signal).

use std::time::Duration;

/// CoDel's two settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// Acceptable standing queue delay (RFC 8289: 5 ms).
    pub target: Duration,
    /// The time a queue may stay above `target` before it is signalled; on the order of the
    /// worst round trip of the flows through it (RFC 8289: 100 ms).
    pub interval: Duration,
    /// A queue holding at most this many bytes is never signalled (one full packet: a
    /// queue with a single packet in it is not a standing queue).
    pub mtu: usize,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            target: Duration::from_millis(5),
            interval: Duration::from_millis(100),
            mtu: 1500,
        }
    }
}

impl Params {
    /// Settings for a queue whose flows cross a path of round trip `rtt`: the interval is
    /// about the worst round trip of those flows (eight path round trips, between 20 ms and
    /// RFC 8289's 100 ms), the target 5 % of it (RFC 8289 §4.4: 5-10 %). Between nodes in one
    /// place (a path of well under a millisecond) that is 1 ms and 20 ms: a standing queue of
    /// 5 ms is five times what the flows need there. Across the internet it is RFC 8289's 5 ms
    /// and 100 ms.
    pub fn for_rtt(rtt: Duration, mtu: usize) -> Params {
        let interval = (rtt * 8).clamp(Duration::from_millis(20), Duration::from_millis(100));
        Params {
            target: interval / 20,
            interval,
            mtu,
        }
    }
}

/// What the queue does with one packet it takes from its head.
pub trait Queue {
    type Packet;
    /// Removes the head packet, with the time it was enqueued.
    fn pop(&mut self) -> Option<(Self::Packet, Duration)>;
    /// Bytes still queued (after the pop).
    fn backlog(&self) -> usize;
    /// Sets CE on an ECN-capable packet; `false` if it is not one (it is then dropped).
    fn mark(&mut self, packet: &mut Self::Packet) -> bool;
    /// Disposes of a dropped packet (counting it).
    fn dropped(&mut self, packet: Self::Packet);
    /// Counts a packet delivered with CE set.
    fn marked(&mut self);
}

/// One queue's CoDel state.
#[derive(Debug, Clone, Default)]
pub struct Codel {
    /// When the sojourn time went (and stayed) above target, plus an interval; `None`
    /// while it is below.
    first_above_time: Option<Duration>,
    /// When the next signal is due, while dropping.
    drop_next: Duration,
    /// Signals in the current dropping state.
    count: u32,
    last_count: u32,
    dropping: bool,
}

impl Codel {
    /// Whether the queue is in its dropping state (for diagnostics).
    pub fn dropping(&self) -> bool {
        self.dropping
    }

    /// Takes the next packet to deliver from `q` at `now`, signalling congestion on the way
    /// when the queue has stood above target for an interval.
    pub fn dequeue<Q: Queue>(&mut self, q: &mut Q, now: Duration, p: &Params) -> Option<Q::Packet> {
        let (mut packet, ok_to_drop) = match self.pop(q, now, p) {
            Some(x) => x,
            None => {
                self.dropping = false;
                return None;
            }
        };
        if self.dropping {
            if !ok_to_drop {
                self.dropping = false;
                return Some(packet);
            }
            while self.dropping && now >= self.drop_next {
                self.count = self.count.saturating_add(1);
                if q.mark(&mut packet) {
                    q.marked();
                    self.drop_next = control_law(self.drop_next, self.count, p);
                    return Some(packet);
                }
                q.dropped(packet);
                match self.pop(q, now, p) {
                    None => {
                        self.dropping = false;
                        return None;
                    }
                    Some((next, ok)) => {
                        packet = next;
                        if ok {
                            self.drop_next = control_law(self.drop_next, self.count, p);
                        } else {
                            self.dropping = false;
                        }
                    }
                }
            }
            return Some(packet);
        }
        if ok_to_drop {
            if q.mark(&mut packet) {
                q.marked();
            } else {
                q.dropped(packet);
                packet = self.pop(q, now, p)?.0;
            }
            self.dropping = true;
            // Signal at the rate the last dropping state ended with, if it ended recently:
            // the congestion is likely the same.
            let delta = self.count.saturating_sub(self.last_count);
            self.count = if delta > 1 && now.saturating_sub(self.drop_next) < p.interval * 16 {
                delta
            } else {
                1
            };
            self.last_count = self.count;
            self.drop_next = control_law(now, self.count, p);
        }
        Some(packet)
    }

    /// RFC 8289's `dodequeue`: the head packet and whether it may be dropped.
    fn pop<Q: Queue>(&mut self, q: &mut Q, now: Duration, p: &Params) -> Option<(Q::Packet, bool)> {
        let Some((packet, enqueued)) = q.pop() else {
            self.first_above_time = None;
            return None;
        };
        let sojourn = now.saturating_sub(enqueued);
        if sojourn < p.target || q.backlog() <= p.mtu {
            self.first_above_time = None;
            return Some((packet, false));
        }
        match self.first_above_time {
            None => {
                self.first_above_time = Some(now + p.interval);
                Some((packet, false))
            }
            Some(t) => Some((packet, now >= t)),
        }
    }
}

/// The next signal: `interval / sqrt(count)` after `t`.
fn control_law(t: Duration, count: u32, p: &Params) -> Duration {
    t + p.interval.div_f64(f64::from(count.max(1)).sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// A plain FIFO of (ECN-capable, enqueue time) with 1000-byte packets.
    #[derive(Default)]
    struct Fifo {
        q: VecDeque<(bool, Duration)>,
        drops: u32,
        marks: u32,
    }

    impl Queue for Fifo {
        type Packet = bool;
        fn pop(&mut self) -> Option<(bool, Duration)> {
            self.q.pop_front()
        }
        fn backlog(&self) -> usize {
            self.q.len() * 1000
        }
        fn mark(&mut self, ect: &mut bool) -> bool {
            *ect
        }
        fn dropped(&mut self, _: bool) {
            self.drops += 1;
        }
        fn marked(&mut self) {
            self.marks += 1;
        }
    }

    const MS: Duration = Duration::from_millis(1);

    /// A queue fed `per_ms` packets and drained `out_per_ms` each millisecond for `ms`.
    fn run(ect: bool, per_ms: u32, out_per_ms: u32, ms: u32) -> (Fifo, Codel, Duration) {
        let p = Params::default();
        let mut q = Fifo::default();
        let mut c = Codel::default();
        let mut worst = Duration::ZERO;
        for t in 0..ms {
            let now = MS * t;
            for _ in 0..per_ms {
                q.q.push_back((ect, now));
            }
            for _ in 0..out_per_ms {
                if let Some(head) = q.q.front() {
                    worst = worst.max(now - head.1);
                }
                c.dequeue(&mut q, now, &p);
            }
        }
        (q, c, worst)
    }

    #[test]
    fn settings_follow_the_path_round_trip_within_bounds() {
        let lan = Params::for_rtt(Duration::from_micros(300), 1280);
        assert_eq!(lan.interval, Duration::from_millis(20));
        assert_eq!(lan.target, Duration::from_millis(1));
        let mid = Params::for_rtt(Duration::from_millis(5), 1280);
        assert_eq!(mid.interval, Duration::from_millis(40));
        assert_eq!(mid.target, Duration::from_millis(2));
        let far = Params::for_rtt(Duration::from_millis(80), 1280);
        assert_eq!(
            far,
            Params {
                mtu: 1280,
                ..Params::default()
            }
        );
    }

    #[test]
    fn a_queue_that_drains_is_never_signalled() {
        let (q, c, _) = run(false, 10, 10, 2000);
        assert_eq!((q.drops, q.marks), (0, 0));
        assert!(!c.dropping());
    }

    #[test]
    fn a_short_burst_is_absorbed() {
        let p = Params::default();
        let mut q = Fifo::default();
        let mut c = Codel::default();
        // 50 packets at once, drained one a millisecond: above target for 45 ms, less
        // than one interval.
        for _ in 0..50 {
            q.q.push_back((false, Duration::ZERO));
        }
        for t in 0..60 {
            c.dequeue(&mut q, MS * t, &p);
        }
        assert_eq!(q.drops, 0);
    }

    #[test]
    fn a_standing_queue_is_dropped_down_to_target() {
        // Twice as much in as out: the queue would grow without bound.
        let (q, c, _) = run(false, 2, 1, 3000);
        assert!(q.drops > 100, "drops {}", q.drops);
        assert!(c.dropping() || q.q.len() < 20);
        // CoDel drops at an increasing rate, yet a FIFO fed twice its drain rate needs one
        // drop per delivered packet; the drops climb toward that.
        assert!(q.drops < 3000);
    }

    #[test]
    fn ecn_capable_packets_are_marked_not_dropped() {
        let (q, _, _) = run(true, 2, 1, 1000);
        assert_eq!(q.drops, 0);
        assert!(q.marks > 0);
    }

    #[test]
    fn signals_speed_up_while_the_queue_stands() {
        let p = Params::default();
        let mut q = Fifo::default();
        let mut c = Codel::default();
        let mut signal_times = Vec::new();
        for t in 0..1000u32 {
            let now = MS * t;
            // A queue that stays 20 ms deep: one in, one out, plus the standing 20.
            if t == 0 {
                for _ in 0..20 {
                    q.q.push_back((true, now));
                }
            }
            q.q.push_back((true, now));
            let before = q.marks;
            c.dequeue(&mut q, now, &p);
            if q.marks > before {
                signal_times.push(t);
            }
        }
        assert!(signal_times.len() >= 3, "{signal_times:?}");
        let gaps: Vec<u32> = signal_times.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps[0] >= 60, "first gap is about an interval: {gaps:?}");
        assert!(
            gaps.last().unwrap() < &gaps[0],
            "later signals come faster: {gaps:?}"
        );
    }

    #[test]
    fn a_single_packet_queue_is_left_alone() {
        let p = Params::default();
        let mut q = Fifo::default();
        let mut c = Codel::default();
        // One old packet at a time: a long sojourn but no standing queue behind it.
        for t in 0..1000u32 {
            q.q.push_back((false, MS * t.saturating_sub(50)));
            c.dequeue(&mut q, MS * t, &p);
        }
        assert_eq!(q.drops, 0);
    }
}
