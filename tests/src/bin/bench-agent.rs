//! `bench/agent`: how fast a node joins. One control plane and relay; then, run after run, a
//! fresh machine (a node namespace with its own filesystem view and cgroup root) that gets
//! only an identity document and `socialweb-agent run`, exactly as in the tests. Each run
//! times, from the agent's start: the Node registered (it appears in the API) and the Node
//! Ready, polled through the API every 50 ms.
//!
//! The peer is the seeds' figure: their guest reached Ready 5.5 s after its VMM started
//! (shared/seeds/plan-0004-streamplace-test-job.md). Ours starts at the agent, not at a VMM
//! (no guest kernel boots here), so the ratio bounds only the part after boot.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use testbed::k8s::{ControlPlane, KubeNode, cni_bin_dir, mesh_keygen, node_options};
use testbed::mesh::Relay;
use testbed::stats::{print_summary, show};
use testbed::topology::HOST_SERVICE_ADDR;
use testbed::{Reach, Topology};

/// The seeds' guest: VMM start to Node Ready.
const SEED_READY_MS: f64 = 5500.0;

#[derive(Debug, Parser)]
#[command(about = "Agent start to Node registered and Ready, over several runs")]
struct Args {
    /// Runs (one fresh machine each).
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u8).range(1..=50))]
    runs: u8,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() -> Result<()> {
    let args = Args::parse();
    let topo = Topology::new(args.runs, Reach::HostOnly)?;
    let _dns = testbed::resolver::dnsmasq(&topo.host, HOST_SERVICE_ADDR, &[])?;
    let cp = ControlPlane::start(&topo.host, HOST_SERVICE_ADDR)?;
    let cni = cni_bin_dir()?;
    let keys = (0..args.runs)
        .map(|_| mesh_keygen())
        .collect::<Result<Vec<_>>>()?;
    let endpoints: Vec<String> = keys.iter().map(|(_, e)| e.clone()).collect();
    let _relay = Relay::start(&topo.host, Some(&endpoints), &cp.dir().join("relay.log"))?;

    let (mut to_registered, mut to_ready, mut registered_to_ready) = (vec![], vec![], vec![]);
    for (i, key) in (1..=args.runs).zip(keys) {
        let mut opts = node_options(&topo, i, &cni);
        opts.mesh_key = Some(key);
        let name = opts.name.clone();
        let t = Instant::now();
        let node = KubeNode::start(&cp, &topo.node(i).ns, opts)?;
        let started = t + node
            .timings
            .iter()
            .find(|(what, _)| *what == "agent started")
            .map(|(_, d)| *d)
            .context("no agent start time")?;
        let mut registered = None;
        let deadline = Instant::now() + Duration::from_secs(120);
        let ready = loop {
            if Instant::now() > deadline {
                anyhow::bail!("{name} not Ready after 120 s\n{}", node.diagnostics());
            }
            if let Ok(v) = cp.kubectl_json(&["get", "node", &name]) {
                let now = Instant::now();
                registered.get_or_insert(now);
                if testbed::k8s::node_is_ready(&v) {
                    break now;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let registered = registered.expect("registered before Ready");
        let (a, b, c) = (
            ms(registered - started),
            ms(ready - started),
            ms(ready - registered),
        );
        eprintln!(
            "run {i}: agent start -> registered {a:.0} ms, -> Ready {b:.0} ms (registered -> Ready {c:.0} ms)"
        );
        to_registered.push(a);
        to_ready.push(b);
        registered_to_ready.push(c);
        drop(node);
    }
    println!("runs={}", args.runs);
    print_summary("agent_start_to_registered_ms", "", 0, &mut to_registered);
    let p50 = print_summary("agent_start_to_ready_ms", "", 0, &mut to_ready);
    print_summary("registered_to_ready_ms", "", 0, &mut registered_to_ready);
    println!("seed_guest_vmm_start_to_ready_ms={SEED_READY_MS:.0}");
    println!(
        "ratio_ready_vs_seed_guest={}",
        show(p50.map(|p| p / SEED_READY_MS), 3)
    );
    Ok(())
}
