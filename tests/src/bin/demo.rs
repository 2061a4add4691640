//! `socialweb-demo` (`./x demo`): the product on this machine, end to end.
//!
//! Network namespaces play the operator's host and two provider machines on an "internet"
//! (with a public resolver on it). On the host runs `socialweb-broker run`; on each provider
//! machine `socialweb-broker provider`, whose nodes sit behind NAT inside it. Everything after
//! that is what an operator and a user do: a cluster created with `socialweb-broker cluster
//! create` (zero nodes), a workload applied with kubectl, nodes rented from both providers,
//! booted and joined by themselves through the broker's public endpoints alone, pods reaching
//! each other across providers and resolving names, the workload deleted and the cluster back
//! at zero.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use testbed::broker::{Broker, BrokerOptions};
use testbed::k8s::wait_for;
use testbed::world::World;

/// A local socialweb cluster, from zero nodes to a few and back.
#[derive(Debug, Parser)]
#[command(version, about, long_about)]
struct Args {
    /// How many pods (one per node, so as many nodes).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(2..=8))]
    nodes: u32,
    /// Keep the cluster up with its pods until Ctrl-C, to look around, before it goes back
    /// to zero.
    #[arg(long)]
    hold: bool,
    /// The scale hold: how long the cluster idles before it returns to zero.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    scale_hold: Duration,
}

fn step(t: Instant, what: &str) {
    println!("\n== [{:>5.1}s] {what}", t.elapsed().as_secs_f64());
}

fn web(i: u32) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: web-{i}, namespace: default, labels: {{app: web, instance: web-{i}}}}}
spec:
  terminationGracePeriodSeconds: 1
  affinity:
    podAntiAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
      - topologyKey: kubernetes.io/hostname
        labelSelector: {{matchLabels: {{app: web}}}}
  containers:
  - name: web
    image: socialweb.local/busybox:1
    imagePullPolicy: Never
    command: ["sh", "-c", "mkdir -p /www && echo \"hello from $(hostname) on $NODE_NAME\" > /www/index.html && httpd -f -p 8080 -h /www"]
    env: [{{name: NODE_NAME, valueFrom: {{fieldRef: {{fieldPath: spec.nodeName}}}}}}]
    resources: {{requests: {{cpu: 100m, memory: 32Mi}}}}
---
apiVersion: v1
kind: Service
metadata: {{name: web-{i}, namespace: default}}
spec:
  selector: {{instance: web-{i}}}
  ports: [{{name: http, port: 80, targetPort: 8080}}]
"#
    )
}

