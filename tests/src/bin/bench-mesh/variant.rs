//! One variant of the benchmark: two pods on two nodes over some tunnel, measured round by
//! round (idle ping, one stream with a ping beside it, four streams), with the diagnostics
//! that say where the time went.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::Value;
use testbed::mesh::MeshCluster;
use testbed::process::Spawned;
use testbed::{Netns, probe};

use crate::measure::{
    UdpCounters, bucket_quantile, iperf, link_drops, percentile, pings, runqueue_wait_ns, show,
    thread_ticks, udp_counters,
};

/// One variant, set up and waiting for rounds.
pub(crate) struct Variant<'t> {
    pub(crate) name: &'static str,
    // Field order is drop order: pods, then daemons, then the mesh.
    pub(crate) a: Netns,
    pub(crate) b: Netns,
    pub(crate) b_ip: String,
    pub(crate) nodes: [&'t Netns; 2],
    /// Processes whose CPU is accounted (label, pid).
    pub(crate) procs: Vec<(String, u32)>,
    pub(crate) _daemons: Vec<Spawned>,
    pub(crate) mesh: Option<MeshCluster<'t>>,
    pub(crate) _dir: Option<testbed::tmp::TempDir>,
    pub(crate) results: Results,
}

#[derive(Default)]
pub(crate) struct Results {
    pub(crate) gbit: Vec<f64>,
    pub(crate) retransmits: u64,
    pub(crate) stream_rtt_ms: Vec<f64>,
    /// The QUIC connection's RTT and congestion window halfway through each stream.
    pub(crate) mid_rtt_ms: Vec<f64>,
    pub(crate) mid_cwnd: Vec<f64>,
    pub(crate) gbit4: Vec<f64>,
    pub(crate) idle_ms: Vec<f64>,
    pub(crate) loaded_ms: Vec<f64>,
    /// CPU ticks per (label, thread) over the single-stream runs.
    pub(crate) cpu: BTreeMap<(String, String), u64>,
    pub(crate) cpu_seconds: f64,
    /// Nanoseconds each process (label) waited for a CPU while runnable, over the same runs.
    pub(crate) runq_wait_ns: BTreeMap<String, u64>,
    pub(crate) udp: [UdpCounters; 2],
    /// Packets dropped per (node, device, direction) during the single-stream runs.
    pub(crate) link_drops: BTreeMap<(usize, String, &'static str), u64>,
    pub(crate) quic: Option<QuicDelta>,
}

#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct QuicDelta {
    sent_packets: u64,
    lost_packets: u64,
    congestion_events: u64,
    send_waits: u64,
    too_big: u64,
    black_holes: u64,
    /// The sender's outbound queue and the receiver's inbound queue (agents that have them).
    /// DATAGRAM frames the receiver's connection got, and what its agent took from it.
    dgrams_received: u64,
    dgrams_taken: u64,
    codel_drops_out: u64,
    ecn_marks_out: u64,
    codel_drops_in: u64,
    ecn_marks_in: u64,
    overlimit_drops: u64,
}

/// The mesh's counters, node 1 sending to node 2 (the direction iperf3 loads).
fn quic_counters(mesh: &MeshCluster<'_>) -> Result<QuicDelta> {
    let p = mesh.peer(1, 2)?;
    let back = mesh.peer(2, 1)?;
    let q = &p["quic"];
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let (out, inq) = (&p["queue_out"], &back["queue_in"]);
    Ok(QuicDelta {
        dgrams_received: n(&back["quic"]["datagrams_received"]),
        dgrams_taken: n(&back["rx"]["datagrams"])
            + back["drops"]
                .as_object()
                .map_or(0, |d| d.values().map(n).sum::<u64>()),
        codel_drops_out: n(&out["codel_drops"]),
        ecn_marks_out: n(&out["ecn_marks"]),
        codel_drops_in: n(&inq["codel_drops"]),
        ecn_marks_in: n(&inq["ecn_marks"]),
        overlimit_drops: n(&out["overlimit_drops"]) + n(&inq["overlimit_drops"]),
        sent_packets: n(&q["sent_packets"]),
        lost_packets: n(&q["lost_packets"]),
        congestion_events: n(&q["congestion_events"]),
        send_waits: n(&p["send_waits"]),
        too_big: n(&p["drops"]["too_big"]),
        black_holes: n(&q["black_holes"]),
    })
}

