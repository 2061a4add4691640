//! dnsperf, in one run, against node-local DNS and two peers -- unbound and dnsmasq, each a
//! forwarding cache to the same upstream on the same machine -- for a cached external-name
//! mix; then against ours alone for cluster names. Run by `bench/dns`; prints `name=value`.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use testbed::k8s::{Cluster, wait_for};
use testbed::process::Spawned;
use testbed::tmp::TempDir;
use testbed::topology::HOST_SERVICE_ADDR;
use testbed::{Netns, Reach, Topology, link};

/// Node-local DNS against unbound and dnsmasq.
#[derive(Debug, Parser)]
struct Args {
    /// Seconds of dnsperf per measurement.
    #[arg(long, default_value_t = 10)]
    seconds: u32,
    /// Distinct names in each query mix.
    #[arg(long, default_value_t = 200)]
    names: usize,
    /// Fixed query rate of the latency runs (p99 at a given load, not at saturation).
    #[arg(long, default_value_t = 50_000)]
    rate: u32,
}

const OURS: &str = "169.254.20.10";
const UNBOUND: &str = "169.254.20.11";
const DNSMASQ: &str = "169.254.20.12";

#[derive(Debug)]
struct Run {
    qps: f64,
    lost: u64,
    p99_ms: f64,
}

