//! Counters the data path bumps (atomics, no locks) and the snapshots `mesh status` prints.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use socialweb_mesh_core::filter::DropReason;

pub use super::queue::QueueStatus;

/// Datagrams and bytes one way.
#[derive(Debug, Default)]
pub struct Flow {
    datagrams: AtomicU64,
    bytes: AtomicU64,
}

impl Flow {
    pub fn add(&self, bytes: usize) {
        self.datagrams.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> FlowSnapshot {
        FlowSnapshot {
            datagrams: self.datagrams.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowSnapshot {
    pub datagrams: u64,
    pub bytes: u64,
}

/// Drops counted by reason.
#[derive(Debug, Default)]
pub struct Drops {
    counts: [AtomicU64; DropReason::ALL.len()],
}

impl Drops {
    pub fn count(&self, reason: DropReason) {
        self.counts[reason.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self, reason: DropReason) -> u64 {
        self.counts[reason.index()].load(Ordering::Relaxed)
    }

    /// Non-zero counts only.
    pub fn snapshot(&self) -> BTreeMap<DropReason, u64> {
        DropReason::ALL
            .iter()
            .map(|r| (*r, self.get(*r)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }
}

/// One peer as `mesh status` / `mesh peers` show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerStatus {
    pub node: String,
    pub pod_cidr: String,
    pub endpoint: String,
    pub connected: bool,
    /// `direct <ip:port>`, `relay <url>`, or `none`.
    pub path: String,
    pub rtt_ms: Option<f64>,
    pub tx: FlowSnapshot,
    pub rx: FlowSnapshot,
    pub drops: BTreeMap<DropReason, u64>,
    pub last_error: Option<String>,
    /// Seconds since the current connection came up.
    pub connected_for_s: Option<f64>,
    /// Largest IP packet the current path carries.
    pub max_packet: Option<usize>,
    /// QUIC's view of the selected path: congestion window (bytes), congestion events, and
    /// packets lost (datagrams are not retransmitted: a lost packet is the pods' TCP's
    /// business).
    pub quic: Option<QuicPathStats>,
    /// Times the send path found the connection's datagram buffer full and waited for room
    /// (back-pressure into the TUN); a number that climbs with throughput means the
    /// connection, not the TUN, is the bottleneck.
    #[serde(default)]
    pub send_waits: u64,
    /// The queue where packets wait for the connection (to the peer).
    #[serde(default)]
    pub queue_out: Option<QueueStatus>,
    /// The queue where the peer's packets wait for the TUN.
    #[serde(default)]
    pub queue_in: Option<QueueStatus>,
}

/// QUIC path statistics worth a look when throughput disappoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuicPathStats {
    pub cwnd: u64,
    pub congestion_events: u64,
    pub lost_packets: u64,
    pub sent_packets: u64,
    /// Times black-hole detection shrank the path to QUIC's minimum MTU.
    #[serde(default)]
    pub black_holes: u64,
    /// The UDP payload size the path carries now.
    #[serde(default)]
    pub current_mtu: u16,
    /// DATAGRAM frames the connection sent and received (all its paths). What the mesh gave
    /// it less what it sent is what still waits in its buffer; what it received less what the
    /// mesh took (rx plus filter drops) is what its receive buffer dropped when full.
    #[serde(default)]
    pub datagrams_sent: u64,
    #[serde(default)]
    pub datagrams_received: u64,
}

/// The whole mesh as `mesh status` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeshStatus {
    pub node: String,
    pub endpoint: String,
    pub pod_cidr: Option<String>,
    /// This node's address in the cluster (reached over the mesh), if it has one.
    #[serde(default)]
    pub node_ip: Option<String>,
    /// The home relay (the one peers find this node at), or the renting host's before the
    /// endpoint picked one.
    pub relay_url: String,
    /// Every relay the node may use: the renting host's, then the fleet's others.
    #[serde(default)]
    pub relays: Vec<String>,
    pub tun: String,
    pub mtu: u16,
    /// How the mesh's thread is scheduled (`SCHED_FIFO 1`, or `normal, nice 0` and why).
    #[serde(default)]
    pub scheduling: String,
    pub direct_addrs: Vec<String>,
    pub relay_connected: bool,
    pub peers: Vec<PeerStatus>,
    /// Drops not attributable to a peer (no route, malformed from the TUN, ...).
    pub drops: BTreeMap<DropReason, u64>,
    /// Connections refused from endpoints the directory did not list within a window after.
    pub strangers_refused: u64,
    /// Connections refused from endpoints the directory listed soon after: real peers that
    /// dialled before this node's directory caught up with theirs (they dial again).
    pub early_peers_refused: u64,
    /// Refusals not sorted yet (inside their window).
    pub refusals_pending: u64,
    pub rejected: Vec<(String, String)>,
}

/// A route as `mesh routes` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteStatus {
    pub cidr: String,
    pub node: String,
    pub via: String,
    /// Whether the kernel route is installed (it is while the peer's connection is up).
    pub installed: bool,
}
