//! `bench/scale`: what a tenant cluster costs at rest and how fast it leaves zero.
//!
//! - The scale decision's cost over 10,000 Pods (the pure function, in process).
//! - The placement on shapes, in process: plan time for 1,000 and 10,000 waiting Pods of
//!   mixed shapes, the nodes rented against the lower bound, and an hour of CI replayed
//!   against the product's decision and the one it replaced (`testbed::scale_trace`).
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
use socialweb_broker::config::{Access, ClusterDefaults, Registration};
use socialweb_broker_core::scale::NodeSize;
use socialweb_broker_core::scale::{
    Knobs, LeaseView, Offers, Phase, PodView, Pool, Rentable, Scheduling, decide,
};
use socialweb_market::{NodeSpec, Shape};
use testbed::broker::{Broker, BrokerOptions};
use testbed::stats::{percentile_sorted, show};

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
    /// Rounds of each datastore (etcd, kine, interleaved): create, idle memory, wake.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u8).range(1..=50))]
    ds_rounds: u8,
    /// GOGC values for the control plane's components (`clusters.gogc`), compared in rounds
    /// interleaved across them (the broker restarted with each), on --tune-on.
    #[arg(long, value_delimiter = ',', default_values_t = [100u32, 50])]
    gogc: Vec<u32>,
    /// The datastore the GOGC rounds run on.
    #[arg(long, default_value = "etcd", value_parser = ["etcd", "kine"])]
    tune_on: String,
    /// Rounds of each GOGC value.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(1..=50))]
    tune_rounds: u8,
    /// Clusters created and left to hibernate, for the broker's cost of one at rest.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=500))]
    at_rest: u32,
    /// Wakes timed, each from hibernation to the first answer at the front.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=500))]
    wakes: u32,
    /// Only the in-process figures: the decision's cost, the placement's plan time and
    /// packing, and the CI trace replayed (no broker, no root needed).
    #[arg(long)]
    simulation_only: bool,
}

/// Prints `v`'s median and spread (`testbed::stats`), `none` each without samples; returns
/// the median.
fn stats(name: &str, unit: &str, mut v: Vec<f64>) -> Option<f64> {
    testbed::stats::print_summary(name, &format!("_{unit}"), 1, &mut v)
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
            extended: Vec::new(),
            scheduling: Scheduling::Unschedulable(String::new()),
            claims: Vec::new(),
            labels: Default::default(),
            anti_affinity: Vec::new(),
            affinity: Vec::new(),
            spread: Vec::new(),
            node: Default::default(),
            host_ports: Vec::new(),
        })
        .collect()
}