impl<'t> Variant<'t> {
    /// A peer's variant: traffic from pod `from` to pod `to`, wired by hand; `daemons` (and
    /// the directory of their configuration) live as long as the variant.
    pub(crate) fn peer(
        name: &'static str,
        nodes: [&'t Netns; 2],
        (from, to): (testbed::Pod, testbed::Pod),
        procs: Vec<(String, u32)>,
        daemons: Vec<Spawned>,
        dir: Option<testbed::tmp::TempDir>,
    ) -> Variant<'t> {
        Variant {
            name,
            a: from.ns,
            b_ip: to.addr.to_string(),
            b: to.ns,
            nodes,
            procs,
            _daemons: daemons,
            mesh: None,
            _dir: dir,
            results: Results::default(),
        }
    }

    /// One round: idle ping, one stream with ping under load, four streams.
    pub(crate) fn round(&mut self, seconds: u32) -> Result<()> {
        probe::ping_until(&self.a, &self.b_ip, Duration::from_secs(10))?;
        let idle = pings(&self.a, &self.b_ip, 1)?;
        self.results.idle_ms.extend(idle);

        let links_before = [link_drops(self.nodes[0])?, link_drops(self.nodes[1])?];
        let udp_before = [udp_counters(self.nodes[0])?, udp_counters(self.nodes[1])?];
        let quic_before = self.mesh.as_ref().map(quic_counters).transpose()?;
        let cpu_before: Vec<_> = self
            .procs
            .iter()
            .map(|(l, p)| (l.clone(), thread_ticks(*p)))
            .collect();
        let waits_before: Vec<u64> = self
            .procs
            .iter()
            .map(|(_, p)| runqueue_wait_ns(*p))
            .collect();
        let started = Instant::now();
        let (a, b, ip) = (&self.a, &self.b, self.b_ip.as_str());
        let mesh = self.mesh.as_ref();
        let (gbit, loaded, mid) = std::thread::scope(|s| {
            let pinger = s.spawn(|| {
                std::thread::sleep(Duration::from_millis(800));
                pings(a, ip, seconds.saturating_sub(1).max(1))
            });
            // The sender's view of its connection halfway through the stream.
            let sampler = s.spawn(|| {
                std::thread::sleep(Duration::from_millis(u64::from(seconds) * 500));
                mesh.map(|m| m.peer(1, 2)).transpose()
            });
            let gbit = iperf(a, b, ip, seconds, 1);
            let loaded = pinger.join().expect("the pinger does not panic");
            let mid = sampler.join().expect("the sampler does not panic");
            (gbit, loaded, mid)
        });
        if let Ok(Some(p)) = mid {
            self.results
                .mid_rtt_ms
                .push(p["rtt_ms"].as_f64().unwrap_or(f64::NAN));
            self.results
                .mid_cwnd
                .push(p["quic"]["cwnd"].as_f64().unwrap_or(f64::NAN));
        }
        let elapsed = started.elapsed().as_secs_f64();
        let one = gbit?;
        self.results.gbit.push(one.gbit);
        self.results.retransmits += one.retransmits;
        self.results.stream_rtt_ms.push(one.mean_rtt_ms);
        self.results.loaded_ms.extend(loaded?);
        self.results.cpu_seconds += elapsed;
        for ((label, pid), before) in self.procs.iter().zip(waits_before) {
            *self.results.runq_wait_ns.entry(label.clone()).or_default() +=
                runqueue_wait_ns(*pid).saturating_sub(before);
        }
        for (label, before) in cpu_before {
            let pid = self.procs.iter().find(|(l, _)| *l == label).map(|p| p.1);
            let after = pid.map(thread_ticks).unwrap_or_default();
            for (thread, t) in after {
                let d = t.saturating_sub(before.get(&thread).copied().unwrap_or(0));
                *self.results.cpu.entry((label.clone(), thread)).or_default() += d;
            }
        }
        for (i, before) in links_before.iter().enumerate() {
            for (key, n) in link_drops(self.nodes[i])? {
                let d = n.saturating_sub(before.get(&key).copied().unwrap_or(0));
                *self
                    .results
                    .link_drops
                    .entry((i + 1, key.0, key.1))
                    .or_default() += d;
            }
        }
        for (i, b) in udp_before.iter().enumerate() {
            let a = udp_counters(self.nodes[i])?;
            let acc = &mut self.results.udp[i];
            acc.rcvbuf_errors += a.rcvbuf_errors - b.rcvbuf_errors;
            acc.sndbuf_errors += a.sndbuf_errors - b.sndbuf_errors;
            acc.in_errors += a.in_errors - b.in_errors;
        }
        if let (Some(before), Some(mesh)) = (quic_before, self.mesh.as_ref()) {
            let after = quic_counters(mesh)?;
            let acc = self.results.quic.get_or_insert_default();
            acc.sent_packets += after.sent_packets.saturating_sub(before.sent_packets);
            acc.lost_packets += after.lost_packets.saturating_sub(before.lost_packets);
            acc.congestion_events += after
                .congestion_events
                .saturating_sub(before.congestion_events);
            acc.send_waits += after.send_waits.saturating_sub(before.send_waits);
            acc.too_big += after.too_big.saturating_sub(before.too_big);
            acc.black_holes += after.black_holes.saturating_sub(before.black_holes);
            acc.dgrams_received += after.dgrams_received.saturating_sub(before.dgrams_received);
            acc.dgrams_taken += after.dgrams_taken.saturating_sub(before.dgrams_taken);
            acc.codel_drops_out += after.codel_drops_out.saturating_sub(before.codel_drops_out);
            acc.ecn_marks_out += after.ecn_marks_out.saturating_sub(before.ecn_marks_out);
            acc.codel_drops_in += after.codel_drops_in.saturating_sub(before.codel_drops_in);
            acc.ecn_marks_in += after.ecn_marks_in.saturating_sub(before.ecn_marks_in);
            acc.overlimit_drops += after.overlimit_drops.saturating_sub(before.overlimit_drops);
        }

        self.results
            .gbit4
            .push(iperf(&self.a, &self.b, &self.b_ip, seconds, 4)?.gbit);
        Ok(())
    }

