//! The mesh across node namespaces: direct, through the relay, across a node's death, under
//! attack, out of the cluster, and with packets too big for the path.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use testbed::k8s::wait_for;
use testbed::mesh::{MESH_PORT, MeshCluster, MeshOptions, MeshPod, RelayPlace, Spot, relay_url};
use testbed::topology::HOST_SERVICE_ADDR;
use testbed::{Netns, Reach, Topology, probe};

/// Ping and a 256 KiB TCP exchange between every ordered pair of pods; the receiver must see
/// the sending pod's own address.
fn every_pair_talks(mesh: &MeshCluster<'_>, pods: &[MeshPod]) {
    for a in pods {
        for b in pods.iter().filter(|b| b.node != a.node) {
            probe::ping_until(&a.ns, &b.addr.to_string(), Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("{e:#}\n{}", mesh.logs_tail()));
            let server =
                probe::EchoServer::start(&b.ns, SocketAddr::new(b.addr.into(), 0)).unwrap();
            probe::tcp_exchange(&a.ns, server.addr, &vec![0x5au8; 256 * 1024]).unwrap();
            let seen = server.next_peer(Duration::from_secs(5)).unwrap();
            assert_eq!(
                seen.ip(),
                IpAddr::V4(a.addr),
                "the receiver sees the pod's own source"
            );
        }
    }
}

/// Each ordered pair's path as `mesh status` says it; "no path" while a pair has none (a
/// connection being made again after a relay was lost), so that waiting on paths retries
/// instead of failing on a moment without one.
fn paths(mesh: &MeshCluster<'_>, nodes: u8) -> Vec<String> {
    let mut out = Vec::new();
    for n in 1..=nodes {
        for m in (1..=nodes).filter(|m| *m != n) {
            out.push(match mesh.peer(n, m) {
                Ok(peer) => peer["path"].as_str().unwrap_or("no path").to_string(),
                Err(e) => format!("no peer entry: {e:#}"),
            });
        }
    }
    out
}

#[test]
fn three_nodes_direct_every_pair_of_pods_talks_with_sources_kept() {
    let topo = Topology::new(3, Reach::Direct).unwrap();
    let mesh = MeshCluster::start(&topo, MeshOptions::default()).unwrap();
    let pods: Vec<_> = (1..=3).map(|n| mesh.pod(n, "p").unwrap()).collect();
    every_pair_talks(&mesh, &pods);
    for p in paths(&mesh, 3) {
        assert!(p.starts_with("direct 172.31."), "{p}");
    }
    let status = mesh.cli(1, &["mesh", "status"]).unwrap();
    assert!(
        status.contains("node-2") && status.contains("direct 172.31.2.2:7443"),
        "{status}"
    );
    // The data path runs ahead of the pods (docs/mesh.md): the agent says so, and the
    // kernel agrees about the thread named "mesh".
    assert!(status.contains("mesh thread SCHED_FIFO 1"), "{status}");
    let (policy, priority) = mesh_thread_policy(mesh.agent(1).pid());
    assert_eq!((policy, priority), (1, 1), "SCHED_FIFO (1) at priority 1");
}

/// The scheduling policy and real-time priority of the agent's thread named "mesh", from
/// /proc/<pid>/task/<tid>/stat (fields 41 and 40).
fn mesh_thread_policy(pid: u32) -> (u32, u32) {
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() != "mesh" {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap();
        // Fields after the command name (which ends at the last ')'), from field 3 on.
        let rest: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
        return (rest[41 - 3].parse().unwrap(), rest[40 - 3].parse().unwrap());
    }
    panic!("agent {pid} has no thread named mesh");
}

#[test]
fn nodes_that_cannot_reach_each_other_talk_through_the_relay() {
    let topo = Topology::new(3, Reach::HostOnly).unwrap();
    let mesh = MeshCluster::start(&topo, MeshOptions::default()).unwrap();
    let pods: Vec<_> = (1..=3).map(|n| mesh.pod(n, "p").unwrap()).collect();
    every_pair_talks(&mesh, &pods);
    let relay = relay_url();
    for p in paths(&mesh, 3) {
        assert!(p.starts_with(&format!("relay {relay}")), "{p}");
    }
    let status = mesh.cli(2, &["mesh", "status"]).unwrap();
    assert!(
        status.contains(&format!("relay {relay}")),
        "mesh status says so:\n{status}"
    );
    // And the data really went through: the relayed peer counted datagrams both ways.
    let p = mesh.peer(1, 2).unwrap();
    assert!(
        p["tx"]["datagrams"].as_u64().unwrap() > 100
            && p["rx"]["datagrams"].as_u64().unwrap() > 100,
        "{p}"
    );
}

