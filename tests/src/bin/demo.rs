//! `socialweb-demo` (`./x demo`): a local socialweb cluster on this machine.
//!
//! A host namespace plays the operator's host (control plane, relay); node namespaces play
//! rented guests that can reach the host and nothing else. Each node gets an identity
//! document and runs `socialweb-agent`, which joins by itself (containerd, the kubelet,
//! kube-proxy); pods on different nodes talk through the mesh.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use testbed::k8s::{Cluster, run_pod};
use testbed::topology::HOST_SERVICE_ADDR;
use testbed::{Reach, Topology};

/// A local socialweb cluster: a control plane, nodes with kubelets and node agents, pods on
/// every node talking across the mesh.
#[derive(Debug, Parser)]
#[command(version, about, long_about)]
struct Args {
    /// How many nodes.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(2..=8))]
    nodes: u8,
    /// Let nodes reach each other directly (default: only the host, so traffic goes through
    /// the relay, as between guests behind user-mode NAT).
    #[arg(long)]
    direct: bool,
    /// Keep the cluster up until Ctrl-C, to look around (`ip netns list`, the printed
    /// kubeconfig, `socialweb-agent mesh status --ctl-socket ...`).
    #[arg(long)]
    hold: bool,
}

/// Retries a flaky first attempt (a fresh Service's endpoints take a moment).
fn wait_for_ok(mut f: impl FnMut() -> Result<String>) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    }
}

fn step(started: Instant, what: &str) {
    println!("\n== [{:>5.1}s] {what}", started.elapsed().as_secs_f64());
}

fn main() -> Result<()> {
    let args = Args::parse();
    let t = Instant::now();
    let reach = if args.direct {
        Reach::Direct
    } else {
        Reach::HostOnly
    };

    step(
        t,
        &format!(
            "a host and {} nodes (network namespaces); nodes reach {}",
            args.nodes,
            if args.direct {
                "each other directly"
            } else {
                "only the host"
            }
        ),
    );
    let topo = Topology::new(args.nodes, reach)?;
    println!(
        "host    {}  (services on {HOST_SERVICE_ADDR})",
        topo.host.name()
    );
    for n in &topo.nodes {
        println!("node-{}  {}  address {}", n.index, n.ns.name(), n.addr);
    }

    step(
        t,
        &format!(
            "an upstream DNS resolver on the host ({HOST_SERVICE_ADDR}: dnsmasq, answering example.test)"
        ),
    );
    let _upstream = testbed::resolver::dnsmasq(
        &topo.host,
        HOST_SERVICE_ADDR,
        &[
            "--address=/example.test/192.0.2.10",
            "--address=/example.test/2001:db8::10",
        ],
    )?;

    step(
        t,
        "control plane and mesh relay on the host; on every node only an identity document and socialweb-agent",
    );
    let c = Cluster::start(&topo, |_| {})?;
    let cp = &c.cp;
    println!("apiserver {}  (zero nodes: {:?})", cp.url, cp.node_names()?);
    println!("admin kubeconfig {}", cp.admin_kubeconfig.display());

    step(
        t,
        "each agent joins by itself: containerd, the kubelet (TLS bootstrap), the Node, cni0, the mesh, kube-proxy",
    );
    c.wait_ready(Duration::from_secs(180))
        .with_context(|| c.diagnostics())?;
    print!("{}", cp.kubectl(&["get", "nodes", "-o", "custom-columns=NODE:.metadata.name,READY:.status.conditions[-1].status,POD-CIDR:.spec.podCIDR,ADDRESS:.status.addresses[0].address"])?);
    print!("{}", c.node(1).cli(&["status"])?);

    step(t, "a web server pod on every node");
    let mut ips = Vec::new();
    for i in 1..=args.nodes {
        let name = format!("web-{i}");
        let ip = run_pod(
            cp,
            &name,
            &format!("node-{i}"),
            &[
                "sh",
                "-c",
                "mkdir -p /www && echo \"hello from $(hostname) on $NODE_NAME\" > /www/index.html && httpd -f -p 8080 -h /www",
            ],
        )?;
        // A headless Service per pod, so `web-N` resolves to the pod's address.
        cp.apply(&format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  clusterIP: None\n  selector: {{app: {name}}}\n  ports: [{{name: http, port: 8080}}]\n"
        ))?;
        ips.push((name, ip));
    }
    print!("{}", cp.kubectl(&["get", "pods", "-o", "wide"])?);

    step(t, "pod to pod across nodes (kubectl exec: ping, then HTTP)");
    for (i, (from, _)) in ips.iter().enumerate() {
        let (to, ip) = &ips[(i + 1) % ips.len()];
        let ping = cp
            .kubectl(&["exec", from, "--", "ping", "-c", "2", "-W", "2", ip])
            .with_context(|| c.diagnostics())?;
        let summary = ping
            .lines()
            .find(|l| l.contains("packets transmitted"))
            .unwrap_or("")
            .trim();
        // By address: Debian's busybox-static is glibc built statically, whose resolver
        // crashes (no NSS in a static binary); names are shown with nslookup below.
        let url = format!("http://{ip}:8080/");
        let page = wait_for_ok(|| cp.kubectl(&["exec", from, "--", "wget", "-qO-", &url]))?;
        println!(
            "{from} -> {to} ({ip}): {summary}; GET {url} says {:?}",
            page.trim()
        );
    }

    step(
        t,
        "names through each node's own DNS at 169.254.20.10: a cluster name, an external one",
    );
    let first = &ips[0].0;
    print!(
        "{}",
        cp.kubectl(&["exec", first, "--", "cat", "/etc/resolv.conf"])?
    );
    for name in ["web-2.default.svc.cluster.local", "example.test"] {
        let out = cp.kubectl(&["exec", first, "--", "nslookup", name])?;
        let answer: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with("Address") && !l.contains("#53"))
            .map(str::trim)
            .collect();
        println!("{first}: nslookup {name} -> {}", answer.join(" "));
    }
    print!("{}", c.node(1).cli(&["dns", "stats"])?);

    step(t, "socialweb-agent mesh status, on node-1");
    print!("{}", c.node(1).cli(&["mesh", "status"])?);

    if args.hold {
        step(t, "holding; Ctrl-C tears everything down");
        println!(
            "kubectl:      {} kubectl --kubeconfig {} get pods -o wide",
            cp.bins.kube().display(),
            cp.admin_kubeconfig.display()
        );
        println!(
            "              (run it inside the host namespace: ip netns exec {} ...)",
            topo.host.name()
        );
        for n in &c.nodes {
            println!(
                "agent:        socialweb-agent status --ctl-socket {}   (also: mesh status, dns stats)",
                n.ctl.display()
            );
        }
        let mut signals = nix::sys::signal::SigSet::empty();
        signals.add(nix::sys::signal::Signal::SIGINT);
        signals.add(nix::sys::signal::Signal::SIGTERM);
        signals.thread_block()?;
        signals.wait()?;
    }

    step(t, "tearing down");
    drop(c);
    Ok(())
}
