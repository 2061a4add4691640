//! socialweb-cni, called exactly as containerd calls it, side by side with Debian's reference
//! `bridge` + `host-local` where the reference speaks the verb.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use testbed::cni::{Call, Outcome, result_ip, workspace_bin};
use testbed::tmp::TempDir;
use testbed::{Netns, link, probe};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Impl {
    Ours,
    Reference,
}

const NET: &str = "podnet";

impl Impl {
    fn plugin(self) -> PathBuf {
        match self {
            Impl::Ours => workspace_bin("socialweb-cni"),
            Impl::Reference => {
                let p = PathBuf::from("/usr/lib/cni/bridge");
                assert!(
                    p.is_file(),
                    "{} missing: ./x test installs containernetworking-plugins",
                    p.display()
                );
                p
            }
        }
    }

    /// The same network in each plugin's terms, at a version both speak.
    fn config(self, version: &str, subnet: &str, data: &Path) -> Value {
        match self {
            Impl::Ours => json!({
                "cniVersion": version, "name": NET, "type": "socialweb-cni",
                "bridge": "cni0", "subnet": subnet, "mtu": 1280,
                "dataDir": data.to_string_lossy(),
            }),
            Impl::Reference => json!({
                "cniVersion": version, "name": NET, "type": "bridge",
                "bridge": "cni0", "isGateway": true, "mtu": 1280, "hairpinMode": true,
                "ipam": {
                    "type": "host-local", "subnet": subnet,
                    "dataDir": data.to_string_lossy(),
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            }),
        }
    }

    /// Addresses the plugin's store holds.
    fn allocated(self, data: &Path) -> Vec<String> {
        match self {
            Impl::Ours => {
                let path = data.join(NET).join("allocations.json");
                let Ok(text) = std::fs::read_to_string(path) else {
                    return Vec::new();
                };
                let table: Value = serde_json::from_str(&text).unwrap();
                table["allocations"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|a| a["ip"].as_str().unwrap().to_string())
                    .collect()
            }
            Impl::Reference => std::fs::read_dir(data.join(NET))
                .map(|d| {
                    d.filter_map(|e| e.ok())
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .filter(|n| n.parse::<std::net::Ipv4Addr>().is_ok())
                        .collect()
                })
                .unwrap_or_default(),
        }
    }
}

/// A node namespace, a scratch data dir and the plugin under test.
struct Fixture {
    imp: Impl,
    plugin: PathBuf,
    data: TempDir,
    node: Netns,
}

impl Fixture {
    fn new(imp: Impl) -> Fixture {
        Fixture {
            imp,
            plugin: imp.plugin(),
            data: TempDir::new("cni").unwrap(),
            node: Netns::new("cninode").unwrap(),
        }
    }

    fn config(&self, version: &str, subnet: &str) -> Value {
        self.imp.config(version, subnet, self.data.path())
    }

    fn call(&self, call: &Call<'_>, config: &Value) -> Outcome {
        call.run(&self.node, &self.plugin, config).unwrap()
    }

    fn add(&self, id: &str, pod: &Netns, config: &Value) -> Value {
        self.call(&Call::for_pod("ADD", id, pod), config)
            .expect_ok("ADD")
            .unwrap()
            .json
    }

    fn allocated(&self) -> Vec<String> {
        self.imp.allocated(self.data.path())
    }

