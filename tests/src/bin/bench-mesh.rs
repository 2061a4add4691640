//! Pod-to-pod throughput and latency across two node namespaces for the mesh (direct, relayed,
//! and direct at the best pod MTU its path proves) and three peers: kernel vxlan, boringtun
//! (userspace WireGuard) and quincy (a QUIC VPN on quinn). Every variant is set up once, side
//! by side in its own namespaces, then measured in interleaved rounds (mesh, vxlan, boringtun,
//! quincy, …, mesh, …), so a slow minute of this shared machine hits every variant alike.
//!
//! Held equal (bench/README.md): pod MTU, the underlay (veth, MTU 1500, default offloads), the
//! nftables state (every node has the same `ip socialweb` masquerade table the agent installs),
//! the iperf3 and ping invocations. Run by `bench/mesh`; prints `name=value` lines.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde_json::Value;
use testbed::link;
use testbed::mesh::{MeshCluster, MeshOptions};
use testbed::process::Spawned;
use testbed::topology::{CLUSTER_CIDR, Node, manual_pod};
use testbed::{Netns, Reach, Topology, probe};

/// The mesh against vxlan, boringtun and quincy, pod to pod across two nodes, interleaved.
#[derive(Debug, Parser)]
struct Args {
    /// Seconds of iperf3 per measurement.
    #[arg(long, default_value_t = 5)]
    seconds: u32,
    /// Rounds (each measures every variant once, in turn).
    #[arg(long, default_value_t = 5)]
    rounds: u32,
    /// Pod MTU every variant runs with.
    #[arg(long, default_value_t = 1280)]
    mtu: u16,
    /// The boringtun-cli binary.
    #[arg(long)]
    boringtun: PathBuf,
    /// Directory holding bin/quincy-server and bin/quincy-client.
    #[arg(long)]
    quincy: PathBuf,
    /// Only these variants (mesh, mesh_best_mtu, mesh_relayed, vxlan, boringtun, quincy, and
    /// the tuning variants of --levers).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Also run the mesh with each tuning knob set one way and the other (LEVERS), to see
    /// what each is worth against the agent's defaults in the same run.
    #[arg(long)]
    levers: bool,
}

/// Direct mesh variants with one agent knob set: (name, arguments).
const LEVERS: &[(&str, &[&str])] = &[
    ("mesh_bbr", &["--mesh-congestion", "bbr"]),
    ("mesh_ack_default", &["--mesh-ack-threshold", "0"]),
    ("mesh_cipher_any", &["--mesh-cipher", "any"]),
    ("mesh_recv_4m", &["--mesh-recv-buffer-kib", "4096"]),
    ("mesh_recv_128k", &["--mesh-recv-buffer-kib", "128"]),
];

/// One variant, set up and waiting for rounds.
struct Variant<'t> {
    name: &'static str,
    // Field order is drop order: pods, then daemons, then the mesh.
    a: Netns,
    b: Netns,
    b_ip: String,
    nodes: [&'t Node; 2],
    /// Processes whose CPU is accounted (label, pid).
    procs: Vec<(String, u32)>,
    _daemons: Vec<Spawned>,
    mesh: Option<MeshCluster<'t>>,
    _dir: Option<testbed::tmp::TempDir>,
    results: Results,
}

#[derive(Default)]
struct Results {
    gbit: Vec<f64>,
    gbit4: Vec<f64>,
    idle_ms: Vec<f64>,
    loaded_ms: Vec<f64>,
    /// CPU ticks per (label, thread) over the single-stream runs.
    cpu: BTreeMap<(String, String), u64>,
    cpu_seconds: f64,
    udp: [UdpCounters; 2],
    quic: Option<QuicDelta>,
}

#[derive(Debug, Default, Clone, Copy)]
struct UdpCounters {
    rcvbuf_errors: u64,
    sndbuf_errors: u64,
    in_errors: u64,
}

#[derive(Debug, Default, Clone, Copy)]
struct QuicDelta {
    sent_packets: u64,
    lost_packets: u64,
    congestion_events: u64,
    send_waits: u64,
    too_big: u64,
    black_holes: u64,
}

