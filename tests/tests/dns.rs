//! Node-local DNS against real Kubernetes: Services and EndpointSlices created through the API,
//! a real pod's network namespace and the resolv.conf its kubelet wrote, real `dig` and
//! `getent`, a real upstream resolver (dnsmasq) on the host.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use testbed::k8s::{Cluster, run_pod, wait_for};
use testbed::mesh::{MeshCluster, MeshOptions};
use testbed::process::Spawned;
use testbed::tmp::TempDir;
use testbed::topology::HOST_SERVICE_ADDR;
use testbed::{Netns, Reach, Topology};

const DNS: &str = "169.254.20.10";

/// dnsmasq on the host's service address: the upstream resolver for names outside the
/// cluster. `example.test` answers `addr`; `big.example.test` has a TXT too large for 512
/// bytes. Every query it sees is logged.
fn upstream(host: &Netns, dir: &Path, addr: &str) -> Spawned {
    let big: String = (0..12)
        .map(|i| format!("{i:02}-{}", "x".repeat(60)))
        .collect::<Vec<_>>()
        .join("\",\"");
    let address = format!("--address=/example.test/{addr}");
    let txt = format!("--txt-record=big.example.test,\"{big}\"");
    let log = format!("--log-facility={}", dir.join("dnsmasq.log").display());
    testbed::resolver::dnsmasq(
        host,
        HOST_SERVICE_ADDR,
        &[
            &address,
            &txt,
            "--local-ttl=2",
            "--neg-ttl=2",
            "--log-queries",
            &log,
        ],
    )
    .unwrap()
}

struct Dns<'t> {
    c: Cluster<'t>,
}

impl Dns<'_> {
    /// `dig` in pod default/client, as the pod resolves.
    fn dig(&self, args: &[&str]) -> String {
        let out = self.pod("dig", &[&["+time=2", "+tries=1"], args].concat());
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn short(&self, args: &[&str]) -> Vec<String> {
        let mut v: Vec<String> = self
            .dig(&[&["+short"], args].concat())
            .lines()
            .map(str::to_string)
            .collect();
        v.sort();
        v
    }

    fn status(&self, args: &[&str]) -> String {
        let out = self.dig(args);
        out.lines()
            .find_map(|l| l.split("status: ").nth(1))
            .map(|s| s.split(',').next().unwrap_or("").to_string())
            .unwrap_or_else(|| panic!("no status in {out}"))
    }

    fn pod(&self, program: &str, args: &[&str]) -> Output {
        self.c
            .node(1)
            .pod_command("default", "client", program, args)
            .unwrap()
            .output()
            .unwrap()
    }

    fn getent(&self, name: &str) -> Option<String> {
        let out = self.pod("getent", &["hosts", name]);
        out.status.success().then(|| {
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .next()
                .unwrap_or("")
                .to_string()
        })
    }

    fn stats(&self) -> serde_json::Value {
        serde_json::from_str(&self.c.node(1).cli(&["dns", "stats", "--json"]).unwrap()).unwrap()
    }
}

const OBJECTS: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  ports: [{name: http, port: 80, protocol: TCP}, {name: alt, port: 8080, protocol: UDP}]
---
apiVersion: v1
kind: Service
metadata: {name: db, namespace: default}
spec:
  clusterIP: None
  ports: [{name: pg, port: 5432, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: db-1, namespace: default, labels: {kubernetes.io/service-name: db}}
addressType: IPv4
ports: [{name: pg, port: 5432, protocol: TCP}]
endpoints:
- {addresses: ["10.42.200.5"], hostname: db-0, conditions: {ready: true}}
- {addresses: ["10.42.200.6"], conditions: {ready: true}}
- {addresses: ["10.42.200.7"], hostname: db-2, conditions: {ready: false}}
---
apiVersion: v1
kind: Service
metadata: {name: tolerant, namespace: default}
spec:
  clusterIP: None
  publishNotReadyAddresses: true
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: tolerant-1, namespace: default, labels: {kubernetes.io/service-name: tolerant}}
addressType: IPv4
endpoints:
- {addresses: ["10.42.201.9"], conditions: {ready: false}}
---
apiVersion: v1
kind: Service
metadata: {name: empty, namespace: default}
spec:
  clusterIP: None
---
apiVersion: v1
kind: Service
metadata: {name: ext, namespace: default}
spec:
  type: ExternalName
  externalName: example.test
