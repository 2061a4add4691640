//! `socialweb-agent`: the program baked into the node image, and the node's diagnostics tool.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use socialweb_agent::ctl::{self, protocol::Request};
use socialweb_agent::mesh::stats::{MeshStatus, RouteStatus};
use socialweb_agent::node::PodNetwork;
use socialweb_agent::run::{self, RunOptions};

/// The socialweb node agent.
///
/// Runs on every rented node, started by systemd from the node image. `run` reads the node's
/// identity, follows the peer directory (the cluster's Nodes, or a static file), puts this
/// node's pod CIDR on the cni0 bridge and writes the CNI configuration, serves node-local DNS
/// at 169.254.20.10, and routes every other node's pod CIDR as QUIC datagrams over iroh --
/// directly where the nodes reach each other, through the operator's relay where they do not.
/// (Supervising `k3s agent` for the join is not in this version: the kubelet is started
/// beside it.) Its other subcommands talk to the running agent over its control socket (root
/// only).
///
/// Start here:  socialweb-agent run --identity /etc/socialweb/identity.json
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
    /// Log format: `auto` writes to journald when run by systemd, else to stderr.
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
    /// Run the agent (as systemd does on a node).
    Run(RunArgs),
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
    /// Run a mesh relay (the broker hosts one; this is for tests and the demo).
    Relay(RelayArgs),
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
    /// A static peer directory (JSON: {"nodes": [{"node", "endpoint", "pod_cidr", "addrs"}]}),
    /// for nodes without Kubernetes and for the demo. Re-read when it changes.
    #[arg(long, conflicts_with = "kubeconfig")]
    peers: Option<PathBuf>,
    /// Kubeconfig of this node (the one the join wrote): the peer directory is then the
    /// cluster's Nodes, and the agent publishes its mesh endpoint on its own Node.
    #[arg(long, env = "SOCIALWEB_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// The control socket.
    #[arg(long, default_value = ctl::DEFAULT_SOCKET)]
    ctl_socket: PathBuf,
    /// UDP address the mesh binds for direct paths.
    #[arg(long, default_value = "0.0.0.0:7443")]
    mesh_listen: SocketAddr,
    /// Name of the mesh's TUN device.
    #[arg(long, default_value = "socialweb0")]
    tun: String,
    /// MTU of the TUN device and of pods (1280 fits a QUIC datagram on any sane path).
    #[arg(long, default_value_t = socialweb_wire::mesh::DEFAULT_MTU, value_parser = clap::value_parser!(u16).range(1280..=9000))]
    mtu: u16,
    /// Do not masquerade pod traffic leaving the cluster.
    #[arg(long)]
    no_masquerade: bool,
    /// Where containerd reads CNI configurations.
    #[arg(long, default_value = "/etc/cni/net.d")]
    cni_conf_dir: PathBuf,
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
    /// Do not serve node-local DNS.
    #[arg(long)]
    no_dns: bool,
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

#[derive(Debug, Args)]
struct RelayArgs {
    /// Address to serve plain HTTP on; nodes use http://<this>.
    #[arg(long, default_value = "0.0.0.0:3340")]
    listen: SocketAddr,
    /// Admit only these endpoint ids (repeatable); without it, anyone may relay.
    #[arg(long = "allow")]
    allow: Vec<String>,
}

fn init_logging(to: LogTo) {
    use tracing_subscriber::prelude::*;
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("SOCIALWEB_LOG").unwrap_or_else(|_| {
            tracing_subscriber::EnvFilter::new("info,iroh=warn,noq=warn,iroh_relay=warn")
        });
    let journald = match to {
        LogTo::Journald => true,
        LogTo::Auto => std::env::var_os("JOURNAL_STREAM").is_some(),
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
            let pod_network = (!a.no_pod_network).then(|| PodNetwork {
                conf_dir: a.cni_conf_dir.clone(),
                mtu: a.mtu,
                portmap: !a.no_portmap,
            });
            run::run(RunOptions {
                identity: a.identity,
                peers: a.peers,
                kubeconfig: a.kubeconfig,
                ctl_socket: a.ctl_socket,
                mesh_listen: a.mesh_listen,
                tun: a.tun,
                mtu: a.mtu,
                masquerade: !a.no_masquerade,
                pod_network,
                dns_listen: (!a.no_dns).then_some(a.dns_listen),
                dns_threads: a.dns_threads,
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
        Command::Relay(a) => relay(a).await,
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

async fn relay(a: RelayArgs) -> Result<()> {
    use socialweb_agent::mesh::relay::{Allow, serve};
    let allow = if a.allow.is_empty() {
        Allow::everyone()
    } else {
        Allow::only(
            a.allow
                .iter()
                .map(|s| socialweb_agent::mesh::transport::parse_endpoint_id(s))
                .collect::<Result<Vec<_>>>()?,
        )
    };
    let server = serve(a.listen, allow).await?;
    eprintln!(
        "relay serving on http://{}",
        server
            .http_addr()
            .map(|a| a.to_string())
            .unwrap_or_default()
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    server.shutdown().await.context("stopping the relay")?;
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

fn drops_text(
    d: &std::collections::BTreeMap<socialweb_agent::mesh::filter::DropReason, u64>,
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
                }
                println!(
                    "drops not tied to a peer: {}  strangers refused: {}",
                    drops_text(&s.drops),
                    s.strangers_refused
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