/// The same masquerade table the agent installs, on a peer's node (so conntrack and the nat
/// hook cost every variant the same), plus `extra` rules.
fn nft_table(node: &Node, extra: &str) -> Result<()> {
    let script = format!(
        "table ip socialweb {{\n chain postrouting {{\n  type nat hook postrouting priority srcnat; policy accept;\n  ip saddr {} ip daddr != {CLUSTER_CIDR} masquerade\n  {extra}\n }}\n}}\n",
        node.pod_cidr()
    );
    node.ns
        .exec_with_stdin("nft", &["-f", "-"], script.as_bytes())?;
    Ok(())
}

/// Pods wired by hand behind each node's bridge, with `mtu`.
fn manual_pods(topo: &Topology, mtu: u16) -> Result<(testbed::Pod, testbed::Pod)> {
    let a = manual_pod(topo.node(1), 10)?;
    let b = manual_pod(topo.node(2), 10)?;
    for p in [&a, &b] {
        p.ns.ip(&["link", "set", "eth0", "mtu", &mtu.to_string()])?;
    }
    Ok((a, b))
}

fn both(topo: &Topology) -> [&Node; 2] {
    [topo.node(1), topo.node(2)]
}

fn mesh<'t>(
    name: &'static str,
    topo: &'t Topology,
    mtu: Option<u16>,
    agent_args: &[&str],
) -> Result<Variant<'t>> {
    // With no MTU given, the agent's TUN takes 1500 and the pods the largest packet the
    // path carries, as `mesh status` reports it once path MTU discovery has run.
    let opts = MeshOptions {
        mtu: mtu.unwrap_or(1500),
        agent_args: agent_args.iter().map(|a| a.to_string()).collect(),
        ..MeshOptions::default()
    };
    let cluster = MeshCluster::start(topo, opts)?;
    let a = cluster.pod(1, "bench")?;
    let b = cluster.pod(2, "bench")?;
    if mtu.is_none() {
        std::thread::sleep(Duration::from_secs(3));
        let best = cluster
            .peer(1, 2)?
            .get("max_packet")
            .and_then(Value::as_u64)
            .context("no max_packet in mesh status")?
            .min(cluster.peer(2, 1)?["max_packet"].as_u64().unwrap_or(0));
        println!("{name}_pod_mtu={best}");
        for p in [&a.ns, &b.ns] {
            p.ip(&["link", "set", "eth0", "mtu", &best.to_string()])?;
        }
    }
    let path = cluster.peer(1, 2)?["path"]
        .as_str()
        .unwrap_or("")
        .to_string();
    eprintln!("bench: {name}: path {path}");
    let mut procs: Vec<(String, u32)> = (1..=2u8)
        .map(|i| (format!("agent{i}"), cluster.agent(i).pid()))
        .collect();
    if path.starts_with("relay") {
        procs.push(("relay".into(), cluster.relay_pid()));
    }
    Ok(Variant {
        name,
        a: a.ns,
        b: b.ns,
        b_ip: b.addr.to_string(),
        nodes: both(topo),
        procs,
        _daemons: Vec::new(),
        mesh: Some(cluster),
        _dir: None,
        results: Results::default(),
    })
}

fn vxlan(topo: &Topology, mtu: u16) -> Result<Variant<'_>> {
    let nodes = both(topo);
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
        nft_table(n, "")?;
    }
    Ok(Variant::peer(
        "vxlan",
        nodes,
        manual_pods(topo, mtu)?,
        Vec::new(),
        Vec::new(),
        None,
    ))
}

/// A WireGuard-style key pair from `wg` (X25519, base64): (private, public).
fn x25519_pair(ns: &Netns) -> Result<(String, String)> {
    let private = ns.exec("wg", &["genkey"])?.trim().to_string();
    let public = ns.exec_with_stdin("wg", &["pubkey"], private.as_bytes())?;
    Ok((private, public.trim().to_string()))
}

