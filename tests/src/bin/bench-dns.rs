//! Node-local DNS against two peers -- unbound and dnsmasq, each a forwarding cache to the same
//! upstream on the same node -- in one run, in interleaved rounds: throughput (dnsperf at
//! saturation) and losses for a cached external-name mix, latency percentiles at fixed rates
//! (our own open-loop driver, `load`), ours alone for cluster names, and how soon a new
//! Service resolves and the server answers after a flood of junk. Every server gets the same
//! socket receive buffer, checked on the sockets themselves. Run by `bench/dns`; prints
//! `name=value` lines, medians with their spread (min and max over the rounds).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use testbed::k8s::{Cluster, wait_for};
use testbed::process::Spawned;
use testbed::stats::show;
use testbed::tmp::TempDir;
use testbed::topology::HOST_SERVICE_ADDR;
use testbed::{Netns, Reach, Topology, link};

#[path = "bench-dns/load.rs"]
mod load;

/// Node-local DNS against unbound and dnsmasq.
#[derive(Debug, Parser)]
struct Args {
    /// Seconds of load per measurement.
    #[arg(long, default_value_t = 5)]
    seconds: u32,
    /// Distinct names in each query mix.
    #[arg(long, default_value_t = 200)]
    names: usize,
    /// Interleaved rounds (each server measured once per round, the order rotating).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(5..))]
    rounds: u32,
    /// Fixed query rates of the latency runs, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [10_000u32, 50_000, 100_000])]
    rates: Vec<u32>,
}

const OURS: &str = "169.254.20.10";
const UNBOUND: &str = "169.254.20.11";
const DNSMASQ: &str = "169.254.20.12";
const SERVERS: [(&str, &str); 3] = [("ours", OURS), ("unbound", UNBOUND), ("dnsmasq", DNSMASQ)];

/// Every server's UDP sockets keep the kernel's default receive buffer: dnsmasq has no option
/// to change it and `net.core.rmem_default` cannot be set in a network namespace, so ours
/// runs with `--dns-rcvbuf 0` (bench/dns exports SOCIALWEB_DNS_RCVBUF=0; the agent asks for
/// 4 MiB otherwise) and unbound with `so-rcvbuf: 0`. Checked on the sockets themselves.
const ENV_RCVBUF: &str = "SOCIALWEB_DNS_RCVBUF";

/// One dnsperf run at saturation (200 queries outstanding), without per-query output.
fn dnsperf(ns: &Netns, server: &str, queries: &Path, seconds: u32) -> Result<(f64, u64)> {
    let out = ns.output(
        "dnsperf",
        &[
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
        ],
    )?;
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
    Ok((
        field("Queries per second:")?.parse()?,
        field("Queries lost:")?.parse()?,
    ))
}

/// Every round's value of each figure, by name.
#[derive(Debug, Default)]
struct Figures(BTreeMap<String, Vec<f64>>);

impl Figures {
    /// Adds a round's value (none: nothing measured this round).
    fn add(&mut self, name: impl Into<String>, v: impl Into<Option<f64>>) {
        let values = self.0.entry(name.into()).or_default();
        values.extend(v.into());
    }

    /// The median over rounds (`testbed::stats`).
    fn median(&self, name: &str) -> Option<f64> {
        testbed::stats::median(&mut self.0.get(name).cloned().unwrap_or_default())
    }

    fn sum(&self, name: &str) -> f64 {
        self.0.get(name).map(|v| v.iter().sum()).unwrap_or(f64::NAN)
    }

    /// `<name>_median`, `_min`, `_max`, with `decimals` (`none` without a value).
    fn print(&self, name: &str, decimals: usize) {
        let s = testbed::stats::summary(&mut self.0.get(name).cloned().unwrap_or_default());
        println!("{name}_median={}", show(s.map(|s| s.p50), decimals));
        println!("{name}_min={}", show(s.map(|s| s.min), decimals));
        println!("{name}_max={}", show(s.map(|s| s.max), decimals));
    }
}

/// `a / b` with three decimals, `none` when either is missing.
fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    show(a.zip(b).map(|(a, b)| a / b), 3)
}

/// `10000` -> `10k`.
fn rate_label(rate: u32) -> String {
    if rate.is_multiple_of(1000) {
        format!("{}k", rate / 1000)
    } else {
        rate.to_string()
    }
}

