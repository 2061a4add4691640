//! `socialweb-broker`: the small daemon on the operator's host.

use clap::Parser;

/// The socialweb broker.
///
/// One daemon on the operator's host. It rents nodes for tenant clusters from the compute
/// market (RFP, bids, lease), keeps one certificate authority per cluster and fronts each
/// tenant apiserver with an mTLS proxy that honours revocation, decides how many nodes each
/// cluster needs from its Pods, and hosts the relay the node mesh falls back to.
#[derive(Debug, Parser)]
#[command(name = "socialweb-broker", version, about, long_about)]
struct Cli {}

fn main() {
    let _ = Cli::parse();
    // Nothing runs yet: say so rather than exit as if work had been done.
    eprintln!(
        "socialweb-broker: not implemented yet in this version (only --help and --version); \
         see docs/architecture.md"
    );
    std::process::exit(2);
}