fn boringtun<'t>(bin: &Path, topo: &'t Topology, mtu: u16) -> Result<Variant<'t>> {
    let dir = testbed::tmp::TempDir::new("boringtun")?;
    let nodes = both(topo);
    let mut keys = Vec::new();
    for n in &nodes {
        let (private, public) = x25519_pair(&n.ns)?;
        let key_file = dir.path().join(format!("wg{}.key", n.index));
        std::fs::write(&key_file, &private)?;
        keys.push((key_file, public));
    }
    let mut daemons: Vec<Spawned> = Vec::new();
    let mut procs = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        // Interface names differ per node: boringtun's control socket is
        // /var/run/wireguard/<name>.sock, one filesystem for all namespaces.
        let ifname = format!("swtwg{}", n.index);
        let _ = std::fs::remove_file(format!("/var/run/wireguard/{ifname}.sock"));
        let mut cmd = n.ns.command(&bin.to_string_lossy());
        cmd.args([&ifname, "--foreground", "--disable-drop-privileges"])
            .env("WG_SUDO", "1");
        let d = Spawned::start_logged(cmd, "boringtun", &dir.path().join(format!("{ifname}.log")))?;
        procs.push((format!("boringtun{}", n.index), d.id()));
        daemons.push(d);
        let sock = PathBuf::from(format!("/var/run/wireguard/{ifname}.sock"));
        testbed::k8s::wait_for("boringtun's socket", Duration::from_secs(10), || {
            Ok(sock.exists().then_some(()))
        })?;
        let other = nodes[1 - i];
        n.ns.exec(
            "wg",
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
        nft_table(n, "")?;
    }
    Ok(Variant::peer(
        "boringtun",
        nodes,
        manual_pods(topo, mtu)?,
        procs,
        daemons,
        Some(dir),
    ))
}

/// quincy 3.x in Noise mode (X25519, its benchmark's mode): the server on node 1, the client
/// on node 2. Quincy routes to a client by the tunnel address the server gave it and drops
/// client packets from any other source, so node 2 masquerades its pods' traffic into the
/// tunnel (a conntrack lookup per packet on an established flow).
fn quincy<'t>(dir_bin: &Path, topo: &'t Topology, mtu: u16) -> Result<Variant<'t>> {
    let dir = testbed::tmp::TempDir::new("quincy")?;
    let nodes = both(topo);
    let (server_key, server_pub) = x25519_pair(&nodes[0].ns)?;
    let (client_key, client_pub) = x25519_pair(&nodes[1].ns)?;
    let users = dir.path().join("users.toml");
    std::fs::write(
        &users,
        format!("[users.node2]\nauthorized_keys = [\"{client_pub}\"]\nauthorized_certs = []\n"),
    )?;
    // quincy's MTU is its TUN's; 1420 leaves a 1280-byte pod packet room, as for boringtun.
    let connection = "[connection]\nmtu = 1420\n";
    let server_conf = dir.path().join("server.toml");
    std::fs::write(
        &server_conf,
        format!(
            "name = \"bench\"\ninterface_name = \"swq0\"\nbind_address = \"{}\"\nbind_port = 55555\n\
             tunnel_network = \"10.98.0.1/24\"\nusers_file = \"{}\"\n\
             [protocol]\nmode = \"noise\"\nkey_exchange = \"standard\"\nprivate_key = \"{server_key}\"\n\
             {connection}[log]\nlevel = \"warn\"\n",
            nodes[0].addr,
            users.display()
        ),
    )?;
    let client_conf = dir.path().join("client.toml");
    std::fs::write(
        &client_conf,
        format!(
            "connection_string = \"{}:55555\"\n\
             [protocol]\nmode = \"noise\"\nkey_exchange = \"standard\"\nserver_public_key = \"{server_pub}\"\nprivate_key = \"{client_key}\"\n\
             {connection}[network]\ninterface_name = \"swq1\"\nroutes = [\"{}\"]\n[log]\nlevel = \"warn\"\n",
            nodes[0].addr,
            nodes[0].pod_cidr()
        ),
    )?;
    let mut daemons = Vec::new();
    let mut procs = Vec::new();
    for (i, (role, conf)) in [("server", &server_conf), ("client", &client_conf)]
        .into_iter()
        .enumerate()
    {
        let bin = dir_bin.join("bin").join(format!("quincy-{role}"));
        let mut cmd = nodes[i].ns.command(&bin.to_string_lossy());
        cmd.arg("--config-path").arg(conf);
        let d = Spawned::start_logged(cmd, role, &dir.path().join(format!("{role}.log")))?;
        procs.push((format!("quincy-{role}"), d.id()));
        daemons.push(d);
        let dev = if role == "server" { "swq0" } else { "swq1" };
        let log = dir.path().join(format!("{role}.log"));
        testbed::k8s::wait_for(
            &format!("quincy's {role} to bring {dev} up"),
            Duration::from_secs(20),
            || {
                Ok(link::links(&nodes[i].ns)?
                    .iter()
                    .any(|l| l == dev)
                    .then_some(()))
            },
        )
        .with_context(|| std::fs::read_to_string(&log).unwrap_or_default())?;
    }
    nft_table(nodes[0], "")?;
    nft_table(
        nodes[1],
        &format!(
            "oifname \"swq1\" ip saddr {} masquerade",
            nodes[1].pod_cidr()
        ),
    )?;
    let (server_pod, client_pod) = manual_pods(topo, mtu)?;
    // The client's route to node 1's pods may come a moment after its device.
    testbed::k8s::wait_for("quincy's route", Duration::from_secs(10), || {
        let routes = nodes[1].ns.ip(&["route", "show", &nodes[0].pod_cidr()])?;
        Ok((!routes.trim().is_empty()).then_some(()))
    })?;
    // Traffic goes from the client side's pod (node 2) to the server side's (node 1).
    Ok(Variant::peer(
        "quincy",
        [nodes[1], nodes[0]],
        (client_pod, server_pod),
        procs,
        daemons,
        Some(dir),
    ))
}