#[test]
fn when_a_fleet_hosts_relay_is_lost_relayed_nodes_talk_through_another_hosts() {
    // Nodes that cannot reach each other, rented by two hosts of a fleet: node-1 and node-3
    // name the first host's relay as theirs, node-2 the second's, and each names the other
    // as a fleet relay. Then the host whose relay carries the most pairs is lost with it.
    let topo = Topology::new(3, Reach::HostOnly).unwrap();
    let opts = MeshOptions {
        more_relays: 1,
        ..MeshOptions::default()
    };
    let mut mesh = MeshCluster::start(&topo, opts).unwrap();
    let pods: Vec<_> = (1..=3).map(|n| mesh.pod(n, "p").unwrap()).collect();
    every_pair_talks(&mesh, &pods);
    let relays = mesh.relay_urls();
    let status = mesh.cli(2, &["mesh", "status"]).unwrap();
    for r in &relays {
        assert!(status.contains(r.as_str()), "{r} listed:\n{status}");
    }
    let homes: Vec<String> = (1..=3)
        .map(|n| {
            let s: serde_json::Value =
                serde_json::from_str(&mesh.cli(n, &["mesh", "status", "--json"]).unwrap()).unwrap();
            s["relay_url"].as_str().unwrap_or("none").to_string()
        })
        .collect();
    // The host lost is the one whose relay carries the most pairs now (each node makes its
    // home the nearest answering relay, either one, and may move it between two looks; the
    // paths are what is in use).
    let before = paths(&mesh, 3);
    let through = |r: &String| {
        before
            .iter()
            .filter(|p| p.starts_with(&format!("relay {r}")))
            .count()
    };
    let lost_relay = (0..relays.len())
        .max_by_key(|i| through(&relays[*i]))
        .unwrap();
    assert!(
        through(&relays[lost_relay]) > 0,
        "some pair goes through a relay: {before:?} (homes {homes:?})"
    );
    let survivor = &relays[1 - lost_relay];
    mesh.kill_relay(lost_relay);
    let lost = Instant::now();
    // Every ordered pair answers a ping again; until then some go unanswered.
    let all_talk = || {
        pods.iter().all(|a| {
            pods.iter()
                .filter(|b| b.node != a.node)
                .all(|b| probe::ping(&a.ns, &b.addr.to_string(), 1).is_ok())
        })
    };
    wait_for(
        "every pair of pods to talk again after the relay was lost",
        Duration::from_secs(90),
        || Ok(all_talk().then_some(())),
    )
    .unwrap_or_else(|e| panic!("{e:#}\n{}", mesh.logs_tail()));
    eprintln!(
        "every pair talked again {:.1} s after the relay in use was killed",
        lost.elapsed().as_secs_f64()
    );
    every_pair_talks(&mesh, &pods);
    // And each connection's path says so, once iroh has dropped the dead relay's path.
    let through = format!("relay {survivor}");
    wait_for(
        "every pair's path through the surviving relay",
        Duration::from_secs(30),
        || {
            Ok(paths(&mesh, 3)
                .iter()
                .all(|p| p.starts_with(&through))
                .then_some(()))
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}: {:?}\n{}", paths(&mesh, 3), mesh.logs_tail()));
}

fn route_installed(node: &Netns, cidr: &str) -> bool {
    node.ip(&["route", "show", cidr])
        .map(|r| !r.trim().is_empty())
        .unwrap_or(false)
}

#[test]
fn a_killed_node_loses_its_routes_and_comes_back_with_the_same_identity() {
    let topo = Topology::new(3, Reach::Direct).unwrap();
    let mut mesh = MeshCluster::start(&topo, MeshOptions::default()).unwrap();
    let p1 = mesh.pod(1, "p").unwrap();
    let p2 = mesh.pod(2, "p").unwrap();
    probe::ping_until(&p1.ns, &p2.addr.to_string(), Duration::from_secs(5)).unwrap();
    let (pid1, pid3) = (mesh.agent(1).pid(), mesh.agent(3).pid());
    let cidr2 = topo.node(2).pod_cidr();
    assert!(route_installed(&topo.node(1).ns, &cidr2));

    mesh.kill_agent(2);
    let killed = Instant::now();
    for other in [1u8, 3] {
        wait_for(
            &format!("node-{other} to withdraw node-2's route"),
            Duration::from_secs(15),
            || Ok((!route_installed(&topo.node(other).ns, &cidr2)).then_some(())),
        )
        .unwrap();
    }
    let withdrawn = killed.elapsed();
    eprintln!(
        "routes withdrawn {:.1}s after the kill",
        withdrawn.as_secs_f64()
    );
    let routes = mesh.cli(1, &["mesh", "routes"]).unwrap();
    assert!(
        routes
            .lines()
            .any(|l| l.contains(&cidr2) && l.contains("absent")),
        "{routes}"
    );
    assert!(probe::ping(&p1.ns, &p2.addr.to_string(), 1).is_err());

    mesh.restart_agent(2).unwrap();
    mesh.wait_all_connected(Duration::from_secs(30)).unwrap();
    probe::ping_until(&p1.ns, &p2.addr.to_string(), Duration::from_secs(10)).unwrap();
    assert!(route_installed(&topo.node(1).ns, &cidr2));
    assert_eq!(
        (mesh.agent(1).pid(), mesh.agent(3).pid()),
        (pid1, pid3),
        "the others were not restarted"
    );
}

#[test]
fn pod_traffic_leaving_the_cluster_is_masqueraded_with_the_node_address() {
    let topo = Topology::new(2, Reach::HostOnly).unwrap();
    let mesh = MeshCluster::start(&topo, MeshOptions::default()).unwrap();
    let pod = mesh.pod(1, "out").unwrap();
    let server =
        probe::EchoServer::start(&topo.host, SocketAddr::new(HOST_SERVICE_ADDR.into(), 0)).unwrap();
    probe::tcp_exchange(&pod.ns, server.addr, b"to the outside").unwrap();
    let seen = server.next_peer(Duration::from_secs(5)).unwrap();
    assert_eq!(
        seen.ip(),
        IpAddr::V4(topo.node(1).addr),
        "left with the node's address"
    );
    let rules = topo
        .node(1)
        .ns
        .exec("nft", &["list", "table", "ip", "socialweb"])
        .unwrap();
    assert!(rules.contains("masquerade"), "{rules}");
    // The table is the agent's: a clean shutdown removes it, and its routes and address.
    let mut mesh = mesh;
    mesh.stop_agent(1).unwrap();
    let tables = topo.node(1).ns.exec("nft", &["list", "tables"]).unwrap();
    assert!(!tables.contains("socialweb"), "{tables}");
    let routes = topo.node(1).ns.ip(&["route"]).unwrap();
    assert!(!routes.contains("socialweb0"), "{routes}");
    let lo = topo.node(1).ns.ip(&["addr", "show", "lo"]).unwrap();
    assert!(!lo.contains("169.254.20.10"), "{lo}");
}

/// The steps of `socialweb-agent status --json`: (name, state, attempts, since).
fn steps(mesh: &MeshCluster<'_>, node: u8) -> anyhow::Result<Vec<(String, String, u64, String)>> {
    let status: serde_json::Value = serde_json::from_str(&mesh.cli(node, &["status", "--json"])?)?;
    Ok(status["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_string(),
                s["state"].as_str().unwrap().to_string(),
                s["attempts"].as_u64().unwrap(),
                s["since"].as_str().unwrap().to_string(),
            )
        })
        .collect())
}

