//! Tests of the harness itself: namespaces, links, routing through a host, probes, cleanup.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use testbed::topology::{HOST_SERVICE_ADDR, manual_pod};
use testbed::{Netns, Reach, Topology, netns, probe};

/// Names of harness namespaces that exist now among `names`.
fn still_there(names: &[String]) -> Vec<String> {
    let now = netns::list();
    names.iter().filter(|n| now.contains(n)).cloned().collect()
}

fn names_of(t: &Topology, pods: &[&testbed::Pod]) -> Vec<String> {
    let mut v: Vec<String> = t.nodes.iter().map(|n| n.ns.name().to_string()).collect();
    v.push(t.host.name().to_string());
    v.extend(pods.iter().map(|p| p.ns.name().to_string()));
    v
}

#[test]
fn pods_on_two_nodes_reach_each_other_through_the_host_and_vanish_afterwards() {
    let names;
    {
        let t = Topology::new(2, Reach::Direct).unwrap();
        t.route_pod_cidrs_via_host().unwrap();
        let a = manual_pod(t.node(1), 10).unwrap();
        let b = manual_pod(t.node(2), 10).unwrap();
        names = names_of(&t, &[&a, &b]);
        assert_eq!(
            still_there(&names).len(),
            names.len(),
            "all namespaces were created"
        );

        probe::ping(&a.ns, &t.node(1).pod_gateway().to_string(), 1).unwrap();
        probe::ping(&a.ns, &b.addr.to_string(), 2).unwrap();
        probe::ping(&b.ns, &a.addr.to_string(), 2).unwrap();

        let server = probe::EchoServer::start(&b.ns, SocketAddr::new(b.addr.into(), 0)).unwrap();
        let payload: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        probe::tcp_exchange(&a.ns, server.addr, &payload).unwrap();
        let peer = server.next_peer(Duration::from_secs(5)).unwrap();
        assert_eq!(
            peer.ip(),
            std::net::IpAddr::V4(a.addr),
            "pod source address survives"
        );
    }
    assert_eq!(
        still_there(&names),
        Vec::<String>::new(),
        "every namespace is gone after drop"
    );
}

#[test]
fn host_only_nodes_reach_the_host_but_not_each_other() {
    let t = Topology::new(2, Reach::HostOnly).unwrap();
    let n1 = t.node(1);
    let n2 = t.node(2);
    probe::ping(&n1.ns, &HOST_SERVICE_ADDR.to_string(), 1).unwrap();
    probe::ping(&n2.ns, &HOST_SERVICE_ADDR.to_string(), 1).unwrap();
    let err = probe::ping(&n1.ns, &n2.addr.to_string(), 1).unwrap_err();
    assert!(err.to_string().contains("failed"), "{err:#}");
}

#[test]
fn a_panicking_test_leaves_nothing_behind() {
    let created = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = created.clone();
    let result = std::panic::catch_unwind(move || {
        let t = Topology::new(2, Reach::Direct).unwrap();
        let pod = manual_pod(t.node(1), 20).unwrap();
        let sleeper = pod.ns.spawn("sleep", &["300"]).unwrap();
        std::mem::forget(sleeper); // only the namespace teardown can stop it now
        *seen.lock().unwrap() = names_of(&t, &[&pod]);
        panic!("deliberate panic in the middle of a test");
    });
    assert!(result.is_err(), "the closure panicked");
    let names = created.lock().unwrap().clone();
    assert_eq!(names.len(), 4);
    assert_eq!(still_there(&names), Vec::<String>::new());
}