/// iperf3 from `a` to `b_ip` (server in `b`), TCP, `streams` streams; Gbit/s received.
fn iperf(a: &Netns, b: &Netns, b_ip: &str, seconds: u32, streams: u32) -> Result<f64> {
    let server = b.spawn("iperf3", &["-s", "-1", "-B", b_ip])?;
    std::thread::sleep(Duration::from_millis(300));
    let out = a.output(
        "iperf3",
        &[
            "-c",
            b_ip,
            "-t",
            &seconds.to_string(),
            "-P",
            &streams.to_string(),
            "-J",
        ],
    )?;
    drop(server);
    let v: Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("iperf3 output: {}", String::from_utf8_lossy(&out.stdout)))?;
    if let Some(e) = v["error"].as_str() {
        bail!("iperf3: {e}");
    }
    let bps = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .context("no sum_received in iperf3 output")?;
    Ok(bps / 1e9)
}

/// RTTs (ms) of pings every 10 ms for `seconds`.
fn pings(a: &Netns, ip: &str, seconds: u32) -> Result<Vec<f64>> {
    let out = a.output(
        "ping",
        &["-n", "-i", "0.01", "-w", &seconds.to_string(), ip],
    )?;
    let text = String::from_utf8_lossy(&out.stdout);
    let rtts: Vec<f64> = text
        .lines()
        .filter_map(|l| l.split("time=").nth(1))
        .filter_map(|t| t.split_whitespace().next()?.parse().ok())
        .collect();
    if rtts.is_empty() {
        bail!("no ping replies from {ip}: {text}");
    }
    Ok(rtts)
}

fn percentile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let i = ((s.len() - 1) as f64 * p).round() as usize;
    s[i]
}

/// CPU ticks (user + system) of every thread of `pid`, by "<comm>-<tid>".
fn thread_ticks(pid: u32) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
            continue;
        };
        // comm is in parentheses and may hold spaces; the fields after it are fixed.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = &stat[open + 1..close];
        let rest: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        let ticks = rest
            .get(11)
            .and_then(|u| u.parse::<u64>().ok())
            .unwrap_or(0)
            + rest
                .get(12)
                .and_then(|s| s.parse::<u64>().ok())
                .unwrap_or(0);
        out.insert(format!("{comm}-{}", t.file_name().to_string_lossy()), ticks);
    }
    out
}

