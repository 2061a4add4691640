//! Pod-to-pod throughput (iperf3) and latency (ping p50) across two node namespaces, in one
//! run, for: the mesh direct, the mesh relayed, kernel vxlan, and boringtun (userspace
//! WireGuard configured with `wg`). Run by `bench/mesh`; prints `name=value` lines.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use testbed::link;
use testbed::mesh::{MeshCluster, MeshOptions};
use testbed::process::Spawned;
use testbed::topology::{Node, manual_pod};
use testbed::{Netns, Reach, Topology, probe};

/// Mesh against vxlan and boringtun, pod to pod across two nodes.
#[derive(Debug, Parser)]
struct Args {
    /// Seconds of iperf3 per variant.
    #[arg(long, default_value_t = 8)]
    seconds: u32,
    /// The boringtun-cli binary.
    #[arg(long)]
    boringtun: PathBuf,
    /// Only these variants (mesh_direct, mesh_relayed, vxlan, boringtun).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
}

#[derive(Debug, Clone, Copy)]
struct Figures {
    gbit: f64,
    rtt_p50_ms: f64,
}

/// iperf3 from `a` to `b_ip` (server in `b`), TCP, one stream.
fn iperf(a: &Netns, b: &Netns, b_ip: &str, seconds: u32) -> Result<f64> {
    let server = b.spawn("iperf3", &["-s", "-1", "-B", b_ip])?;
    std::thread::sleep(Duration::from_millis(300));
    let out = a.output("iperf3", &["-c", b_ip, "-t", &seconds.to_string(), "-J"])?;
    drop(server);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("iperf3 output: {}", String::from_utf8_lossy(&out.stdout)))?;
    if let Some(e) = v["error"].as_str() {
        bail!("iperf3: {e}");
    }
    let bps = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .context("no sum_received in iperf3 output")?;
    Ok(bps / 1e9)
}

/// Median RTT of 40 pings.
fn rtt_p50(a: &Netns, ip: &str) -> Result<f64> {
    let out = a.exec("ping", &["-n", "-c", "40", "-i", "0.05", ip])?;
    let mut rtts: Vec<f64> = out
        .lines()
        .filter_map(|l| l.split("time=").nth(1))
        .filter_map(|t| t.split_whitespace().next()?.parse().ok())
        .collect();
    if rtts.is_empty() {
        bail!("no replies: {out}");
    }
    rtts.sort_by(f64::total_cmp);
    Ok(rtts[rtts.len() / 2])
}

fn measure(a: &Netns, b: &Netns, b_ip: &str, seconds: u32) -> Result<Figures> {
    probe::ping_until(a, b_ip, Duration::from_secs(10))?;
    let rtt_p50_ms = rtt_p50(a, b_ip)?;
    let gbit = iperf(a, b, b_ip, seconds)?;
    Ok(Figures { gbit, rtt_p50_ms })
}

fn mesh(reach: Reach, seconds: u32) -> Result<Figures> {
    let topo = Topology::new(2, reach)?;
    let mesh = MeshCluster::start(&topo, MeshOptions::default())?;
    let a = mesh.pod(1, "bench")?;
    let b = mesh.pod(2, "bench")?;
    let f = measure(&a.ns, &b.ns, &b.addr.to_string(), seconds)?;
    let path = mesh.peer(1, 2)?["path"].as_str().unwrap_or("").to_string();
    eprintln!("bench: mesh {reach:?}: path {path}");
    Ok(f)
}

/// Pods wired by hand behind each node's bridge, with `mtu`.
fn pods(topo: &Topology, mtu: u32) -> Result<(testbed::Pod, testbed::Pod)> {
    let a = manual_pod(topo.node(1), 10)?;
    let b = manual_pod(topo.node(2), 10)?;
    for p in [&a, &b] {
        p.ns.ip(&["link", "set", "eth0", "mtu", &mtu.to_string()])?;
    }
    Ok((a, b))
}

fn vxlan(seconds: u32) -> Result<Figures> {
    let topo = Topology::new(2, Reach::Direct)?;
    let nodes: [&Node; 2] = [topo.node(1), topo.node(2)];
    for (i, n) in nodes.iter().enumerate() {
        let other = nodes[1 - i];
        n.ns.ip(&[
            "link",
            "add",
            "vx0",
            "type",
            "vxlan",
            "id",
            "42",
            "local",
            &n.addr.to_string(),
            "remote",
            &other.addr.to_string(),
            "dstport",
            "4789",
            "dev",
            "eth0",
        ])?;
        n.ns.ip(&["link", "set", "vx0", "mtu", "1450", "up"])?;
        link::addr(&n.ns, "vx0", &format!("10.99.0.{}/24", n.index))?;
        link::route(
            &n.ns,
            &other.pod_cidr(),
            Some(&format!("10.99.0.{}", other.index)),
            Some("vx0"),
        )?;
    }
    let (a, b) = pods(&topo, 1450)?;
    measure(&a.ns, &b.ns, &b.addr.to_string(), seconds)
}

