//! ADD+DEL latency of socialweb-cni and of Debian's reference bridge + host-local, measured in
//! one run over the same pods. Run by `bench/cni`; prints `name=value` lines.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde_json::{Value, json};
use testbed::Netns;
use testbed::stats::{percentile_sorted, show};
use testbed::tmp::TempDir;

/// Times ADD+DEL pairs of socialweb-cni against the reference plugins.
#[derive(Debug, Parser)]
struct Args {
    /// Pods (ADD+DEL pairs) per plugin.
    #[arg(long, default_value_t = 300)]
    pods: usize,
    /// Path of socialweb-cni.
    #[arg(long)]
    ours: String,
}

fn invoke(plugin: &str, verb: &str, id: &str, netns: &Path, conf: &Value) -> Result<()> {
    let mut child = Command::new(plugin)
        .env_clear()
        .env("CNI_COMMAND", verb)
        .env("CNI_CONTAINERID", id)
        .env("CNI_NETNS", netns)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", "/usr/lib/cni")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {plugin}"))?;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(conf.to_string().as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("{plugin} {verb}: {}", String::from_utf8_lossy(&out.stdout));
    }
    Ok(())
}

/// Milliseconds of each ADD+DEL pair.
fn measure(plugin: &str, conf: &Value, pods: &[Netns]) -> Result<Vec<f64>> {
    let mut times = Vec::with_capacity(pods.len());
    for (i, pod) in pods.iter().enumerate() {
        let id = format!("bench-{i}");
        let t = Instant::now();
        invoke(plugin, "ADD", &id, &pod.path(), conf)?;
        invoke(plugin, "DEL", &id, &pod.path(), conf)?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(times)
}

fn main() -> Result<()> {
    let args = Args::parse();
    let node = Netns::new("benchnode")?;
    let pods = (0..args.pods)
        .map(|i| Netns::new(&format!("b{i}")))
        .collect::<Result<Vec<_>>>()?;
    let data_ours = TempDir::new("bench-ours")?;
    let data_ref = TempDir::new("bench-ref")?;
    let ours_conf = json!({
        "cniVersion": "1.0.0", "name": "bench", "type": "socialweb-cni",
        "bridge": "cni0", "subnet": "10.42.0.0/22", "mtu": 1280,
        "dataDir": data_ours.path(),
    });
    let ref_conf = json!({
        "cniVersion": "1.0.0", "name": "bench", "type": "bridge",
        "bridge": "cni1", "isGateway": true, "mtu": 1280, "hairpinMode": true,
        "ipam": {"type": "host-local", "subnet": "10.43.0.0/22", "dataDir": data_ref.path(),
                 "routes": [{"dst": "0.0.0.0/0"}]},
    });
    // The plugins run in the node namespace, as containerd's would: they are spawned from a
    // thread inside it, so no `ip netns exec` sits between the clock and the plugin.
    let (mut ours, mut reference) = node.run(|| -> Result<(Vec<f64>, Vec<f64>)> {
        // One warm-up pair each (creates the bridges, pages the binaries in).
        measure(&args.ours, &ours_conf, &pods[..1])?;
        measure("/usr/lib/cni/bridge", &ref_conf, &pods[..1])?;
        // Interleave in rounds so that machine noise lands on both alike.
        let (mut ours, mut reference) = (Vec::new(), Vec::new());
        for chunk in pods.chunks(50) {
            ours.extend(measure(&args.ours, &ours_conf, chunk)?);
            reference.extend(measure("/usr/lib/cni/bridge", &ref_conf, chunk)?);
        }
        Ok((ours, reference))
    })??;
    ours.sort_by(f64::total_cmp);
    reference.sort_by(f64::total_cmp);
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    println!("pods={}", args.pods);
    let (ours_p50, ref_p50) = (
        percentile_sorted(&ours, 0.5),
        percentile_sorted(&reference, 0.5),
    );
    println!("ours_add_del_p50_ms={}", show(ours_p50, 3));
    println!(
        "ours_add_del_p99_ms={}",
        show(percentile_sorted(&ours, 0.99), 3)
    );
    println!("ours_add_del_mean_ms={:.3}", mean(&ours));
    println!("reference_add_del_p50_ms={}", show(ref_p50, 3));
    println!(
        "reference_add_del_p99_ms={}",
        show(percentile_sorted(&reference, 0.99), 3)
    );
    println!("reference_add_del_mean_ms={:.3}", mean(&reference));
    println!(
        "ratio_p50_ours_vs_reference={}",
        show(ours_p50.zip(ref_p50).map(|(o, r)| o / r), 3)
    );
    println!(
        "ratio_mean_ours_vs_reference={:.3}",
        mean(&ours) / mean(&reference)
    );
    Ok(())
}