fn decision_cost() {
    let pods = pods();
    let leases: Vec<LeaseView> = (0..100)
        .map(|i| LeaseView {
            node: format!("n{i}"),
            live: true,
            spec: socialweb_market::NodeSpec {
                vcpu: 2,
                mem_mib: 4096,
                disk_mib: 20480,
            },
            allocatable: None,
            topology: Default::default(),
            pod_capacity: None,
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
        max_hold: Duration::from_secs(3600),
    };
    let labels = Default::default();
    let offers = Offers {
        shapes: &[],
        labels: &labels,
        daemonsets: &[],
    };
    let t0 = SystemTime::now();
    let mut us = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        let d = decide(&pods, &leases, &offers, &Pool::default(), &knobs, t0, t0);
        std::hint::black_box(&d);
        us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    stats("decide_10k_pods", "us", us);
}

/// The market of the simulation: 1, 2 and 4 vCPU (2 GiB a vCPU), priced by the vCPU.
fn shapes() -> Vec<Rentable> {
    [1u32, 2, 4]
        .map(|v| Shape {
            spec: NodeSpec {
                vcpu: v,
                mem_mib: 2048 * u64::from(v),
                disk_mib: 20480,
            },
            price_micros_per_hour: u64::from(v) * 10_000,
        })
        .map(Rentable::anywhere)
        .to_vec()
}

/// `n` waiting Pods of mixed shapes: requests from 100m to 3 CPUs and 128 MiB to 6 GiB,
/// one in ten a CI job with the seeds' anti-affinity (one a node), one in twenty pinned to
/// a shape by its nodeSelector.
fn mixed_pods(n: usize) -> Vec<PodView> {
    use socialweb_broker_core::placement::{
        AntiAffinity, INSTANCE_TYPE, Namespaces, Requirement, Selector,
    };
    let runner = "project.runner.gitlab.com/id";
    let cpus = [100u64, 250, 500, 1000, 1500, 3000];
    let mems = [128u64 << 20, 512 << 20, 1 << 30, 2 << 30, 3 << 30, 6 << 30];
    (0..n)
        .map(|i| {
            // A fixed scramble of i: shapes vary without a generator.
            let h = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32;
            let mut p = PodView {
                namespace: "ci".into(),
                name: format!("p{i}"),
                phase: Phase::Pending,
                priority: 0,
                node_name: None,
                follows_nodes: false,
                cpu_millis: cpus[(h % 6) as usize],
                memory_bytes: mems[((h / 6) % 6) as usize].min(cpus[(h % 6) as usize] << 21),
                extended: Vec::new(),
                scheduling: Scheduling::Unschedulable(String::new()),
                claims: Vec::new(),
                labels: Default::default(),
                anti_affinity: Vec::new(),
                affinity: Vec::new(),
                spread: Vec::new(),
                node: Default::default(),
                host_ports: Vec::new(),
            };
            if i % 10 == 0 {
                p.labels = [(runner.to_string(), "42".to_string())].into();
                p.anti_affinity = vec![AntiAffinity {
                    selector: Selector {
                        match_expressions: vec![Requirement::Exists(runner.into())],
                        ..Default::default()
                    },
                    namespaces: Namespaces::Listed(vec![]),
                    topology_key: socialweb_broker_core::placement::HOSTNAME.into(),
                }];
            } else if i % 20 == 5 {
                p.node.selector = [(INSTANCE_TYPE.to_string(), "4vcpu-8192mib".to_string())].into();
            }
            p
        })
        .collect()
}

/// The placement on shapes: plan time for 1k and 10k waiting Pods, the nodes rented against
/// the lower bound, and the CI trace's bill against the decision it replaced.
fn simulation() {
    let shapes = shapes();
    let labels = Default::default();
    let offers = Offers {
        shapes: &shapes,
        labels: &labels,
        daemonsets: &[],
    };
    let knobs = Knobs {
        max_nodes: 100_000,
        pods_per_node: 110,
        hold: Duration::from_secs(120),
        expendable_priority_cutoff: -10,
        node: NodeSize::default(),
        max_hold: Duration::from_secs(3600),
    };
    let t0 = SystemTime::now();
    for (n, rounds) in [(1_000usize, 50), (10_000, 10)] {
        let pods = mixed_pods(n);
        let mut ms = Vec::new();
        let mut last = None;
        for _ in 0..rounds {
            let t = Instant::now();
            let d = decide(&pods, &[], &offers, &Pool::default(), &knobs, t0, t0);
            ms.push(t.elapsed().as_secs_f64() * 1e3);
            last = Some(d);
        }
        let k = if n == 1_000 { "1k" } else { "10k" };
        stats(&format!("plan_{k}_pods"), "ms", ms);
        let d = last.expect("a round");
        // The lower bound: the requests over the largest shape (its planned memory), or
        // the anti-affine jobs, one a node, whichever is more.
        let big = shapes.last().expect("a shape").shape.spec;
        let cpu: u64 = pods.iter().map(|p| p.cpu_millis).sum();
        let mem: u64 = pods.iter().map(|p| p.memory_bytes).sum();
        let big_mem = (big.mem_mib << 20)
            - (big.mem_mib << 20) * socialweb_broker_core::scale::MEMORY_RESERVE_PERCENT / 100;
        let anti = pods.iter().filter(|p| !p.anti_affinity.is_empty()).count() as u64;
        let bound = cpu
            .div_ceil(u64::from(big.vcpu) * 1000)
            .max(mem.div_ceil(big_mem))
            .max(anti);
        let vcpus: u64 = d.shapes.iter().map(|s| u64::from(s.shape.spec.vcpu)).sum();
        println!("plan_{k}_nodes={}", d.shapes.len());
        println!("plan_{k}_lower_bound_nodes={bound}");
        println!(
            "ratio_{k}_nodes_vs_lower_bound={:.3}",
            d.shapes.len() as f64 / bound as f64
        );
        println!(
            "ratio_{k}_vcpus_vs_requests={:.3}",
            vcpus as f64 * 1000.0 / cpu as f64
        );
    }
    trace(&knobs, &shapes);
}

/// The CI hour replayed against the product's decision and the one it replaced.
fn trace(knobs: &Knobs, shapes: &[Rentable]) {
    use testbed::scale_trace::{Count, Product, ci_hour, replay};
    let jobs = ci_hour(2, 7);
    println!("trace_jobs={}", jobs.len());
    let mut product = Product {
        knobs: Knobs {
            pods_per_node: 8,
            max_nodes: 200,
            ..*knobs
        },
        shapes: shapes.to_vec(),
        last_intent: SystemTime::UNIX_EPOCH,
        empty_since: Default::default(),
    };
    // The operator of the seeds sets pods_per_node from a measured job: a 2-vCPU node
    // holds two of the common 1000m jobs.
    let mut count = Count {
        pods_per_node: 2,
        max_nodes: 200,
        hold: knobs.hold,
        node: shapes[1].shape.spec,
        last_intent: SystemTime::UNIX_EPOCH,
    };
    let (step_s, boot_s, limit_s) = (10, 30, 4 * 3600);
    let p = replay(&jobs, &mut product, step_s, boot_s, limit_s);
    let c = replay(&jobs, &mut count, step_s, boot_s, limit_s);
    for (name, b) in [("product", &p), ("count", &c)] {
        println!("trace_{name}_node_minutes={:.0}", b.node_minutes);
        println!("trace_{name}_vcpu_minutes={:.0}", b.vcpu_minutes);
        println!("trace_{name}_nodes_rented={}", b.nodes_rented);
        println!("trace_{name}_wait_p50_s={}", show(b.wait_p50_s, 0));
        println!("trace_{name}_wait_p99_s={}", show(b.wait_p99_s, 0));
        println!("trace_{name}_jobs_never_ran={}", b.never_ran);
    }
    println!(
        "ratio_trace_vcpu_minutes_vs_count={:.3}",
        p.vcpu_minutes / c.vcpu_minutes
    );
    println!(
        "ratio_trace_node_minutes_vs_count={:.3}",
        p.node_minutes / c.node_minutes
    );
    mixed_trace(&product.knobs, shapes, (step_s, boot_s, limit_s));
}

/// The CI hour as CI is written now (issue 59): native sidecars, gated jobs and pause Pods,
/// replayed against the product's decision; what it paid against the least any decision
/// could pay (every job running the moment its gate lifts, on perfectly packed nodes of the
/// largest shape).
fn mixed_trace(knobs: &Knobs, shapes: &[Rentable], (step_s, boot_s, limit_s): (u64, u64, u64)) {
    use testbed::scale_trace::{Product, ci_hour_mixed, lower_bound, replay};
    let jobs = ci_hour_mixed(2, 7);
    let mut product = Product {
        knobs: *knobs,
        shapes: shapes.to_vec(),
        last_intent: SystemTime::UNIX_EPOCH,
        empty_since: Default::default(),
    };
    let b = replay(&jobs, &mut product, step_s, boot_s, limit_s);
    let largest = shapes
        .iter()
        .map(|s| s.shape.spec)
        .max_by_key(|s| (s.vcpu, s.mem_mib))
        .expect("shapes on offer");
    let (lb_nodes, lb_vcpus) = lower_bound(&jobs, largest, step_s);
    println!("trace_mixed_jobs={}", jobs.len());
    println!("trace_mixed_node_minutes={:.0}", b.node_minutes);
    println!("trace_mixed_vcpu_minutes={:.0}", b.vcpu_minutes);
    println!("trace_mixed_lower_bound_node_minutes={lb_nodes:.0}");
    println!("trace_mixed_lower_bound_vcpu_minutes={lb_vcpus:.0}");
    println!("trace_mixed_nodes_rented={}", b.nodes_rented);
    println!("trace_mixed_wait_p50_s={}", show(b.wait_p50_s, 0));
    println!("trace_mixed_wait_p99_s={}", show(b.wait_p99_s, 0));
    println!("trace_mixed_jobs_never_ran={}", b.never_ran);
    println!(
        "ratio_trace_mixed_vcpu_minutes_vs_lower_bound={:.3}",
        b.vcpu_minutes / lb_vcpus
    );
}

/// Memory of the processes a cluster's pidfiles name, in MiB: the resident set of each, and
/// the total proportional set (shared pages split between the processes sharing them: the
/// four components are one multicall binary, whose text RSS counts four times).
fn control_plane_memory(run_dir: &Path) -> Result<Memory> {
    let mut total = 0.0;
    let mut pss = 0.0;
    let mut uss = 0.0;
    let mut anon = 0.0;
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
        uss += uss_mib(pid)?;
        anon += rollup_mib(pid, "Anonymous:")?;
        each.push((name.replace('-', "_"), mib));
    }
    if each.is_empty() {
        bail!("no control-plane pidfile in {}", run_dir.display());
    }
    each.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Memory {
        rss_total: total,
        pss_total: pss,
        uss_total: uss,
        anon_total: anon,
        rss_each: each,
    })
}

