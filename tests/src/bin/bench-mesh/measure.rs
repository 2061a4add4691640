//! What the benchmark reads off a run: iperf3 and ping, per-thread CPU, device and UDP
//! counters, percentiles; and the knobs it sets on the machine for every variant alike.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use testbed::Netns;

#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct UdpCounters {
    pub(crate) rcvbuf_errors: u64,
    pub(crate) sndbuf_errors: u64,
    pub(crate) in_errors: u64,
}

/// What one iperf3 run measured.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Iperf {
    /// Gbit/s received.
    pub(crate) gbit: f64,
    /// Segments the senders retransmitted.
    pub(crate) retransmits: u64,
    /// The first stream's smoothed RTT, mean over the run (ms): the queue the stream itself
    /// sits behind.
    pub(crate) mean_rtt_ms: f64,
}

/// Sets the nice value of every thread of `pid` (nice is per thread on Linux).
pub(crate) fn renice_threads(pid: u32, nice: i32) -> Result<()> {
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))?.flatten() {
        let tid = t.file_name().to_string_lossy().into_owned();
        let out = std::process::Command::new("renice")
            .args(["-n", &nice.to_string(), "-p", &tid])
            .output()?;
        if !out.status.success() {
            bail!("renice {tid}: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
    Ok(())
}

/// Puts every thread of `pid` under SCHED_FIFO 1 (threads it starts later inherit it).
pub(crate) fn realtime_threads(pid: u32) -> Result<()> {
    let out = std::process::Command::new("chrt")
        .args(["--fifo", "--all-tasks", "--pid", "1", &pid.to_string()])
        .output()?;
    if !out.status.success() {
        bail!("chrt {pid}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// Lets network namespaces other than the host's choose `cc` (only what
/// net.ipv4.tcp_allowed_congestion_control lists may be set there).
pub(crate) fn allow_congestion_control(cc: &str) -> Result<()> {
    let key = "/proc/sys/net/ipv4/tcp_allowed_congestion_control";
    let allowed = std::fs::read_to_string(key).context(key)?;
    if !allowed.split_whitespace().any(|a| a == cc) {
        eprintln!(
            "bench: adding {cc} to net.ipv4.tcp_allowed_congestion_control ({})",
            allowed.trim()
        );
        std::fs::write(key, format!("{} {cc}", allowed.trim())).with_context(|| {
            format!("allowing {cc} (is it in tcp_available_congestion_control?)")
        })?;
    }
    Ok(())
}

/// iperf3 from `a` to `b_ip` (server in `b`), TCP, `streams` streams.
pub(crate) fn iperf(a: &Netns, b: &Netns, b_ip: &str, seconds: u32, streams: u32) -> Result<Iperf> {
    let server = b.spawn("iperf3", &["-s", "-1", "-B", b_ip])?;
    std::thread::sleep(Duration::from_millis(300));
    let out = a.output(
        "iperf3",
        &[
            "-c",
            b_ip,
            "-t",
            &seconds.to_string(),
            "-P",
            &streams.to_string(),
            "-J",
        ],
    )?;
    drop(server);
    let v: Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("iperf3 output: {}", String::from_utf8_lossy(&out.stdout)))?;
    if let Some(e) = v["error"].as_str() {
        bail!("iperf3: {e}");
    }
    let bps = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .context("no sum_received in iperf3 output")?;
    Ok(Iperf {
        gbit: bps / 1e9,
        retransmits: v["end"]["sum_sent"]["retransmits"].as_u64().unwrap_or(0),
        mean_rtt_ms: v["end"]["streams"][0]["sender"]["mean_rtt"]
            .as_f64()
            .unwrap_or(f64::NAN)
            / 1e3,
    })
}

/// RTTs (ms) of pings every 10 ms for `seconds`.
pub(crate) fn pings(a: &Netns, ip: &str, seconds: u32) -> Result<Vec<f64>> {
    let out = a.output(
        "ping",
        &["-n", "-i", "0.01", "-w", &seconds.to_string(), ip],
    )?;
    let text = String::from_utf8_lossy(&out.stdout);
    let rtts: Vec<f64> = text
        .lines()
        .filter_map(|l| l.split("time=").nth(1))
        .filter_map(|t| t.split_whitespace().next()?.parse().ok())
        .collect();
    if rtts.is_empty() {
        bail!("no ping replies from {ip}: {text}");
    }
    Ok(rtts)
}

/// The `p` percentile of `v` (`testbed::stats`: the nearest rank; none without samples).
pub(crate) fn percentile(v: &[f64], p: f64) -> Option<f64> {
    testbed::stats::percentile(&mut v.to_vec(), p)
}

pub(crate) use testbed::stats::show;

/// `a / b` with three decimals, `none` when either is missing.
pub(crate) fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    show(a.zip(b).map(|(a, b)| a / b), 3)
}

/// CPU ticks (user + system) of every thread of `pid`, by "<comm>-<tid>".
pub(crate) fn thread_ticks(pid: u32) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
            continue;
        };
        // comm is in parentheses and may hold spaces; the fields after it are fixed.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = &stat[open + 1..close];
        let rest: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        let ticks = rest
            .get(11)
            .and_then(|u| u.parse::<u64>().ok())
            .unwrap_or(0)
            + rest
                .get(12)
                .and_then(|s| s.parse::<u64>().ok())
                .unwrap_or(0);
        out.insert(format!("{comm}-{}", t.file_name().to_string_lossy()), ticks);
    }
    out
}