/// What the agent's shutdown said it removed, in its order.
fn removed(log: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once(" removed ").map(|(_, what)| what.to_string()))
        .collect()
}

/// Nothing of an agent left on its node: the DNS address, the TUN and its routes, the
/// masquerade table.
fn nothing_installed(node: &Netns) {
    let tables = node.exec("nft", &["list", "tables"]).unwrap();
    assert!(!tables.contains("socialweb"), "{tables}");
    let links = node.ip(&["link"]).unwrap();
    for device in ["socialweb0", "socialweb-dns"] {
        assert!(!links.contains(device), "{links}");
    }
    let routes = node.ip(&["route"]).unwrap();
    assert!(!routes.contains("socialweb0"), "{routes}");
    let addrs = node.ip(&["addr"]).unwrap();
    assert!(!addrs.contains("169.254.20.10"), "{addrs}");
}

#[test]
fn the_bring_up_runs_its_steps_in_order_and_the_shutdown_removes_them_newest_first() {
    let topo = Topology::new(2, Reach::Direct).unwrap();
    let mut mesh = MeshCluster::start(&topo, MeshOptions::default()).unwrap();
    mesh.wait_all_connected(Duration::from_secs(30)).unwrap();
    wait_for("node-1's steps done", Duration::from_secs(20), || {
        Ok(steps(&mesh, 1)?.iter().all(|s| s.1 == "done").then_some(()))
    })
    .unwrap();
    let steps = steps(&mesh, 1).unwrap();
    let names: Vec<&str> = steps.iter().map(|s| s.0.as_str()).collect();
    assert_eq!(names, ["sysctls", "dns", "mesh", "pod-network"]);
    // Each step was done no earlier than the one before it (RFC 3339, same zone and width).
    for pair in steps.windows(2) {
        assert!(
            pair[0].3 <= pair[1].3,
            "{} done after {}: {steps:?}",
            pair[0].0,
            pair[1].0
        );
    }
    mesh.stop_agent(1).unwrap();
    let removed = removed(&mesh.agent(1).log);
    assert_eq!(
        removed,
        [
            "the masquerade table socialweb",
            "the mesh (socialweb0)",
            "the DNS address 169.254.20.10 on Loopback",
        ],
        "removed newest first"
    );
    nothing_installed(&topo.node(1).ns);
}

#[test]
fn a_step_failing_midway_leaves_nothing_installed() {
    let topo = Topology::new(1, Reach::Direct).unwrap();
    // The mesh cannot bind an address the node does not have: DNS is up, the mesh opens its
    // TUN and fails, the pod network never starts.
    let opts = MeshOptions {
        agent_args: vec!["--mesh-listen".into(), "192.0.2.1:7443".into()],
        ..MeshOptions::default()
    };
    let node = topo.node(1);
    let spot = Spot {
        index: 1,
        ns: &node.ns,
        addr: None,
    };
    let mut mesh =
        MeshCluster::start_in(vec![spot], &topo.host, RelayPlace::plain(), opts).unwrap();
    wait_for(
        "the mesh step to fail twice",
        Duration::from_secs(30),
        || {
            let s = steps(&mesh, 1)?;
            Ok((s.len() == 4 && s[2].1 == "retrying" && s[2].2 >= 2).then_some(s))
        },
    )
    .unwrap();
    let s = steps(&mesh, 1).unwrap();
    assert_eq!(
        (s[0].1.as_str(), s[1].1.as_str()),
        ("done", "done"),
        "{s:?}"
    );
    assert_eq!(
        (s[3].1.as_str(), s[3].2),
        ("pending", 0),
        "not attempted: {s:?}"
    );
    let status = mesh.cli(1, &["status"]).unwrap();
    assert!(
        status.contains("192.0.2.1"),
        "the mesh's error is shown: {status}"
    );
    let addrs = topo.node(1).ns.ip(&["addr", "show", "lo"]).unwrap();
    assert!(addrs.contains("169.254.20.10"), "DNS was up: {addrs}");

    mesh.stop_agent(1).unwrap();
    assert_eq!(
        removed(&mesh.agent(1).log),
        ["the DNS address 169.254.20.10 on Loopback"]
    );
    nothing_installed(&topo.node(1).ns);
}