fn main() -> Result<()> {
    let args = Args::parse();
    let t = Instant::now();
    let n = args.nodes;

    step(
        t,
        "the operator's host and two provider machines on an internet (network namespaces), a resolver on it answering example.test",
    );
    let world = World::new(2)?;
    let host = &world.operator;
    println!(
        "operator {}, providers {}",
        host.name(),
        world
            .providers
            .iter()
            .map(|p| format!("{} ({})", p.ns.name(), p.addr))
            .collect::<Vec<_>>()
            .join(", ")
    );

    step(
        t,
        "socialweb-broker run on the operator's host: store, relay, tunnel, metrics; socialweb-broker provider on each provider machine",
    );
    let b = Broker::start(
        &world,
        BrokerOptions {
            max_nodes: n,
            pods_per_node: 1,
            hold: args.scale_hold,
            providers: 2,
            // The nodes spread over both providers.
            provider_capacity: n.div_ceil(2),
            ..Default::default()
        },
    )?;
    println!("config {}", b.config.display());
    print!(
        "{}",
        std::fs::read_to_string(&b.config)?
            .lines()
            .take(3)
            .map(|l| format!("  {l}\n"))
            .collect::<String>()
    );

    step(t, "socialweb-broker cluster create demo");
    print!("{}", b.cli(&["cluster", "create", "demo"])?);
    println!(
        "nodes: {}",
        b.kubectl("demo", &["get", "nodes"])?
            .trim()
            .lines()
            .count()
            .saturating_sub(1)
    );

    step(
        t,
        &format!("kubectl apply: {n} web pods, one per node (anti-affinity), a Service each"),
    );
    let manifest: String = (1..=n).map(|i| format!("{}---\n", web(i))).collect();
    b.apply("demo", &manifest)?;
    let reason = b.wait_decision("demo", "Provision", i64::from(n), Duration::from_secs(30))?;
    println!(
        "scale decision: Provision nodes={n}: {}",
        reason.trim_start_matches("Provision: ")
    );

    step(
        t,
        "nodes rented from both providers, booting behind NAT and joining through the broker's public endpoints",
    );
    let mut seen = 0;
    wait_for("every node Ready", Duration::from_secs(300), || {
        let ready = b.ready_nodes("demo")?;
        if ready.len() > seen {
            seen = ready.len();
            println!(
                "[{:>5.1}s] Ready: {}",
                t.elapsed().as_secs_f64(),
                ready.join(" ")
            );
        }
        Ok((ready.len() == n as usize).then_some(()))
    })
    .with_context(|| b.diagnostics())?;
    print!("{}", b.kubectl("demo", &["get", "nodes", "-o", "custom-columns=NODE:.metadata.name,POD-CIDR:.spec.podCIDR,ADDRESS:.status.addresses[0].address"])?);
    wait_for("every pod Running", Duration::from_secs(120), || {
        let v = b.kubectl_json("demo", &["get", "pods"])?;
        let items = v["items"].as_array().cloned().unwrap_or_default();
        Ok(
            (items.len() == n as usize && items.iter().all(|p| p["status"]["phase"] == "Running"))
                .then_some(()),
        )
    })
    .with_context(|| b.diagnostics())?;
    print!("{}", b.kubectl("demo", &["get", "pods", "-o", "wide"])?);

    step(
        t,
        "pod to pod across nodes and providers: by pod IP, by Service name",
    );
    for i in 1..=n {
        let to = i % n + 1;
        let ip = b.kubectl_json("demo", &["get", "pod", &format!("web-{to}")])?["status"]["podIP"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let ping = b.kubectl(
            "demo",
            &[
                "exec",
                &format!("web-{i}"),
                "--",
                "ping",
                "-c",
                "2",
                "-W",
                "2",
                &ip,
            ],
        )?;
        let summary = ping
            .lines()
            .find(|l| l.contains("packets transmitted"))
            .unwrap_or("")
            .trim()
            .to_string();
        let page = wait_for("the Service to answer", Duration::from_secs(20), || {
            Ok(b.kubectl(
                "demo",
                &[
                    "exec",
                    &format!("web-{i}"),
                    "--",
                    "probe",
                    "get",
                    &format!("http://web-{to}/"),
                ],
            )
            .ok())
        })?;
        println!(
            "web-{i} -> web-{to} ({ip}): {summary}; GET http://web-{to}/ says {:?}",
            page.trim()
        );
    }

    step(
        t,
        "names through each node's own DNS at 169.254.20.10: a cluster name, an external one",
    );
    print!(
        "{}",
        b.kubectl("demo", &["exec", "web-1", "--", "cat", "/etc/resolv.conf"])?
    );
    for name in ["web-2.default.svc.cluster.local", "example.test"] {
        let out = b.kubectl("demo", &["exec", "web-1", "--", "probe", "lookup", name])?;
        println!("web-1: {name} -> {}", out.trim());
    }

    step(t, "socialweb-agent mesh status, on a node");
    if let Some(node) = b.node_dirs().first() {
        let out = std::process::Command::new(testbed::cni::workspace_bin("socialweb-agent"))
            .args(["mesh", "status", "--ctl-socket"])
            .arg(node.join("agent.sock"))
            .output()?;
        print!("{}", String::from_utf8_lossy(&out.stdout));
    }
    println!("\nthe provider's own view:");
    print!("{}", b.cli(&["leases"])?);

    if args.hold {
        step(
            t,
            "holding; Ctrl-C deletes the workload and returns the cluster to zero",
        );
        let kube = testbed::k8s::binaries()?.kube();
        println!(
            "kubectl:  ip netns exec {} {} kubectl --kubeconfig {} get pods -o wide",
            host.name(),
            kube.display(),
            b.kubeconfig("demo").display()
        );
        println!(
            "broker:   socialweb-broker cluster show demo --ctl-socket {}",
            b.socket.display()
        );
        for d in b.node_dirs() {
            println!(
                "agent:    socialweb-agent status --ctl-socket {}",
                d.join("agent.sock").display()
            );
        }
        let mut signals = nix::sys::signal::SigSet::empty();
        signals.add(nix::sys::signal::Signal::SIGINT);
        signals.add(nix::sys::signal::Signal::SIGTERM);
        signals.thread_block()?;
        signals.wait()?;
    }

    step(
        t,
        "kubectl delete the workload; the cluster idles through the hold",
    );
    b.kubectl("demo", &["delete", "pods", "--all", "--wait=true"])?;
    let reason = b.wait_decision("demo", "Teardown", 0, Duration::from_secs(120))?;
    println!(
        "scale decision: Teardown nodes=0: {}",
        reason.trim_start_matches("Teardown: ")
    );
    wait_for("zero live leases", Duration::from_secs(120), || {
        Ok(b.live_leases()?.is_empty().then_some(()))
    })?;
    wait_for("zero nodes", Duration::from_secs(60), || {
        Ok(b.kubectl_json("demo", &["get", "nodes"])?["items"]
            .as_array()
            .is_some_and(|a| a.is_empty())
            .then_some(()))
    })?;
    println!(
        "back at zero: nodes 0, live leases 0 ({} released), control plane {}",
        b.provider_leases()?.len(),
        b.kubectl("demo", &["get", "--raw", "/readyz"])?.trim()
    );
    print!("{}", b.cli(&["cluster", "show", "demo"])?);

    step(t, "socialweb-broker cluster delete demo");
    b.cli(&["cluster", "delete", "demo"])?;
    print!("{}", b.cli(&["cluster", "list"])?);
    Ok(())
}