/// One dnsperf run from inside `ns`, as fast as the server answers (200 queries outstanding)
/// or at `rate` queries a second; per-query latencies (`-v`) give the p99.
fn dnsperf(
    ns: &Netns,
    server: &str,
    queries: &Path,
    seconds: u32,
    rate: Option<u32>,
) -> Result<Run> {
    let mut args: Vec<String> = [
        "-s",
        server,
        "-d",
        &queries.to_string_lossy(),
        "-l",
        &seconds.to_string(),
        "-q",
        "200",
        "-t",
        "2",
        "-v",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if let Some(r) = rate {
        args.extend(["-Q".to_string(), r.to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = ns.output("dnsperf", &args)?;
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |label: &str| -> Result<String> {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(label))
            .map(|v| v.split_whitespace().next().unwrap_or("").to_string())
            .with_context(|| {
                format!(
                    "dnsperf printed no {label:?}: {}",
                    String::from_utf8_lossy(&out.stderr)
                )
            })
    };
    let qps: f64 = field("Queries per second:")?.parse()?;
    let lost: u64 = field("Queries lost:")?.parse()?;
    let mut lat: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with("> "))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    if lat.is_empty() {
        bail!("no per-query latencies from dnsperf -v");
    }
    lat.sort_by(f64::total_cmp);
    let p99_ms = lat[(lat.len() as f64 * 0.99) as usize - 1] * 1e3;
    Ok(Run { qps, lost, p99_ms })
}

fn main() -> Result<()> {
    let args = Args::parse();
    let topo = Topology::new(1, Reach::Direct)?;
    let node = &topo.node(1).ns;
    let dir = TempDir::new("bench-dns")?;

    // The upstream every cache forwards to: answers for *.bench.test, an hour's TTL.
    let _upstream = testbed::resolver::dnsmasq(
        &topo.host,
        HOST_SERVICE_ADDR,
        &["--address=/bench.test/192.0.2.1", "--local-ttl=3600"],
    )?;

    // Ours: the agent of a node that joined the cluster, cluster data from the control plane.
    let k8s = Cluster::start(&topo, |_| {})?;
    k8s.wait_ready(Duration::from_secs(180))
        .with_context(|| k8s.diagnostics())?;
    let services: String = (0..args.names)
        .map(|i| format!("apiVersion: v1\nkind: Service\nmetadata: {{name: svc{i}, namespace: default}}\nspec:\n  ports: [{{name: http, port: 80}}]\n---\n"))
        .collect();
    k8s.cp.apply(&services)?;
    let last = format!("svc{}.default.svc.cluster.local", args.names - 1);
    wait_for("the cluster zone to load", Duration::from_secs(30), || {
        Ok(testbed::probe::dig(node, OURS, &last, "A")
            .ok()
            .filter(|a| !a.is_empty())
            .map(|_| ()))
    })?;

    // The peers, on the same node, forwarding to the same upstream.
    link::addr(node, "lo", &format!("{UNBOUND}/32"))?;
    link::addr(node, "lo", &format!("{DNSMASQ}/32"))?;
    let unbound_conf = dir.path().join("unbound.conf");
    std::fs::write(
        &unbound_conf,
        format!(
            "server:\n  interface: {UNBOUND}\n  port: 53\n  access-control: 0.0.0.0/0 allow\n  do-daemonize: no\n  \
             chroot: \"\"\n  username: \"\"\n  pidfile: \"\"\n  use-syslog: no\n  num-threads: 2\n  so-reuseport: yes\n  \
             module-config: \"iterator\"\n  do-not-query-localhost: no\n  msg-cache-size: 64m\n  rrset-cache-size: 128m\n  \
             verbosity: 0\n  local-zone: \"test.\" nodefault\nforward-zone:\n  name: \".\"\n  forward-addr: {HOST_SERVICE_ADDR}\n"
        ),
    )?;
    let mut ub = node.command("unbound");
    ub.arg("-d").arg("-c").arg(&unbound_conf);
    let _unbound = Spawned::start_logged(ub, "unbound", &dir.path().join("unbound.log"))?;
    let dnsmasq_server = format!("--server={HOST_SERVICE_ADDR}");
    let _dnsmasq = testbed::resolver::dnsmasq(
        node,
        DNSMASQ.parse()?,
        &[&dnsmasq_server, "--cache-size=10000"],
    )?;
    for server in [UNBOUND, DNSMASQ] {
        wait_for(
            &format!("{server} to answer"),
            Duration::from_secs(10),
            || {
                Ok(testbed::probe::dig(node, server, "warm.bench.test", "A")
                    .ok()
                    .filter(|a| !a.is_empty())
                    .map(|_| ()))
            },
        )?;
    }

    let external = dir.path().join("external.txt");
    std::fs::write(
        &external,
        (0..args.names)
            .map(|i| format!("name{i}.bench.test A\n"))
            .collect::<String>(),
    )?;
    let cluster = dir.path().join("cluster.txt");
    std::fs::write(
        &cluster,
        (0..args.names)
            .map(|i| match i % 4 {
                0 | 1 => format!("svc{i}.default.svc.cluster.local A\n"),
                2 => format!("_http._tcp.svc{i}.default.svc.cluster.local SRV\n"),
                _ => format!("missing{i}.default.svc.cluster.local A\n"),
            })
            .collect::<String>(),
    )?;

    let mut results = Vec::new();
    for (name, server) in [("ours", OURS), ("unbound", UNBOUND), ("dnsmasq", DNSMASQ)] {
        dnsperf(node, server, &external, 2, None)?; // warm the cache: the mix is cached names
        let r = dnsperf(node, server, &external, args.seconds, None)?;
        let at = dnsperf(node, server, &external, args.seconds, Some(args.rate))?;
        eprintln!(
            "bench: {name} external: {r:?}, at {} qps: {at:?}",
            args.rate
        );
        results.push((name, r, at));
    }
    let ours_cluster = dnsperf(node, OURS, &cluster, args.seconds, None)?;
    let ours_cluster_at = dnsperf(node, OURS, &cluster, args.seconds, Some(args.rate))?;

    let rate = args.rate;
    for (name, r, at) in &results {
        println!("{name}_external_qps={:.0}", r.qps);
        println!("{name}_external_lost={}", r.lost);
        println!("{name}_external_p99_ms={:.3}", r.p99_ms);
        println!("{name}_external_p99_at_{rate}_qps_ms={:.3}", at.p99_ms);
        println!("{name}_external_lost_at_{rate}_qps={}", at.lost);
    }
    println!("ours_cluster_qps={:.0}", ours_cluster.qps);
    println!("ours_cluster_lost={}", ours_cluster.lost);
    println!("ours_cluster_p99_ms={:.3}", ours_cluster.p99_ms);
    println!(
        "ours_cluster_p99_at_{rate}_qps_ms={:.3}",
        ours_cluster_at.p99_ms
    );
    println!("ours_cluster_lost_at_{rate}_qps={}", ours_cluster_at.lost);
    let ours = &results[0].1;
    let best = results[1..]
        .iter()
        .map(|(_, r, _)| r.qps)
        .fold(0.0, f64::max);
    println!(
        "ratio_ours_vs_unbound_qps={:.3}",
        ours.qps / results[1].1.qps
    );
    println!(
        "ratio_ours_vs_dnsmasq_qps={:.3}",
        ours.qps / results[2].1.qps
    );
    println!("ratio_ours_vs_best_peer_qps={:.3}", ours.qps / best);
    let stats = k8s.node(1).cli(&["dns", "stats", "--json"])?;
    eprintln!("bench: ours stats {stats}");
    drop(k8s);
    Ok(())
}