#[test]
fn a_packet_too_big_for_the_path_is_answered_and_tcp_finds_the_path_mtu() {
    // Pods and TUN at 1500, so that packets larger than a QUIC datagram reach the agent.
    let topo = Topology::new(2, Reach::Direct).unwrap();
    let mesh = MeshCluster::start(
        &topo,
        MeshOptions {
            mtu: 1500,
            ..Default::default()
        },
    )
    .unwrap();
    let b = mesh.pod(2, "big").unwrap();
    // Path MTU discovery runs on the QUIC connection all along and may move the path's size
    // between reading it and the ping (the agent then answers with the size of that moment,
    // which `mesh status` shows too). So read it before and after each ping and judge only an
    // attempt where it held still. Each attempt from a fresh pod: a pod's kernel keeps the
    // size a Packet Too Big told it and would refuse the next big ping itself.
    let mut seen = Vec::new();
    let mut a = None;
    for attempt in 0..10 {
        let pod = mesh.pod(1, &format!("big{attempt}")).unwrap();
        probe::ping_until(&pod.ns, &b.addr.to_string(), Duration::from_secs(5)).unwrap();
        let before = mesh.peer(1, 2).unwrap()["max_packet"].as_u64().unwrap();
        assert!(
            before < 1428,
            "a 1400-byte ping (1428-byte packet) must not fit; the path carries {before}"
        );
        let text = df_ping(&pod, &b.addr.to_string(), 1400);
        let after = mesh.peer(1, 2).unwrap()["max_packet"].as_u64().unwrap();
        seen.push((before, after, text.clone()));
        a = Some(pod);
        if before == after {
            assert!(
                text.contains(&format!("mtu = {before}")),
                "Packet Too Big with the path's size {before} (mesh status before and after \
                 the ping):\n{text}"
            );
            break;
        }
    }
    assert!(
        seen.last().is_some_and(|(b, a, _)| b == a),
        "the path's size never held still across a ping: {seen:?}"
    );
    // The figures, for whoever reads a run's output.
    let sizes: Vec<_> = seen.iter().map(|(b, a, _)| (b, a)).collect();
    eprintln!("path size before and after each big ping: {sizes:?}");
    let a = a.expect("one attempt ran");
    let drops = mesh.peer(1, 2).unwrap()["drops"].clone();
    assert!(drops["too_big"].as_u64().unwrap_or(0) >= 1, "{drops}");

    // TCP with full-size segments: the first ones are answered with Packet Too Big, the
    // kernel lowers the path MTU, and the transfer completes.
    let server = probe::EchoServer::start(&b.ns, SocketAddr::new(b.addr.into(), 0)).unwrap();
    probe::tcp_exchange(&a.ns, server.addr, &vec![7u8; 1 << 20]).unwrap();
}

#[test]
fn with_the_default_mtu_a_big_ping_is_refused_at_the_pod() {
    let topo = Topology::new(2, Reach::Direct).unwrap();
    let mesh = MeshCluster::start(&topo, MeshOptions::default()).unwrap();
    let a = mesh.pod(1, "big").unwrap();
    let b = mesh.pod(2, "big").unwrap();
    probe::ping_until(&a.ns, &b.addr.to_string(), Duration::from_secs(5)).unwrap();
    let out =
        a.ns.output(
            "ping",
            &[
                "-n",
                "-c",
                "1",
                "-W",
                "2",
                "-M",
                "do",
                "-s",
                "1400",
                &b.addr.to_string(),
            ],
        )
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("mtu=1280") || text.contains("mtu = 1280"),
        "{text}"
    );
    // A full 1280-byte packet fits a datagram and crosses.
    a.ns.exec(
        "ping",
        &[
            "-n",
            "-c",
            "1",
            "-W",
            "2",
            "-M",
            "do",
            "-s",
            "1252",
            &b.addr.to_string(),
        ],
    )
    .unwrap();
}

/// Pings of `size` bytes of payload with Don't Fragment, `count` of them `interval` apart;
/// the output whatever the outcome.
fn df_pings(from: &Netns, to: &str, size: u32, count: u32, interval: &str) -> String {
    let out = from
        .output(
            "ping",
            &[
                "-n",
                "-c",
                &count.to_string(),
                "-i",
                interval,
                "-W",
                "2",
                "-M",
                "do",
                "-s",
                &size.to_string(),
                to,
            ],
        )
        .unwrap();
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}