/// The node namespace's UDP counters (/proc/net/snmp is per network namespace).
fn udp_counters(ns: &Netns) -> Result<UdpCounters> {
    let snmp = ns.exec("cat", &["/proc/net/snmp"])?;
    let mut lines = snmp.lines().filter(|l| l.starts_with("Udp:"));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
        bail!("no Udp lines in /proc/net/snmp");
    };
    let map: BTreeMap<&str, u64> = names
        .split_whitespace()
        .zip(values.split_whitespace())
        .filter_map(|(n, v)| Some((n, v.parse().ok()?)))
        .collect();
    Ok(UdpCounters {
        rcvbuf_errors: map.get("RcvbufErrors").copied().unwrap_or(0),
        sndbuf_errors: map.get("SndbufErrors").copied().unwrap_or(0),
        in_errors: map.get("InErrors").copied().unwrap_or(0),
    })
}

/// The mesh's counters, node 1 sending to node 2 (the direction iperf3 loads).
fn quic_counters(mesh: &MeshCluster<'_>) -> Result<QuicDelta> {
    let p = mesh.peer(1, 2)?;
    let q = &p["quic"];
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    Ok(QuicDelta {
        sent_packets: n(&q["sent_packets"]),
        lost_packets: n(&q["lost_packets"]),
        congestion_events: n(&q["congestion_events"]),
        send_waits: n(&p["send_waits"]),
        too_big: n(&p["drops"]["too_big"]),
        black_holes: n(&q["black_holes"]),
    })
}

impl<'t> Variant<'t> {
    /// A peer's variant: traffic from pod `from` to pod `to`, wired by hand; `daemons` (and
    /// the directory of their configuration) live as long as the variant.
    fn peer(
        name: &'static str,
        nodes: [&'t Node; 2],
        (from, to): (testbed::Pod, testbed::Pod),
        procs: Vec<(String, u32)>,
        daemons: Vec<Spawned>,
        dir: Option<testbed::tmp::TempDir>,
    ) -> Variant<'t> {
        Variant {
            name,
            a: from.ns,
            b_ip: to.addr.to_string(),
            b: to.ns,
            nodes,
            procs,
            _daemons: daemons,
            mesh: None,
            _dir: dir,
            results: Results::default(),
        }
    }

    /// One round: idle ping, one stream with ping under load, four streams.
    fn round(&mut self, seconds: u32) -> Result<()> {
        probe::ping_until(&self.a, &self.b_ip, Duration::from_secs(10))?;
        let idle = pings(&self.a, &self.b_ip, 1)?;
        self.results.idle_ms.extend(idle);

        let udp_before = [
            udp_counters(&self.nodes[0].ns)?,
            udp_counters(&self.nodes[1].ns)?,
        ];
        let quic_before = self.mesh.as_ref().map(quic_counters).transpose()?;
        let cpu_before: Vec<_> = self
            .procs
            .iter()
            .map(|(l, p)| (l.clone(), thread_ticks(*p)))
            .collect();
        let started = Instant::now();
        let (a, b, ip) = (&self.a, &self.b, self.b_ip.as_str());
        let (gbit, loaded) = std::thread::scope(|s| {
            let pinger = s.spawn(|| {
                std::thread::sleep(Duration::from_millis(800));
                pings(a, ip, seconds.saturating_sub(1).max(1))
            });
            let gbit = iperf(a, b, ip, seconds, 1);
            let loaded = pinger.join().expect("the pinger does not panic");
            (gbit, loaded)
        });
        let elapsed = started.elapsed().as_secs_f64();
        self.results.gbit.push(gbit?);
        self.results.loaded_ms.extend(loaded?);
        self.results.cpu_seconds += elapsed;
        for (label, before) in cpu_before {
            let pid = self.procs.iter().find(|(l, _)| *l == label).map(|p| p.1);
            let after = pid.map(thread_ticks).unwrap_or_default();
            for (thread, t) in after {
                let d = t.saturating_sub(before.get(&thread).copied().unwrap_or(0));
                *self.results.cpu.entry((label.clone(), thread)).or_default() += d;
            }
        }
        for (i, b) in udp_before.iter().enumerate() {
            let a = udp_counters(&self.nodes[i].ns)?;
            let acc = &mut self.results.udp[i];
            acc.rcvbuf_errors += a.rcvbuf_errors - b.rcvbuf_errors;
            acc.sndbuf_errors += a.sndbuf_errors - b.sndbuf_errors;
            acc.in_errors += a.in_errors - b.in_errors;
        }
        if let (Some(before), Some(mesh)) = (quic_before, self.mesh.as_ref()) {
            let after = quic_counters(mesh)?;
            let acc = self.results.quic.get_or_insert_default();
            acc.sent_packets += after.sent_packets.saturating_sub(before.sent_packets);
            acc.lost_packets += after.lost_packets.saturating_sub(before.lost_packets);
            acc.congestion_events += after
                .congestion_events
                .saturating_sub(before.congestion_events);
            acc.send_waits += after.send_waits.saturating_sub(before.send_waits);
            acc.too_big += after.too_big.saturating_sub(before.too_big);
            acc.black_holes += after.black_holes.saturating_sub(before.black_holes);
        }

        self.results
            .gbit4
            .push(iperf(&self.a, &self.b, &self.b_ip, seconds, 4)?);
        Ok(())
    }

