//! FQ-CoDel (RFC 8290): the queue where the mesh's packets wait, one per peer and
//! direction. Packets are hashed by their inner flow into buckets, each with its own CoDel
//! state; a deficit round robin serves the buckets, new flows (a ping, a DNS query, a TCP
//! handshake) ahead of old ones, so a bulk transfer's standing queue does not delay anyone
//! else's packets, and CoDel keeps that standing queue near its target by marking (ECN) or
//! dropping. A byte limit bounds memory; beyond it the head of the fattest flow is dropped.
//! Pure: the caller gives the time, and the packets are any type that exposes its bytes.

use std::collections::VecDeque;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::codel::{self, Codel};
use crate::ecn;

/// A packet the queue can hold: its IP bytes, and a way to set CE in them.
pub trait Packet {
    fn ip(&self) -> &[u8];
    /// Sets CE if the packet is ECN-capable ([`ecn::mark_ce`]); `false` if it is not.
    fn mark_ce(&mut self) -> bool;
}

impl Packet for Vec<u8> {
    fn ip(&self) -> &[u8] {
        self
    }
    fn mark_ce(&mut self) -> bool {
        ecn::mark_ce(self)
    }
}

/// The queue's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub codel: codel::Params,
    /// Bytes a flow may send per round (RFC 8290: one MTU).
    pub quantum: usize,
    /// Hash buckets (flows told apart).
    pub flows: usize,
    /// Bytes the queue holds at most.
    pub limit_bytes: usize,
    /// Mark ECN-capable packets CE instead of dropping them.
    pub ecn: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            codel: codel::Params::default(),
            quantum: 1514,
            flows: 128,
            limit_bytes: 4 << 20,
            ecn: true,
        }
    }
}

/// What happened to the packets that passed through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    pub enqueued: u64,
    pub delivered: u64,
    /// Dropped by CoDel (a standing queue, packet not ECN-capable).
    pub codel_drops: u64,
    /// Delivered with CE set by CoDel.
    pub ecn_marks: u64,
    /// Dropped because the queue was over its byte limit.
    pub overlimit_drops: u64,
}

/// Sojourn times of delivered packets, in power-of-two microsecond buckets: bucket `i`
/// holds times below `2^i` µs (and at least `2^(i-1)`), the last one everything longer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sojourns {
    pub buckets: [u64; SOJOURN_BUCKETS],
}

/// Up to 2^20 µs (about a second) in its own buckets.
pub const SOJOURN_BUCKETS: usize = 22;

impl Default for Sojourns {
    fn default() -> Self {
        Sojourns {
            buckets: [0; SOJOURN_BUCKETS],
        }
    }
}

impl Sojourns {
    fn record(&mut self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let i = (64 - us.leading_zeros()) as usize;
        self.buckets[i.min(SOJOURN_BUCKETS - 1)] += 1;
    }

    /// The bound under which a share `q` (0..=1) of the recorded times fall (a bucket's
    /// upper edge), or `None` before any.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let total: u64 = self.buckets.iter().sum();
        if total == 0 {
            return None;
        }
        let want = ((total as f64) * q.clamp(0.0, 1.0)).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= want {
                return Some(Duration::from_micros(1u64 << i.min(40)));
            }
        }
        None
    }

    /// The counts since `earlier` (a snapshot taken before).
    pub fn since(&self, earlier: &Sojourns) -> Sojourns {
        let mut out = Sojourns::default();
        for (i, b) in out.buckets.iter_mut().enumerate() {
            *b = self.buckets[i].saturating_sub(earlier.buckets[i]);
        }
        out
    }
}

#[derive(Debug)]
struct Flow<P> {
    q: VecDeque<(P, Duration)>,
    bytes: usize,
    deficit: i64,
    codel: Codel,
    listed: bool,
}

impl<P> Default for Flow<P> {
    fn default() -> Self {
        Flow {
            q: VecDeque::new(),
            bytes: 0,
            deficit: 0,
            codel: Codel::default(),
            listed: false,
        }
    }
}

