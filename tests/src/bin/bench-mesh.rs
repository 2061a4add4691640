//! Pod-to-pod throughput and latency across two node namespaces for the mesh (direct, relayed,
//! and direct at the best pod MTU its path proves) and three peers: kernel vxlan, boringtun
//! (userspace WireGuard) and quincy (a QUIC VPN on quinn). Every variant is set up once, side
//! by side in its own namespaces, then measured in interleaved rounds (mesh, vxlan, boringtun,
//! quincy, …, mesh, …), so a slow minute of this shared machine hits every variant alike.
//!
//! Held equal (bench/README.md): pod MTU, the underlay (veth, MTU 1500, default offloads), the
//! nftables state (every node has the same `ip socialweb` masquerade table the agent installs),
//! the iperf3 and ping invocations. Run by `bench/mesh`; prints `name=value` lines.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde_json::Value;
use testbed::mesh::{MeshCluster, MeshOptions};
use testbed::{Reach, Topology};

#[path = "bench-mesh/measure.rs"]
mod measure;
#[path = "bench-mesh/nat.rs"]
mod nat;
#[path = "bench-mesh/peers.rs"]
mod peers;
#[path = "bench-mesh/variant.rs"]
mod variant;

use measure::{
    allow_congestion_control, percentile, ratio, realtime_threads, renice_threads, show,
};
use variant::{Results, Variant};

/// The mesh against vxlan, boringtun and quincy, pod to pod across two nodes, interleaved.
#[derive(Debug, Parser)]
struct Args {
    /// Seconds of iperf3 per measurement.
    #[arg(long, default_value_t = 5)]
    seconds: u32,
    /// Rounds (each measures every variant once, in turn).
    #[arg(long, default_value_t = 5)]
    rounds: u32,
    /// Pod MTU every variant runs with.
    #[arg(long, default_value_t = 1280)]
    mtu: u16,
    /// The boringtun-cli binary.
    #[arg(long)]
    boringtun: PathBuf,
    /// Directory holding bin/quincy-server and bin/quincy-client.
    #[arg(long)]
    quincy: PathBuf,
    /// Only these variants (mesh, mesh_best_mtu, mesh_relayed, vxlan, boringtun, quincy,
    /// boringtun_rt and quincy_rt: the same under SCHED_FIFO 1, as the mesh's thread runs;
    /// nat_direct and nat_relayed across two providers behind NAT, nat_ratio (NAT traversal
    /// across four providers, no throughput), mesh_baseline with --baseline-agent, and the
    /// tuning variants of --levers).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Also run the mesh with each tuning knob set one way and the other (LEVERS), to see
    /// what each is worth against the agent's defaults in the same run.
    #[arg(long)]
    levers: bool,
    /// The `socialweb-agent` binary of every mesh variant but the baseline (default: the
    /// workspace's release build).
    #[arg(long)]
    agent: Option<PathBuf>,
    /// More arguments for every mesh agent but the baseline's (`--agent-arg=--mesh-nice=-5`).
    #[arg(long = "agent-arg", allow_hyphen_values = true)]
    agent_args: Vec<String>,
    /// A `socialweb-agent` binary to measure beside the workspace's, as the variant
    /// `mesh_baseline` (an earlier build: before and after in one run).
    #[arg(long)]
    baseline_agent: Option<PathBuf>,
    /// Set every variant up, print its namespaces and pods, and wait for Enter instead of
    /// measuring (to look around with iperf3, ping, ss, tcpdump, `mesh status`).
    #[arg(long)]
    hold: bool,
    /// Nice value for every tunnel's processes (each agent, the relay, boringtun, quincy),
    /// all their threads; unset: left as started.
    #[arg(long, allow_hyphen_values = true)]
    daemon_nice: Option<i32>,
    /// How the relay of the relayed variants is scheduled: `fifo` (SCHED_FIFO 1, every
    /// thread), as the agents' data-path threads run, standing for a relay on a host of its
    /// own (the broker's); `normal`: the relay waits for the two cores behind both nodes' mesh
    /// threads, which a deployment never asks of it.
    #[arg(long, value_enum, default_value_t = RelaySched::Fifo)]
    relay_sched: RelaySched,
    /// TCP congestion control in every pod (a per-namespace sysctl; new namespaces inherit
    /// it from the host otherwise). Linux's default, what a node's pods run.
    #[arg(long, default_value = "cubic")]
    pod_tcp: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum RelaySched {
    Fifo,
    Normal,
}

/// Direct mesh variants with one agent knob set: (name, arguments).
const LEVERS: &[(&str, &[&str])] = &[
    ("mesh_fifo", &["--mesh-queue", "fifo"]),
    ("mesh_no_tun_gro", &["--mesh-no-tun-gro"]),
    ("mesh_send_32k", &["--mesh-send-buffer-kib", "32"]),
    ("mesh_send_512k", &["--mesh-send-buffer-kib", "512"]),
    ("mesh_recv_2m", &["--mesh-recv-buffer-kib", "2048"]),
    ("mesh_threads_2", &["--mesh-threads", "2"]),
    ("mesh_no_realtime", &["--mesh-realtime", "0"]),
    ("mesh_nice", &["--mesh-realtime", "0", "--mesh-nice", "-10"]),
    ("mesh_ack_default", &["--mesh-ack-threshold", "0"]),
    ("mesh_cipher_any", &["--mesh-cipher", "any"]),
    (
        "mesh_codel_rfc",
        &[
            "--mesh-codel-target",
            "5ms",
            "--mesh-codel-interval",
            "100ms",
        ],
    ),
];

fn mesh<'t>(
    name: &'static str,
    topo: &'t Topology,
    mtu: Option<u16>,
    agent_args: Vec<String>,
    agent_bin: Option<&Path>,
) -> Result<Variant<'t>> {
    // With no MTU given, the agent's TUN takes 1500 and the pods the largest packet the
    // path carries, as `mesh status` reports it once path MTU discovery has run.
    let opts = MeshOptions {
        mtu: mtu.unwrap_or(1500),
        agent_args,
        agent_bin: agent_bin.map(Path::to_path_buf),
        ..MeshOptions::default()
    };
    let cluster = MeshCluster::start(topo, opts)?;
    let best_mtu = mtu.is_none();
    mesh_variant(
        name,
        cluster,
        [&topo.node(1).ns, &topo.node(2).ns],
        best_mtu,
    )
}

