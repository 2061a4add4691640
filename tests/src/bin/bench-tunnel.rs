//! `bench/tunnel`: what the way between nodes and their control plane costs (docs/tunnel.md),
//! against a direct connection, on the real topology (one provider machine, its nodes behind
//! NAT).
//!
//! The peer is the same cluster reached without the tunnel: the bench (never the product)
//! adds a "host link", a veth from the operator's host straight into one node's namespace,
//! and a second apiserver of the cluster (the same etcd, the same flags, but no egress
//! selector, bound where the node can reach it over that link). Then rounds, interleaved
//! (tunnel, direct, tunnel, ...):
//!
//! - `kubectl exec <pod> -- true`, wall time, through each apiserver (the apiserver reaches
//!   the kubelet through the broker's tunnel, or over the host link);
//! - `kubectl logs` of a Pod that wrote a fixed amount of log, throughput;
//! - apiserver to kubelet connect: a CONNECT on the cluster's egress socket answered 200
//!   (broker, tunnel, the node dialling the kubelet), or a TCP connect over the host link;
//! - node to apiserver: `GET /readyz` from inside the node on one kept-alive HTTP/2
//!   connection, to the node-local 169.254.20.11 (through the tunnel), or over the host link.
//!
//! And, once per new node, the gap from a Pod running on a node that just joined to its first
//! answered ping to a Pod on another node (the mesh gates scheduling on live paths).

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use testbed::broker::{Broker, BrokerOptions};
use testbed::k8s::wait_for;
use testbed::netns::Netns;
use testbed::stats::{median, percentile, show, spread};
use testbed::world::World;

#[derive(Debug, Parser)]
#[command(about = "The tunnel against a direct connection: exec, logs, connect, node to apiserver")]
struct Args {
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u8).range(1..=50))]
    rounds: u8,
    /// Operations of each kind per round and side.
    #[arg(long, default_value_t = 20)]
    per_round: usize,
    /// MiB of log the log Pod writes. At most 8: the kubelet rotates a container's log at
    /// 10 MiB (its default containerLogMaxSize, with the CRI's prefix on every line), and
    /// `kubectl logs` reads only the current file.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=8))]
    log_mib: u32,
    /// Fresh nodes for the Running-to-first-answer gap.
    #[arg(long, default_value_t = 3)]
    fresh_nodes: u32,
}

const HOST_LINK: (&str, &str) = ("192.168.250.1", "192.168.250.2");
const DIRECT_PORT: u16 = 17999;

fn pods(log_mib: u32) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: echo, namespace: default, labels: {{bench: tunnel}}}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: socialweb.local/busybox:1
    imagePullPolicy: Never
    command: ["sh", "-c", "dd if=/dev/zero bs=1048576 count={log_mib} 2>/dev/null | tr '\\0' 'x' | fold -w 1023; sleep 100000"]
    resources: {{requests: {{cpu: 100m, memory: 32Mi}}}}
"#
    )
}

fn fresh(i: u32, target: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: fresh-{i}, namespace: default, labels: {{bench: fresh}}}}
spec:
  terminationGracePeriodSeconds: 1
  restartPolicy: Never
  affinity:
    podAntiAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
      - topologyKey: kubernetes.io/hostname
        labelSelector: {{matchExpressions: [{{key: bench, operator: Exists}}]}}
  containers:
  - name: c
    image: socialweb.local/busybox:1
    imagePullPolicy: Never
    command: ["ping", "-i", "0.01", "-c", "300", "-W", "1", "{target}"]
"#
    )
}

/// Per-round medians of one measure, both sides.
#[derive(Default)]
struct Side {
    all: Vec<f64>,
    medians: Vec<f64>,
}

impl Side {
    fn add_round(&mut self, mut v: Vec<f64>) {
        self.medians.extend(median(&mut v));
        self.all.extend(v);
    }
}

struct Bench<'w> {
    b: Broker<'w>,
    kube: PathBuf,
    tunnel_kc: PathBuf,
    direct_kc: PathBuf,
    node: String,
    node_ns: String,
    node_ip: String,
    api_port: u16,
    egress: PathBuf,
}

/// `kubectl` with kubeconfig `kc`, on the operator's host.
fn kubectl(host: &Netns, kube: &Path, kc: &Path, args: &[&str]) -> Command {
    let mut c = host.command(&kube.to_string_lossy());
    c.arg("kubectl")
        .arg(format!("--kubeconfig={}", kc.display()))
        .args(args);
    c
}

