//! `socialweb-image-builder`: builds the node image (`docs/image.md`).

mod base;
mod build;
mod config;
mod digest;
mod ext4;
mod progress;
mod seeds;
mod stage;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};

/// Builds the socialweb node image.
///
/// From one config file (docs/image.md): a base root filesystem (a directory, a tarball, or a
/// minimal Debian made with debootstrap and cached), our Kubernetes build's kubelet and
/// kube-proxy, socialweb-agent and socialweb-cni, the agent's systemd unit, extra files and
/// container images to seed. Writes rootfs.ext4 (sized from the staged tree plus headroom),
/// seeds.img (the seed disk the agent imports into containerd at boot), Debian's kernel and
/// initrd when the base has them, and nodeimage.json (vcpu, memMiB, sizes, digests and the
/// fingerprint over every input, which names the image). The same inputs give the same bytes.
#[derive(Debug, Parser)]
#[command(name = "socialweb-image-builder", version, about, long_about)]
struct Cli {
    /// Progress on stderr: a bar on a terminal, plain lines in logs.
    #[arg(long, value_enum, default_value_t = progress::Mode::Auto, global = true)]
    progress: progress::Mode,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Builds the image described by CONFIG into OUT (replaced only once complete).
    Build {
        /// The config file (TOML, docs/image.md).
        #[arg(long, short)]
        config: PathBuf,
        /// The output directory.
        #[arg(long, short)]
        out: PathBuf,
        /// Where the debootstrap base is cached [default: $SOCIALWEB_CACHE or ~/.cache/socialweb].
        #[arg(long)]
        cache: Option<PathBuf>,
        /// Build even if OUT already holds this fingerprint.
        #[arg(long)]
        force: bool,
        /// Print nodeimage.json on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Checks an output directory: every file's size and digest against its nodeimage.json.
    Check {
        dir: PathBuf,
        /// Print nodeimage.json on stdout once checked.
        #[arg(long)]
        json: bool,
    },
    /// Prints the name and fingerprint CONFIG's inputs give, without building.
    Fingerprint {
        #[arg(long, short)]
        config: PathBuf,
        #[arg(long)]
        cache: Option<PathBuf>,
        /// Print the inputs and their digests as JSON.
        #[arg(long)]
        json: bool,
    },
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        eprintln!("socialweb-image-builder: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    let progress = progress::Progress::new(cli.progress);
    match cli.cmd {
        Cmd::Build {
            config,
            out,
            cache,
            force,
            json,
        } => {
            let cfg = config::Config::load(&config)?;
            let cache = cache.unwrap_or_else(build::default_cache);
            let t = std::time::Instant::now();
            let d = build::build(&cfg, &out, &cache, force, &progress)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&d)?);
            } else {
                println!(
                    "{} in {} ({:.1}s): rootfs.ext4 {} MiB, seeds.img {} MiB",
                    d["name"].as_str().unwrap_or(""),
                    out.display(),
                    t.elapsed().as_secs_f64(),
                    d["files"]["rootfs.ext4"]["bytes"].as_u64().unwrap_or(0) >> 20,
                    d["files"]["seeds.img"]["bytes"].as_u64().unwrap_or(0) >> 20,
                );
            }
        }
        Cmd::Check { dir, json } => {
            let d = build::check(&dir, &progress)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&d)?);
            } else {
                println!(
                    "{}: ok ({})",
                    dir.display(),
                    d["name"].as_str().unwrap_or("")
                );
            }
        }
        Cmd::Fingerprint {
            config,
            cache,
            json,
        } => {
            let cfg = config::Config::load(&config)?;
            let cache = cache.unwrap_or_else(build::default_cache);
            let i = build::inputs(&cfg, &cache, &progress)?;
            if json {
                let list: Vec<_> = i
                    .list
                    .iter()
                    .map(|(k, v)| serde_json::json!({"name": k, "value": v}))
                    .collect();
                println!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::json!({
                        "name": i.name, "fingerprint": i.fingerprint, "inputs": list,
                    }))?
                );
            } else {
                println!("{} {}", i.name, i.fingerprint);
            }
        }
    }
    Ok(())
}