/// The queue.
#[derive(Debug)]
pub struct FqCodel<P> {
    settings: Settings,
    seed: u64,
    flows: Vec<Flow<P>>,
    new_flows: VecDeque<usize>,
    old_flows: VecDeque<usize>,
    backlog: usize,
    packets: usize,
    counters: Counters,
    sojourns: Sojourns,
}

impl<P: Packet> FqCodel<P> {
    /// An empty queue; `seed` perturbs the flow hash (give each queue a random one).
    pub fn new(settings: Settings, seed: u64) -> FqCodel<P> {
        let flows = settings.flows.max(1);
        FqCodel {
            settings,
            seed,
            flows: (0..flows).map(|_| Flow::default()).collect(),
            new_flows: VecDeque::new(),
            old_flows: VecDeque::new(),
            backlog: 0,
            packets: 0,
            counters: Counters::default(),
            sojourns: Sojourns::default(),
        }
    }

    /// Queues a packet that arrived at `now`.
    pub fn enqueue(&mut self, packet: P, now: Duration) {
        let len = packet.ip().len();
        let i = (ecn::flow_hash(packet.ip(), self.seed) % self.flows.len() as u64) as usize;
        let flow = &mut self.flows[i];
        flow.q.push_back((packet, now));
        flow.bytes += len;
        if !flow.listed {
            flow.listed = true;
            flow.deficit = self.settings.quantum as i64;
            self.new_flows.push_back(i);
        }
        self.backlog += len;
        self.packets += 1;
        self.counters.enqueued += 1;
        while self.backlog > self.settings.limit_bytes {
            self.drop_from_fattest();
        }
    }

    fn drop_from_fattest(&mut self) {
        let Some((i, _)) = self.flows.iter().enumerate().max_by_key(|(_, f)| f.bytes) else {
            return;
        };
        let flow = &mut self.flows[i];
        if let Some((p, _)) = flow.q.pop_front() {
            let len = p.ip().len();
            flow.bytes -= len;
            self.backlog -= len;
            self.packets -= 1;
            self.counters.overlimit_drops += 1;
        }
    }

    /// The next packet to send at `now`, if any (CoDel may drop or mark on the way).
    pub fn dequeue(&mut self, now: Duration) -> Option<P> {
        loop {
            let (from_new, i) = match (self.new_flows.front(), self.old_flows.front()) {
                (Some(&i), _) => (true, i),
                (None, Some(&i)) => (false, i),
                (None, None) => return None,
            };
            if self.flows[i].deficit <= 0 {
                self.flows[i].deficit += self.settings.quantum as i64;
                self.list(from_new).pop_front();
                self.old_flows.push_back(i);
                continue;
            }
            let params = self.settings.codel;
            let mut codel = std::mem::take(&mut self.flows[i].codel);
            let mut view = FlowView {
                q: self,
                i,
                last_enqueued: None,
            };
            let got = codel.dequeue(&mut view, now, &params);
            let enqueued = view.last_enqueued;
            self.flows[i].codel = codel;
            match got {
                None => {
                    self.list(from_new).pop_front();
                    if from_new && !self.old_flows.is_empty() {
                        self.old_flows.push_back(i);
                    } else {
                        self.flows[i].listed = false;
                    }
                }
                Some(p) => {
                    self.flows[i].deficit -= p.ip().len() as i64;
                    self.counters.delivered += 1;
                    if let Some(t) = enqueued {
                        self.sojourns.record(now.saturating_sub(t));
                    }
                    return Some(p);
                }
            }
        }
    }

    fn list(&mut self, new: bool) -> &mut VecDeque<usize> {
        if new {
            &mut self.new_flows
        } else {
            &mut self.old_flows
        }
    }

    /// Empties the queue (the connection is gone), returning how many packets it held; they
    /// are not counted as CoDel's.
    pub fn clear(&mut self) -> usize {
        let n = self.packets;
        for f in &mut self.flows {
            *f = Flow::default();
        }
        self.new_flows.clear();
        self.old_flows.clear();
        self.backlog = 0;
        self.packets = 0;
        n
    }

