//! `bench/image`: the node image's build time and size for the reference config, cold (the
//! debootstrap base made from the mirror into an empty cache) and with its inputs cached; then
//! a seed image over 2 GiB carried on the seed disk, imported by the agent at boot and run by
//! a Pod without a pull, on a node the broker's local provider boots from the image.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde_json::json;
use sha2::{Digest, Sha256};
use testbed::broker::{Broker, BrokerOptions};
use testbed::k8s::wait_for;
use testbed::nodeimage::{self, Spec};
use testbed::tmp::TempDir;

#[derive(Debug, Parser)]
#[command(about = "Node image build time and size, cold and cached; a seed image over 2 GiB")]
struct Args {
    /// Skip the cold build (it runs debootstrap against the mirror, about 2 minutes).
    #[arg(long)]
    no_cold: bool,
    /// The big seed image's payload in MiB.
    #[arg(long, default_value_t = 2300)]
    big_mib: u64,
}

/// Pseudo-random bytes (xorshift): incompressible, and not zeros, so no filesystem or tar
/// format can make a hole of them.
struct Noise {
    left: u64,
    state: u64,
}

impl Read for Noise {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = (buf.len() as u64).min(self.left) as usize / 8 * 8;
        let n = if n == 0 {
            self.left.min(buf.len() as u64) as usize
        } else {
            n
        };
        for chunk in buf[..n].chunks_mut(8) {
            self.state ^= self.state << 13;
            self.state ^= self.state >> 7;
            self.state ^= self.state << 17;
            let b = self.state.to_le_bytes();
            chunk.copy_from_slice(&b[..chunk.len()]);
        }
        self.left -= n as u64;
        Ok(n)
    }
}

fn sha256_file(p: &Path) -> Result<String> {
    let mut f = std::fs::File::open(p)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

fn header(size: u64, mode: u32) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_mode(mode);
    h.set_size(size);
    h.set_mtime(0);
    h
}

/// An OCI archive `socialweb.local/big:1`: busybox's `sh` and `/big`, `mib` MiB of noise.
fn big_image(dir: &Path, mib: u64) -> Result<PathBuf> {
    let layer = dir.join("layer.tar");
    {
        let mut b = tar::Builder::new(std::io::BufWriter::new(std::fs::File::create(&layer)?));
        let busybox = std::fs::read("/bin/busybox").context("/bin/busybox (busybox-static)")?;
        b.append_data(
            &mut header(busybox.len() as u64, 0o755),
            "bin/busybox",
            busybox.as_slice(),
        )?;
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_mode(0o777);
        h.set_size(0);
        h.set_mtime(0);
        b.append_link(&mut h, "bin/sh", "busybox")?;
        let noise = Noise {
            left: mib << 20,
            state: 0x9e37_79b9_7f4a_7c15,
        };
        b.append_data(&mut header(mib << 20, 0o644), "big", noise)?;
        b.into_inner()?.flush()?;
    }
    let layer_digest = sha256_file(&layer)?;
    let layer_len = std::fs::metadata(&layer)?.len();
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": ["/bin/sh"], "Env": ["PATH=/bin"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_digest}")]},
    }))?;
    let hex = |b: &[u8]| -> String {
        Sha256::digest(b)
            .iter()
            .map(|x| format!("{x:02x}"))
            .collect()
    };
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": format!("sha256:{}", hex(&config)), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": format!("sha256:{layer_digest}"), "size": layer_len}],
    }))?;
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": format!("sha256:{}", hex(&manifest)), "size": manifest.len(),
                       "annotations": {"io.containerd.image.name": "socialweb.local/big:1",
                                       "org.opencontainers.image.ref.name": "1"}}],
    }))?;
    let out = dir.join("big.tar");
    let mut b = tar::Builder::new(std::io::BufWriter::new(std::fs::File::create(&out)?));
    for (name, data) in [
        (
            "oci-layout".to_string(),
            br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
        ),
        ("index.json".to_string(), index),
        (format!("blobs/sha256/{}", hex(&config)), config.clone()),
        (format!("blobs/sha256/{}", hex(&manifest)), manifest.clone()),
    ] {
        b.append_data(&mut header(data.len() as u64, 0o644), name, data.as_slice())?;
    }
    b.append_data(
        &mut header(layer_len, 0o644),
        format!("blobs/sha256/{layer_digest}"),
        std::fs::File::open(&layer)?,
    )?;
    b.into_inner()?.flush()?;
    std::fs::remove_file(&layer)?;
    Ok(out)
}

fn allocated(p: &Path) -> Result<u64> {
    use std::os::unix::fs::MetadataExt;
    Ok(std::fs::metadata(p)?.blocks() * 512)
}

fn build_timed(
    spec: &Spec,
    dir: &Path,
    out: &Path,
    cache: Option<&Path>,
) -> Result<(f64, serde_json::Value)> {
    let t = Instant::now();
    let cache = cache.map(|c| c.to_string_lossy().into_owned());
    let extra: Vec<&str> = match &cache {
        Some(c) => vec!["--cache", c.as_str()],
        None => vec![],
    };
    let d = nodeimage::build_with(spec, dir, out, true, &extra)?;
    Ok((t.elapsed().as_secs_f64(), d))
}

