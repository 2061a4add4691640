//! `socialweb-agent`: the program baked into the node image, and the node's diagnostics tool.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::{Args, Parser, Subcommand, ValueEnum};
use socialweb_agent::ctl::{self, protocol::Request};
use socialweb_agent::join::Machine;
use socialweb_agent::join::proxy_mode::ProxyChoice;
use socialweb_agent::mesh::stats::{MeshStatus, RouteStatus};
use socialweb_agent::node::PodNetwork;
use socialweb_agent::run::{self, RunOptions};

/// The socialweb node agent.
///
/// Runs on every rented node, started by systemd from the node image. `run` reads the node's
/// identity and joins the cluster by itself: it starts containerd, the kubelet (which gets its
/// client certificate with the identity's bootstrap token) and kube-proxy, and keeps them
/// running. It serves node-local DNS at 169.254.20.10, puts this node's pod CIDR on the cni0
/// bridge and writes the CNI configuration, and routes every other node's pod CIDR as QUIC
/// datagrams over iroh -- directly where the nodes reach each other, through the operator's
/// relay where they do not. Its other subcommands talk to the running agent over its control
/// socket (root only).
///
/// Start here:  socialweb-agent run --identity /etc/socialweb/identity.json
///              socialweb-agent status
///              socialweb-agent mesh status
#[derive(Debug, Parser)]
#[command(
    name = "socialweb-agent",
    version,
    about,
    long_about,
    verbatim_doc_comment
)]
struct Cli {
    /// Where logs go: `auto` writes to journald when its socket exists (and stderr is not a
    /// terminal), else to stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogTo::Auto)]
    log: LogTo,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogTo {
    Auto,
    Stderr,
    Journald,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the agent (as systemd does on a node): join the cluster, then keep the node up.
    Run(Box<RunArgs>),
    /// The running agent's bring-up: each step, its state and last error, the children.
    Status {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Inspect the mesh of the agent running on this node.
    Mesh {
        #[command(subcommand)]
        command: MeshCommand,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Inspect node-local DNS of the agent running on this node.
    Dns {
        #[command(subcommand)]
        command: DnsCommand,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Make a mesh secret key and print it with its endpoint id.
    Keygen {
        /// Print JSON: {"secret_key": .., "endpoint": ..}.
        #[arg(long)]
        json: bool,
    },
    /// Check an identity document and say what is wrong with it, if anything.
    CheckIdentity {
        /// The document (JSON, contract 1).
        path: PathBuf,
    },
}

#[derive(Debug, Args)]
struct RunArgs {
    /// The node identity document the broker wrote (read-only identity disk on a node).
    #[arg(
        long,
        default_value = "/etc/socialweb/identity.json",
        env = "SOCIALWEB_IDENTITY"
    )]
    identity: PathBuf,
    /// A static peer directory (JSON: {"nodes": [{"node", "endpoint", "pod_cidr", "addrs"}]})
    /// for a node without Kubernetes: no join, only DNS, the mesh and the pod network.
    /// Re-read when it changes.
    #[arg(long)]
    peers: Option<PathBuf>,
    /// The control socket.
    #[arg(long, default_value = ctl::DEFAULT_SOCKET)]
    ctl_socket: PathBuf,
    #[command(flatten)]
    machine: MachineArgs,
    /// UDP address the mesh binds for direct paths.
    #[arg(long, default_value = "0.0.0.0:7443")]
    mesh_listen: SocketAddr,
    /// Name of the mesh's TUN device.
    #[arg(long, default_value = "socialweb0")]
    tun: String,
    /// MTU of the TUN device and of pods (1280 fits a QUIC datagram on any sane path).
    #[arg(long, default_value_t = socialweb_wire::mesh::DEFAULT_MTU, value_parser = clap::value_parser!(u16).range(1280..=9000))]
    mtu: u16,
    #[command(flatten)]
    mesh_tuning: socialweb_agent::mesh::transport::Tuning,
    /// Do not masquerade pod traffic leaving the cluster.
    #[arg(long)]
    no_masquerade: bool,
    /// Leave the cni0 bridge and the CNI configuration alone.
    #[arg(long)]
    no_pod_network: bool,
    /// Do not chain Debian's portmap plugin after socialweb-cni.
    #[arg(long)]
    no_portmap: bool,
    /// Where node-local DNS listens (the address goes on a dummy interface, or on lo where
    /// the kernel has no dummy driver).
    #[arg(long, default_value = "169.254.20.10:53")]
    dns_listen: SocketAddr,
    /// UDP threads serving DNS.
    #[arg(long, default_value_t = 2)]
    dns_threads: usize,
    /// Receive buffer asked for each DNS UDP socket, in bytes (the kernel doubles it and caps
    /// it at net.core.rmem_max); 0 leaves the kernel's default.
    #[arg(long, default_value_t = socialweb_agent::dns::server::DEFAULT_RCVBUF, env = "SOCIALWEB_DNS_RCVBUF")]
    dns_rcvbuf: usize,
    /// Do not serve node-local DNS.
    #[arg(long)]
    no_dns: bool,
}

/// Where things are on this machine (defaults: the node image's layout).
#[derive(Debug, Args)]
#[command(next_help_heading = "Machine")]
struct MachineArgs {
    /// Persistent state: the CA, the bootstrap kubeconfig, generated configurations.
    #[arg(
        long,
        default_value = "/var/lib/socialweb",
        env = "SOCIALWEB_STATE_DIR"
    )]
    state_dir: PathBuf,
    /// State of this boot: pidfiles, the readiness file `ready`, resolv.conf.
    #[arg(long, default_value = "/run/socialweb", env = "SOCIALWEB_RUN_DIR")]
    run_dir: PathBuf,
    /// containerd's binary.
    #[arg(long, default_value = "/usr/bin/containerd")]
    containerd: PathBuf,
    /// containerd's `ctr` (imports the seed images).
    #[arg(long, default_value = "/usr/bin/ctr")]
    ctr: PathBuf,
    /// The kubelet's binary (our Kubernetes build; a link to its multicall `kube` works).
    #[arg(long, default_value = "/usr/local/bin/kubelet")]
    kubelet: PathBuf,
    /// kube-proxy's binary (likewise).
    #[arg(long, default_value = "/usr/local/bin/kube-proxy")]
    kube_proxy: PathBuf,
    /// kube-proxy's backend.
    #[arg(long, value_enum, default_value_t = ProxyChoice::Auto)]
    proxy_mode: ProxyChoice,
    /// Where containerd finds CNI plugins (socialweb-cni, loopback, portmap).
    #[arg(long, default_value = "/usr/lib/cni")]
    cni_bin_dir: PathBuf,
    /// Where the agent writes the CNI configuration and containerd reads it.
    #[arg(long, default_value = "/etc/cni/net.d")]
    cni_conf_dir: PathBuf,
    /// Container image archives (*.tar, OCI or Docker) imported into containerd at boot.
    #[arg(long, default_value = "/var/lib/socialweb/images")]
    seed_images: PathBuf,
    /// The seed disk: a block device (or file) holding image archives of any size behind a
    /// manifest, written by socialweb-image-builder; imported at boot when it exists.
    #[arg(long, default_value = socialweb_wire::seeds::DEFAULT_DISK)]
    seed_disk: PathBuf,
    /// The pod sandbox image (must be among the seed images: nothing is pulled for it).
    #[arg(long, default_value = socialweb_agent::join::DEFAULT_SANDBOX_IMAGE)]
    sandbox_image: String,
    /// The kubelet's cgroup root (a machine shared with other nodes gives each its own).
    #[arg(long, default_value = "/")]
    cgroup_root: String,
    /// The kubelet's node IP [default: the address of the default route's interface].
    #[arg(long)]
    node_ip: Option<std::net::Ipv4Addr>,
    /// JSON merged over the generated kubelet configuration (RFC 7386 merge patch), e.g.
    /// '{"maxPods": 30}'.
    #[arg(long, value_parser = parse_json_object)]
    kubelet_config_patch: Option<serde_json::Value>,
    /// Write containerd's, the kubelet's and kube-proxy's output to DIR/<name>.log instead of
    /// the agent's own stderr (the journal under systemd).
    #[arg(long, value_name = "DIR")]
    child_log_dir: Option<PathBuf>,
}