fn wg(ns: &Netns, args: &[&str]) -> Result<String> {
    ns.exec("wg", args)
}

fn boringtun(bin: &Path, seconds: u32) -> Result<Figures> {
    let topo = Topology::new(2, Reach::Direct)?;
    let dir = testbed::tmp::TempDir::new("boringtun")?;
    let nodes: [&Node; 2] = [topo.node(1), topo.node(2)];
    let mut keys = Vec::new();
    for n in &nodes {
        let private = n.ns.exec("wg", &["genkey"])?.trim().to_string();
        let key_file = dir.path().join(format!("wg{}.key", n.index));
        std::fs::write(&key_file, &private)?;
        let mut cmd = std::process::Command::new("sh");
        cmd.arg("-c").arg(format!("echo {private} | wg pubkey"));
        let public = String::from_utf8(cmd.output()?.stdout)?.trim().to_string();
        keys.push((key_file, public));
    }
    let mut daemons: Vec<Spawned> = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        // Interface names differ per node: boringtun's control socket is
        // /var/run/wireguard/<name>.sock, one filesystem for all namespaces.
        let ifname = format!("swtwg{}", n.index);
        let mut cmd = n.ns.command(&bin.to_string_lossy());
        cmd.args([&ifname, "--foreground", "--disable-drop-privileges"])
            .env("WG_SUDO", "1");
        daemons.push(Spawned::start_logged(
            cmd,
            "boringtun",
            &dir.path().join(format!("{ifname}.log")),
        )?);
        let sock = PathBuf::from(format!("/var/run/wireguard/{ifname}.sock"));
        testbed::k8s::wait_for("boringtun's socket", Duration::from_secs(10), || {
            Ok(sock.exists().then_some(()))
        })?;
        let other = nodes[1 - i];
        wg(
            &n.ns,
            &[
                "set",
                &ifname,
                "private-key",
                &keys[i].0.to_string_lossy(),
                "listen-port",
                "51820",
                "peer",
                &keys[1 - i].1,
                "endpoint",
                &format!("{}:51820", other.addr),
                "allowed-ips",
                &other.pod_cidr(),
            ],
        )?;
        n.ns.ip(&["link", "set", &ifname, "mtu", "1420", "up"])?;
        link::route(&n.ns, &other.pod_cidr(), None, Some(&ifname))?;
    }
    let (a, b) = pods(&topo, 1420)?;
    let f = measure(&a.ns, &b.ns, &b.addr.to_string(), seconds);
    for n in &nodes {
        let _ = std::fs::remove_file(format!("/var/run/wireguard/swtwg{}.sock", n.index));
    }
    drop(daemons);
    f
}

fn main() -> Result<()> {
    let args = Args::parse();
    let want = |name: &str| args.only.is_empty() || args.only.iter().any(|o| o == name);
    let mut results: Vec<(&str, Figures)> = Vec::new();
    if want("mesh_direct") {
        results.push(("mesh_direct", mesh(Reach::Direct, args.seconds)?));
    }
    if want("mesh_relayed") {
        results.push(("mesh_relayed", mesh(Reach::HostOnly, args.seconds)?));
    }
    if want("vxlan") {
        results.push(("vxlan", vxlan(args.seconds)?));
    }
    if want("boringtun") {
        results.push(("boringtun", boringtun(&args.boringtun, args.seconds)?));
    }
    for (name, f) in &results {
        println!("{name}_gbit={:.3}", f.gbit);
        println!("{name}_rtt_p50_ms={:.3}", f.rtt_p50_ms);
    }
    let get = |n: &str| results.iter().find(|(k, _)| *k == n).map(|(_, f)| *f);
    if let (Some(m), Some(v)) = (get("mesh_direct"), get("vxlan")) {
        println!("ratio_mesh_vs_vxlan={:.3}", m.gbit / v.gbit);
    }
    if let (Some(m), Some(b)) = (get("mesh_direct"), get("boringtun")) {
        println!("ratio_mesh_vs_boringtun={:.3}", m.gbit / b.gbit);
    }
    if let (Some(r), Some(v)) = (get("mesh_relayed"), get("vxlan")) {
        println!("ratio_relayed_vs_vxlan={:.3}", r.gbit / v.gbit);
    }
    Ok(())
}
