//! `bench/scale`: what a tenant cluster costs at rest and how fast it leaves zero.
//!
//! - The scale decision's cost over 10,000 Pods (the pure function, in process).
//! - One `socialweb-broker run` (the release build, the embedded local provider), one cluster:
//!   the memory of its idle control plane (every process of it, from the pidfiles: resident
//!   and proportional set), sampled once a second after it settles.
//! - Rounds of one Pod from zero: from the start of `kubectl create` to the broker's stored
//!   `Provision` decision, and to the Pod Running on a node rented for it; then back to zero
//!   before the next round.
//!
//! The peer is cluster-autoscaler's scalability SLO (a scale-up decision within 20 s of a Pod
//! turning unschedulable; it cannot run here); the ratio says what fraction of it we use.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use clap::Parser;
use socialweb_broker_core::scale::NodeSize;
use socialweb_broker_core::scale::{Knobs, LeaseView, Phase, PodView, decide};
use testbed::broker::{Broker, BrokerOptions};

/// cluster-autoscaler's SLO: unschedulable Pod to scale-up decision.
const CA_SLO_MS: f64 = 20_000.0;

#[derive(Debug, Parser)]
#[command(about = "Idle control-plane memory, decision cost, Pending to Provision and to Running")]
struct Args {
    /// Rounds of one Pod from zero (each rents a node and waits for zero again).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u8).range(1..=50))]
    rounds: u8,
    /// Seconds of idle memory samples.
    #[arg(long, default_value_t = 10)]
    samples: u32,
}

fn stats(name: &str, unit: &str, mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let p50 = v[v.len() / 2];
    println!("{name}_p50_{unit}={p50:.1}");
    println!("{name}_min_{unit}={:.1}", v[0]);
    println!("{name}_max_{unit}={:.1}", v[v.len() - 1]);
    p50
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// 10,000 Pods as a busy cluster has them: most running, some pending, some finished,
/// the addons and a few expendable ones.
fn pods() -> Vec<PodView> {
    (0..10_000)
        .map(|i| PodView {
            namespace: if i % 50 == 0 { "kube-system" } else { "ci" }.into(),
            name: format!("job-{i}"),
            phase: match i % 10 {
                0..=5 => Phase::Running,
                6..=8 => Phase::Pending,
                _ => Phase::Succeeded,
            },
            priority: if i % 97 == 0 { -10 } else { 0 },
            node_name: (i % 10 <= 5).then(|| format!("n{}", i % 100)),
            follows_nodes: i % 333 == 0,
            cpu_millis: 100,
            memory_bytes: 64 << 20,
        })
        .collect()
}

fn decision_cost() {
    let pods = pods();
    let leases: Vec<LeaseView> = (0..100)
        .map(|i| LeaseView {
            node: format!("n{i}"),
            live: true,
        })
        .collect();
    let knobs = Knobs {
        max_nodes: 1000,
        pods_per_node: 8,
        hold: Duration::from_secs(120),
        expendable_priority_cutoff: -10,
        node: NodeSize {
            vcpu: 2,
            mem_mib: 4096,
            disk_mib: 20480,
        },
    };
    let t0 = SystemTime::now();
    let mut us = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        let d = decide(&pods, &leases, &knobs, t0, t0);
        std::hint::black_box(&d);
        us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    stats("decide_10k_pods", "us", us);
}

/// Memory of the processes a cluster's pidfiles name, in MiB: the resident set of each, and
/// the total proportional set (shared pages split between the processes sharing them: the
/// four components are one multicall binary, whose text RSS counts four times).
fn control_plane_memory(run_dir: &Path) -> Result<Memory> {
    let mut total = 0.0;
    let mut pss = 0.0;
    let mut each = Vec::new();
    for e in std::fs::read_dir(run_dir).with_context(|| format!("reading {}", run_dir.display()))? {
        let path = e?.path();
        let Some(name) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".pid"))
        else {
            continue;
        };
        let pid: u32 = std::fs::read_to_string(&path)?
            .split_whitespace()
            .next()
            .context("an empty pidfile")?
            .parse()?;
        let mib = rss_mib(pid)?;
        total += mib;
        pss += pss_mib(pid)?;
        each.push((name.replace('-', "_"), mib));
    }
    if each.is_empty() {
        bail!("no control-plane pidfile in {}", run_dir.display());
    }
    each.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Memory {
        rss_total: total,
        pss_total: pss,
        rss_each: each,
    })
}