/// The receive buffer (skmem `rb`) of every UDP socket bound to `addr:53` in `ns`.
fn rcvbufs(ns: &Netns, addr: &str) -> Result<Vec<u64>> {
    let out = ns.exec("ss", &["-u", "-a", "-n", "-m", "-H"])?;
    let mut found = Vec::new();
    let mut lines = out.lines();
    while let Some(line) = lines.next() {
        if !line.split_whitespace().any(|w| w == format!("{addr}:53")) {
            continue;
        }
        // ss prints skmem on the same line or the next.
        let mem = if line.contains("skmem:") {
            line.to_string()
        } else {
            lines.next().unwrap_or_default().to_string()
        };
        let rb = mem
            .split("rb")
            .nth(1)
            .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("no rb in {mem:?}"))?;
        found.push(rb);
    }
    if found.is_empty() {
        bail!("no UDP socket on {addr}:53: {out}");
    }
    Ok(found)
}

/// The answer's RCODE and answer count for a DNS query sent from `sock`, if one came.
fn ask(sock: &UdpSocket, server: SocketAddr, name: &str, id: u16) -> Option<(u8, u16)> {
    let mut q = load::query(name, 1);
    q[..2].copy_from_slice(&id.to_be_bytes());
    sock.send_to(&q, server).ok()?;
    let mut buf = [0u8; 1500];
    loop {
        let (n, _) = sock.recv_from(&mut buf).ok()?;
        if n >= 12 && buf[..2] == id.to_be_bytes() {
            return Some((buf[3] & 0x0f, u16::from_be_bytes([buf[6], buf[7]])));
        }
    }
}