/// Nanoseconds all threads of `pid` have spent runnable but waiting for a CPU
/// (`/proc/<pid>/task/<tid>/schedstat`, second field): how much the machine, not the
/// process, held it back.
pub(crate) fn runqueue_wait_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}

/// Dropped packets of every device of a node namespace: (device, "tx"|"rx") -> count.
pub(crate) fn link_drops(ns: &Netns) -> Result<BTreeMap<(String, &'static str), u64>> {
    let v: Value = serde_json::from_str(&ns.ip(&["-s", "-j", "link", "show"])?)?;
    let mut out = BTreeMap::new();
    for l in v.as_array().into_iter().flatten() {
        let name = l["ifname"].as_str().unwrap_or("?").to_string();
        for way in ["tx", "rx"] {
            let n = l["stats64"][way]["dropped"].as_u64().unwrap_or(0);
            out.insert((name.clone(), way), n);
        }
    }
    Ok(out)
}

/// The upper edge (ms) of the power-of-two microsecond bucket holding quantile `q`.
pub(crate) fn bucket_quantile(counts: &[u64], q: f64) -> f64 {
    let total: u64 = counts.iter().sum();
    let want = ((total as f64) * q).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (i, c) in counts.iter().enumerate() {
        seen += c;
        if seen >= want {
            return (1u64 << i) as f64 / 1e3;
        }
    }
    f64::NAN
}

/// The node namespace's UDP counters (/proc/net/snmp is per network namespace).
pub(crate) fn udp_counters(ns: &Netns) -> Result<UdpCounters> {
    let snmp = ns.exec("cat", &["/proc/net/snmp"])?;
    let mut lines = snmp.lines().filter(|l| l.starts_with("Udp:"));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
        bail!("no Udp lines in /proc/net/snmp");
    };
    let map: BTreeMap<&str, u64> = names
        .split_whitespace()
        .zip(values.split_whitespace())
        .filter_map(|(n, v)| Some((n, v.parse().ok()?)))
        .collect();
    Ok(UdpCounters {
        rcvbuf_errors: map.get("RcvbufErrors").copied().unwrap_or(0),
        sndbuf_errors: map.get("SndbufErrors").copied().unwrap_or(0),
        in_errors: map.get("InErrors").copied().unwrap_or(0),
    })
}