    fn node_links(&self) -> Vec<String> {
        link::links(&self.node).unwrap()
    }
}

fn with_prev(config: &Value, prev: &Value) -> Value {
    let mut c = config.clone();
    c["prevResult"] = prev.clone();
    c
}

/// The scenario the issue names, run against one implementation.
fn add_check_del_scenario(imp: Impl) {
    let f = Fixture::new(imp);
    let conf = f.config("1.0.0", "10.42.7.0/24");
    let a = Netns::new("poda").unwrap();
    let b = Netns::new("podb").unwrap();
    let ra = f.add("ctr-a", &a, &conf);
    let rb = f.add("ctr-b", &b, &conf);
    let ip_a = result_ip(&ra, "eth0").expect("ADD result names eth0's address");
    let ip_b = result_ip(&rb, "eth0").unwrap();
    assert_ne!(ip_a, ip_b);
    assert_eq!(f.allocated().len(), 2, "{imp:?}");

    // Pod to pod, and pod to the gateway.
    probe::ping(&a, &ip_b, 2).unwrap();
    probe::ping(&b, "10.42.7.1", 1).unwrap();
    let mtu = a.exec("cat", &["/sys/class/net/eth0/mtu"]).unwrap();
    assert_eq!(mtu.trim(), "1280", "{imp:?} sets the MTU from the config");

    // CHECK passes, then fails once the pod's address is gone.
    let check = Call::for_pod("CHECK", "ctr-a", &a);
    f.call(&check, &with_prev(&conf, &ra))
        .expect_ok("CHECK")
        .unwrap();
    a.ip(&["addr", "flush", "dev", "eth0"]).unwrap();
    let broken = f.call(&check, &with_prev(&conf, &ra));
    assert!(
        !broken.ok,
        "{imp:?}: CHECK must fail after the address is removed"
    );
    assert!(
        broken.code().is_some(),
        "{imp:?}: an error result carries a code: {}",
        broken.stdout
    );

    // DEL twice: both succeed and the address is free.
    let del = Call::for_pod("DEL", "ctr-a", &a);
    f.call(&del, &with_prev(&conf, &ra))
        .expect_ok("first DEL")
        .unwrap();
    f.call(&del, &with_prev(&conf, &ra))
        .expect_ok("second DEL")
        .unwrap();
    assert!(!f.allocated().contains(&ip_a), "{imp:?}: {ip_a} freed");
    assert_eq!(f.allocated().len(), 1);

    // DEL without a namespace and without prevResult (the runtime lost both) still works.
    let mut gone = Call::for_pod("DEL", "ctr-b", &b);
    gone.netns = None;
    f.call(&gone, &conf)
        .expect_ok("DEL without CNI_NETNS")
        .unwrap();
    assert!(f.allocated().is_empty(), "{imp:?}: {:?}", f.allocated());
}

#[test]
fn ours_add_check_del() {
    add_check_del_scenario(Impl::Ours);
}

#[test]
fn reference_add_check_del() {
    add_check_del_scenario(Impl::Reference);
}

/// A second ADD for an attachment that exists (a runtime retrying) must fail and leave the
/// first attachment as it was: its interface, its address, its place in the pool. The pool
/// here has one address, so a plugin that gave it back would hand it to the next pod.
fn repeated_add_scenario(imp: Impl) {
    let f = Fixture::new(imp);
    // A /30: the gateway and one pod address.
    let conf = f.config("1.0.0", "10.42.17.0/30");
    let a = Netns::new("first").unwrap();
    let first = f.add("ctr-a", &a, &conf);
    let ip_a = result_ip(&first, "eth0").unwrap();
    let node_links = f.node_links();

    let again = f.call(&Call::for_pod("ADD", "ctr-a", &a), &conf);
    assert!(
        !again.ok,
        "{imp:?}: ADD of an existing attachment must fail"
    );
    assert!(again.code().is_some(), "{imp:?}: {}", again.stdout);

    // The first attachment is intact.
    let held = a.ip(&["-4", "addr", "show", "dev", "eth0"]).unwrap();
    assert!(held.contains(&format!("{ip_a}/30")), "{imp:?}: {held}");
    probe::ping(&a, "10.42.17.1", 1)
        .unwrap_or_else(|e| panic!("{imp:?}: the first pod lost its network: {e:#}"));
    assert_eq!(f.node_links(), node_links, "{imp:?}: node links unchanged");
    assert_eq!(f.allocated(), vec![ip_a.clone()], "{imp:?}");

    // Its address is still taken: the next pod finds the pool empty rather than a second
    // holder of the same address.
    let b = Netns::new("second").unwrap();
    let next = f.call(&Call::for_pod("ADD", "ctr-b", &b), &conf);
    assert!(
        !next.ok,
        "{imp:?}: the next pod was given {:?}, the first pod's address is {ip_a}",
        result_ip(&next.json, "eth0")
    );
    if imp == Impl::Ours {
        assert_eq!(again.code(), Some(103), "{}", again.stdout);
        assert!(again.msg().contains("already"), "{}", again.msg());
        assert_eq!(next.code(), Some(101), "{}", next.stdout);
    }
}

#[test]
fn ours_refuses_a_repeated_add_and_keeps_the_first_attachment() {
    repeated_add_scenario(Impl::Ours);
}

#[test]
fn reference_refuses_a_repeated_add_and_keeps_the_first_attachment() {
    repeated_add_scenario(Impl::Reference);
}

/// An ADD whose interface name is already taken inside the container fails (the spec: "If an
/// interface of the requested name already exists in the container, the CNI plugin MUST
/// return with an error") and changes nothing.
fn taken_ifname_scenario(imp: Impl) {
    let f = Fixture::new(imp);
    let conf = f.config("1.0.0", "10.42.18.0/24");
    // The bridge exists already (as the agent makes it), so only the ADD's own work counts.
    let warm = Netns::new("warm").unwrap();
    f.add("ctr-warm", &warm, &conf);
    let pod = Netns::new("taken").unwrap();
    // (A bridge: this kernel has no dummy driver; any kind of link will do.)
    pod.ip(&["link", "add", "eth0", "type", "bridge"]).unwrap();
    let (node_links, allocated) = (f.node_links(), f.allocated());

    let out = f.call(&Call::for_pod("ADD", "ctr-x", &pod), &conf);
    assert!(!out.ok, "{imp:?}: must fail");
    let kind = pod.ip(&["-d", "link", "show", "eth0"]).unwrap();
    assert!(
        kind.contains("bridge"),
        "{imp:?}: the pod's own eth0 is left: {kind}"
    );
    assert_eq!(f.node_links(), node_links, "{imp:?}: node links unchanged");
    assert_eq!(f.allocated(), allocated, "{imp:?}: no address taken");
    if imp == Impl::Ours {
        assert_eq!(out.code(), Some(103), "{}", out.stdout);
        assert!(out.msg().contains("eth0"), "{}", out.msg());
    }
}

#[test]
fn ours_refuses_an_interface_name_taken_in_the_container() {
    taken_ifname_scenario(Impl::Ours);
}

#[test]
fn reference_refuses_an_interface_name_taken_in_the_container() {
    taken_ifname_scenario(Impl::Reference);
}

/// A host interface already carries the name ours would give this attachment's host end (a
/// leftover nobody recorded): the ADD fails and leaves it alone, since it did not make it.
/// (The reference names host ends at random, so it has no such case.)
#[test]
fn ours_leaves_a_host_interface_it_did_not_create() {
    let f = Fixture::new(Impl::Ours);
    let conf = f.config("1.0.0", "10.42.19.0/24");
    let warm = Netns::new("warm").unwrap();
    f.add("ctr-warm", &warm, &conf);
    let host = socialweb_cni::plugin::host_veth_name("ctr-x", "eth0");
    f.node
        .ip(&["link", "add", &host, "type", "bridge"])
        .unwrap();
    let (node_links, allocated) = (f.node_links(), f.allocated());
    let pod = Netns::new("pod").unwrap();

    let out = f.call(&Call::for_pod("ADD", "ctr-x", &pod), &conf);
    assert!(!out.ok);
    assert_eq!(f.node_links(), node_links, "{host} is still there");
    assert_eq!(f.allocated(), allocated);
    assert!(!link::links(&pod).unwrap().contains(&"eth0".to_string()));
    assert_eq!(out.code(), Some(103), "{}", out.stdout);
    assert!(out.msg().contains(&host), "{}", out.msg());
}

#[test]
fn ours_speaks_1_1_and_the_result_describes_the_attachment() {
    let f = Fixture::new(Impl::Ours);
    let conf = f.config("1.1.0", "10.42.8.0/24");
    let pod = Netns::new("pod").unwrap();
    let r = f.add("ctr-1", &pod, &conf);
    assert_eq!(r["cniVersion"], "1.1.0");
    let ifaces = r["interfaces"].as_array().unwrap();
    assert_eq!(ifaces[0]["name"], "cni0");
    assert_eq!(ifaces[2]["name"], "eth0");
    assert_eq!(ifaces[2]["sandbox"], pod.path().to_string_lossy().as_ref());
    let ip = result_ip(&r, "eth0").unwrap();
    // The MAC follows the address: 0a:58 and the four octets.
    let octets: Vec<String> = ip
        .split('.')
        .map(|o| format!("{:02x}", o.parse::<u8>().unwrap()))
        .collect();
    assert_eq!(ifaces[2]["mac"], format!("0a:58:{}", octets.join(":")));
    let mac = pod.exec("cat", &["/sys/class/net/eth0/address"]).unwrap();
    assert_eq!(mac.trim(), ifaces[2]["mac"]);
    assert_eq!(r["routes"][0]["dst"], "0.0.0.0/0");
    assert_eq!(r["ips"][0]["gateway"], "10.42.8.1");
    let hairpin = f
        .node
        .exec(
            "cat",
            &[&format!(
                "/sys/class/net/{}/brport/hairpin_mode",
                ifaces[1]["name"].as_str().unwrap()
            )],
        )
        .unwrap();
    assert_eq!(hairpin.trim(), "1");

    let version = f.call(&Call::verb("VERSION"), &json!({"cniVersion": "1.1.0"}));
    assert!(version.ok);
    let supported: Vec<&str> = version.json["supportedVersions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(supported, ["0.4.0", "1.0.0", "1.1.0"]);
}

#[test]
fn gc_with_a_partial_valid_list_frees_exactly_the_rest() {
    let f = Fixture::new(Impl::Ours);
    let conf = f.config("1.1.0", "10.42.9.0/24");
    let pods: Vec<Netns> = (0..4)
        .map(|i| Netns::new(&format!("gc{i}")).unwrap())
        .collect();
    let ips: Vec<String> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| result_ip(&f.add(&format!("ctr-{i}"), p, &conf), "eth0").unwrap())
        .collect();
    let mut gc_conf = conf.clone();
    gc_conf["cni.dev/valid-attachments"] = json!([
        {"containerID": "ctr-0", "ifname": "eth0"},
        {"containerID": "ctr-2", "ifname": "eth0"},
    ]);
    f.call(&Call::verb("GC"), &gc_conf).expect_ok("GC").unwrap();
    let mut left = f.allocated();
    left.sort();
    let mut want = vec![ips[0].clone(), ips[2].clone()];
    want.sort();
    assert_eq!(left, want);
    // The freed pods' links are gone too; the valid ones still work.
    assert!(!link::links(&pods[1]).unwrap().contains(&"eth0".to_string()));
    assert!(!link::links(&pods[3]).unwrap().contains(&"eth0".to_string()));
    probe::ping(&pods[0], &ips[2], 1).unwrap();
}

#[test]
fn status_says_whether_adds_can_succeed() {
    let f = Fixture::new(Impl::Ours);
    // A /29 has 6 host addresses, one of them the gateway: room for 5 pods.
    let conf = f.config("1.1.0", "10.42.10.0/29");
    let status = f.call(&Call::verb("STATUS"), &conf);
    assert!(!status.ok);
    assert_eq!(status.code(), Some(50), "no bridge yet: {}", status.stdout);
    assert!(status.msg().contains("cni0"));

    let pods: Vec<Netns> = (0..5)
        .map(|i| Netns::new(&format!("st{i}")).unwrap())
        .collect();
    for (i, p) in pods.iter().enumerate() {
        f.add(&format!("ctr-{i}"), p, &conf);
        if i == 0 {
            f.call(&Call::verb("STATUS"), &conf)
                .expect_ok("STATUS with a bridge")
                .unwrap();
        }
    }
    let full = f.call(&Call::verb("STATUS"), &conf);
    assert_eq!(full.code(), Some(50), "pool full: {}", full.stdout);
    assert!(full.msg().contains("no free address"), "{}", full.msg());
}

#[test]
fn fifty_concurrent_adds_from_separate_processes_get_fifty_addresses() {
    let f = Fixture::new(Impl::Ours);
    let conf = f.config("1.1.0", "10.42.11.0/24");
    let pods: Vec<Netns> = (0..50)
        .map(|i| Netns::new(&format!("c{i}")).unwrap())
        .collect();
    let ids: Vec<String> = (0..50).map(|i| format!("ctr-{i}")).collect();
    let running: Vec<_> = pods
        .iter()
        .zip(&ids)
        .map(|(p, id)| {
            Call::for_pod("ADD", id, p)
                .start(&f.node, &f.plugin, &conf)
                .unwrap()
        })
        .collect();
    let mut ips = Vec::new();
    for r in running {
        let out = r.finish(Duration::from_secs(60)).unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "ADD failed: {stdout} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_str(&stdout).unwrap();
        ips.push(result_ip(&v, "eth0").unwrap());
    }
    let distinct: std::collections::HashSet<_> = ips.iter().collect();
    assert_eq!(distinct.len(), 50, "{ips:?}");
    assert_eq!(f.allocated().len(), 50);
    // Every pod really holds its address: ping a few across the bridge.
    probe::ping(&pods[0], &ips[49], 1).unwrap();
    probe::ping(&pods[25], &ips[3], 1).unwrap();
}

/// Kills an ADD after it reserved an address and before it attached it.
fn crashed_add(f: &Fixture, conf: &Value, id: &str, pod: &Netns) -> String {
    let mut call = Call::for_pod("ADD", id, pod);
    call.env.push((
        socialweb_cni::plugin::FAULT_ENV,
        "hang-after-reserve".into(),
    ));
    let before = f.allocated().len();
    let child = call.start(&f.node, &f.plugin, conf).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while f.allocated().len() <= before {
        assert!(Instant::now() < deadline, "the ADD never reserved");
        std::thread::sleep(Duration::from_millis(20));
    }
    let stderr = child.kill();
    assert!(
        stderr.contains("hanging"),
        "{} ignored {}: build it as the workspace does (`cargo build --workspace --bins`, \
         where the harness turns on its fault-injection feature), not alone: {stderr}",
        f.plugin.display(),
        socialweb_cni::plugin::FAULT_ENV
    );
    assert!(
        !link::links(pod).unwrap().contains(&"eth0".to_string()),
        "nothing was attached"
    );
    f.allocated().last().unwrap().clone()
}

#[test]
fn a_crash_between_reserve_and_attach_loses_no_address_after_the_next_add() {
    let f = Fixture::new(Impl::Ours);
    // A /30 has two host addresses, one of them the gateway: one address for pods.
    let conf = f.config("1.1.0", "10.42.12.0/30");
    let victim = Netns::new("victim").unwrap();
    let lost = crashed_add(&f, &conf, "ctr-crashed", &victim);
    assert_eq!(f.allocated(), vec![lost.clone()]);

    // The pool has no other address: the next ADD succeeds only if the abandoned
    // reservation is reclaimed.
    let next = Netns::new("next").unwrap();
    let r = f.add("ctr-next", &next, &conf);
    assert_eq!(
        result_ip(&r, "eth0").unwrap(),
        lost,
        "the abandoned address was reclaimed"
    );
    assert_eq!(f.allocated(), vec![lost]);
}

#[test]
fn a_crash_between_reserve_and_attach_loses_no_address_after_gc() {
    let f = Fixture::new(Impl::Ours);
    let conf = f.config("1.1.0", "10.42.13.0/24");
    let victim = Netns::new("victim").unwrap();
    crashed_add(&f, &conf, "ctr-crashed", &victim);
    let mut gc_conf = conf.clone();
    // The runtime vouches for the crashed container (it retries ADDs it believes in): the
    // reservation is dropped anyway because its process died before attaching.
    gc_conf["cni.dev/valid-attachments"] =
        json!([{"containerID": "ctr-crashed", "ifname": "eth0"}]);
    f.call(&Call::verb("GC"), &gc_conf).expect_ok("GC").unwrap();
    assert!(f.allocated().is_empty(), "{:?}", f.allocated());
}

#[test]
fn bad_input_gets_the_right_code_and_changes_nothing() {
    let f = Fixture::new(Impl::Ours);
    let good = f.config("1.1.0", "10.42.14.0/30");
    let pod = Netns::new("bad").unwrap();
    // Fill the one free address so the pool is exhausted.
    let filler = Netns::new("filler").unwrap();
    f.add("ctr-filler", &filler, &good);

    let links_before = f.node_links();
    let table_before = std::fs::read(f.data.path().join(NET).join("allocations.json")).unwrap();
    let pod_links_before = link::links(&pod).unwrap();

    let mut not_a_network = good.clone();
    not_a_network["subnet"] = json!("10.42.14.5/24");
    let mut old = good.clone();
    old["cniVersion"] = json!("0.2.0");
    let mut missing_netns = Call::for_pod("ADD", "ctr-x", &pod);
    missing_netns.netns = None;

    let cases: Vec<(&str, Call<'_>, Value, u64, &str)> = vec![
        (
            "malformed JSON",
            Call::for_pod("ADD", "ctr-x", &pod),
            json!("{not json"),
            6,
            "JSON",
        ),
        (
            "missing CNI_NETNS",
            missing_netns,
            good.clone(),
            4,
            "CNI_NETNS",
        ),
        (
            "unsupported cniVersion",
            Call::for_pod("ADD", "ctr-x", &pod),
            old,
            1,
            "0.2.0",
        ),
        (
            "subnet not a network",
            Call::for_pod("ADD", "ctr-x", &pod),
            not_a_network,
            7,
            "subnet",
        ),
        (
            "exhausted pool",
            Call::for_pod("ADD", "ctr-x", &pod),
            good.clone(),
            101,
            "no free address",
        ),
    ];
    for (what, call, config, code, needle) in cases {
        // A string config is sent as raw text, not as a JSON string.
        let out = if let Value::String(raw) = &config {
            call.run_raw(&f.node, &f.plugin, raw.as_bytes()).unwrap()
        } else {
            f.call(&call, &config)
        };
        assert!(!out.ok, "{what}: must fail");
        assert_eq!(out.code(), Some(code), "{what}: {}", out.stdout);
        assert!(
            out.msg().contains(needle) || out.stdout.contains(needle),
            "{what}: {}",
            out.stdout
        );
        assert_eq!(f.node_links(), links_before, "{what}: node links unchanged");
        assert_eq!(
            link::links(&pod).unwrap(),
            pod_links_before,
            "{what}: pod unchanged"
        );
        let table = std::fs::read(f.data.path().join(NET).join("allocations.json")).unwrap();
        assert_eq!(table, table_before, "{what}: allocation table unchanged");
    }
}

#[test]
fn chained_before_the_reference_portmap_a_host_port_reaches_the_pod() {
    // The conflist containerd would run: our plugin, then portmap with the pod's port
    // mappings; portmap gets our result as prevResult.
    let f = Fixture::new(Impl::Ours);
    let conf = f.config("1.0.0", "10.42.15.0/24");
    f.node
        .ip(&["addr", "add", "192.0.2.10/32", "dev", "lo"])
        .unwrap();
    let pod = Netns::new("web").unwrap();
    let ours = f.add("ctr-web", &pod, &conf);
    let pod_ip = result_ip(&ours, "eth0").unwrap();

    let portmap = json!({
        "cniVersion": "1.0.0", "name": NET, "type": "portmap",
        "capabilities": {"portMappings": true},
        "runtimeConfig": {"portMappings": [
            {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}
        ]},
        "prevResult": ours,
    });
    let pm = Path::new("/usr/lib/cni/portmap");
    let add = Call::for_pod("ADD", "ctr-web", &pod)
        .run(&f.node, pm, &portmap)
        .unwrap();
    let add = add.expect_ok("portmap ADD").unwrap();
    assert_eq!(
        result_ip(&add.json, "eth0").unwrap(),
        pod_ip,
        "portmap passes our result on"
    );

    let server =
        probe::EchoServer::start(&pod, SocketAddr::new(pod_ip.parse().unwrap(), 80)).unwrap();
    // From the node itself to its own address on the host port: portmap's OUTPUT rule
    // covers locally originated traffic.
    f.node
        .exec(
            "sysctl",
            &["-q", "-w", "net.ipv4.conf.all.route_localnet=1"],
        )
        .unwrap();
    probe::tcp_exchange(
        &f.node,
        "192.0.2.10:8080".parse().unwrap(),
        b"through portmap",
    )
    .unwrap();
    let _ = server.next_peer(Duration::from_secs(5)).unwrap();

    // DEL in reverse order, as the runtime does.
    let mut pm_del = portmap.clone();
    pm_del["prevResult"] = add.json.clone();
    Call::for_pod("DEL", "ctr-web", &pod)
        .run(&f.node, pm, &pm_del)
        .unwrap()
        .expect_ok("portmap DEL")
        .unwrap();
    f.call(&Call::for_pod("DEL", "ctr-web", &pod), &conf)
        .expect_ok("DEL")
        .unwrap();
    assert!(f.allocated().is_empty());
}

#[test]
fn addresses_held_before_a_reboot_are_reclaimed_by_the_next_add() {
    let f = Fixture::new(Impl::Ours);
    let conf = f.config("1.1.0", "10.42.16.0/30");
    let old = Netns::new("oldboot").unwrap();
    let r = f.add("ctr-old", &old, &conf);
    let held = result_ip(&r, "eth0").unwrap();
    // Rewrite the table as if it had been written in an earlier boot (the host-local
    // reference keeps such addresses forever: containernetworking/plugins#697).
    let path = f.data.path().join(NET).join("allocations.json");
    let mut table: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    table["allocations"][0]["boot_id"] = json!("00000000-0000-0000-0000-000000000000");
    std::fs::write(&path, table.to_string()).unwrap();

    let new = Netns::new("newboot").unwrap();
    let r = f.add("ctr-new", &new, &conf);
    assert_eq!(result_ip(&r, "eth0").unwrap(), held);
}
