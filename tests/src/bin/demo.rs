//! `socialweb-demo`: a local cluster of nodes on this machine, as network namespaces.
//!
//! Run by `./x demo`. It builds a host and nodes, puts a pod on each node, and shows pod to pod
//! traffic across nodes, printing each step. Everything is removed when it exits (Ctrl-C
//! included, through the harness's sweep on the next run).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Parser;
use testbed::topology::manual_pod;
use testbed::{Reach, Topology, probe};

/// A local socialweb cluster on this machine: nodes and pods as network namespaces.
#[derive(Debug, Parser)]
#[command(version, about, long_about)]
struct Args {
    /// How many nodes.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(2..=20))]
    nodes: u8,
    /// Keep the cluster up until Ctrl-C, to look around with `ip netns exec`.
    #[arg(long)]
    hold: bool,
}

fn step(what: &str) {
    println!("\n== {what}");
}

fn main() -> Result<()> {
    let args = Args::parse();
    let started = Instant::now();

    step(&format!(
        "host and {} nodes (network namespaces, one veth per node)",
        args.nodes
    ));
    let t = Topology::new(args.nodes, Reach::Direct)?;
    println!("host   {}", t.host.name());
    for n in &t.nodes {
        println!(
            "node{}  {}  underlay {}  pod CIDR {}",
            n.index,
            n.ns.name(),
            n.addr,
            n.pod_cidr()
        );
    }

    step("pod CIDRs routed between nodes (kernel routes through the host for now)");
    t.route_pod_cidrs_via_host()?;

    step("a pod on each node");
    let pods = t
        .nodes
        .iter()
        .map(|n| manual_pod(n, 10))
        .collect::<Result<Vec<_>>>()?;
    for (n, p) in t.nodes.iter().zip(&pods) {
        println!("pod on node{}: {} at {}", n.index, p.ns.name(), p.addr);
    }

    step("pod to pod across nodes: ping and a TCP exchange");
    let (first, last) = (&pods[0], &pods[pods.len() - 1]);
    let out = probe::ping(&first.ns, &last.addr.to_string(), 3)?;
    println!(
        "{} -> {}: {}",
        first.addr,
        last.addr,
        out.lines().last().unwrap_or("").trim()
    );
    let server = probe::EchoServer::start(&last.ns, SocketAddr::new(last.addr.into(), 0))?;
    probe::tcp_exchange(&first.ns, server.addr, &vec![7u8; 1 << 20])?;
    let peer = server.next_peer(Duration::from_secs(5))?;
    println!(
        "1 MiB echoed by {}; it saw the connection come from {}",
        server.addr,
        peer.ip()
    );

    if args.hold {
        step("holding; press Ctrl-C to tear down");
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }

    step(&format!(
        "done in {:.1}s; tearing down",
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}