#[test]
fn losing_full_size_packets_for_a_while_does_not_shrink_the_path_below_the_pod_mtu() {
    // QUIC's black-hole detection takes loss bursts of packets larger than its minimum MTU
    // for a path MTU drop and falls back to that minimum. With the stack's default of 1200
    // bytes, a burst of ordinary loss (congestion, a flapping link) would leave the path too
    // small for a 1280-byte pod packet, and every one of them would be answered "too big"
    // until the next probe, minutes later. The agent pins the minimum at what the pod MTU
    // needs. Here: every full-size datagram from node 1 is lost for a while, then the path
    // heals; 1280-byte packets must cross again at once.
    let topo = Topology::new(2, Reach::Direct).unwrap();
    let mesh = MeshCluster::start(&topo, MeshOptions::default()).unwrap();
    let a = mesh.pod(1, "pmtu").unwrap();
    let b = mesh.pod(2, "pmtu").unwrap();
    let b_ip = b.addr.to_string();
    probe::ping_until(&a.ns, &b_ip, Duration::from_secs(10)).unwrap();
    let full = df_pings(&a.ns, &b_ip, 1252, 3, "0.2");
    assert!(full.contains(" 0% packet loss"), "before: {full}");

    // Lose every UDP datagram node 1 sends that is big enough to hold a 1280-byte pod
    // packet (small ones, acknowledgements and keep-alives, still pass).
    let node1 = &topo.node(1).ns;
    nft(
        node1,
        &format!(
            "table ip pmtu_test {{\n chain out {{\n  type filter hook output priority 0; policy accept;\n  udp dport {MESH_PORT} ip length > 1300 drop\n }}\n}}\n"
        ),
    );
    let lossy = df_pings(&a.ns, &b_ip, 1252, 400, "0.005");
    // Nearly all are lost (iroh may carry the odd one over the relay, which the rule spares).
    let received: u32 = lossy
        .split(" received")
        .next()
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no ping summary: {lossy}"));
    assert!(received <= 40, "during: {lossy}");
    nft(node1, "delete table ip pmtu_test");

    std::thread::sleep(Duration::from_secs(1));
    let peer = mesh.peer(1, 2).unwrap();
    let max = peer["max_packet"].as_u64().unwrap_or(0);
    assert!(
        max >= 1280,
        "after the loss the path carries {max}-byte packets, less than the pod MTU: {peer}"
    );
    let after = df_pings(&a.ns, &b_ip, 1252, 5, "0.2");
    assert!(
        after.contains(" 0% packet loss"),
        "after the loss, full-size packets must cross at once:\n{after}\n{peer}"
    );
}

fn nft(ns: &Netns, script: &str) {
    ns.exec_with_stdin("nft", &["-f", "-"], script.as_bytes())
        .unwrap_or_else(|e| panic!("nft refused {script}: {e:#}"));
}

/// A rogue endpoint: speaks the mesh ALPN with a given key from inside a namespace.
fn rogue<R>(
    ns: &Netns,
    key: [u8; 32],
    bind: SocketAddr,
    f: impl AsyncFnOnce(iroh::Endpoint) -> R + Send,
) -> R
where
    R: Send,
{
    ns.run(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let relay: iroh::RelayUrl = relay_url().parse().unwrap();
            let ep = iroh::Endpoint::builder(iroh::endpoint::presets::Minimal)
                .secret_key(iroh::SecretKey::from_bytes(&key))
                .alpns(vec![socialweb_alpn()])
                .relay_mode(iroh::RelayMode::custom([relay]))
                .clear_ip_transports()
                .bind_addr(bind)
                .unwrap()
                .bind()
                .await
                .unwrap();
            f(ep).await
        })
    })
    .unwrap()
}

fn socialweb_alpn() -> Vec<u8> {
    b"socialweb/mesh/1".to_vec()
}

fn hex_key(s: &str) -> [u8; 32] {
    let mut k = [0u8; 32];
    for (i, b) in k.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
    }
    k
}

fn udp_packet(src: Ipv4Addr, dst: Ipv4Addr, port: u16, payload: &[u8]) -> bytes::Bytes {
    let b = etherparse::PacketBuilder::ipv4(src.octets(), dst.octets(), 64).udp(40000, port);
    let mut out = Vec::new();
    b.write(&mut out, payload).unwrap();
    out.into()
}