/// One kubectl call's output, on the operator's host.
fn kubectl_out(host: &Netns, kube: &Path, kc: &Path, args: &[&str]) -> Result<String> {
    let out = kubectl(host, kube, kc, args).output()?;
    Ok(format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

/// One kubectl call on the operator's host (where the broker and its apiservers are), timed.
fn kubectl_time(host: &Netns, kube: &Path, kc: &Path, args: &[&str]) -> Result<(f64, usize)> {
    let t = Instant::now();
    let out = kubectl(host, kube, kc, args).output()?;
    let secs = t.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!(
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok((secs, out.stdout.len()))
}

impl Bench<'_> {
    fn exec_ms(&self, kc: &Path) -> Result<Vec<f64>> {
        (0..20)
            .map(|_| {
                Ok(
                    kubectl_time(self.b.host, &self.kube, kc, &["exec", "echo", "--", "true"])?.0
                        * 1e3,
                )
            })
            .collect()
    }

    fn logs_mbs(&self, kc: &Path) -> Result<Vec<f64>> {
        (0..3)
            .map(|_| {
                let (s, n) = kubectl_time(self.b.host, &self.kube, kc, &["logs", "echo"])?;
                if n < 1 << 20 {
                    let head = kubectl_out(self.b.host, &self.kube, kc, &["logs", "echo"])?;
                    bail!(
                        "the echo Pod's log is {n} bytes, not MiBs: {}",
                        head.chars().take(300).collect::<String>()
                    );
                }
                Ok(n as f64 / s / 1e6)
            })
            .collect()
    }

    /// A CONNECT on the egress socket to the kubelet, until its 200.
    fn connect_tunnel_ms(&self, n: usize) -> Result<Vec<f64>> {
        let mut out = Vec::new();
        for _ in 0..n {
            let t = Instant::now();
            let mut s = std::os::unix::net::UnixStream::connect(&self.egress)?;
            write!(
                s,
                "CONNECT {}:10250 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
                self.node_ip
            )?;
            let mut line = String::new();
            BufReader::new(&s).read_line(&mut line)?;
            if !line.starts_with("HTTP/1.1 200") {
                bail!("CONNECT: {line}");
            }
            out.push(t.elapsed().as_secs_f64() * 1e3);
        }
        Ok(out)
    }

    fn connect_direct_ms(&self, n: usize) -> Result<Vec<f64>> {
        let addr: std::net::SocketAddr = format!("{}:10250", self.node_ip).parse()?;
        self.b.host.run(|| {
            (0..n)
                .map(|_| {
                    let t = Instant::now();
                    let s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
                    drop(s);
                    Ok(t.elapsed().as_secs_f64() * 1e3)
                })
                .collect::<Result<Vec<f64>>>()
        })?
    }

    /// `GET /readyz` from inside the node, on one kept-alive connection.
    fn api_ms(&self, url: &str, n: usize) -> Result<Vec<f64>> {
        let url = url.to_string();
        run_in(&self.node_ns, move || -> Result<Vec<f64>> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async {
                let c = reqwest::Client::builder()
                    .tls_danger_accept_invalid_certs(true)
                    .build()?;
                c.get(&url).send().await?.error_for_status()?;
                let mut v = Vec::new();
                for _ in 0..n {
                    let t = Instant::now();
                    c.get(&url)
                        .send()
                        .await?
                        .error_for_status()?
                        .bytes()
                        .await?;
                    v.push(t.elapsed().as_secs_f64() * 1e3);
                }
                Ok(v)
            })
        })?
    }
}