#[test]
fn sweep_removes_the_leftovers_of_a_killed_run_and_their_processes() {
    // A run that is SIGKILLed after creating a namespace with a process in it: its Drop
    // handlers never run. The namespace name carries the dead shell's pid.
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(
            "n=swt-$$-0-orphan; ip netns add $n || exit 3; \
             ip netns exec $n sleep 300 </dev/null >/dev/null 2>&1 & \
             sleep 0.3; echo $n; kill -9 $$",
        )
        .output()
        .unwrap();
    let name = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        name.starts_with("swt-"),
        "child printed {name:?}, stderr {:?}",
        out.stderr
    );
    assert!(
        netns::list().contains(&name),
        "the orphan exists before the sweep"
    );
    let o = std::process::Command::new("ip")
        .args(["netns", "pids", &name])
        .output();
    let orphan_pids = String::from_utf8_lossy(&o.unwrap().stdout).to_string();
    assert!(
        !orphan_pids.trim().is_empty(),
        "a process runs inside the orphan"
    );

    let removed = netns::sweep().unwrap();
    assert!(
        removed.contains(&name),
        "sweep removed {removed:?}, expected {name}"
    );
    assert!(!netns::list().contains(&name));
    for pid in orphan_pids.split_whitespace() {
        assert!(
            !is_running(pid),
            "process {pid} from the orphan namespace still runs"
        );
    }
}

/// Whether a process exists and is not a zombie waiting for PID 1 to reap it.
fn is_running(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next())
                != Some("Z")
        })
        .unwrap_or(false)
}

#[test]
fn sweep_leaves_namespaces_of_live_runs_alone() {
    let mine = Netns::new("live").unwrap();
    netns::sweep().unwrap();
    assert!(netns::list().contains(&mine.name().to_string()));
}

#[test]
fn a_closure_runs_inside_the_namespace() {
    let ns = Netns::new("closure").unwrap();
    ns.ip(&["addr", "add", "192.0.2.7/32", "dev", "lo"])
        .unwrap();
    // Binding an address that exists only in the namespace proves the socket lives there.
    let bound = ns
        .run(|| std::net::UdpSocket::bind((Ipv4Addr::new(192, 0, 2, 7), 0)).map(|_| ()))
        .unwrap();
    assert!(bound.is_ok(), "{bound:?}");
    let devs = ns
        .run(|| std::fs::read_to_string("/proc/thread-self/net/dev").unwrap())
        .unwrap();
    let names: Vec<&str> = devs
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(str::trim)
        .collect();
    assert_eq!(names, vec!["lo"], "a fresh namespace holds only lo");
}

#[test]
fn the_root_namespace_is_never_touched() {
    let snapshot = || {
        let run = |args: &[&str]| {
            let o = std::process::Command::new(args[0])
                .args(&args[1..])
                .output()
                .unwrap();
            String::from_utf8_lossy(&o.stdout).to_string()
        };
        // Interface names and addresses only: counters move on their own.
        (
            run(&["ip", "-o", "link", "show"])
                .lines()
                .map(|l| l.split(':').nth(1).unwrap_or("").to_string())
                .collect::<Vec<_>>(),
            run(&["ip", "-o", "addr", "show"]),
            run(&["ip", "route", "show", "table", "all"]),
            run(&["nft", "list", "ruleset"]),
        )
    };
    let before = snapshot();
    {
        let t = Topology::new(2, Reach::Direct).unwrap();
        t.route_pod_cidrs_via_host().unwrap();
        let _a = manual_pod(t.node(1), 30).unwrap();
    }
    assert_eq!(before, snapshot());
}

#[test]
fn dig_reads_a_resolver_in_another_namespace() {
    // A real DNS server (dnsmasq, answering from an address list) in the host namespace and
    // dig in a node namespace: the probe the DNS tests build on.
    let t = Topology::new(1, Reach::Direct).unwrap();
    let _dns = testbed::resolver::dnsmasq(
        &t.host,
        HOST_SERVICE_ADDR,
        &["--address=/probe.test/192.0.2.99"],
    )
    .unwrap();
    let server = HOST_SERVICE_ADDR.to_string();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let answer = loop {
        match probe::dig(&t.node(1).ns, &server, "probe.test", "A") {
            Ok(a) if !a.is_empty() => break a,
            r if std::time::Instant::now() > deadline => panic!("no answer: {r:?}"),
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    assert_eq!(answer, vec!["192.0.2.99"]);
    assert_eq!(
        probe::dig_status(&t.node(1).ns, &server, "probe.test", "A").unwrap(),
        "NOERROR"
    );
}