---
apiVersion: v1
kind: Namespace
metadata: {name: other}
---
apiVersion: v1
kind: Service
metadata: {name: api, namespace: other}
spec:
  ports: [{name: https, port: 443, protocol: TCP}]
"#;

#[test]
fn node_local_dns_answers_the_cluster_zone_and_forwards_the_rest() {
    let topo = Topology::new(1, Reach::HostOnly).unwrap();
    let dir = TempDir::new("dns").unwrap();
    let mut dnsmasq = upstream(&topo.host, dir.path(), "192.0.2.10");
    let cluster = Cluster::start(&topo, |_| {}).unwrap();
    cluster.wait_ready(Duration::from_secs(120)).unwrap();
    cluster.cp.apply(OBJECTS).unwrap();
    run_pod(&cluster.cp, "client", "node-1", &["sleep", "3600"]).unwrap();
    let c = Dns { c: cluster };

    // The resolv.conf the kubelet wrote points at node-local DNS with the search path.
    let resolv = String::from_utf8(c.pod("cat", &["/etc/resolv.conf"]).stdout).unwrap();
    assert!(resolv.contains(&format!("nameserver {DNS}")), "{resolv}");
    assert!(
        resolv.contains("search default.svc.cluster.local svc.cluster.local cluster.local"),
        "{resolv}"
    );
    assert!(resolv.contains("ndots:5"), "{resolv}");
    let labels =
        c.c.cp.kubectl_json(&["get", "node", "node-1"]).unwrap()["metadata"]["labels"].clone();
    assert_eq!(labels["socialweb.computer/node-local-dns"], "true");

    let web_ip = c.c.cp.kubectl_json(&["get", "svc", "web"]).unwrap()["spec"]["clusterIP"]
        .as_str()
        .unwrap()
        .to_string();
    wait_for("web to resolve", Duration::from_secs(10), || {
        Ok((c.short(&["web.default.svc.cluster.local"]) == vec![web_ip.clone()]).then_some(()))
    })
    .unwrap();

    // The table: every record kind the spec names.
    assert_eq!(
        c.short(&["dns-version.cluster.local", "TXT"]),
        ["\"1.1.0\""]
    );
    assert_eq!(
        c.short(&["+search", "web"]),
        [web_ip.as_str()],
        "short name through the search path"
    );
    assert_eq!(
        c.short(&["WEB.Default.SVC.Cluster.Local"]),
        [web_ip.as_str()],
        "case-insensitive"
    );
    assert_eq!(
        c.short(&["_http._tcp.web.default.svc.cluster.local", "SRV"]),
        ["0 100 80 web.default.svc.cluster.local."]
    );
    assert_eq!(
        c.short(&["-x", &web_ip]),
        ["web.default.svc.cluster.local."]
    );
    assert_eq!(
        c.short(&["db.default.svc.cluster.local"]),
        ["10.42.200.5", "10.42.200.6"],
        "ready endpoints only"
    );
    assert_eq!(
        c.short(&["db-0.db.default.svc.cluster.local"]),
        ["10.42.200.5"]
    );
    assert_eq!(
        c.short(&["_pg._tcp.db.default.svc.cluster.local", "SRV"]),
        [
            "0 50 5432 10-42-200-6.db.default.svc.cluster.local.",
            "0 50 5432 db-0.db.default.svc.cluster.local."
        ]
    );
    assert_eq!(
        c.short(&["-x", "10.42.200.5"]),
        ["db-0.db.default.svc.cluster.local."]
    );
    assert_eq!(
        c.short(&["-x", "10.42.200.6"]),
        ["10-42-200-6.db.default.svc.cluster.local."],
        "an endpoint without a hostname: its system-assigned name"
    );
    assert_eq!(
        c.status(&["-x", "10.42.200.7"]),
        "NXDOMAIN",
        "a not-ready endpoint has no PTR"
    );
    assert_eq!(
        c.short(&["tolerant.default.svc.cluster.local"]),
        ["10.42.201.9"],
        "publishNotReadyAddresses"
    );
    assert_eq!(
        c.short(&["ext.default.svc.cluster.local"]),
        ["192.0.2.10", "example.test."],
        "ExternalName: CNAME, chased"
    );
    assert_eq!(c.short(&["api.other.svc.cluster.local"]).len(), 1);
    // NXDOMAIN versus NODATA.
    assert_eq!(c.status(&["nope.default.svc.cluster.local"]), "NXDOMAIN");
    assert_eq!(
        c.status(&["db-2.db.default.svc.cluster.local"]),
        "NXDOMAIN",
        "not-ready endpoint has no name"
    );
    assert_eq!(
        c.status(&["empty.default.svc.cluster.local"]),
        "NXDOMAIN",
        "headless without endpoints"
    );
    assert_eq!(
        c.status(&["web.default.svc.cluster.local", "AAAA"]),
        "NOERROR"
    );
    assert!(
        c.short(&["web.default.svc.cluster.local", "AAAA"])
            .is_empty()
    );
    assert_eq!(
        c.status(&["default.svc.cluster.local"]),
        "NOERROR",
        "empty non-terminal"
    );
    assert_eq!(c.status(&["-x", "10.42.250.250"]), "NXDOMAIN");
    let ttl: Vec<u32> = c
        .dig(&["+noall", "+answer", "web.default.svc.cluster.local"])
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
        .collect();
    assert_eq!(ttl, [5]);

    // getent, through glibc and the search path.
    assert_eq!(c.getent("web").as_deref(), Some(web_ip.as_str()));
    assert_eq!(
        c.getent("api.other")
            .as_deref()
            .map(|s| s.starts_with("10.43.")),
        Some(true)
    );
    assert_eq!(
        c.getent("example.test").as_deref(),
        Some("192.0.2.10"),
        "an external name"
    );
    assert_eq!(c.getent("db-0.db").as_deref(), Some("10.42.200.5"));
    assert_eq!(c.getent("no-such-name-anywhere"), None);

    // The search walk of an external name is answered in one round trip.
    let before = c.stats()["autopath"].as_u64().unwrap();
    let walk = c.dig(&["example.test.default.svc.cluster.local"]);
    assert!(
        walk.contains("status: NOERROR") && walk.contains("192.0.2.10") && walk.contains("CNAME"),
        "{walk}"
    );
    assert!(c.stats()["autopath"].as_u64().unwrap() > before);

    // Cluster names never reached the upstream.
    let upstream_log = std::fs::read_to_string(dir.path().join("dnsmasq.log")).unwrap();
    assert!(
        !upstream_log.contains("cluster.local"),
        "cluster names leaked upstream:\n{upstream_log}"
    );
    assert!(upstream_log.contains("example.test"));

    // A Service created now resolves, from the watch, with nothing restarted (how soon is
    // measured by bench/dns: this machine is too noisy for a time limit in a test).
    assert_eq!(c.status(&["fresh.default.svc.cluster.local"]), "NXDOMAIN");
    c.c.cp.apply("apiVersion: v1\nkind: Service\nmetadata: {name: fresh, namespace: default}\nspec:\n  ports: [{port: 80}]\n").unwrap();
    let fresh_ip = wait_for("fresh to resolve", Duration::from_secs(60), || {
        Ok(c.short(&["fresh.default.svc.cluster.local"]).pop())
    })
    .unwrap();
    assert_eq!(
        c.c.cp.kubectl_json(&["get", "svc", "fresh"]).unwrap()["spec"]["clusterIP"],
        fresh_ip.as_str()
    );

    // EDNS and truncation: without EDNS a big answer is truncated over UDP and dig gets it
    // whole over TCP; with EDNS it fits... or is truncated at 1232 and retried too.
    let tc = c.dig(&["+noedns", "+ignore", "big.example.test", "TXT"]);
    assert!(tc.contains(" tc"), "flags carry tc: {tc}");
    let full = c.short(&["+noedns", "big.example.test", "TXT"]);
    assert_eq!(full.len(), 1);
    assert!(full[0].contains("11-xxx"), "{full:?}");
    assert!(
        c.dig(&["+tcp", "web.default.svc.cluster.local"])
            .contains(&web_ip),
        "TCP"
    );

    // Upstream down: names resolved before are still answered, stale, and counted.
    assert_eq!(c.short(&["example.test"]), ["192.0.2.10"]);
    dnsmasq.kill_now();
    std::thread::sleep(Duration::from_secs(3)); // past dnsmasq's 2 s TTL
    let stale_before = c.stats()["stale"].as_u64().unwrap();
    assert_eq!(
        c.short(&["example.test"]),
        ["192.0.2.10"],
        "stale answer while the upstream is down"
    );
    assert!(c.stats()["stale"].as_u64().unwrap() > stale_before);
    assert_eq!(c.status(&["never-seen.example.org"]), "SERVFAIL");
    // Upstream back with new data: fresh answers.
    let _dnsmasq = upstream(&topo.host, dir.path(), "192.0.2.11");
    wait_for("fresh answers", Duration::from_secs(10), || {
        Ok((c.short(&["example.test"]) == ["192.0.2.11"]).then_some(()))
    })
    .unwrap();

    let stats = c.stats();
    eprintln!("dns stats: {stats}");
    for k in [
        "cluster",
        "cache_hits",
        "upstream_queries",
        "stale",
        "autopath",
    ] {
        assert!(stats[k].as_u64().unwrap() > 0, "{k} counted: {stats}");
    }
    assert!(stats["upstream_latency_mean_ms"].as_f64().is_some());
}

