//! `socialweb-agent`: the program baked into the node image, and the node's diagnostics tool.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::{Args, Parser, Subcommand, ValueEnum};
use socialweb_agent::config::AgentConfig;
use socialweb_agent::{agent, cli, ctl};

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
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("SOCIALWEB_COMMIT"), ")"),
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
    Run(Box<AgentConfig>),
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
        Command::Run(config) => agent::run(*config).await,
        Command::Status { client } => {
            let s = client.agent().status().await?;
            client.print(&s, cli::status::text)
        }
        Command::Dns {
            command: DnsCommand::Stats,
            client,
        } => {
            let s = client.agent().dns_stats().await?;
            client.print(&s, cli::dns::stats_text)
        }
        Command::Mesh { command, client } => mesh(command, client).await,
        Command::Keygen { json } => {
            keygen(json);
            Ok(())
        }
        Command::CheckIdentity { path } => {
            let id = agent::read_identity(&path)?;
            let endpoint = socialweb_agent::mesh::transport::endpoint_id(&id.mesh_secret_key.0);
            println!(
                "{}: valid identity for node {} of cluster {} (endpoint {endpoint})",
                path.display(),
                id.node,
                id.cluster,
            );
            Ok(())
        }
    }
}

fn keygen(json: bool) {
    let secret: [u8; 32] = rand::random();
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    let id = socialweb_agent::mesh::transport::endpoint_id(&secret);
    if json {
        let doc = serde_json::json!({"secret_key": hex, "endpoint": id.to_string()});
        println!("{doc}");
    } else {
        println!("secret_key {hex}\nendpoint   {id}");
    }
}

impl ClientArgs {
    fn agent(&self) -> ctl::client::Client {
        ctl::client::Client::new(&self.ctl_socket, Duration::from_secs(10))
    }

    /// The answer as JSON with `--json`, else as `text` says.
    fn print<T: serde::Serialize>(&self, answer: &T, text: impl Fn(&T) -> String) -> Result<()> {
        if self.json {
            println!("{}", serde_json::to_string_pretty(answer)?);
        } else {
            print!("{}", text(answer));
        }
        Ok(())
    }
}

async fn mesh(command: MeshCommand, c: ClientArgs) -> Result<()> {
    let agent = c.agent();
    match command {
        MeshCommand::Status => c.print(&agent.mesh_status().await?, cli::mesh::status_text),
        MeshCommand::Peers => c.print(&agent.mesh_status().await?, cli::mesh::peers_text),
        MeshCommand::Routes => c.print(&agent.mesh_routes().await?, |r| cli::mesh::routes_text(r)),
        MeshCommand::Ping { target, count } => {
            let mut results = Vec::new();
            for seq in 1..=count {
                let r = agent.mesh_ping(&target).await?;
                if !c.json {
                    println!("{}", cli::mesh::ping_line(&r, seq));
                }
                results.push(r);
                if seq < count {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            if c.json {
                println!("{}", serde_json::to_string_pretty(&results)?);
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
