//! `socialweb-image-builder`: builds the node image.

use clap::Parser;

/// Builds the socialweb node image.
///
/// Produces the root filesystem a rented VM boots: a minimal Debian with k3s, containerd,
/// socialweb-agent and socialweb-cni, and the systemd units that start the agent, which reads
/// its identity from a read-only disk the broker writes when a lease is awarded.
#[derive(Debug, Parser)]
#[command(name = "socialweb-image-builder", version, about, long_about)]
struct Cli {}

fn main() {
    let _ = Cli::parse();
    // Nothing runs yet: say so rather than exit as if work had been done.
    eprintln!(
        "socialweb-image-builder: not implemented yet in this version (only --help and --version); \
         see docs/architecture.md"
    );
    std::process::exit(2);
}