    pub(crate) fn print(&self) {
        let n = self.name;
        let r = &self.results;
        let list = |v: &[f64]| {
            v.iter()
                .map(|x| format!("{x:.2}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        println!("{n}_gbit={}", show(percentile(&r.gbit, 0.5), 3));
        println!(
            "{n}_gbit_min={}\n{n}_gbit_max={}\n{n}_gbit_rounds={}",
            show(percentile(&r.gbit, 0.0), 3),
            show(percentile(&r.gbit, 1.0), 3),
            list(&r.gbit)
        );
        println!("{n}_4streams_gbit={}", show(percentile(&r.gbit4, 0.5), 3));
        println!("{n}_4streams_gbit_rounds={}", list(&r.gbit4));
        println!("{n}_ping_p50_ms={}", show(percentile(&r.idle_ms, 0.5), 3));
        println!("{n}_ping_p99_ms={}", show(percentile(&r.idle_ms, 0.99), 3));
        println!(
            "{n}_ping_loaded_p50_ms={}",
            show(percentile(&r.loaded_ms, 0.5), 3)
        );
        println!(
            "{n}_ping_loaded_p99_ms={}",
            show(percentile(&r.loaded_ms, 0.99), 3)
        );
        println!("diag_{n}_tcp_retransmits={}", r.retransmits);
        println!(
            "diag_{n}_tcp_stream_rtt_ms={}",
            show(percentile(&r.stream_rtt_ms, 0.5), 3)
        );
        if !r.mid_rtt_ms.is_empty() {
            println!(
                "diag_{n}_quic_rtt_ms_loaded={}\ndiag_{n}_quic_cwnd_kib_loaded={}",
                list(&r.mid_rtt_ms),
                list(&r.mid_cwnd.iter().map(|c| c / 1024.0).collect::<Vec<_>>())
            );
        }
        // Diagnostics: CPU of each process's busiest threads during the single stream, in
        // percent of one core.
        let hz = 100.0;
        let mut by_label: BTreeMap<&str, Vec<(f64, &str)>> = BTreeMap::new();
        for ((label, thread), ticks) in &r.cpu {
            let pct = *ticks as f64 / hz / r.cpu_seconds.max(1e-9) * 100.0;
            by_label.entry(label).or_default().push((pct, thread));
        }
        for (label, mut threads) in by_label {
            threads.sort_by(|x, y| y.0.total_cmp(&x.0));
            let total: f64 = threads.iter().map(|t| t.0).sum();
            println!("diag_{n}_{label}_cpu_pct={total:.0}");
            let top: Vec<String> = threads
                .iter()
                .filter(|t| t.0 >= 1.0)
                .map(|(p, t)| format!("{t}:{p:.0}"))
                .collect();
            println!("diag_{n}_{label}_threads_cpu_pct={}", top.join(","));
        }
        for (label, ns) in &r.runq_wait_ns {
            // Percent of the wall time: a process waiting 10 % of the time for a CPU was
            // held back by the machine for that long.
            let pct = *ns as f64 / 1e9 / r.cpu_seconds.max(1e-9) * 100.0;
            println!("diag_{n}_{label}_runqueue_wait_pct={pct:.1}");
        }
        for (i, u) in r.udp.iter().enumerate() {
            let node = i + 1;
            println!(
                "diag_{n}_node{node}_udp_rcvbuf_errors={}\ndiag_{n}_node{node}_udp_sndbuf_errors={}\ndiag_{n}_node{node}_udp_in_errors={}",
                u.rcvbuf_errors, u.sndbuf_errors, u.in_errors
            );
        }
        for ((node, dev, way), d) in &r.link_drops {
            if *d > 0 {
                println!("diag_{n}_node{node}_{dev}_{way}_dropped={d}");
            }
        }
        if let Some(q) = r.quic {
            println!(
                "diag_{n}_quic_sent_packets={}\ndiag_{n}_quic_lost_packets={}\ndiag_{n}_quic_congestion_events={}\ndiag_{n}_send_waits={}\ndiag_{n}_too_big_drops={}\ndiag_{n}_quic_black_holes={}",
                q.sent_packets,
                q.lost_packets,
                q.congestion_events,
                q.send_waits,
                q.too_big,
                q.black_holes
            );
            println!(
                "diag_{n}_codel_drops_out={}\ndiag_{n}_ecn_marks_out={}\ndiag_{n}_codel_drops_in={}\ndiag_{n}_ecn_marks_in={}\ndiag_{n}_queue_overlimit_drops={}",
                q.codel_drops_out,
                q.ecn_marks_out,
                q.codel_drops_in,
                q.ecn_marks_in,
                q.overlimit_drops
            );
            if q.dgrams_received > 0 {
                println!(
                    "diag_{n}_quic_recv_buffer_drops={}",
                    q.dgrams_received.saturating_sub(q.dgrams_taken)
                );
            }
        }
    }

    /// The mesh's queues at the end of the run: how long packets waited, out on node 1 and
    /// in on node 2 (every run of the variant together).
    pub(crate) fn print_queues(&self) {
        let Some(mesh) = self.mesh.as_ref() else {
            return;
        };
        let n = self.name;
        for (way, from, to) in [("out", 1, 2), ("in", 2, 1)] {
            let Ok(p) = mesh.peer(from, to) else { continue };
            let q = &p[format!("queue_{way}")];
            let Some(buckets) = q["sojourns"]["buckets"].as_array() else {
                continue;
            };
            let counts: Vec<u64> = buckets.iter().map(|b| b.as_u64().unwrap_or(0)).collect();
            for (label, quant) in [("p50", 0.5), ("p99", 0.99)] {
                println!(
                    "diag_{n}_sojourn_{way}_{label}_ms={:.3}",
                    bucket_quantile(&counts, quant)
                );
            }
        }
    }

    pub(crate) fn gbit(&self) -> Option<f64> {
        percentile(&self.results.gbit, 0.5)
    }
}
