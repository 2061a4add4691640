//! `socialweb-agent`: the program baked into the node image.

use clap::Parser;

/// The socialweb node agent.
///
/// Runs on every rented node, started by systemd from the node image. It joins the tenant k3s
/// cluster, serves node-local DNS at 169.254.20.10, puts this node's pod CIDR on the cni0
/// bridge and routes every other node's pod CIDR as QUIC datagrams over iroh (through the
/// operator's relay when nodes cannot reach each other). Its subcommands are also the mesh
/// diagnostics tool for the node it runs on.
#[derive(Debug, Parser)]
#[command(name = "socialweb-agent", version, about, long_about)]
struct Cli {}

fn main() {
    let _ = Cli::parse();
}
