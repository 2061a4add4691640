//! `socialweb-package`: the Debian packages an operator installs (`./x package`;
//! docs/quickstart.md). See `testbed::package` for what each holds.

use std::path::PathBuf;

use anyhow::Result;
use clap::Parser;

/// Builds the Debian packages of this checkout: socialweb-broker (cargo-deb),
/// socialweb-kubernetes and socialweb-node-image (dpkg-deb). Run through `./x package`, which
/// builds the release binaries, the pinned Kubernetes and kine first. Needs root (the node
/// image is built as root).
#[derive(Parser, Debug)]
#[command(version)]
struct Cli {
    /// Where the packages go.
    #[arg(long, default_value = "target/package")]
    out: PathBuf,
    /// Print the packages' paths as JSON.
    #[arg(long)]
    json: bool,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let packages = testbed::package::build(&cli.out, &mut |what| eprintln!("==> {what}"))?;
    if cli.json {
        let paths: Vec<_> = packages
            .all()
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        println!("{}", serde_json::json!({ "packages": paths }));
    } else {
        for p in packages.all() {
            println!("{}", p.display());
        }
    }
    Ok(())
}