/// A variant over a running mesh cluster of two nodes (`nodes`, node 1 sending): its pods,
/// the processes whose CPU counts. With `best_mtu`, the pods take the largest packet the
/// path carries, as `mesh status` reports it once path MTU discovery has run.
pub(crate) fn mesh_variant<'t>(
    name: &'static str,
    cluster: MeshCluster<'t>,
    nodes: [&'t testbed::Netns; 2],
    best_mtu: bool,
) -> Result<Variant<'t>> {
    let a = cluster.pod(1, "bench")?;
    let b = cluster.pod(2, "bench")?;
    if best_mtu {
        std::thread::sleep(Duration::from_secs(3));
        let best = cluster
            .peer(1, 2)?
            .get("max_packet")
            .and_then(Value::as_u64)
            .context("no max_packet in mesh status")?
            .min(cluster.peer(2, 1)?["max_packet"].as_u64().unwrap_or(0));
        println!("{name}_pod_mtu={best}");
        for p in [&a.ns, &b.ns] {
            p.ip(&["link", "set", "eth0", "mtu", &best.to_string()])?;
        }
    }
    let path = cluster.peer(1, 2)?["path"]
        .as_str()
        .unwrap_or("")
        .to_string();
    eprintln!("bench: {name}: path {path}");
    let mut procs: Vec<(String, u32)> = (1..=2u8)
        .map(|i| (format!("agent{i}"), cluster.agent(i).pid()))
        .collect();
    if path.starts_with("relay") {
        procs.push(("relay".into(), cluster.relay_pid()));
    }
    Ok(Variant {
        name,
        a: a.ns,
        b: b.ns,
        b_ip: b.addr.to_string(),
        nodes,
        procs,
        _daemons: Vec::new(),
        mesh: Some(cluster),
        _dir: None,
        results: Results::default(),
    })
}

/// What a variant's two nodes stand on: a host with two nodes (direct or only through the
/// host), or two providers behind NAT.
enum Ground {
    Topo(Reach),
    Nat([testbed::world::Nat; 2]),
}

enum Built {
    Topo(Topology),
    Nat(testbed::natmesh::NatGround),
}