/// Runs `f` in the network namespace named `name` (a node's, which the provider made).
fn run_in<R: Send>(name: &str, f: impl FnOnce() -> R + Send) -> Result<R> {
    let file = std::fs::File::open(format!("/run/netns/{name}"))?;
    std::thread::scope(|s| {
        s.spawn(move || {
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                .map(|()| f())
                .map_err(|e| anyhow::anyhow!("setns into {name}: {e}"))
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the thread in {name} panicked"))?
    })
}

/// The host link (a veth from the operator's host into the node, and a route to the node's
/// address over it) and a second apiserver without the egress selector, reachable over it.
fn direct_peer(
    b: &Broker<'_>,
    node_ns: &str,
    node_ip: &str,
    kube: &Path,
) -> Result<(testbed::process::Spawned, PathBuf)> {
    let h = b.host;
    h.ip(&[
        "link", "add", "tbl0", "type", "veth", "peer", "name", "tbl1", "netns", node_ns,
    ])?;
    h.ip(&["addr", "add", &format!("{}/30", HOST_LINK.0), "dev", "tbl0"])?;
    h.ip(&["link", "set", "tbl0", "up"])?;
    let n = |args: &[&str]| -> Result<()> {
        let o = Command::new("ip")
            .arg("-n")
            .arg(node_ns)
            .args(args)
            .output()?;
        if !o.status.success() {
            bail!(
                "ip -n {node_ns} {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        Ok(())
    };
    n(&["addr", "add", &format!("{}/30", HOST_LINK.1), "dev", "tbl1"])?;
    n(&["link", "set", "tbl1", "up"])?;
    h.ip(&["route", "add", &format!("{node_ip}/32"), "via", HOST_LINK.1])?;
    let run = b.cluster_dir("tb").join("run");
    let pid: u32 = std::fs::read_to_string(run.join("apiserver.pid"))?
        .split_whitespace()
        .next()
        .context("pidfile")?
        .parse()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))?;
    let mut args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .skip(1)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .filter(|a| {
            !a.starts_with("--egress-selector-config-file")
                && !a.starts_with("--enable-aggregator-routing")
        })
        .map(|a| {
            if a.starts_with("--secure-port=") {
                format!("--secure-port={DIRECT_PORT}")
            } else if a.starts_with("--bind-address=") {
                "--bind-address=0.0.0.0".into()
            } else {
                a
            }
        })
        .collect();
    args.push("--endpoint-reconciler-type=none".into());
    let mut cmd = h.command(&kube.to_string_lossy());
    cmd.args(&args);
    let log = b.state.join("direct-apiserver.log");
    let second = testbed::process::Spawned::start_logged(cmd, "the direct apiserver", &log)?;
    let kc = b.state.join("direct.kubeconfig");
    let admin = std::fs::read_to_string(b.kubeconfig("tb"))?;
    let port = admin
        .split("https://127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .context("the admin kubeconfig's server")?
        .to_string();
    std::fs::write(
        &kc,
        admin.replace(
            &format!("127.0.0.1:{port}"),
            &format!("127.0.0.1:{DIRECT_PORT}"),
        ),
    )?;
    wait_for("the direct apiserver", Duration::from_secs(60), || {
        Ok(kubectl_time(h, kube, &kc, &["get", "--raw", "/readyz"])
            .is_ok()
            .then_some(()))
    })
    .with_context(|| {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(30).collect();
        format!(
            "{}:\n{}",
            log.display(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        )
    })?;
    Ok((second, kc))
}

fn report(name: &str, unit: &str, t: &Side, d: &Side, p99: bool) {
    let (mut ta, mut da) = (t.all.clone(), d.all.clone());
    let (tp, dp) = (percentile(&mut ta, 0.5), percentile(&mut da, 0.5));
    let range = |s: &Side| match spread(&s.medians) {
        Some((lo, hi)) => format!("{lo:.2}..{hi:.2}"),
        None => "none".into(),
    };
    println!("{name}_p50_{unit}_tunnel={}", show(tp, 2));
    println!("{name}_p50_{unit}_direct={}", show(dp, 2));
    if p99 {
        let (t99, d99) = (percentile(&mut ta, 0.99), percentile(&mut da, 0.99));
        println!("{name}_p99_{unit}_tunnel={}", show(t99, 2));
        println!("{name}_p99_{unit}_direct={}", show(d99, 2));
    }
    println!("{name}_round_medians_{unit}_tunnel={}", range(t));
    println!("{name}_round_medians_{unit}_direct={}", range(d));
    println!(
        "{name}_ratio_tunnel_over_direct={}",
        show(tp.zip(dp).map(|(t, d)| t / d), 2)
    );
}

fn main() -> Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let world = World::new(1)?;
    let b = Broker::start(
        &world,
        BrokerOptions {
            providers: 1,
            max_nodes: 2 + args.fresh_nodes,
            hold: Duration::from_secs(3600),
            ..Default::default()
        },
    )?;
    let kube = testbed::k8s::binaries()?.kube();
    b.cli(&["cluster", "create", "tb"])?;
    b.apply("tb", &pods(args.log_mib))?;
    wait_for("the echo pod Running", Duration::from_secs(180), || {
        let v = b.kubectl_json("tb", &["get", "pod", "echo"])?;
        Ok((v["status"]["phase"] == "Running").then_some(()))
    })
    .with_context(|| b.diagnostics())?;
    // The log written whole before any round reads it.
    std::thread::sleep(Duration::from_secs(5));
    let pod = b.kubectl_json("tb", &["get", "pod", "echo"])?;
    let node = pod["spec"]["nodeName"]
        .as_str()
        .context("nodeName")?
        .to_string();
    let nodes = b.kubectl_json("tb", &["get", "node", &node])?;
    let node_ip = nodes["status"]["addresses"]
        .as_array()
        .context("addresses")?
        .iter()
        .find(|a| a["type"] == "InternalIP")
        .and_then(|a| a["address"].as_str())
        .context("InternalIP")?
        .to_string();
    let node_ns = b.node_netns(&node)?;
    let admin = std::fs::read_to_string(b.kubeconfig("tb"))?;
    let api_port: u16 = admin
        .split("https://127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .context("the admin kubeconfig's server")?
        .parse()?;
    let (_second, direct_kc) = direct_peer(&b, &node_ns, &node_ip, &kube)?;
    let bench = Bench {
        kube,
        tunnel_kc: b.kubeconfig("tb"),
        direct_kc,
        node,
        node_ns,
        node_ip,
        api_port,
        egress: b.cluster_dir("tb").join("run/egress.sock"),
        b,
    };
    rounds(&bench, &args)?;
    gap(&bench, &args)?;
    Ok(())
}

fn rounds(bench: &Bench<'_>, args: &Args) -> Result<()> {
    let [
        mut et,
        mut ed,
        mut lt,
        mut ld,
        mut ct,
        mut cd,
        mut at,
        mut ad,
    ] = std::array::from_fn::<Side, 8, _>(|_| Side::default());
    let tunnel_api = format!("https://169.254.20.11:{}/readyz", bench.api_port);
    let direct_api = format!("https://{}:{DIRECT_PORT}/readyz", HOST_LINK.0);
    for r in 0..args.rounds {
        eprintln!("round {}/{} on {}", r + 1, args.rounds, bench.node);
        et.add_round(bench.exec_ms(&bench.tunnel_kc)?);
        ed.add_round(bench.exec_ms(&bench.direct_kc)?);
        lt.add_round(bench.logs_mbs(&bench.tunnel_kc)?);
        ld.add_round(bench.logs_mbs(&bench.direct_kc)?);
        ct.add_round(bench.connect_tunnel_ms(args.per_round)?);
        cd.add_round(bench.connect_direct_ms(args.per_round)?);
        at.add_round(bench.api_ms(&tunnel_api, args.per_round * 5)?);
        ad.add_round(bench.api_ms(&direct_api, args.per_round * 5)?);
    }
    println!("rounds={}", args.rounds);
    report("exec_rtt", "ms", &et, &ed, true);
    report("logs", "mbyte_s", &lt, &ld, false);
    report("kubelet_connect", "ms", &ct, &cd, false);
    report("node_api_request", "ms", &at, &ad, false);
    Ok(())
}

/// Fresh nodes, one at a time: a Pod placed on a node that just joined pings the echo Pod
/// on another node every 10 ms from its start; the first answered sequence number is the gap.
fn gap(bench: &Bench<'_>, args: &Args) -> Result<()> {
    let b = &bench.b;
    let target = b.kubectl_json("tb", &["get", "pod", "echo"])?["status"]["podIP"]
        .as_str()
        .context("podIP")?
        .to_string();
    let mut gaps = Vec::new();
    for i in 1..=args.fresh_nodes {
        b.apply("tb", &fresh(i, &target))?;
        let name = format!("fresh-{i}");
        wait_for("the fresh pod to finish", Duration::from_secs(240), || {
            let v = b.kubectl_json("tb", &["get", "pod", &name])?;
            Ok(matches!(v["status"]["phase"].as_str(), Some("Succeeded" | "Failed")).then_some(()))
        })
        .with_context(|| b.diagnostics())?;
        let mut log = String::new();
        let out = b.kubectl("tb", &["logs", &name])?;
        out.as_bytes().read_to_string(&mut log)?;
        let first = log
            .lines()
            .find_map(|l| {
                l.split("seq=")
                    .nth(1)?
                    .split_whitespace()
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .context("no ping was answered")?;
        // Sequence n is sent n * 10 ms after the Pod starts: 0 is "under 10 ms".
        let ms = first as f64 * 10.0;
        println!("running_to_first_answer_ms_node{i}={ms:.0}");
        gaps.push(ms);
    }
    if let Some(p50) = median(&mut gaps) {
        println!("running_to_first_answer_p50_ms={p50:.0}");
    }
    Ok(())
}
