//! `socialweb-cni`: the CNI plugin.

use clap::Parser;

/// The socialweb CNI plugin.
#[derive(Debug, Parser)]
#[command(name = "socialweb-cni", version, about, long_about)]
struct Cli {}

fn main() {
    let _ = Cli::parse();
}