impl Ground {
    fn build(&self) -> Result<Built> {
        Ok(match self {
            Ground::Topo(reach) => Built::Topo(Topology::new(2, *reach)?),
            Ground::Nat(nats) => Built::Nat(testbed::natmesh::NatGround::new(nats)?),
        })
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let is_lever = |name: &str| LEVERS.iter().any(|(l, _)| *l == name);
    let want = |name: &str| {
        if name == "mesh_baseline" {
            return args.baseline_agent.is_some()
                && (args.only.is_empty() || args.only.iter().any(|o| o == name));
        }
        if args.only.is_empty() {
            !is_lever(name) || args.levers
        } else {
            args.only.iter().any(|o| o == name)
        }
    };
    let agent = args.agent.as_deref();
    // Every mesh agent's arguments but the baseline's: --agent-arg, then the variant's own.
    let ours = |extra: &[&str]| -> Vec<String> {
        args.agent_args
            .iter()
            .cloned()
            .chain(extra.iter().map(|a| a.to_string()))
            .collect()
    };
    let mesh_opts = |extra: &[&str]| MeshOptions {
        mtu: args.mtu,
        agent_args: ours(extra),
        agent_bin: agent.map(Path::to_path_buf),
        ..MeshOptions::default()
    };
    if want("nat_ratio") {
        eprintln!("bench: NAT traversal across four providers");
        nat::direct_ratio(mesh_opts(&[]))?;
    }
    // Every variant in its own namespaces, all up at once.
    use testbed::world::Nat::{EndpointIndependent as Eim, Symmetric as Sym};
    let plan: Vec<(&'static str, Ground)> = [
        ("mesh", Ground::Topo(Reach::Direct)),
        ("mesh_baseline", Ground::Topo(Reach::Direct)),
        ("vxlan", Ground::Topo(Reach::Direct)),
        ("boringtun", Ground::Topo(Reach::Direct)),
        ("quincy", Ground::Topo(Reach::Direct)),
        ("boringtun_rt", Ground::Topo(Reach::Direct)),
        ("quincy_rt", Ground::Topo(Reach::Direct)),
        ("mesh_relayed", Ground::Topo(Reach::HostOnly)),
        ("mesh_best_mtu", Ground::Topo(Reach::Direct)),
        ("nat_direct", Ground::Nat([Eim, Eim])),
        ("nat_relayed", Ground::Nat([Eim, Sym])),
    ]
    .into_iter()
    .chain(
        LEVERS
            .iter()
            .map(|(n, _)| (*n, Ground::Topo(Reach::Direct))),
    )
    .filter(|(n, _)| want(n))
    .collect();
    let grounds: Vec<Built> = plan.iter().map(|(_, g)| g.build()).collect::<Result<_>>()?;
    let mut variants = Vec::new();
    for ((name, _), ground) in plan.iter().zip(&grounds) {
        eprintln!("bench: setting up {name}");
        let v = match (*name, ground) {
            (n @ ("nat_direct" | "nat_relayed"), Built::Nat(g)) => {
                nat::variant(n, g, mesh_opts(&[]))?
            }
            (_, Built::Nat(_)) => bail!("{name} is not a NAT variant"),
            ("mesh", Built::Topo(topo)) => mesh("mesh", topo, Some(args.mtu), ours(&[]), agent)?,
            ("mesh_baseline", Built::Topo(topo)) => mesh(
                "mesh_baseline",
                topo,
                Some(args.mtu),
                Vec::new(),
                args.baseline_agent.as_deref(),
            )?,
            ("mesh_relayed", Built::Topo(topo)) => {
                mesh("mesh_relayed", topo, Some(args.mtu), ours(&[]), agent)?
            }
            ("mesh_best_mtu", Built::Topo(topo)) => {
                mesh("mesh_best_mtu", topo, None, ours(&[]), agent)?
            }
            (lever, Built::Topo(topo)) if is_lever(lever) => {
                let (n, a) = LEVERS.iter().find(|(l, _)| *l == lever).expect("a lever");
                mesh(n, topo, Some(args.mtu), ours(a), agent)?
            }
            ("vxlan", Built::Topo(topo)) => peers::vxlan(topo, args.mtu)?,
            (n @ ("boringtun" | "boringtun_rt"), Built::Topo(topo)) => {
                peers::boringtun(n, &args.boringtun, topo, args.mtu, n.ends_with("_rt"))?
            }
            (n @ ("quincy" | "quincy_rt"), Built::Topo(topo)) => {
                peers::quincy(n, &args.quincy, topo, args.mtu, n.ends_with("_rt"))?
            }
            (other, _) => bail!("unknown variant {other}"),
        };
        variants.push(v);
    }
    allow_congestion_control(&args.pod_tcp)?;
    if args.relay_sched == RelaySched::Fifo {
        for v in &variants {
            for (_, pid) in v.procs.iter().filter(|(l, _)| l == "relay") {
                realtime_threads(*pid)?;
            }
        }
    }
    println!(
        "relay_sched={}",
        match args.relay_sched {
            RelaySched::Fifo => "fifo",
            RelaySched::Normal => "normal",
        }
    );
    if let Some(nice) = args.daemon_nice {
        for v in &variants {
            for (_, pid) in &v.procs {
                renice_threads(*pid, nice)?;
            }
        }
        println!("daemon_nice={nice}");
    }
    for v in &variants {
        for pod in [&v.a, &v.b] {
            pod.exec(
                "sysctl",
                &[
                    "-q",
                    "-w",
                    &format!("net.ipv4.tcp_congestion_control={}", args.pod_tcp),
                ],
            )
            .with_context(|| format!("setting the pods' TCP to {}", args.pod_tcp))?;
        }
    }
    if args.hold {
        for v in &variants {
            println!(
                "{}: nodes {} {}, pods {} -> {} ({})",
                v.name,
                v.nodes[0].name(),
                v.nodes[1].name(),
                v.a.name(),
                v.b.name(),
                v.b_ip
            );
        }
        println!("holding; press Enter to tear down");
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)?;
        return Ok(());
    }
    println!("pod_tcp={}", args.pod_tcp);
    println!("pod_mtu={}", args.mtu);
    println!("rounds={}", args.rounds);
    println!("seconds={}", args.seconds);
    for round in 1..=args.rounds {
        for v in &mut variants {
            eprintln!("bench: round {round}/{}: {}", args.rounds, v.name);
            v.round(args.seconds)
                .with_context(|| format!("round {round} of {}", v.name))?;
        }
    }
    for v in &variants {
        v.print();
        v.print_queues();
    }
    let get = |n: &str| variants.iter().find(|v| v.name == n);
    if let Some(m) = get("mesh") {
        println!("direct_gbit={}", show(m.gbit(), 3));
        println!(
            "ping_p50_ms={}",
            show(percentile(&m.results.idle_ms, 0.5), 3)
        );
        println!(
            "ping_loaded_p99_ms={}",
            show(percentile(&m.results.loaded_ms, 0.99), 3)
        );
        for peer in [
            "mesh_baseline",
            "vxlan",
            "boringtun",
            "quincy",
            "boringtun_rt",
            "quincy_rt",
        ] {
            if let Some(p) = get(peer) {
                println!(
                    "ping_loaded_p99_ms_{peer}={}",
                    show(percentile(&p.results.loaded_ms, 0.99), 3)
                );
                println!("ratio_{peer}={}", ratio(m.gbit(), p.gbit()));
                let m4 = percentile(&m.results.gbit4, 0.5);
                let p4 = percentile(&p.results.gbit4, 0.5);
                println!("ratio_{peer}_4streams={}", ratio(m4, p4));
            }
        }
    }
    if let Some(m) = get("mesh") {
        for (lever, _) in LEVERS {
            if let Some(l) = get(lever) {
                println!("ratio_{lever}_vs_mesh={}", ratio(l.gbit(), m.gbit()));
            }
        }
    }
    if let Some(r) = get("mesh_relayed") {
        println!("relayed_gbit={}", show(r.gbit(), 3));
    }
    if let (Some(d), Some(r)) = (get("nat_direct"), get("nat_relayed")) {
        println!("cross_provider_direct_gbit={}", show(d.gbit(), 3));
        println!("cross_provider_relayed_gbit={}", show(r.gbit(), 3));
        println!(
            "ratio_cross_provider_relayed_vs_direct={}",
            ratio(r.gbit(), d.gbit())
        );
    }
    if let Some(b) = get("mesh_best_mtu") {
        println!("direct_best_mtu_gbit={}", show(b.gbit(), 3));
        if let Some(q) = get("quincy") {
            println!("ratio_quincy_best_mtu={}", ratio(b.gbit(), q.gbit()));
        }
    }
    Ok(())
}
