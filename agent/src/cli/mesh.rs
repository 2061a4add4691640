//! `socialweb-agent mesh status | peers | routes | ping`.

use std::collections::BTreeMap;
use std::fmt::Write;

use socialweb_mesh_core::filter::DropReason;

use super::{human_bytes, serde_name};
use crate::ctl::protocol::PingResult;
use crate::mesh::stats::{MeshStatus, PeerStatus, QueueStatus, RouteStatus};

/// This node, then a block per peer, then what is not tied to a peer.
pub fn status_text(s: &MeshStatus) -> String {
    let mut out = String::new();
    let cidr = s.pod_cidr.as_deref().unwrap_or("(not allocated yet)");
    let _ = writeln!(
        out,
        "node {}  pod CIDR {cidr}  endpoint {}",
        s.node, s.endpoint
    );
    let relay = if s.relay_connected {
        "connected"
    } else {
        "not connected"
    };
    let direct = if s.direct_addrs.is_empty() {
        "-".into()
    } else {
        s.direct_addrs.join(",")
    };
    let _ = writeln!(
        out,
        "relay {} ({relay})  tun {} mtu {}  direct {direct}",
        s.relay_url, s.tun, s.mtu
    );
    if s.relays.len() > 1 {
        let _ = writeln!(out, "relays {}", s.relays.join(", "));
    }
    if !s.scheduling.is_empty() {
        let _ = writeln!(out, "mesh thread {}", s.scheduling);
    }
    let _ = writeln!(
        out,
        "{:<14} {:<16} {:<36} {:>8} {:>20} {:>20}  {:<20} LAST ERROR",
        "PEER", "POD CIDR", "PATH", "RTT", "TX dgrams/bytes", "RX dgrams/bytes", "DROPS"
    );
    for p in &s.peers {
        peer_block(&mut out, p);
    }
    let _ = writeln!(
        out,
        "drops not tied to a peer: {}  refused: {} strangers, {} early peers, {} not sorted yet",
        drops_text(&s.drops),
        s.strangers_refused,
        s.early_peers_refused,
        s.refusals_pending
    );
    for (node, why) in &s.rejected {
        let _ = writeln!(out, "refused directory entry {node}: {why}");
    }
    out
}

/// One peer's line, its QUIC line and its queues.
fn peer_block(out: &mut String, p: &PeerStatus) {
    let rtt = p.rtt_ms.map(|r| format!("{r:.2}ms"));
    let _ = writeln!(
        out,
        "{:<14} {:<16} {:<36} {:>8} {:>20} {:>20}  {:<20} {}",
        p.node,
        p.pod_cidr,
        p.path,
        rtt.unwrap_or_else(|| "-".into()),
        format!("{}/{}", p.tx.datagrams, human_bytes(p.tx.bytes)),
        format!("{}/{}", p.rx.datagrams, human_bytes(p.rx.bytes)),
        drops_text(&p.drops),
        p.last_error.as_deref().unwrap_or("-"),
    );
    if let Some(q) = &p.quic {
        let max_packet = p.max_packet.map(|m| m.to_string());
        let _ = writeln!(
            out,
            "{:<14} quic: cwnd {}  sent {}  lost {}  congestion events {}  black holes {}  path MTU {}  max packet {}  send waits {}",
            "",
            human_bytes(q.cwnd),
            q.sent_packets,
            q.lost_packets,
            q.congestion_events,
            q.black_holes,
            q.current_mtu,
            max_packet.unwrap_or_else(|| "-".into()),
            p.send_waits
        );
    }
    for (way, q) in [("out", &p.queue_out), ("in", &p.queue_in)] {
        if let Some(q) = q {
            let _ = writeln!(out, "{:<14} {}", "", queue_text(way, q));
        }
    }
}

/// One line per peer.
pub fn peers_text(s: &MeshStatus) -> String {
    let mut out = String::new();
    for p in &s.peers {
        let connected = if p.connected {
            "connected"
        } else {
            "disconnected"
        };
        let _ = writeln!(
            out,
            "{:<14} {:<16} {} {connected:<12} {}",
            p.node, p.pod_cidr, p.endpoint, p.path
        );
    }
    out
}

/// The routes the mesh means and whether the kernel has each.
pub fn routes_text(routes: &[RouteStatus]) -> String {
    let mut out = format!("{:<18} {:<14} {:<10} VIA\n", "POD CIDR", "NODE", "KERNEL");
    for r in routes {
        let kernel = if r.installed { "installed" } else { "absent" };
        let _ = writeln!(out, "{:<18} {:<14} {kernel:<10} {}", r.cidr, r.node, r.via);
    }
    out
}

/// One round trip, as ping prints it.
pub fn ping_line(r: &PingResult, seq: u32) -> String {
    format!(
        "reply from {} via {}: seq={seq} time={:.3} ms",
        r.node, r.path, r.rtt_ms
    )
}

/// One queue as `mesh status` prints it.
fn queue_text(way: &str, q: &QueueStatus) -> String {
    let ms = |x: Option<f64>| x.map(|v| format!("{v:.2}ms")).unwrap_or_else(|| "-".into());
    let codel = if q.codel_target_ms.is_finite() && q.codel_target_ms < 1e9 {
        format!("{:.1}ms/{:.0}ms", q.codel_target_ms, q.codel_interval_ms)
    } else {
        "off (fifo)".into()
    };
    format!(
        "queue {way}: {} packets/{}  waited p50 {} p99 {}  CoDel {codel}  drops {} marks {}  over limit {}",
        q.packets,
        human_bytes(q.bytes as u64),
        ms(q.sojourn_ms(0.5)),
        ms(q.sojourn_ms(0.99)),
        q.counters.codel_drops,
        q.counters.ecn_marks,
        q.counters.overlimit_drops
    )
}

fn drops_text(d: &BTreeMap<DropReason, u64>) -> String {
    if d.is_empty() {
        return "-".into();
    }
    let each: Vec<String> = d
        .iter()
        .map(|(r, n)| format!("{}={n}", serde_name(r)))
        .collect();
    each.join(",")
}