fn parse_json_object(s: &str) -> Result<serde_json::Value, String> {
    match serde_json::from_str::<serde_json::Value>(s) {
        Ok(v @ serde_json::Value::Object(_)) => Ok(v),
        Ok(_) => Err("must be a JSON object".into()),
        Err(e) => Err(format!("not JSON: {e}")),
    }
}

#[derive(Debug, Args)]
struct ClientArgs {
    /// The running agent's control socket.
    #[arg(long, global = true, default_value = ctl::DEFAULT_SOCKET)]
    ctl_socket: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum MeshCommand {
    /// This node's endpoint, relay, and every peer: path, RTT, traffic, drops, last error.
    Status,
    /// One line per peer.
    Peers,
    /// Round trips to a peer's agent over its connection, by node name or pod address.
    Ping {
        /// A node name, or an address inside a peer's pod CIDR.
        target: String,
        /// How many round trips.
        #[arg(short, long, default_value_t = 3)]
        count: u32,
    },
    /// Pod CIDRs routed through the mesh and whether each kernel route is installed.
    Routes,
}

#[derive(Debug, Subcommand)]
enum DnsCommand {
    /// Queries, cluster answers, cache hits, upstream latency, stale answers, errors.
    Stats,
}

fn init_logging(to: LogTo) {
    use tracing_subscriber::prelude::*;
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("SOCIALWEB_LOG").unwrap_or_else(|_| {
            tracing_subscriber::EnvFilter::new("info,iroh=warn,noq=warn,iroh_relay=warn")
        });
    let journald = match to {
        LogTo::Journald => true,
        // The journal when it is there (a node under systemd); someone running the agent by
        // hand in a terminal sees its lines there instead.
        LogTo::Auto => {
            use std::io::IsTerminal;
            std::path::Path::new("/run/systemd/journal/socket").exists()
                && !std::io::stderr().is_terminal()
        }
        LogTo::Stderr => false,
    };
    let registry = tracing_subscriber::registry().with(filter);
    if journald && let Ok(layer) = tracing_journald::layer() {
        registry.with(layer).init();
        return;
    }
    registry
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
        .init();
}

fn main() {
    let cli = Cli::parse();
    init_logging(cli.log);
    let rt = tokio::runtime::Runtime::new().expect("starting the async runtime");
    if let Err(e) = rt.block_on(dispatch(cli.command)) {
        eprintln!("socialweb-agent: {e:#}");
        std::process::exit(1);
    }
}

async fn dispatch(command: Command) -> Result<()> {
    match command {
        Command::Run(a) => {
            let a = *a;
            let m = a.machine;
            let pod_network = (!a.no_pod_network).then(|| PodNetwork {
                conf_dir: m.cni_conf_dir.clone(),
                mtu: a.mtu,
                portmap: !a.no_portmap,
            });
            run::run(RunOptions {
                identity: a.identity,
                peers: a.peers,
                machine: Machine {
                    state_dir: m.state_dir,
                    run_dir: m.run_dir,
                    containerd: m.containerd,
                    ctr: m.ctr,
                    kubelet: m.kubelet,
                    kube_proxy: m.kube_proxy,
                    cni_bin_dir: m.cni_bin_dir,
                    cni_conf_dir: m.cni_conf_dir,
                    seed_images: m.seed_images,
                    seed_disk: m.seed_disk,
                    sandbox_image: m.sandbox_image,
                    cgroup_root: m.cgroup_root,
                    log_dir: m.child_log_dir,
                    kubelet_config_patch: m.kubelet_config_patch,
                    ..Machine::default()
                },
                node_ip: m.node_ip,
                proxy: m.proxy_mode,
                ctl_socket: a.ctl_socket,
                mesh_listen: a.mesh_listen,
                tun: a.tun,
                mtu: a.mtu,
                mesh_tuning: a.mesh_tuning,
                masquerade: !a.no_masquerade,
                pod_network,
                dns_listen: (!a.no_dns).then_some(a.dns_listen),
                dns_threads: a.dns_threads,
                dns_rcvbuf: a.dns_rcvbuf,
            })
            .await
        }
        Command::Dns {
            command: DnsCommand::Stats,
            client,
        } => {
            let v = ctl::client::call(
                &client.ctl_socket,
                &Request::DnsStats,
                Duration::from_secs(10),
            )
            .await?;
            if client.json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else if let Some(map) = v.as_object() {
                for (k, v) in map {
                    println!(
                        "{k:<28} {}",
                        if v.is_null() {
                            "-".to_string()
                        } else {
                            v.to_string()
                        }
                    );
                }
            }
            Ok(())
        }
        Command::Mesh { command, client } => mesh(command, client).await,
        Command::Status { client } => status(client).await,
        Command::Keygen { json } => {
            let secret: [u8; 32] = rand::random();
            let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
            let id = socialweb_agent::mesh::transport::endpoint_id(&secret);
            if json {
                println!(
                    "{}",
                    serde_json::json!({"secret_key": hex, "endpoint": id.to_string()})
                );
            } else {
                println!("secret_key {hex}\nendpoint   {id}");
            }
            Ok(())
        }
        Command::CheckIdentity { path } => {
            let id = run::read_identity(&path)?;
            println!(
                "{}: valid identity for node {} of cluster {} (endpoint {})",
                path.display(),
                id.node,
                id.cluster,
                socialweb_agent::mesh::transport::endpoint_id(&id.mesh_secret_key.0)
            );
            Ok(())
        }
    }
}

async fn status(c: ClientArgs) -> Result<()> {
    use socialweb_agent::status::AgentStatus;
    let v = ctl::client::call(&c.ctl_socket, &Request::Status, Duration::from_secs(10)).await?;
    if c.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let s: AgentStatus = serde_json::from_value(v)?;
    println!(
        "node {} of cluster {}: {}",
        s.node,
        s.cluster,
        if s.ready { "ready" } else { "not ready" }
    );
    println!(
        "{:<16} {:<9} {:<21} {:>4}  DETAIL / LAST ERROR",
        "STEP", "STATE", "SINCE", "TRY"
    );
    for st in &s.steps {
        let state = serde_json::to_value(st.state)?;
        println!(
            "{:<16} {:<9} {:<21} {:>4}  {}",
            st.name,
            state.as_str().unwrap_or(""),
            st.since,
            st.attempts,
            match (&st.last_error, &st.detail) {
                (Some(e), _) => format!("error: {e}"),
                (None, Some(d)) => d.clone(),
                (None, None) => "-".into(),
            }
        );
    }
    if !s.children.is_empty() {
        println!(
            "\n{:<12} {:>8} {:<8} {:<21} {:>8}  LAST EXIT",
            "CHILD", "PID", "STATE", "SINCE", "RESTARTS"
        );
        for ch in &s.children {
            println!(
                "{:<12} {:>8} {:<8} {:<21} {:>8}  {}",
                ch.name,
                ch.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
                if ch.running { "running" } else { "stopped" },
                ch.since,
                ch.restarts,
                ch.last_exit.as_deref().unwrap_or("-")
            );
        }
    }
    Ok(())
}

fn human_bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

/// One queue as `mesh status` prints it.
fn queue_text(way: &str, q: &socialweb_agent::mesh::stats::QueueStatus) -> String {
    let ms = |x: Option<f64>| x.map(|v| format!("{v:.2}ms")).unwrap_or_else(|| "-".into());
    format!(
        "queue {way}: {} packets/{}  waited p50 {} p99 {}  CoDel {}  drops {} marks {}  over limit {}",
        q.packets,
        human_bytes(q.bytes as u64),
        ms(q.sojourn_ms(0.5)),
        ms(q.sojourn_ms(0.99)),
        if q.codel_target_ms.is_finite() && q.codel_target_ms < 1e9 {
            format!("{:.1}ms/{:.0}ms", q.codel_target_ms, q.codel_interval_ms)
        } else {
            "off (fifo)".into()
        },
        q.counters.codel_drops,
        q.counters.ecn_marks,
        q.counters.overlimit_drops
    )
}

fn drops_text(
    d: &std::collections::BTreeMap<socialweb_mesh_core::filter::DropReason, u64>,
) -> String {
    if d.is_empty() {
        return "-".into();
    }
    d.iter()
        .map(|(r, n)| {
            format!(
                "{}={n}",
                serde_json::to_value(r)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join(",")
}

async fn mesh(command: MeshCommand, c: ClientArgs) -> Result<()> {
    let timeout = Duration::from_secs(10);
    match command {
        MeshCommand::Status | MeshCommand::Peers => {
            let v = ctl::client::call(&c.ctl_socket, &Request::MeshStatus, timeout).await?;
            if c.json {
                println!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(());
            }
            let s: MeshStatus = serde_json::from_value(v)?;
            if matches!(command, MeshCommand::Status) {
                println!(
                    "node {}  pod CIDR {}  endpoint {}",
                    s.node,
                    s.pod_cidr.as_deref().unwrap_or("(not allocated yet)"),
                    s.endpoint
                );
                println!(
                    "relay {} ({})  tun {} mtu {}  direct {}",
                    s.relay_url,
                    if s.relay_connected {
                        "connected"
                    } else {
                        "not connected"
                    },
                    s.tun,
                    s.mtu,
                    if s.direct_addrs.is_empty() {
                        "-".into()
                    } else {
                        s.direct_addrs.join(",")
                    }
                );
                if !s.scheduling.is_empty() {
                    println!("mesh thread {}", s.scheduling);
                }
                println!(
                    "{:<14} {:<16} {:<36} {:>8} {:>20} {:>20}  {:<20} LAST ERROR",
                    "PEER",
                    "POD CIDR",
                    "PATH",
                    "RTT",
                    "TX dgrams/bytes",
                    "RX dgrams/bytes",
                    "DROPS"
                );
                for p in &s.peers {
                    println!(
                        "{:<14} {:<16} {:<36} {:>8} {:>20} {:>20}  {:<20} {}",
                        p.node,
                        p.pod_cidr,
                        p.path,
                        p.rtt_ms
                            .map(|r| format!("{r:.2}ms"))
                            .unwrap_or_else(|| "-".into()),
                        format!("{}/{}", p.tx.datagrams, human_bytes(p.tx.bytes)),
                        format!("{}/{}", p.rx.datagrams, human_bytes(p.rx.bytes)),
                        drops_text(&p.drops),
                        p.last_error.as_deref().unwrap_or("-"),
                    );
                    if let Some(q) = &p.quic {
                        println!(
                            "{:<14} quic: cwnd {}  sent {}  lost {}  congestion events {}  black holes {}  path MTU {}  max packet {}  send waits {}",
                            "",
                            human_bytes(q.cwnd),
                            q.sent_packets,
                            q.lost_packets,
                            q.congestion_events,
                            q.black_holes,
                            q.current_mtu,
                            p.max_packet
                                .map(|m| m.to_string())
                                .unwrap_or_else(|| "-".into()),
                            p.send_waits
                        );
                    }
                    for (way, q) in [("out", &p.queue_out), ("in", &p.queue_in)] {
                        if let Some(q) = q {
                            println!("{:<14} {}", "", queue_text(way, q));
                        }
                    }
                }
                println!(
                    "drops not tied to a peer: {}  refused: {} strangers, {} early peers, {} not sorted yet",
                    drops_text(&s.drops),
                    s.strangers_refused,
                    s.early_peers_refused,
                    s.refusals_pending
                );
                for (node, why) in &s.rejected {
                    println!("refused directory entry {node}: {why}");
                }
            } else {
                for p in &s.peers {
                    println!(
                        "{:<14} {:<16} {} {:<12} {}",
                        p.node,
                        p.pod_cidr,
                        p.endpoint,
                        if p.connected {
                            "connected"
                        } else {
                            "disconnected"
                        },
                        p.path
                    );
                }
            }
        }
        MeshCommand::Routes => {
            let v = ctl::client::call(&c.ctl_socket, &Request::MeshRoutes, timeout).await?;
            if c.json {
                println!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(());
            }
            let routes: Vec<RouteStatus> = serde_json::from_value(v)?;
            println!("{:<18} {:<14} {:<10} VIA", "POD CIDR", "NODE", "KERNEL");
            for r in routes {
                println!(
                    "{:<18} {:<14} {:<10} {}",
                    r.cidr,
                    r.node,
                    if r.installed { "installed" } else { "absent" },
                    r.via
                );
            }
        }
        MeshCommand::Ping { target, count } => {
            let mut results = Vec::new();
            for i in 0..count {
                let v = ctl::client::call(
                    &c.ctl_socket,
                    &Request::MeshPing {
                        target: target.clone(),
                    },
                    timeout,
                )
                .await?;
                let r: ctl::protocol::PingResult = serde_json::from_value(v.clone())?;
                if !c.json {
                    println!(
                        "reply from {} via {}: seq={} time={:.3} ms",
                        r.node,
                        r.path,
                        i + 1,
                        r.rtt_ms
                    );
                }
                results.push(v);
                if i + 1 < count {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            if c.json {
                println!("{}", serde_json::to_string_pretty(&results)?);
            }
        }
    }
    Ok(())
}