/// A real peer can dial before this node's directory lists it (directories on two nodes lag
/// each other). Its refusals are counted as an early peer's, not as a stranger's.
#[test]
fn a_peer_that_dials_before_the_directory_lists_it_is_not_counted_a_stranger() {
    let topo = Topology::new(2, Reach::Direct).unwrap();
    let mesh = MeshCluster::start(&topo, MeshOptions::default()).unwrap();
    let node1_id: iroh::EndpointId = mesh.agent(1).endpoint.parse().unwrap();
    let node1_addr = SocketAddr::new(topo.node(1).addr.into(), MESH_PORT);
    let (secret, endpoint) = testbed::k8s::mesh_keygen().unwrap();

    // The newcomer knows node-1 (its own directory has caught up) and dials; node-1's does
    // not list it yet.
    let closed = rogue(
        &topo.node(2).ns,
        hex_key(&secret),
        SocketAddr::new(topo.node(2).addr.into(), 7446),
        async move |ep| {
            let conn = ep
                .connect(
                    iroh::EndpointAddr::new(node1_id).with_ip_addr(node1_addr),
                    &socialweb_alpn(),
                )
                .await
                .unwrap();
            conn.closed().await.to_string()
        },
    );
    assert!(closed.contains("not in the peer directory"), "{closed}");
    // (The two nodes' own start may have raced their directories too: count from here.)
    let before = mesh.status(1).unwrap();
    assert_eq!(before["refusals_pending"], 1, "{before}");
    let early = before["early_peers_refused"].as_u64().unwrap();

    // Now the directory lists it.
    let mut dir: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&mesh.peers_file).unwrap()).unwrap();
    dir["nodes"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({
            "node": "node-9", "endpoint": endpoint, "pod_cidr": "10.42.9.0/24", "addrs": []
        }));
    std::fs::write(&mesh.peers_file, dir.to_string()).unwrap();
    let s = wait_for("node-1 to list node-9", Duration::from_secs(15), || {
        let s = mesh.status(1)?;
        let listed = s["peers"]
            .as_array()
            .is_some_and(|p| p.iter().any(|p| p["node"] == "node-9"));
        Ok(listed.then_some(s))
    })
    .unwrap();
    assert_eq!(s["early_peers_refused"], early + 1, "{s}");
    assert_eq!(s["strangers_refused"], 0, "{s}");
    assert_eq!(s["refusals_pending"], 0, "{s}");
}

