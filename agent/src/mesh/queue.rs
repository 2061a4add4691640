//! Where a peer's packets wait, each way: an FQ-CoDel queue (`socialweb_mesh_core::fq`)
//! behind a lock, with the clock it judges sojourn times by. Out (TUN to peer), the TUN
//! reader enqueues and never waits, and the peer's sender takes packets as its connection
//! has room; in (peer to TUN), the connection's reader drains what QUIC received and writes
//! in batches. Either way the standing queue is here, where CoDel sees it, and not in the
//! TUN's ring or in QUIC's datagram buffers, where nothing does.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use socialweb_mesh_core::ecn;
use socialweb_mesh_core::fq::{self, Counters, FqCodel, Sojourns};
use tokio::sync::Notify;

/// A packet read from the TUN, bound for a peer: its own slice of the reader's arena.
#[derive(Debug)]
pub struct Outbound(pub BytesMut);

impl fq::Packet for Outbound {
    fn ip(&self) -> &[u8] {
        &self.0
    }
    fn mark_ce(&mut self) -> bool {
        ecn::mark_ce(&mut self.0)
    }
}

/// A datagram from a peer, bound for the TUN: QUIC's own buffer, not copied until it is
/// written (into a buffer the TUN's GRO can grow).
#[derive(Debug)]
pub struct Inbound(pub Bytes);

impl fq::Packet for Inbound {
    fn ip(&self) -> &[u8] {
        &self.0
    }
    fn mark_ce(&mut self) -> bool {
        if !ecn::ecn(&self.0).is_some_and(ecn::Ecn::capable) {
            return false;
        }
        // Shared with the datagrams received beside it: marking copies (rare: only when
        // CoDel signals).
        let mut own = BytesMut::from(&self.0[..]);
        let marked = ecn::mark_ce(&mut own);
        self.0 = own.freeze();
        marked
    }
}

/// The clock every queue of the mesh reads.
#[derive(Debug, Clone, Copy)]
pub struct Clock(Instant);

impl Clock {
    pub fn new() -> Clock {
        Clock(Instant::now())
    }

    pub fn now(&self) -> Duration {
        self.0.elapsed()
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

/// One direction's queue of one peer.
#[derive(Debug)]
pub struct PeerQueue<P> {
    q: Mutex<FqCodel<P>>,
    /// Wakes the side that drains it.
    ready: Notify,
}

impl<P: fq::Packet> PeerQueue<P> {
    pub fn new(settings: fq::Settings) -> PeerQueue<P> {
        PeerQueue {
            q: Mutex::new(FqCodel::new(settings, rand::random())),
            ready: Notify::new(),
        }
    }

    /// Queues packets that arrived at `now` and wakes the drain.
    pub fn push(&self, packets: impl IntoIterator<Item = P>, now: Duration) {
        {
            let mut q = self.lock();
            for p in packets {
                q.enqueue(p, now);
            }
        }
        self.ready.notify_one();
    }

    /// The queue itself, for a batch of operations under one lock.
    pub fn lock(&self) -> std::sync::MutexGuard<'_, FqCodel<P>> {
        self.q.lock().expect("a queue's lock is never poisoned")
    }

    /// Waits until something was pushed since the last wait.
    pub async fn wait(&self) {
        self.ready.notified().await;
    }

    /// Drops everything queued (the connection went away); how many packets that was.
    pub fn clear(&self) -> usize {
        self.lock().clear()
    }

    pub fn status(&self) -> QueueStatus {
        let q = self.lock();
        let codel = q.codel();
        QueueStatus {
            codel_target_ms: codel.target.as_secs_f64() * 1e3,
            codel_interval_ms: codel.interval.as_secs_f64() * 1e3,
            packets: q.len(),
            bytes: q.backlog(),
            counters: q.counters(),
            sojourns: q.sojourns().clone(),
        }
    }
}

/// A queue as `mesh status` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueStatus {
    /// CoDel's settings now (they follow the path's round trip unless fixed; a FIFO's target
    /// is "never").
    #[serde(default)]
    pub codel_target_ms: f64,
    #[serde(default)]
    pub codel_interval_ms: f64,
    pub packets: usize,
    pub bytes: usize,
    #[serde(flatten)]
    pub counters: Counters,
    /// Sojourn times of delivered packets (power-of-two microsecond buckets).
    pub sojourns: Sojourns,
}

impl QueueStatus {
    /// The sojourn time under which a share `q` of delivered packets waited, in ms.
    pub fn sojourn_ms(&self, q: f64) -> Option<f64> {
        self.sojourns.quantile(q).map(|d| d.as_secs_f64() * 1e3)
    }
}