#[test]
fn malformed_queries_truncated_packets_and_bad_tcp_frames_never_wedge_the_server() {
    let topo = Topology::new(1, Reach::HostOnly).unwrap();
    let dir = TempDir::new("dns").unwrap();
    let _dnsmasq = upstream(&topo.host, dir.path(), "192.0.2.10");
    let mesh = MeshCluster::start(&topo, MeshOptions::default()).unwrap();
    let node = &topo.node(1).ns;
    let server: SocketAddr = format!("{DNS}:53").parse().unwrap();
    wait_for("DNS up", Duration::from_secs(10), || {
        Ok(
            testbed::probe::dig(node, DNS, "dns-version.cluster.local", "TXT")
                .ok()
                .filter(|a| !a.is_empty())
                .map(|_| ()),
        )
    })
    .unwrap();

    node.run(|| {
        let udp = UdpSocket::bind("0.0.0.0:0").unwrap();
        // Random garbage, a header alone, a header claiming questions it does not carry,
        // and a truncated real query.
        let query = hex_query();
        let mut rng = 0x2545F4914F6CDD1Du64;
        for i in 0..2000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let len = (rng % 600) as usize;
            let junk: Vec<u8> = (0..len).map(|j| (rng >> (j % 56)) as u8).collect();
            udp.send_to(&junk, server).unwrap();
            udp.send_to(&query[..(i % query.len())], server).unwrap();
        }
        udp.send_to(
            &[0x12, 0x34, 0x01, 0x00, 0x00, 0x05, 0, 0, 0, 0, 0, 0],
            server,
        )
        .unwrap();
        // TCP: a frame that claims 65535 bytes and stops; a zero-length frame; garbage.
        let mut slow = TcpStream::connect(server).unwrap();
        slow.write_all(&[0xff, 0xff, 1, 2, 3]).unwrap();
        let mut zero = TcpStream::connect(server).unwrap();
        zero.write_all(&[0, 0]).unwrap();
        let mut buf = [0u8; 16];
        zero.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        assert!(
            matches!(zero.read(&mut buf), Ok(0) | Err(_)),
            "zero-length frame: hung up"
        );
        let mut junk = TcpStream::connect(server).unwrap();
        junk.write_all(&[0, 20]).unwrap();
        junk.write_all(&[0xde; 20]).unwrap();
        std::mem::forget(slow); // keeps its connection half-sent while we go on
    })
    .unwrap();

    // Still answering, over UDP and TCP (how soon after the flood: bench/dns).
    assert_eq!(
        testbed::probe::dig(node, DNS, "dns-version.cluster.local", "TXT").unwrap(),
        ["\"1.1.0\""]
    );
    let out = node
        .exec(
            "dig",
            &[
                "+short",
                "+tcp",
                "+time=2",
                &format!("@{DNS}"),
                "example.test",
            ],
        )
        .unwrap();
    assert_eq!(out.trim(), "192.0.2.10");
    let stats: serde_json::Value =
        serde_json::from_str(&mesh.cli(1, &["dns", "stats", "--json"]).unwrap()).unwrap();
    assert!(
        stats["formerr"].as_u64().unwrap() + stats["dropped"].as_u64().unwrap() > 1000,
        "{stats}"
    );
}

/// A query for dns-version.cluster.local TXT, by hand.
fn hex_query() -> Vec<u8> {
    let mut q = vec![0xab, 0xcd, 0x01, 0x00, 0x00, 0x01, 0, 0, 0, 0, 0, 0];
    for label in ["dns-version", "cluster", "local"] {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 16, 0, 1]);
    q
}