    fn print(&self) {
        let n = self.name;
        let r = &self.results;
        let list = |v: &[f64]| {
            v.iter()
                .map(|x| format!("{x:.2}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        println!("{n}_gbit={:.3}", percentile(&r.gbit, 0.5));
        println!(
            "{n}_gbit_min={:.3}\n{n}_gbit_max={:.3}\n{n}_gbit_rounds={}",
            percentile(&r.gbit, 0.0),
            percentile(&r.gbit, 1.0),
            list(&r.gbit)
        );
        println!("{n}_4streams_gbit={:.3}", percentile(&r.gbit4, 0.5));
        println!("{n}_4streams_gbit_rounds={}", list(&r.gbit4));
        println!("{n}_ping_p50_ms={:.3}", percentile(&r.idle_ms, 0.5));
        println!("{n}_ping_p99_ms={:.3}", percentile(&r.idle_ms, 0.99));
        println!(
            "{n}_ping_loaded_p50_ms={:.3}",
            percentile(&r.loaded_ms, 0.5)
        );
        println!(
            "{n}_ping_loaded_p99_ms={:.3}",
            percentile(&r.loaded_ms, 0.99)
        );
        // Diagnostics: CPU of each process's busiest threads during the single stream, in
        // percent of one core.
        let hz = 100.0;
        let mut by_label: BTreeMap<&str, Vec<(f64, &str)>> = BTreeMap::new();
        for ((label, thread), ticks) in &r.cpu {
            let pct = *ticks as f64 / hz / r.cpu_seconds.max(1e-9) * 100.0;
            by_label.entry(label).or_default().push((pct, thread));
        }
        for (label, mut threads) in by_label {
            threads.sort_by(|x, y| y.0.total_cmp(&x.0));
            let total: f64 = threads.iter().map(|t| t.0).sum();
            println!("diag_{n}_{label}_cpu_pct={total:.0}");
            let top: Vec<String> = threads
                .iter()
                .filter(|t| t.0 >= 1.0)
                .map(|(p, t)| format!("{t}:{p:.0}"))
                .collect();
            println!("diag_{n}_{label}_threads_cpu_pct={}", top.join(","));
        }
        for (i, u) in r.udp.iter().enumerate() {
            let node = i + 1;
            println!(
                "diag_{n}_node{node}_udp_rcvbuf_errors={}\ndiag_{n}_node{node}_udp_sndbuf_errors={}\ndiag_{n}_node{node}_udp_in_errors={}",
                u.rcvbuf_errors, u.sndbuf_errors, u.in_errors
            );
        }
        if let Some(q) = r.quic {
            println!(
                "diag_{n}_quic_sent_packets={}\ndiag_{n}_quic_lost_packets={}\ndiag_{n}_quic_congestion_events={}\ndiag_{n}_send_waits={}\ndiag_{n}_too_big_drops={}\ndiag_{n}_quic_black_holes={}",
                q.sent_packets,
                q.lost_packets,
                q.congestion_events,
                q.send_waits,
                q.too_big,
                q.black_holes
            );
        }
    }

    fn gbit(&self) -> f64 {
        percentile(&self.results.gbit, 0.5)
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let is_lever = |name: &str| LEVERS.iter().any(|(l, _)| *l == name);
    let want = |name: &str| {
        if args.only.is_empty() {
            !is_lever(name) || args.levers
        } else {
            args.only.iter().any(|o| o == name)
        }
    };
    // Every variant in its own namespaces, all up at once.
    let plan: Vec<(&'static str, Reach)> = [
        ("mesh", Reach::Direct),
        ("vxlan", Reach::Direct),
        ("boringtun", Reach::Direct),
        ("quincy", Reach::Direct),
        ("mesh_relayed", Reach::HostOnly),
        ("mesh_best_mtu", Reach::Direct),
    ]
    .into_iter()
    .chain(LEVERS.iter().map(|(n, _)| (*n, Reach::Direct)))
    .filter(|(n, _)| want(n))
    .collect();
    let topos: Vec<Topology> = plan
        .iter()
        .map(|(_, reach)| Topology::new(2, *reach))
        .collect::<Result<_>>()?;
    let mut variants = Vec::new();
    for ((name, _), topo) in plan.iter().zip(&topos) {
        eprintln!("bench: setting up {name}");
        let v = match *name {
            "mesh" => mesh("mesh", topo, Some(args.mtu), &[])?,
            "mesh_relayed" => mesh("mesh_relayed", topo, Some(args.mtu), &[])?,
            "mesh_best_mtu" => mesh("mesh_best_mtu", topo, None, &[])?,
            lever if is_lever(lever) => {
                let (n, a) = LEVERS.iter().find(|(l, _)| *l == lever).expect("a lever");
                mesh(n, topo, Some(args.mtu), a)?
            }
            "vxlan" => vxlan(topo, args.mtu)?,
            "boringtun" => boringtun(&args.boringtun, topo, args.mtu)?,
            "quincy" => quincy(&args.quincy, topo, args.mtu)?,
            other => bail!("unknown variant {other}"),
        };
        variants.push(v);
    }
    println!("pod_mtu={}", args.mtu);
    println!("rounds={}", args.rounds);
    println!("seconds={}", args.seconds);
    for round in 1..=args.rounds {
        for v in &mut variants {
            eprintln!("bench: round {round}/{}: {}", args.rounds, v.name);
            v.round(args.seconds)
                .with_context(|| format!("round {round} of {}", v.name))?;
        }
    }
    for v in &variants {
        v.print();
    }
    let get = |n: &str| variants.iter().find(|v| v.name == n);
    if let Some(m) = get("mesh") {
        println!("direct_gbit={:.3}", m.gbit());
        println!("ping_p50_ms={:.3}", percentile(&m.results.idle_ms, 0.5));
        println!(
            "ping_loaded_p99_ms={:.3}",
            percentile(&m.results.loaded_ms, 0.99)
        );
        for peer in ["vxlan", "boringtun", "quincy"] {
            if let Some(p) = get(peer) {
                println!("ratio_{peer}={:.3}", m.gbit() / p.gbit());
                let m4 = percentile(&m.results.gbit4, 0.5);
                let p4 = percentile(&p.results.gbit4, 0.5);
                println!("ratio_{peer}_4streams={:.3}", m4 / p4);
            }
        }
    }
    if let Some(m) = get("mesh") {
        for (lever, _) in LEVERS {
            if let Some(l) = get(lever) {
                println!("ratio_{lever}_vs_mesh={:.3}", l.gbit() / m.gbit());
            }
        }
    }
    if let Some(r) = get("mesh_relayed") {
        println!("relayed_gbit={:.3}", r.gbit());
    }
    if let Some(b) = get("mesh_best_mtu") {
        println!("direct_best_mtu_gbit={:.3}", b.gbit());
        if let Some(q) = get("quincy") {
            println!("ratio_quincy_best_mtu={:.3}", b.gbit() / q.gbit());
        }
    }
    Ok(())
}