fn main() -> Result<()> {
    let args = Args::parse();
    let work = TempDir::new("bench-image")?;
    let w = work.path();
    let spec = Spec {
        headroom_mib: 1024,
        ..Spec::default()
    };
    let default_cache = nodeimage::cache_dir();

    if !args.no_cold {
        let cold_cache = w.join("cold-cache");
        std::fs::create_dir_all(&cold_cache)?;
        let (secs, _) = build_timed(&spec, &w.join("cfg"), &w.join("cold"), Some(&cold_cache))?;
        println!("build_cold_s={secs:.1}");
        std::fs::remove_dir_all(w.join("cold"))?;
        std::fs::remove_dir_all(&cold_cache)?;
    }
    // Cached: warm the cache (a no-op when it is), then time a forced build.
    let _ = build_timed(
        &spec,
        &w.join("cfg"),
        &w.join("warm0"),
        Some(&default_cache),
    )?;
    std::fs::remove_dir_all(w.join("warm0"))?;
    let (secs, d) = build_timed(&spec, &w.join("cfg"), &w.join("warm"), Some(&default_cache))?;
    println!("build_cached_s={secs:.1}");
    let rootfs = w.join("warm/rootfs.ext4");
    println!("rootfs_mib={}", std::fs::metadata(&rootfs)?.len() >> 20);
    println!("rootfs_allocated_mib={}", allocated(&rootfs)? >> 20);
    println!(
        "rootfs_staged_mib={}",
        d["rootfs"]["staged_bytes"].as_u64().unwrap_or(0) >> 20
    );
    println!(
        "seeds_mib={}",
        std::fs::metadata(w.join("warm/seeds.img"))?.len() >> 20
    );
    println!(
        "kernel_initrd_mib={}",
        (std::fs::metadata(w.join("warm/vmlinuz"))?.len()
            + std::fs::metadata(w.join("warm/initrd.img"))?.len())
            >> 20
    );
    std::fs::remove_dir_all(w.join("warm"))?;

    // A seed image over 2 GiB.
    let t = Instant::now();
    let big = big_image(w, args.big_mib)?;
    let big_bytes = std::fs::metadata(&big)?.len();
    println!("big_archive_mib={}", big_bytes >> 20);
    eprintln!("big archive written in {:.1}s", t.elapsed().as_secs_f64());
    let big_spec = Spec {
        images: vec![big.clone()],
        ..spec.clone()
    };
    let (secs, d) = build_timed(
        &big_spec,
        &w.join("cfg"),
        &w.join("big-image"),
        Some(&default_cache),
    )?;
    println!("build_with_big_seed_s={secs:.1}");
    std::fs::remove_file(&big)?;
    let seeds = std::fs::metadata(w.join("big-image/seeds.img"))?.len();
    println!("big_seeds_mib={}", seeds >> 20);
    if seeds <= 2 << 30 {
        bail!("the seed disk is {seeds} bytes, not over 2 GiB");
    }
    eprintln!("{}", d["seeds"]);

    // Boot a node from it; a Pod runs the big image without a pull.
    let world = testbed::world::World::new(0)?;
    let b = Broker::start(
        &world,
        BrokerOptions {
            image: Some(w.join("big-image")),
            ..BrokerOptions::default()
        },
    )?;
    b.cli_json(&["cluster", "create", "big"])?;
    let t = Instant::now();
    b.apply(
        "big",
        r#"apiVersion: v1
kind: Pod
metadata: {name: big, namespace: default}
spec:
  restartPolicy: Never
  containers:
  - name: big
    image: socialweb.local/big:1
    imagePullPolicy: Never
    command: ["/bin/busybox", "sh", "-c", "/bin/busybox stat -c %s /big"]
"#,
    )?;
    let phase = wait_for("the big pod to finish", Duration::from_secs(900), || {
        let v = b.kubectl_json("big", &["get", "pod", "big"])?;
        Ok(
            matches!(v["status"]["phase"].as_str(), Some("Succeeded" | "Failed"))
                .then(|| v["status"]["phase"].as_str().unwrap_or("").to_string()),
        )
    })
    .with_context(|| b.diagnostics())?;
    let log = b.kubectl("big", &["logs", "big"])?;
    if phase != "Succeeded" || log.trim() != (args.big_mib << 20).to_string() {
        bail!("the big pod: {phase}, log {log:?}\n{}", b.diagnostics());
    }
    let events = b.kubectl(
        "big",
        &[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=big",
        ],
    )?;
    if events.contains("Pulling") {
        bail!("the big image was pulled:\n{events}");
    }
    println!(
        "big_pod_from_pending_to_done_s={:.1}",
        t.elapsed().as_secs_f64()
    );
    println!("big_image_pulled=0");
    Ok(())
}