/// Milliseconds from `kubectl apply` returning to the new Service's name resolving, asked
/// every 2 ms from the node.
fn new_service_ms(k8s: &Cluster<'_>, node: &Netns, name: &str) -> Result<f64> {
    k8s.cp.apply(&format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  ports: [{{port: 80}}]\n"
    ))?;
    let applied = Instant::now();
    let fqdn = format!("{name}.default.svc.cluster.local");
    node.run(move || -> Result<f64> {
        let sock = UdpSocket::bind("0.0.0.0:0")?;
        sock.set_read_timeout(Some(Duration::from_millis(200)))?;
        let server: SocketAddr = format!("{OURS}:53").parse()?;
        for id in 0u16.. {
            if matches!(ask(&sock, server, &fqdn, id), Some((0, n)) if n > 0) {
                return Ok(applied.elapsed().as_secs_f64() * 1e3);
            }
            if applied.elapsed() > Duration::from_secs(30) {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        bail!("{fqdn} did not resolve within 30 s")
    })?
}

/// Milliseconds from the end of a flood of junk (random datagrams and truncated queries, as
/// tests/tests/dns.rs sends) to a well-formed query answered.
fn after_flood_ms(node: &Netns, round: u32) -> Result<f64> {
    node.run(move || -> Result<f64> {
        let sock = UdpSocket::bind("0.0.0.0:0")?;
        sock.set_read_timeout(Some(Duration::from_millis(200)))?;
        let server: SocketAddr = format!("{OURS}:53").parse()?;
        let query = load::query("dns-version.cluster.local", 16);
        let mut rng = 0x2545_F491_4F6C_DD1Du64 ^ u64::from(round);
        for i in 0..2000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let junk: Vec<u8> = (0..(rng % 600) as usize)
                .map(|j| (rng >> (j % 56)) as u8)
                .collect();
            sock.send_to(&junk, server)?;
            sock.send_to(&query[..(i % query.len())], server)?;
        }
        let flooded = Instant::now();
        let drain = UdpSocket::bind("0.0.0.0:0")?; // FORMERR answers go to `sock`
        drain.set_read_timeout(Some(Duration::from_millis(200)))?;
        for id in 1u16.. {
            if matches!(
                ask(&drain, server, "dns-version.cluster.local", id),
                Some((0, _))
            ) {
                return Ok(flooded.elapsed().as_secs_f64() * 1e3);
            }
            if flooded.elapsed() > Duration::from_secs(30) {
                break;
            }
        }
        bail!("no answer within 30 s of the flood")
    })?
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

    if std::env::var(ENV_RCVBUF).as_deref() != Ok("0") {
        bail!("run through bench/dns, which sets {ENV_RCVBUF}=0 for the agents it starts");
    }

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
             so-rcvbuf: 0\n  module-config: \"iterator\"\n  do-not-query-localhost: no\n  msg-cache-size: 64m\n  \
             rrset-cache-size: 128m\n  verbosity: 0\n  local-zone: \"test.\" nodefault\nforward-zone:\n  name: \".\"\n  \
             forward-addr: {HOST_SERVICE_ADDR}\n"
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
    let mut buffers = BTreeSet::new();
    for (name, addr) in SERVERS {
        let bufs = rcvbufs(node, addr)?;
        buffers.extend(bufs.iter().copied());
        println!("{name}_udp_sockets={}", bufs.len());
        println!("{name}_rcvbuf_bytes={}", bufs[0]);
    }
    if buffers.len() != 1 {
        bail!(
            "the servers' receive buffers differ ({buffers:?}): the comparison would not be fair"
        );
    }

    let names: Vec<String> = (0..args.names)
        .map(|i| format!("name{i}.bench.test"))
        .collect();
    let external = dir.path().join("external.txt");
    std::fs::write(
        &external,
        names.iter().map(|n| format!("{n} A\n")).collect::<String>(),
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
    let wire: Vec<Vec<u8>> = names.iter().map(|n| load::query(n, 1)).collect();

    // Warm every cache: the mix is cached names.
    for (_, addr) in SERVERS {
        dnsperf(node, addr, &external, 2)?;
    }

    let mut f = Figures::default();
    for round in 0..args.rounds {
        let order: Vec<(&str, &str)> = (0..SERVERS.len())
            .map(|i| SERVERS[(i + round as usize) % SERVERS.len()])
            .collect();
        for (name, addr) in &order {
            let (qps, lost) = dnsperf(node, addr, &external, args.seconds)?;
            f.add(format!("{name}_qps"), qps);
            f.add(format!("{name}_lost"), lost as f64);
        }
        let (qps, lost) = dnsperf(node, OURS, &cluster, args.seconds)?;
        f.add("cluster_qps", qps);
        f.add("cluster_lost", lost as f64);
        for &rate in &args.rates {
            for (name, addr) in &order {
                let server: SocketAddr = format!("{addr}:53").parse()?;
                let wire = wire.clone();
                let seconds = Duration::from_secs(u64::from(args.seconds));
                let l = node.run(move || load::run(server, &wire, rate, seconds))??;
                let r = rate_label(rate);
                f.add(format!("{name}_p50_ms_at_{r}"), l.quantile_ms(0.50));
                f.add(format!("{name}_p99_ms_at_{r}"), l.quantile_ms(0.99));
                f.add(format!("{name}_p999_ms_at_{r}"), l.quantile_ms(0.999));
                f.add(format!("{name}_lost_at_{r}"), l.lost() as f64);
                f.add(format!("{name}_achieved_qps_at_{r}"), l.achieved_qps);
            }
        }
        f.add(
            "new_service_resolves_ms",
            new_service_ms(&k8s, node, &format!("fresh{round}"))?,
        );
        f.add("answer_after_flood_ms", after_flood_ms(node, round)?);
        eprintln!("bench: round {} of {} done", round + 1, args.rounds);
    }

    println!("rounds={}", args.rounds);
    println!("seconds_per_measurement={}", args.seconds);
    for (name, _) in SERVERS {
        f.print(&format!("{name}_qps"), 0);
        println!("{name}_lost_total={}", f.sum(&format!("{name}_lost")));
    }
    f.print("cluster_qps", 0);
    println!("cluster_lost_total={}", f.sum("cluster_lost"));
    for &rate in &args.rates {
        let r = rate_label(rate);
        for (name, _) in SERVERS {
            for q in ["p50", "p99", "p999"] {
                f.print(&format!("{name}_{q}_ms_at_{r}"), 3);
            }
            println!(
                "{name}_lost_at_{r}_total={}",
                f.sum(&format!("{name}_lost_at_{r}"))
            );
            f.print(&format!("{name}_achieved_qps_at_{r}"), 0);
        }
    }
    f.print("new_service_resolves_ms", 1);
    f.print("answer_after_flood_ms", 1);

    // The headline figures, last.
    let best_peer = f
        .median("unbound_qps")
        .into_iter()
        .chain(f.median("dnsmasq_qps"))
        .reduce(f64::max);
    if args.rates.contains(&50_000) {
        for (name, _) in SERVERS {
            let p99 = f.median(&format!("{name}_p99_ms_at_50k"));
            println!("{name}_p99_ms_at_50k={}", show(p99, 3));
        }
    }
    println!("cluster_qps={}", show(f.median("cluster_qps"), 0));
    println!("ours_lost={}", f.sum("ours_lost"));
    println!(
        "ratio_ours_vs_unbound={}",
        ratio(f.median("ours_qps"), f.median("unbound_qps"))
    );
    println!(
        "ratio_ours_vs_dnsmasq={}",
        ratio(f.median("ours_qps"), f.median("dnsmasq_qps"))
    );
    println!("ratio={}", ratio(f.median("ours_qps"), best_peer));
    let stats = k8s.node(1).cli(&["dns", "stats", "--json"])?;
    eprintln!("bench: ours stats {stats}");
    drop(k8s);
    Ok(())
}