#[test]
fn spoofed_packets_are_dropped_and_counted_and_strangers_are_refused() {
    let topo = Topology::new(3, Reach::Direct).unwrap();
    let mut mesh = MeshCluster::start(&topo, MeshOptions::default()).unwrap();
    let target = mesh.pod(1, "victim").unwrap();
    let sock = target
        .ns
        .run(move || UdpSocket::bind((target.addr, 5353)).unwrap())
        .unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();

    // Node-3 goes rogue: its agent stops and something else speaks with its key.
    mesh.stop_agent(3).unwrap();
    wait_for("node-1 to see node-3 gone", Duration::from_secs(15), || {
        Ok((mesh.peer(1, 3)?["connected"] == false).then_some(()))
    })
    .unwrap();
    let key3 = hex_key(&mesh.agent(3).secret_key);
    let node1_id: iroh::EndpointId = mesh.agent(1).endpoint.parse().unwrap();
    let node1_addr = SocketAddr::new(topo.node(1).addr.into(), MESH_PORT);
    let own3 = Ipv4Addr::new(10, 42, 3, 9);
    let victim = target.addr;
    rogue(
        &topo.node(3).ns,
        key3,
        SocketAddr::new(topo.node(3).addr.into(), MESH_PORT),
        async move |ep| {
            let conn = ep
                .connect(
                    iroh::EndpointAddr::new(node1_id).with_ip_addr(node1_addr),
                    &socialweb_alpn(),
                )
                .await
                .unwrap();
            for _ in 0..3 {
                conn.send_datagram(udp_packet(
                    Ipv4Addr::new(10, 42, 2, 9),
                    victim,
                    5353,
                    b"spoofed",
                ))
                .unwrap();
                conn.send_datagram(udp_packet(
                    own3,
                    Ipv4Addr::new(10, 42, 2, 5),
                    5353,
                    b"elsewhere",
                ))
                .unwrap();
                conn.send_datagram(bytes::Bytes::from_static(b"\x45not an ip packet at all"))
                    .unwrap();
                conn.send_datagram(udp_packet(own3, victim, 5353, b"valid"))
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            conn.close(0u32.into(), b"done");
        },
    );
    let mut got = Vec::new();
    let mut buf = [0u8; 64];
    while let Ok((n, from)) = sock.recv_from(&mut buf) {
        got.push((String::from_utf8_lossy(&buf[..n]).to_string(), from.ip()));
    }
    assert!(
        !got.is_empty(),
        "the valid packets from node-3's CIDR arrive"
    );
    assert!(
        got.iter()
            .all(|(p, from)| p == "valid" && *from == IpAddr::V4(own3)),
        "only valid ones: {got:?}"
    );
    let drops = mesh.peer(1, 3).unwrap()["drops"].clone();
    for reason in ["spoofed_source", "wrong_destination", "malformed"] {
        assert!(
            drops[reason].as_u64().unwrap_or(0) >= 3,
            "{reason} counted: {drops}"
        );
    }

    // A stranger (a key in no directory) is refused by the agent, directly...
    let stranger: [u8; 32] = std::array::from_fn(|i| i as u8 + 1);
    let closed = rogue(
        &topo.node(3).ns,
        stranger,
        SocketAddr::new(topo.node(3).addr.into(), 7444),
        async move |ep| {
            let conn = ep
                .connect(
                    iroh::EndpointAddr::new(node1_id).with_ip_addr(node1_addr),
                    &socialweb_alpn(),
                )
                .await
                .unwrap();
            let _ = conn.send_datagram(udp_packet(own3, victim, 5353, b"stranger"));
            conn.closed().await.to_string()
        },
    );
    assert!(closed.contains("not in the peer directory"), "{closed}");
    // A refusal is a stranger's once the directory has not listed it for a while (a real peer
    // dialling early would have been listed by then: the test before). The nodes' own
    // start-up races count as early peers', not here.
    wait_for(
        "the refusal to count as a stranger's",
        Duration::from_secs(30),
        || Ok((mesh.status(1)?["strangers_refused"].as_u64() >= Some(1)).then_some(())),
    )
    .unwrap();
    assert!(
        sock.recv_from(&mut buf).is_err(),
        "nothing from the stranger arrived"
    );
    // ...and by the relay, which admits only the cluster's endpoints.
    let relayed = rogue(
        &topo.node(3).ns,
        stranger,
        SocketAddr::new(topo.node(3).addr.into(), 7445),
        async move |ep| {
            let addr =
                iroh::EndpointAddr::new(node1_id).with_relay_url(relay_url().parse().unwrap());
            tokio::time::timeout(Duration::from_secs(5), ep.connect(addr, &socialweb_alpn())).await
        },
    );
    assert!(
        !matches!(relayed, Ok(Ok(_))),
        "the relay carried a stranger's connection"
    );
}

/// The relay (`socialweb-broker relay`) admits only the endpoints it is told; one started without an allow list would
/// relay anyone's traffic, so it refuses to start unless `--open` says that is meant.
#[test]
fn a_relay_without_an_allow_list_refuses_to_start_unless_open() {
    let broker = testbed::cni::workspace_bin("socialweb-broker");
    let run = |args: &[&str]| {
        std::process::Command::new(&broker)
            .arg("relay")
            .args(args)
            .output()
            .unwrap()
    };
    let bare = run(&["--listen", "127.0.0.1:0"]);
    let stderr = String::from_utf8_lossy(&bare.stderr);
    assert!(!bare.status.success(), "started without --allow: {stderr}");
    assert!(
        stderr.contains("--allow") && stderr.contains("--open"),
        "says what is missing: {stderr}"
    );
    let both = run(&[
        "--listen",
        "127.0.0.1:0",
        "--open",
        "--allow",
        &"0".repeat(64),
    ]);
    assert!(
        !both.status.success(),
        "--open with an allow list is a contradiction"
    );

    // --open starts, and says so.
    let ns = Netns::new("open-relay").unwrap();
    ns.ip(&["link", "set", "lo", "up"]).unwrap();
    let mut cmd = ns.command(&broker.to_string_lossy());
    cmd.args(["relay", "--listen", "127.0.0.1:3340", "--open"]);
    let dir = testbed::tmp::TempDir::new("relay").unwrap();
    let log = dir.path().join("relay.log");
    let mut relay = testbed::process::Spawned::start_logged(cmd, "relay", &log).unwrap();
    wait_for("the open relay to listen", Duration::from_secs(10), || {
        Ok(ns
            .run(|| std::net::TcpStream::connect(("127.0.0.1", 3340)).is_ok())?
            .then_some(()))
    })
    .unwrap();
    assert!(relay.is_running());
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(said.contains("admitting any endpoint"), "{said}");
}

/// A stream through a bottleneck, with a ping beside it: the underlay of node 1 shaped to
/// `rate` with a shallow queue (tbf), so QUIC's congestion control backs off and the pods'
/// packets wait in the mesh's own queue. Returns node 1's outbound queue towards node 2 as
/// `mesh status --json` reports it after the stream, and the ping's output.
fn stream_through_a_bottleneck(agent_args: &[&str], pod_ecn: bool) -> (serde_json::Value, String) {
    let topo = Topology::new(2, Reach::Direct).unwrap();
    let opts = MeshOptions {
        agent_args: agent_args.iter().map(|a| a.to_string()).collect(),
        ..MeshOptions::default()
    };
    let mesh = MeshCluster::start(&topo, opts).unwrap();
    let a = mesh.pod(1, "a").unwrap();
    let b = mesh.pod(2, "b").unwrap();
    for pod in [&a.ns, &b.ns] {
        let ecn = if pod_ecn { "1" } else { "0" };
        // A loss-based TCP, which fills whatever queue it meets (what CoDel exists for);
        // reno is always allowed in a namespace, whatever the host's default.
        pod.exec(
            "sysctl",
            &[
                "-q",
                "-w",
                &format!("net.ipv4.tcp_ecn={ecn}"),
                "net.ipv4.tcp_congestion_control=reno",
            ],
        )
        .unwrap();
    }
    probe::ping_until(&a.ns, &b.addr.to_string(), Duration::from_secs(10)).unwrap();
    // The underlay's bottleneck is an AQM that signals with ECN, as a modern router's is:
    // node 1's uplink shaped to 100 Mbit/s, and every ECN-capable packet beyond 64 Mbit/s
    // marked CE. QUIC (which sends ECT(0) once its path proves ECN) slows down on the marks
    // without losing a packet, so the pods' TCP is not told by a loss: the mesh's own queue
    // is where the excess waits, and only its discipline can tell the TCP.
    let node1 = &topo.node(1).ns;
    node1
        .exec(
            "tc",
            &[
                "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "100mbit", "burst", "32kb",
                "latency", "50ms",
            ],
        )
        .unwrap();
    let aqm = format!(
        "table ip bottleneck {{\n chain post {{ type filter hook postrouting priority 0; \
         udp sport {MESH_PORT} ip ecn ect0 limit rate over 8 mbytes/second burst 64 kbytes ip ecn set ce counter; }}\n}}\n"
    );
    node1
        .exec_with_stdin("nft", &["-f", "-"], aqm.as_bytes())
        .unwrap();
    let ip = b.addr.to_string();
    let _server = b.ns.spawn("iperf3", &["-s", "-1", "-B", &ip]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let stream = std::thread::scope(|s| {
        let stream = s.spawn(|| a.ns.output("iperf3", &["-c", &ip, "-t", "8", "-J"]));
        std::thread::sleep(Duration::from_secs(2));
        let ping =
            a.ns.output("ping", &["-n", "-i", "0.02", "-w", "5", &ip])
                .unwrap();
        let stream = stream.join().unwrap().unwrap();
        assert!(
            stream.status.success(),
            "iperf3: {}",
            String::from_utf8_lossy(&stream.stdout)
        );
        String::from_utf8_lossy(&ping.stdout).into_owned()
    });
    let marked = node1
        .exec("nft", &["list", "table", "ip", "bottleneck"])
        .unwrap();
    eprintln!("the underlay's AQM: {marked}");
    let queue = mesh.peer(1, 2).unwrap()["queue_out"].clone();
    (queue, stream)
}

/// Replies over requests, from ping's summary line.
fn ping_replies(out: &str) -> (u64, u64) {
    let line = out
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .unwrap_or_else(|| panic!("no summary in {out}"));
    let n: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    (n[1], n[0])
}

#[test]
fn a_standing_queue_behind_a_bottleneck_is_held_by_time_and_a_ping_passes_it() {
    // FQ-CoDel (the default): the stream's standing queue is signalled by its waiting time
    // -- packets dropped, counted -- long before the queue's byte limit; the ping, a flow of
    // its own, is served ahead of it and gets its replies.
    let (q, ping) = stream_through_a_bottleneck(&[], false);
    let n = |k: &str| q[k].as_u64().unwrap_or_else(|| panic!("{k} in {q}"));
    assert!(
        n("codel_drops") > 0,
        "CoDel dropped from the standing queue: {q}"
    );
    assert_eq!(n("overlimit_drops"), 0, "never held by bytes: {q}");
    let (replies, sent) = ping_replies(&ping);
    assert!(
        replies * 100 >= sent * 95,
        "the ping beside the stream got {replies} of {sent} replies:\n{ping}"
    );

    // Pods that negotiate ECN get marks instead of drops.
    let (q, _) = stream_through_a_bottleneck(&[], true);
    assert!(
        q["ecn_marks"].as_u64().unwrap() > 0,
        "ECN-capable packets are marked CE: {q}"
    );
    assert_eq!(q["overlimit_drops"], 0, "{q}");
}

#[test]
fn a_fifo_holds_the_same_stream_by_bytes_alone() {
    // The same load through a plain FIFO (the lever bench/mesh compares against): nothing
    // signals the stream until the queue is full, then it drops at its byte limit.
    let (q, _) =
        stream_through_a_bottleneck(&["--mesh-queue", "fifo", "--mesh-queue-kib", "256"], false);
    assert_eq!(q["codel_drops"], 0, "{q}");
    assert!(
        q["overlimit_drops"].as_u64().unwrap() > 0,
        "the FIFO dropped only at its limit: {q}"
    );
}

#[test]
fn across_endpoint_independent_nats_nodes_go_direct_and_a_symmetric_nat_keeps_them_relayed() {
    use testbed::natmesh::NatGround;
    use testbed::world::Nat::{EndpointIndependent as Eim, Symmetric as Sym};
    // Three providers, one node each, every node behind its provider's NAT (and its own
    // slirp-like gateway): two map endpoint-independently, one symmetrically.
    let ground = NatGround::new(&[Eim, Eim, Sym]).unwrap();
    let mesh = ground.mesh(MeshOptions::default()).unwrap();
    mesh.wait_all_connected(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e:#}"));
    let path = |a: u8, b: u8| {
        mesh.peer(a, b).unwrap()["path"]
            .as_str()
            .unwrap()
            .to_string()
    };
    // The two endpoint-independent NATs: each node learns its public address from the
    // relay's address discovery, the two punch through, and the pair goes direct.
    wait_for(
        "node-1 and node-2 to find a direct path",
        Duration::from_secs(60),
        || Ok(path(1, 2).starts_with("direct").then_some(())),
    )
    .unwrap_or_else(|e| panic!("{e:#}: {}\n{}", path(1, 2), mesh.logs_tail()));
    assert!(path(2, 1).starts_with("direct"), "{}", path(2, 1));
    // The symmetric NAT gives every destination its own port: the address the relay saw is
    // not the one a peer must reach, so node-3 stays on the relay with both.
    for (a, b) in [(1, 3), (3, 1), (2, 3), (3, 2)] {
        assert!(
            path(a, b).starts_with("relay https://203.0.113.1:3340"),
            "node-{a} -> node-{b}: {}",
            path(a, b)
        );
    }
    let pods: Vec<_> = (1..=3).map(|n| mesh.pod(n, "p").unwrap()).collect();
    every_pair_talks(&mesh, &pods);
}

/// One ping of `size` bytes with Don't Fragment from `pod`; its output and errors as text.
fn df_ping(pod: &MeshPod, to: &str, size: u32) -> String {
    let size = size.to_string();
    let out = pod
        .ns
        .output(
            "ping",
            &["-n", "-c", "1", "-W", "2", "-M", "do", "-s", &size, to],
        )
        .unwrap();
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}