    pub fn is_empty(&self) -> bool {
        self.packets == 0
    }

    pub fn len(&self) -> usize {
        self.packets
    }

    /// Bytes queued.
    pub fn backlog(&self) -> usize {
        self.backlog
    }

    /// Changes CoDel's settings for every flow from now on.
    pub fn set_codel(&mut self, params: codel::Params) {
        self.settings.codel = params;
    }

    pub fn codel(&self) -> codel::Params {
        self.settings.codel
    }

    pub fn counters(&self) -> Counters {
        self.counters
    }

    pub fn sojourns(&self) -> &Sojourns {
        &self.sojourns
    }
}

/// One bucket, as CoDel sees its queue.
struct FlowView<'q, P> {
    q: &'q mut FqCodel<P>,
    i: usize,
    last_enqueued: Option<Duration>,
}

impl<P: Packet> codel::Queue for FlowView<'_, P> {
    type Packet = P;

    fn pop(&mut self) -> Option<(P, Duration)> {
        let flow = &mut self.q.flows[self.i];
        let (p, t) = flow.q.pop_front()?;
        let len = p.ip().len();
        flow.bytes -= len;
        self.q.backlog -= len;
        self.q.packets -= 1;
        self.last_enqueued = Some(t);
        Some((p, t))
    }

    fn backlog(&self) -> usize {
        self.q.backlog
    }

    fn mark(&mut self, packet: &mut P) -> bool {
        self.q.settings.ecn && packet.mark_ce()
    }

    fn dropped(&mut self, _: P) {
        self.q.counters.codel_drops += 1;
    }

    fn marked(&mut self) {
        self.q.counters.ecn_marks += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A TCP packet of `len` bytes from port `sport`, with ECN bits `ect`.
    fn tcp(sport: u16, len: usize, ect: u8) -> Vec<u8> {
        let b = etherparse::PacketBuilder::ipv4([10, 42, 1, 2], [10, 42, 2, 3], 64)
            .tcp(sport, 80, 1, 1000);
        let mut out = Vec::new();
        b.write(&mut out, &vec![0u8; len - 40]).unwrap();
        out[1] |= ect;
        out
    }

    fn ping() -> Vec<u8> {
        let b = etherparse::PacketBuilder::ipv4([10, 42, 1, 2], [10, 42, 2, 3], 64)
            .icmpv4_echo_request(1, 1);
        let mut out = Vec::new();
        b.write(&mut out, &[0u8; 56]).unwrap();
        out
    }

    #[test]
    fn a_new_flow_jumps_the_bulk_flows_queue() {
        let mut q = FqCodel::new(Settings::default(), 1);
        for _ in 0..100 {
            q.enqueue(tcp(1000, 1280, 0), Duration::ZERO);
        }
        // Serve a few bulk packets, then a ping arrives.
        for _ in 0..3 {
            q.dequeue(MS);
        }
        q.enqueue(ping(), MS);
        let mut before_ping = 0;
        loop {
            let p = q.dequeue(MS).unwrap();
            if p.len() < 100 {
                break;
            }
            before_ping += 1;
        }
        assert!(
            before_ping <= 2,
            "the ping waited behind {before_ping} bulk packets"
        );
    }

    #[test]
    fn flows_share_the_link_by_bytes() {
        let mut q = FqCodel::new(Settings::default(), 2);
        for _ in 0..200 {
            q.enqueue(tcp(1, 1280, 0), Duration::ZERO);
            q.enqueue(tcp(2, 640, 0), Duration::ZERO);
            q.enqueue(tcp(2, 640, 0), Duration::ZERO);
        }
        let (mut a, mut b) = (0usize, 0usize);
        for _ in 0..200 {
            let p = q.dequeue(MS).unwrap();
            if p[21] == 1 {
                a += p.len();
            } else {
                b += p.len();
            }
        }
        let ratio = a as f64 / b as f64;
        assert!((0.8..1.25).contains(&ratio), "bytes {a} vs {b}");
    }

    #[test]
    fn a_standing_queue_is_signalled_and_counted() {
        let mut q = FqCodel::new(Settings::default(), 3);
        // Two packets in, one out, every millisecond for two seconds.
        for t in 0..2000u32 {
            let now = MS * t;
            q.enqueue(tcp(1000, 1280, 0), now);
            q.enqueue(tcp(1000, 1280, 0), now);
            q.dequeue(now);
        }
        let c = q.counters();
        assert!(c.codel_drops > 0, "{c:?}");
        assert_eq!(c.ecn_marks, 0);
        assert_eq!(
            c.enqueued,
            c.delivered + c.codel_drops + c.overlimit_drops + q.len() as u64,
            "every packet is accounted for"
        );
    }

    #[test]
    fn ecn_capable_flows_are_marked() {
        let mut q = FqCodel::new(Settings::default(), 4);
        let mut ce = 0;
        for t in 0..2000u32 {
            let now = MS * t;
            q.enqueue(tcp(1000, 1280, 0b10), now);
            q.enqueue(tcp(1000, 1280, 0b10), now);
            if let Some(p) = q.dequeue(now)
                && ecn::ecn(&p) == Some(ecn::Ecn::Ce)
            {
                ce += 1;
            }
        }
        let c = q.counters();
        assert_eq!(c.codel_drops, 0);
        assert!(c.ecn_marks > 0);
        assert_eq!(c.ecn_marks, ce);
    }

    #[test]
    fn ecn_off_drops_instead() {
        let s = Settings {
            ecn: false,
            ..Settings::default()
        };
        let mut q = FqCodel::new(s, 4);
        for t in 0..2000u32 {
            q.enqueue(tcp(1000, 1280, 0b10), MS * t);
            q.enqueue(tcp(1000, 1280, 0b10), MS * t);
            q.dequeue(MS * t);
        }
        assert_eq!(q.counters().ecn_marks, 0);
        assert!(q.counters().codel_drops > 0);
    }

    #[test]
    fn the_byte_limit_drops_from_the_fattest_flow() {
        let s = Settings {
            limit_bytes: 20 * 1280,
            ..Settings::default()
        };
        let mut q = FqCodel::new(s, 5);
        q.enqueue(ping(), Duration::ZERO);
        for _ in 0..100 {
            q.enqueue(tcp(1000, 1280, 0), Duration::ZERO);
        }
        assert!(q.backlog() <= 20 * 1280);
        assert_eq!(q.counters().overlimit_drops, 81);
        assert_eq!(
            q.dequeue(Duration::ZERO).unwrap().len(),
            84,
            "the ping survived"
        );
    }

    #[test]
    fn sojourns_are_recorded_and_read_as_quantiles() {
        let mut q = FqCodel::new(Settings::default(), 6);
        for _ in 0..10 {
            q.enqueue(tcp(1, 1280, 0), Duration::ZERO);
        }
        for i in 0..10u32 {
            q.dequeue(Duration::from_micros(100 * u64::from(i)));
        }
        let s = q.sojourns();
        assert_eq!(s.buckets.iter().sum::<u64>(), 10);
        assert_eq!(s.quantile(0.0), Some(Duration::from_micros(1)));
        assert_eq!(s.quantile(1.0), Some(Duration::from_micros(1024)));
        assert!(Sojourns::default().quantile(0.5).is_none());
        let later = s.since(&Sojourns::default());
        assert_eq!(&later, s);
    }

    #[test]
    fn clear_empties_everything() {
        let mut q = FqCodel::new(Settings::default(), 7);
        for i in 0..10 {
            q.enqueue(tcp(i, 1280, 0), Duration::ZERO);
        }
        assert_eq!(q.clear(), 10);
        assert!(q.is_empty());
        assert_eq!(q.backlog(), 0);
        assert!(q.dequeue(MS).is_none());
        q.enqueue(ping(), MS);
        assert!(q.dequeue(MS).is_some());
    }
}