/// [`control_plane_memory`]'s reading, in MiB.
struct Memory {
    rss_total: f64,
    pss_total: f64,
    /// Per component, by name.
    rss_each: Vec<(String, f64)>,
}

fn pss_mib(pid: u32) -> Result<f64> {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))?;
    let kb: f64 = rollup
        .lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .context("no Pss")?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kb / 1024.0)
}

fn rss_mib(pid: u32) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .context("no VmRSS")?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kb / 1024.0)
}

fn pod(name: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: job
    image: socialweb.local/busybox:1
    imagePullPolicy: Never
    command: ["sh", "-c", "sleep 3600"]
"#
    )
}

fn wait<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Result<Option<T>>) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f()? {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    decision_cost();

    let world = testbed::world::World::new(0)?;
    let b = Broker::start(
        &world,
        BrokerOptions {
            max_nodes: 1,
            hold: Duration::from_secs(2),
            ..Default::default()
        },
    )?;
    let t = Instant::now();
    let created = b.cli_json(&["cluster", "create", "bench"])?;
    if created["state"] != "ready" {
        bail!("cluster not ready: {created}\n{}", b.diagnostics());
    }
    println!(
        "cluster_create_to_ready_ms={:.0}",
        t.elapsed().as_secs_f64() * 1e3
    );

    // Idle: let the controllers settle, then sample.
    std::thread::sleep(Duration::from_secs(10));
    let run_dir = b.cluster_dir("bench").join("run");
    let mut totals = Vec::new();
    let mut psss = Vec::new();
    let mut last = Vec::new();
    for _ in 0..args.samples.max(1) {
        let m = control_plane_memory(&run_dir)?;
        totals.push(m.rss_total);
        psss.push(m.pss_total);
        last = m.rss_each;
        std::thread::sleep(Duration::from_secs(1));
    }
    for (name, mib) in &last {
        println!("idle_{name}_rss_mib={mib:.1}");
    }
    stats("idle_control_plane_rss", "mib", totals);
    stats("idle_control_plane_pss", "mib", psss);

    let (mut to_provision, mut to_running) = (Vec::new(), Vec::new());
    for r in 1..=args.rounds {
        let name = format!("p{r}");
        let t0 = now_ms();
        let start = Instant::now();
        b.apply("bench", &pod(&name))?;
        let at = wait("a Provision decision", Duration::from_secs(30), || {
            let v = b.cli_json(&["cluster", "show", "bench"])?;
            Ok(v["decisions"].as_array().and_then(|d| {
                d.iter()
                    .filter(|d| d["action"] == "Provision")
                    .filter_map(|d| d["at"].as_i64())
                    .find(|at| *at >= t0)
            }))
        })
        .with_context(|| b.diagnostics())?;
        to_provision.push((at - t0) as f64);
        wait(&format!("{name} Running"), Duration::from_secs(120), || {
            let v = b.kubectl_json("bench", &["get", "pod", &name])?;
            Ok((v["status"]["phase"] == "Running").then_some(()))
        })
        .with_context(|| b.diagnostics())?;
        to_running.push(start.elapsed().as_secs_f64() * 1e3);
        b.kubectl("bench", &["delete", "pod", &name, "--wait=true"])?;
        wait("zero live leases", Duration::from_secs(90), || {
            Ok(b.live_leases()?.is_empty().then_some(()))
        })
        .with_context(|| b.diagnostics())?;
        eprintln!(
            "round {r}: provision {:.0} ms, running {:.0} ms",
            to_provision[to_provision.len() - 1],
            to_running[to_running.len() - 1]
        );
    }
    let p50 = stats("pending_to_provision", "ms", to_provision);
    stats("pending_to_running", "ms", to_running);
    println!("ratio_provision_vs_ca_slo={:.4}", p50 / CA_SLO_MS);
    Ok(())
}