/// [`control_plane_memory`]'s reading, in MiB.
struct Memory {
    rss_total: f64,
    pss_total: f64,
    uss_total: f64,
    /// Anonymous memory (heaps, stacks): what each more cluster costs whatever binaries it
    /// shares with the others.
    anon_total: f64,
    /// Per component, by name.
    rss_each: Vec<(String, f64)>,
}

/// A field of `/proc/<pid>/smaps_rollup`, in MiB.
fn rollup_mib(pid: u32, field: &str) -> Result<f64> {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))?;
    let kb: f64 = rollup
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .with_context(|| format!("no {field}"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kb / 1024.0)
}

fn pss_mib(pid: u32) -> Result<f64> {
    rollup_mib(pid, "Pss:")
}

/// The unique set: pages only this process maps, what one more of it costs.
fn uss_mib(pid: u32) -> Result<f64> {
    Ok(rollup_mib(pid, "Private_Clean:")? + rollup_mib(pid, "Private_Dirty:")?)
}

/// What a directory holds on disk, in MiB (`du`: blocks, so preallocated files count).
fn disk_mib(dir: &Path) -> Result<f64> {
    let o = std::process::Command::new("du")
        .arg("-sk")
        .arg(dir)
        .output()?;
    let kb: f64 = String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()
        .context("du's output")?
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

/// A user's key and DID (`socialweb-broker api keygen`).
fn keygen(dir: &Path) -> Result<(std::path::PathBuf, String)> {
    let key = dir.join("user.key");
    let o = std::process::Command::new(testbed::cni::workspace_bin("socialweb-broker"))
        .args(["api", "keygen", "--out"])
        .arg(&key)
        .output()?;
    if !o.status.success() {
        bail!("keygen: {}", String::from_utf8_lossy(&o.stderr));
    }
    Ok((key, String::from_utf8_lossy(&o.stdout).trim().to_string()))
}

/// The user every measured cluster belongs to (wakes come through the front, as a user's).
struct Tenant {
    dir: testbed::tmp::TempDir,
    key: std::path::PathBuf,
    did: String,
}

impl Tenant {
    fn new() -> Result<Tenant> {
        let dir = testbed::tmp::TempDir::new("bench-scale-user")?;
        let (key, did) = keygen(dir.path())?;
        Ok(Tenant { dir, key, did })
    }

    /// A kubeconfig for its cluster `name`, as curl takes it.
    fn curlable(&self, b: &Broker<'_>, name: &str) -> Result<Curlable> {
        let kc = self.dir.path().join(format!("{name}.kubeconfig"));
        b.api(
            &self.key,
            &[
                "kubeconfig",
                name,
                "--lifetime",
                "2h",
                "--out",
                kc.to_str().unwrap(),
            ],
        )?;
        curlable(&kc)
    }
}

/// What one datastore measured, a value per round.
#[derive(Default)]
struct Figures {
    ready_ms: Vec<f64>,
    pss: Vec<f64>,
    rss: Vec<f64>,
    uss: Vec<f64>,
    anon: Vec<f64>,
    /// The cluster's directory while it hibernates.
    disk: Vec<f64>,
    wake_ms: Vec<f64>,
    /// Per component, from the last round.
    each: Vec<(String, f64)>,
}

/// `v`'s median (`testbed::stats`).
fn median(mut v: Vec<f64>) -> Option<f64> {
    testbed::stats::median(&mut v)
}

/// The ratio of two series' medians.
fn ratio(over: Vec<f64>, under: Vec<f64>) -> Option<f64> {
    median(over).zip(median(under)).map(|(a, b)| a / b)
}

/// One round of one datastore: a cluster created, its idle control plane sampled, put to
/// sleep, woken by a request at the front, deleted.
fn datastore_round(
    b: &Broker<'_>,
    user: &Tenant,
    ds: &str,
    name: &str,
    samples: u32,
    f: &mut Figures,
) -> Result<()> {
    let t = Instant::now();
    let c = b.cli_json(&[
        "cluster",
        "create",
        name,
        "--owner",
        &user.did,
        "--datastore",
        ds,
        "--hibernate-after",
        "0",
    ])?;
    if c["state"] != "ready" || c["datastore"] != ds {
        bail!("{name} not ready on {ds}: {c}\n{}", b.diagnostics());
    }
    f.ready_ms.push(t.elapsed().as_secs_f64() * 1e3);
    // Idle: let the controllers settle, then sample.
    std::thread::sleep(Duration::from_secs(10));
    let run_dir = b.cluster_dir(name).join("run");
    let (mut pss, mut rss, mut uss, mut anon) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..samples.max(1) {
        let m = control_plane_memory(&run_dir)?;
        pss.push(m.pss_total);
        rss.push(m.rss_total);
        uss.push(m.uss_total);
        anon.push(m.anon_total);
        f.each = m.rss_each;
        std::thread::sleep(Duration::from_secs(1));
    }
    f.pss.extend(median(pss));
    f.rss.extend(median(rss));
    f.uss.extend(median(uss));
    f.anon.extend(median(anon));
    let client = user.curlable(b, name)?;
    b.cli(&["cluster", "set", name, "--hibernate-after", "1s"])?;
    wait(
        &format!("{name} hibernating"),
        Duration::from_secs(60),
        || Ok((state_of(b, name)? == "hibernating").then_some(())),
    )?;
    f.disk.push(disk_mib(&b.cluster_dir(name))?);
    f.wake_ms.push(first_answer_ms(b, &client)?);
    b.cli(&["cluster", "delete", name])?;
    eprintln!(
        "{ds} round: ready {:.0} ms, idle PSS {:.0} MiB, wake {:.0} ms",
        f.ready_ms[f.ready_ms.len() - 1],
        f.pss[f.pss.len() - 1],
        f.wake_ms[f.wake_ms.len() - 1]
    );
    Ok(())
}

/// etcd and kine side by side, rounds interleaved (etcd, kine, etcd, ...).
fn datastores(b: &Broker<'_>, user: &Tenant, rounds: u8, samples: u32) -> Result<()> {
    let kinds = ["etcd", "kine"];
    let mut figs: Vec<Figures> = kinds.iter().map(|_| Figures::default()).collect();
    for r in 0..rounds {
        for (i, ds) in kinds.iter().enumerate() {
            datastore_round(b, user, ds, &format!("{ds}{r}"), samples, &mut figs[i])?;
        }
    }
    for (ds, f) in kinds.iter().zip(&figs) {
        for (name, mib) in &f.each {
            println!("idle_{ds}_{name}_rss_mib={mib:.1}");
        }
        println!("idle_awake_pss_mib_{ds}={}", show(median(f.pss.clone()), 1));
        stats(&format!("idle_awake_pss_{ds}"), "mib", f.pss.clone());
        stats(&format!("idle_awake_rss_{ds}"), "mib", f.rss.clone());
        stats(&format!("idle_awake_uss_{ds}"), "mib", f.uss.clone());
        stats(&format!("idle_awake_anon_{ds}"), "mib", f.anon.clone());
        stats(&format!("hibernated_disk_{ds}"), "mib", f.disk.clone());
        stats(&format!("create_to_ready_{ds}"), "ms", f.ready_ms.clone());
        stats(
            &format!("wake_to_first_answer_{ds}"),
            "ms",
            f.wake_ms.clone(),
        );
    }
    let kine_vs_etcd = |g: fn(&Figures) -> Vec<f64>| show(ratio(g(&figs[1]), g(&figs[0])), 3);
    for (what, v) in [
        ("idle_pss", kine_vs_etcd(|f| f.pss.clone())),
        ("create_to_ready", kine_vs_etcd(|f| f.ready_ms.clone())),
        ("wake", kine_vs_etcd(|f| f.wake_ms.clone())),
        ("idle_uss", kine_vs_etcd(|f| f.uss.clone())),
        ("idle_anon", kine_vs_etcd(|f| f.anon.clone())),
        ("hibernated_disk", kine_vs_etcd(|f| f.disk.clone())),
    ] {
        println!("ratio_kine_vs_etcd_{what}={v}");
    }
    Ok(())
}

/// Restarts the broker with `clusters.gogc = gogc`.
fn restart_with_gogc(b: &mut Broker<'_>, gogc: u32) -> Result<()> {
    b.edit_config(|c| c.clusters.gogc = gogc)?;
    b.kill_broker();
    b.start_broker()
}

/// GOGC values side by side: rounds interleaved across them, the broker restarted with each.
fn tune_gogc(b: &mut Broker<'_>, user: &Tenant, args: &Args) -> Result<()> {
    let mut figs: Vec<Figures> = args.gogc.iter().map(|_| Figures::default()).collect();
    for r in 0..args.tune_rounds {
        for (i, g) in args.gogc.iter().enumerate() {
            restart_with_gogc(b, *g)?;
            let name = format!("gogc{g}r{r}");
            datastore_round(b, user, &args.tune_on, &name, args.samples, &mut figs[i])?;
        }
    }
    restart_with_gogc(b, 50)?;
    for (g, f) in args.gogc.iter().zip(&figs) {
        stats(&format!("idle_awake_pss_gogc{g}"), "mib", f.pss.clone());
        stats(&format!("idle_awake_uss_gogc{g}"), "mib", f.uss.clone());
        stats(&format!("idle_awake_anon_gogc{g}"), "mib", f.anon.clone());
        stats(
            &format!("wake_to_first_answer_gogc{g}"),
            "ms",
            f.wake_ms.clone(),
        );
        stats(
            &format!("create_to_ready_gogc{g}"),
            "ms",
            f.ready_ms.clone(),
        );
    }
    for (g, f) in args.gogc.iter().zip(&figs).skip(1) {
        let base = &figs[0];
        println!(
            "ratio_gogc{g}_vs_gogc{}_idle_pss={}",
            args.gogc[0],
            show(ratio(f.pss.clone(), base.pss.clone()), 3)
        );
        println!(
            "ratio_gogc{g}_vs_gogc{}_wake={}",
            args.gogc[0],
            show(ratio(f.wake_ms.clone(), base.wake_ms.clone()), 3)
        );
    }
    Ok(())
}

/// The files curl needs from a user's kubeconfig (JSON, as the broker writes it): the
/// server, and the CA, certificate and key as PEM files beside it.
struct Curlable {
    server: String,
    ca: std::path::PathBuf,
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
}

fn curlable(kubeconfig: &Path) -> Result<Curlable> {
    use base64::Engine;
    let kc: serde_json::Value = serde_json::from_slice(&std::fs::read(kubeconfig)?)?;
    let b64 = |v: &serde_json::Value| -> Result<Vec<u8>> {
        Ok(base64::engine::general_purpose::STANDARD
            .decode(v.as_str().context("a kubeconfig field")?)?)
    };
    let write = |ext: &str, data: Vec<u8>| -> Result<std::path::PathBuf> {
        let p = kubeconfig.with_extension(ext);
        std::fs::write(&p, data)?;
        Ok(p)
    };
    let cluster = &kc["clusters"][0]["cluster"];
    let user = &kc["users"][0]["user"];
    Ok(Curlable {
        server: cluster["server"].as_str().context("server")?.to_string(),
        ca: write("ca", b64(&cluster["certificate-authority-data"])?)?,
        cert: write("crt", b64(&user["client-certificate-data"])?)?,
        key: write("key", b64(&user["client-key-data"])?)?,
    })
}

/// One GET of `/api` through the front from the internet, timed by curl itself (from its
/// first byte out to the answer): the wake, when the cluster hibernates.
fn first_answer_ms(b: &Broker<'_>, c: &Curlable) -> Result<f64> {
    let o = b
        .world
        .internet
        .command("curl")
        .args(["-sS", "-o", "/dev/null", "-w", "%{http_code} %{time_total}"])
        .arg("--cacert")
        .arg(&c.ca)
        .arg("--cert")
        .arg(&c.cert)
        .arg("--key")
        .arg(&c.key)
        .arg("--max-time")
        .arg("120")
        .arg(format!("{}/api", c.server))
        .output()?;
    let out = String::from_utf8_lossy(&o.stdout);
    let (code, secs) = out.split_once(' ').context("curl's -w output")?;
    if code != "200" {
        bail!(
            "GET /api answered {code}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(secs.trim().parse::<f64>()? * 1e3)
}

fn state_of(b: &Broker<'_>, name: &str) -> Result<String> {
    let all = b.cli_json(&["cluster", "list"])?;
    Ok(all
        .as_array()
        .and_then(|a| a.iter().find(|c| c["name"] == name))
        .and_then(|c| c["state"].as_str())
        .unwrap_or("gone")
        .to_string())
}

/// The broker's own memory now, in MiB: (resident, proportional).
fn broker_memory(b: &Broker<'_>) -> Result<(f64, f64)> {
    let pid = b.broker_pid();
    Ok((rss_mib(pid)?, pss_mib(pid)?))
}

/// `n` clusters of one user, left to hibernate: what the broker holds for each at rest
/// (its memory grown, divided by `n`; the clusters on `clusters.datastore`), then `wakes` wakes, each timed from hibernation to
/// the first answer at the front.
fn at_rest(b: &Broker<'_>, user: &Tenant, n: u32, wakes: u32) -> Result<()> {
    let (rss0, pss0) = broker_memory(b)?;
    let mut clients = Vec::new();
    for i in 0..n {
        let name = format!("rest{i}");
        let c = b.cli_json(&["cluster", "create", &name, "--owner", &user.did])?;
        if c["state"] != "ready" {
            bail!("{name} not ready: {c}\n{}", b.diagnostics());
        }
        clients.push((name.clone(), user.curlable(b, &name)?));
        eprintln!("at rest: {} of {n} created", i + 1);
    }
    for (name, _) in &clients {
        wait(
            &format!("{name} hibernating"),
            Duration::from_secs(120),
            || Ok((state_of(b, name)? == "hibernating").then_some(())),
        )?;
    }
    // Let the allocator settle after the last control plane stopped.
    std::thread::sleep(Duration::from_secs(5));
    let (rss1, pss1) = broker_memory(b)?;
    let per = (rss1 - rss0).max(0.0) / f64::from(n);
    println!("at_rest_clusters={n}");
    println!("broker_rss_before_mib={rss0:.1}");
    println!("broker_rss_at_rest_mib={rss1:.1}");
    println!("broker_pss_at_rest_mib={pss1:.1}");
    println!("hibernated_rss_mib={per:.3}");
    println!(
        "hibernated_pss_mib={:.3}",
        (pss1 - pss0).max(0.0) / f64::from(n)
    );
    // What 24 GiB holds beside the broker itself.
    println!(
        "clusters_at_rest_per_24gib={:.0}",
        (24.0 * 1024.0 - rss0) / per.max(0.001)
    );
    let mut ms = Vec::new();
    for i in 0..wakes {
        let (name, c) = &clients[(i % n) as usize];
        wait(
            &format!("{name} hibernating"),
            Duration::from_secs(120),
            || Ok((state_of(b, name)? == "hibernating").then_some(())),
        )?;
        let t = first_answer_ms(b, c).with_context(|| b.diagnostics())?;
        eprintln!("wake {}: {name} answered in {t:.0} ms", i + 1);
        ms.push(t);
        // Nothing else running for the next one: this one asleep again.
        wait(
            &format!("{name} hibernating again"),
            Duration::from_secs(120),
            || Ok((state_of(b, name)? == "hibernating").then_some(())),
        )?;
    }
    ms.sort_by(f64::total_cmp);
    let pct = |p: f64| show(percentile_sorted(&ms, p), 0);
    println!("wakes={}", ms.len());
    println!("wake_to_first_answer_p50_ms={}", pct(0.5));
    println!("wake_to_first_answer_p99_ms={}", pct(0.99));
    println!("wake_to_first_answer_min_ms={}", pct(0.0));
    println!("wake_to_first_answer_max_ms={}", pct(1.0));
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    decision_cost();
    simulation();
    if args.simulation_only {
        return Ok(());
    }

    let world = testbed::world::World::new(0)?;
    let mut b = Broker::start(
        &world,
        BrokerOptions {
            max_nodes: 1,
            hold: Duration::from_secs(2),
            // Enough clusters for the at-rest count, which hibernate soon after their
            // last request.
            access: Access {
                registration: Registration::Open,
                tenants_trusted: true,
                max_clusters_per_did: args.at_rest + 1,
                max_clusters: args.at_rest + 1,
                ..Access::default()
            },
            // gogc: rewritten for each value tune_gogc compares.
            clusters: ClusterDefaults {
                hibernate_after: Duration::from_secs(2),
                gogc: 50,
                ..ClusterDefaults::default()
            },
            ..Default::default()
        },
    )?;
    let t = Instant::now();
    // Never hibernating: its idle memory is sampled, and its rounds start from zero nodes.
    let created = b.cli_json(&["cluster", "create", "bench", "--hibernate-after", "0"])?;
    if created["state"] != "ready" {
        bail!("cluster not ready: {created}\n{}", b.diagnostics());
    }
    println!(
        "cluster_create_to_ready_ms={:.0}",
        t.elapsed().as_secs_f64() * 1e3
    );

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
    println!(
        "ratio_provision_vs_ca_slo={}",
        show(p50.map(|p| p / CA_SLO_MS), 4)
    );
    b.cli(&["cluster", "delete", "bench"])?;
    let user = Tenant::new()?;
    datastores(&b, &user, args.ds_rounds, args.samples)?;
    tune_gogc(&mut b, &user, &args)?;
    at_rest(&b, &user, args.at_rest, args.wakes)?;
    Ok(())
}
