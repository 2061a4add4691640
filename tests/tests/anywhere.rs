//! Nodes rented from anywhere (docs/tunnel.md), on the real topology: the operator's host and
//! two provider machines on an internet, each provider's nodes behind NAT (they reach out,
//! nothing reaches in). The operator's host offers nodes nothing but its public listeners,
//! and everything -- the join, logs, exec, proxy, webhooks, NodePorts across providers --
//! goes through the broker's tunnel and the mesh.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use socialweb_wire::mesh::{ENDPOINT_ANNOTATION, PublishedNodes};
use testbed::broker::{Broker, BrokerOptions, FRONT_PORT};
use testbed::k8s::wait_for;
use testbed::ticker::Ticker;
use testbed::tmp::TempDir;
use testbed::user::{User, text};
use testbed::world::{OPERATOR_ADDR, OPERATOR_ADDR_V6, OPERATOR_PRIVATE_ADDR, World};

fn step(t: Instant, what: &str) {
    eprintln!("[{:>6.1}s] {what}", t.elapsed().as_secs_f64());
}

/// Two web pods, one per node (so one per provider: each provider runs one node), a Service
/// each, and a NodePort Service in front of web-1. Each prints a tick a second.
fn workload() -> String {
    let mut m = String::new();
    for i in 1..=2 {
        m.push_str(&format!(
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
    stdin: true
    command: ["sh", "-c", "mkdir -p /www && echo \"hello from web-{i}\" > /www/index.html && httpd -p 8080 -h /www && i=0; while true; do i=$((i+1)); echo tick $i; sleep 1; done"]
    resources: {{requests: {{cpu: 100m, memory: 32Mi}}}}
---
apiVersion: v1
kind: Service
metadata: {{name: web-{i}, namespace: default}}
spec:
  selector: {{instance: web-{i}}}
  ports: [{{name: http, port: 80, targetPort: 8080}}]
---
"#
        ));
    }
    m.push_str(
        r#"apiVersion: v1
kind: Service
metadata: {name: web-1-nodeport, namespace: default}
spec:
  type: NodePort
  selector: {instance: web-1}
  ports: [{name: http, port: 80, targetPort: 8080}]
"#,
    );
    m
}

/// Each Node's name with its InternalIP.
fn node_ips(u: &User, b: &Broker<'_>) -> BTreeMap<String, String> {
    u.json(b, &["get", "nodes"])["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            let ip = n["status"]["addresses"]
                .as_array()
                .unwrap()
                .iter()
                .find(|a| a["type"] == "InternalIP")
                .unwrap()["address"]
                .as_str()
                .unwrap()
                .to_string();
            (n["metadata"]["name"].as_str().unwrap().to_string(), ip)
        })
        .collect()
}

/// Brings up the world, a broker renting from both providers (one node each), a user's
/// cluster and the workload, Running.
fn up(world: &World) -> (Broker<'_>, TempDir, User) {
    let b = Broker::start(
        world,
        BrokerOptions {
            providers: 2,
            provider_capacity: 1,
            max_nodes: 2,
            hold: Duration::from_secs(600),
            ..Default::default()
        },
    )
    .unwrap();
    let dir = TempDir::new("anywhere").unwrap();
    let u = User::new(&b, dir.path(), "any");
    let manifest = dir.path().join("web.yaml");
    std::fs::write(&manifest, workload()).unwrap();
    u.ok(&b, &["apply", "-f", manifest.to_str().unwrap()]);
    for pod in ["web-1", "web-2"] {
        u.ok(
            &b,
            &[
                "wait",
                "--for=condition=Ready",
                &format!("pod/{pod}"),
                "--timeout=240s",
            ],
        );
    }
    (b, dir, u)
}

/// A broker renting one node, held, from the world's first provider machine.
fn one_node(world: &World) -> Broker<'_> {
    Broker::start(
        world,
        BrokerOptions {
            providers: 1,
            provider_capacity: 1,
            max_nodes: 1,
            hold: Duration::from_secs(600),
            ..Default::default()
        },
    )
    .unwrap()
}

#[test]
fn behind_a_one_to_one_nat_the_broker_listens_on_its_own_address_and_nodes_join_at_the_public_one()
{
    let t = Instant::now();
    let world = World::behind_one_to_one_nat(1).unwrap();
    let b = one_node(&world);
    // The public address is on no interface of the operator's host, and the broker put it
    // nowhere: the tunnel and the relay listen on the private one.
    let addrs = world.operator.ip(&["-4", "addr"]).unwrap();
    assert!(!addrs.contains(&format!("{OPERATOR_ADDR}/")), "{addrs}");
    assert!(
        addrs.contains(&format!("{OPERATOR_PRIVATE_ADDR}/")),
        "{addrs}"
    );
    let dir = TempDir::new("one-to-one").unwrap();
    let u = User::new(&b, dir.path(), "nat");
    let kubeconfig = std::fs::read_to_string(&u.kubeconfig).unwrap();
    assert!(
        kubeconfig.contains(&format!("https://{OPERATOR_ADDR}:")),
        "users are told the public address: {kubeconfig}"
    );
    Ticker::start(&b, &u, dir.path());
    step(
        t,
        "a node behind the provider's NAT joined the broker behind the 1:1 NAT",
    );
    // logs and exec come from the apiserver through the node's tunnel: the node reached the
    // tunnel endpoint at the public address (the private one is not routed to from outside).
    let logs = u.ok(&b, &["logs", "ticker"]);
    assert!(logs.contains("tick"), "{logs}");
    let o = u.exec(&b, "ticker", &["echo", "through the tunnel"]);
    assert!(text(&o).contains("through the tunnel"), "{}", text(&o));
    let nodes = u.json(&b, &["get", "nodes"]);
    assert_eq!(nodes["items"].as_array().unwrap().len(), 1, "{nodes}");
    step(t, "logs and exec through the node's tunnel");
}

/// The provider machine's counters of what its guests send to the operator's host: IPv4
/// to any port dropped (the guests' IPv4 path to the broker cut, as for a provider whose
/// only way there is IPv6), IPv6 to the tunnel endpoint counted.
const CUT_V4_COUNT_V6: &str = "table inet cut {
  chain forward {
    type filter hook forward priority -10; policy accept;
    iifname \"swh*\" ip daddr 203.0.113.1 counter drop
    iifname \"swh*\" ip6 daddr 2001:db8:203::1 udp dport 7443 counter
  }
}
";

/// The packets a rule of [`CUT_V4_COUNT_V6`] counted, by a word of the rule.
fn counted(b: &Broker<'_>, rule: &str) -> u64 {
    let out = b.world.providers[0]
        .ns
        .exec("nft", &["list", "table", "inet", "cut"])
        .unwrap();
    let line = out.lines().find(|l| l.contains(rule)).unwrap();
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "packets").unwrap();
    words[at + 1].parse().unwrap()
}

#[test]
fn on_a_dual_stack_host_nodes_join_over_ipv6_and_users_reach_the_front_on_it() {
    let t = Instant::now();
    let world = World::dual_stack(1).unwrap();
    world.providers[0]
        .ns
        .exec_with_stdin("nft", &["-f", "-"], CUT_V4_COUNT_V6.as_bytes())
        .unwrap();
    let b = one_node(&world);
    let dir = TempDir::new("dual-stack").unwrap();
    let u = User::new(&b, dir.path(), "six");
    Ticker::start(&b, &u, dir.path());
    step(t, "a node whose only way to the broker is IPv6 joined");
    // logs and exec come from the apiserver through the node's tunnel, which can only be
    // IPv6: every IPv4 packet from the provider's guests to the operator's host is dropped.
    let logs = u.ok(&b, &["logs", "ticker"]);
    assert!(logs.contains("tick"), "{logs}");
    let o = u.exec(&b, "ticker", &["echo", "through the tunnel"]);
    assert!(text(&o).contains("through the tunnel"), "{}", text(&o));
    let (v4, v6) = (counted(&b, "ip daddr"), counted(&b, "ip6 daddr"));
    assert!(v6 > 0, "no IPv6 packet reached the tunnel endpoint");
    assert!(v4 > 0, "the node never tried IPv4: the cut proves nothing");
    step(
        t,
        &format!("logs and exec through the tunnel over IPv6 ({v6} packets; {v4} IPv4 dropped)"),
    );
    // A user on IPv6: the same kubeconfig's cluster, at the host's IPv6 address, which the
    // front's self-made certificate names.
    let kubeconfig = std::fs::read_to_string(&u.kubeconfig).unwrap();
    let path = kubeconfig
        .split_once("/clusters/")
        .and_then(|(_, rest)| rest.split(['"', '\'', '\n', ' ']).next())
        .unwrap_or_else(|| panic!("no front URL in the kubeconfig: {kubeconfig}"));
    let over_v6 = format!("--server=https://[{OPERATOR_ADDR_V6}]:{FRONT_PORT}/clusters/{path}");
    let o = b
        .kubectl_as(
            &u.kubeconfig,
            &[],
            &[&over_v6, "get", "pod", "ticker", "-o", "name"],
        )
        .output()
        .unwrap();
    assert_eq!(text(&o).trim(), "pod/ticker", "{}", text(&o));
    step(t, "kubectl through the front at its IPv6 address");
}

/// Each provider's running leases, as the provider itself lists them (the broker's key).
fn running_leases(b: &Broker<'_>) -> Vec<usize> {
    let auth = b.provider_curl_args();
    b.providers
        .iter()
        .map(|p| {
            let leases = format!("{}/v1/leases", p.url);
            let mut args: Vec<&str> = vec!["-sf", "--max-time", "5"];
            args.extend(auth.iter().map(String::as_str));
            args.push(&leases);
            let v: Value = serde_json::from_str(&b.host.exec("curl", &args).unwrap()).unwrap();
            v["leases"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|l| l["state"] == "running")
                .count()
        })
        .collect()
}

/// A Pod no other Pod of `app=<app>` shares a node with.
fn apart(app: &str, name: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default, labels: {{app: {app}}}}}
spec:
  terminationGracePeriodSeconds: 1
  affinity:
    podAntiAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
      - topologyKey: kubernetes.io/hostname
        labelSelector: {{matchLabels: {{app: {app}}}}}
  containers:
  - name: c
    image: socialweb.local/busybox:1
    imagePullPolicy: Never
    command: ["sh", "-c", "while true; do sleep 1; done"]
    resources: {{requests: {{cpu: 100m, memory: 32Mi}}}}
"#
    )
}

#[test]
fn a_drained_provider_takes_no_new_lease_and_its_running_node_runs_on() {
    let t = Instant::now();
    let world = World::new(2).unwrap();
    let b = Broker::start(
        &world,
        BrokerOptions {
            providers: 2,
            provider_capacity: 2,
            max_nodes: 3,
            hold: Duration::from_secs(600),
            ..Default::default()
        },
    )
    .unwrap();
    let dir = TempDir::new("drain").unwrap();
    let u = User::new(&b, dir.path(), "drain");
    let run = |name: &str| {
        let manifest = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&manifest, apart("drain", name)).unwrap();
        u.ok(&b, &["apply", "-f", manifest.to_str().unwrap()]);
        u.ok(
            &b,
            &[
                "wait",
                "--for=condition=Ready",
                &format!("pod/{name}"),
                "--timeout=240s",
            ],
        );
    };
    run("first");
    let before = running_leases(&b);
    assert_eq!(before.iter().sum::<usize>(), 1, "{before:?}");
    let busy = before.iter().position(|&n| n == 1).unwrap();
    step(t, &format!("the first node runs at provider {}", busy + 1));

    let drain = |undo: bool| {
        let mut c = Command::new(testbed::cni::workspace_bin("socialweb-broker"));
        c.arg("provider-drain")
            .arg("--config")
            .arg(&b.providers[busy].config);
        if undo {
            c.arg("--undo");
        }
        let o = c.output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
        text(&o)
    };
    let said = drain(false);
    assert!(said.contains("takes no new lease"), "{said}");
    // It would have room for the second node (capacity 2), but bids on nothing: the other
    // provider rents it, and the first node runs on untouched.
    run("second");
    let after = running_leases(&b);
    assert_eq!(
        after[busy], 1,
        "the drained provider took nothing new: {after:?}"
    );
    assert_eq!(after.iter().sum::<usize>(), 2, "{after:?}");
    let first = u.json(&b, &["get", "pod", "first"]);
    assert_eq!(first["status"]["phase"], "Running", "{first}");
    assert_eq!(
        first["status"]["containerStatuses"][0]["restartCount"], 0,
        "{first}"
    );
    step(t, "the second node rented from the other provider");
    assert!(drain(true).contains("bids again"));
}

#[test]
fn nodes_of_two_providers_behind_nat_join_and_serve_through_the_brokers_endpoints_alone() {
    let t = Instant::now();
    let world = World::new(2).unwrap();
    let (b, dir, u) = up(&world);
    step(
        t,
        "two nodes rented, one from each provider, the pods Running",
    );

    // One node at each provider, each seen from the provider's own view.
    let live = running_leases(&b);
    assert_eq!(live, [1, 1], "each provider runs one node");
    let pods = u.json(&b, &["get", "pods", "-l", "app=web"]);
    let ip_of = |name: &str| -> String {
        pods["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["metadata"]["name"] == name)
            .unwrap()["status"]["podIP"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let node_of = |name: &str| -> String {
        pods["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["metadata"]["name"] == name)
            .unwrap()["spec"]["nodeName"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_ne!(node_of("web-1"), node_of("web-2"));

    // From their first packet: one ping, no retry; then by Service name.
    let o = u.exec(
        &b,
        "web-1",
        &["ping", "-c", "1", "-W", "3", &ip_of("web-2")],
    );
    assert!(
        o.status.success(),
        "the first ping across providers: {}",
        text(&o)
    );
    // A Service answers once its endpoint is published and programmed (the endpoint slice
    // controller, then each node's kube-proxy: Kubernetes' own delay after Ready, not the
    // mesh's), so this one waits.
    wait_for(
        "web-1's Service from web-2",
        Duration::from_secs(20),
        || {
            let o = u.exec(&b, "web-2", &["probe", "get", "http://web-1/"]);
            Ok(text(&o).contains("hello from web-1").then_some(()))
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}\n{}", b.diagnostics()));
    step(
        t,
        "pod to pod across providers by IP (first packet) and by Service name",
    );

    // In-cluster clients: `kubernetes.default` has an endpoint (Endpoints refuse a
    // link-local one) and reaches the apiserver through the node's tunnel, the Pod's own
    // service account token and CA verifying it.
    let sa = "/var/run/secrets/kubernetes.io/serviceaccount";
    let o = u.exec(
        &b,
        "web-2",
        &[
            "probe",
            "get",
            "--ca",
            &format!("{sa}/ca.crt"),
            "--bearer-file",
            &format!("{sa}/token"),
            "https://kubernetes.default.svc/version",
        ],
    );
    assert!(
        o.status.success() && text(&o).contains("gitVersion"),
        "the apiserver from a Pod at kubernetes.default: {}",
        text(&o)
    );
    step(t, "a Pod reaches its apiserver at kubernetes.default");

    // The mesh says how each pair is connected.
    for node in [node_of("web-1"), node_of("web-2")] {
        let st: Value =
            serde_json::from_str(&b.agent_cli(&node, &["mesh", "status", "--json"]).unwrap())
                .unwrap();
        let peer = &st["peers"][0];
        assert_eq!(peer["connected"], true, "{st}");
        let path = peer["path"].as_str().unwrap();
        assert!(
            path.starts_with("direct ") || path.starts_with("relay "),
            "{path}"
        );
        eprintln!("{node} -> {}: {path}", peer["node"]);
    }

    streams_and_proxies(&b, &u);
    step(
        t,
        "logs -f, pods/proxy and services/proxy through the front",
    );
    webhook(&b, &u, dir.path());
    step(
        t,
        "an admission webhook served by a Pod admits one object and refuses another",
    );

    a_node_names_no_address_but_its_own(&b, &u, &node_of("web-1"), &node_of("web-2"));
    step(
        t,
        "a node re-annotating its address and writing the broker's ConfigMap changes no route",
    );

    // NodePort: web-1's Service answers on every node's InternalIP, from a Pod on the other
    // provider (after the attack above: the routes the node tried to bend still hold).
    let port = u.json(&b, &["get", "service", "web-1-nodeport"])["spec"]["ports"][0]["nodePort"]
        .as_u64()
        .unwrap();
    for (node, ip) in node_ips(&u, &b) {
        let o = u.exec(
            &b,
            "web-2",
            &["probe", "get", &format!("http://{ip}:{port}/")],
        );
        if !text(&o).contains("hello from web-1") {
            for n in node_ips(&u, &b).keys() {
                let sh =
                    |p: &str, a: &[&str]| b.on_node(n, p, a).map(|o| text(&o)).unwrap_or_default();
                eprintln!("== {n} routes\n{}", sh("ip", &["route"]));
                eprintln!("== {n} addr\n{}", sh("ip", &["-br", "addr"]));
                eprintln!(
                    "== {n} mesh\n{}",
                    b.agent_cli(n, &["mesh", "status", "--json"])
                        .unwrap_or_default()
                );
                eprintln!("== {n} nft\n{}", sh("nft", &["list", "ruleset"]));
            }
        }
        assert!(
            text(&o).contains("hello from web-1"),
            "NodePort {port} on {node} ({ip}) from web-2: {}",
            text(&o)
        );
    }
    step(
        t,
        "a NodePort answers on every node's InternalIP from the other provider",
    );

    isolation(&b, &u, &ip_of("web-1"));
    step(
        t,
        "the operator's host reaches no node or Pod, a node reaches only public listeners",
    );
}

/// The device `ip route get <ip>` picks on `node`.
fn route_dev(b: &Broker<'_>, node: &str, ip: &str) -> String {
    let o = b.on_node(node, "ip", &["-o", "route", "get", ip]).unwrap();
    let out = text(&o);
    out.split_whitespace()
        .skip_while(|w| *w != "dev")
        .nth(1)
        .unwrap_or_else(|| panic!("no device in `ip route get {ip}` on {node}: {out}"))
        .to_string()
}

/// `kubectl <args>` on node `a` with its kubelet's own credentials (what a node that turned
/// on its cluster holds).
fn as_node<'b>(b: &'b Broker<'_>, a: &str) -> impl Fn(&[&str]) -> std::process::Output + 'b {
    let machine = b.agent_socket(a).unwrap().parent().unwrap().to_path_buf();
    // The kubelet's kubeconfig names its certificate inside the machine (/var/lib/kubelet,
    // which is var-lib/kubelet of a machine running this host's agent, kubelet of an image's).
    let kubelet = ["var-lib/kubelet", "kubelet"]
        .map(|d| machine.join(d))
        .into_iter()
        .find(|d| d.join("kubeconfig").is_file())
        .unwrap_or_else(|| panic!("no kubelet kubeconfig under {}", machine.display()));
    // Its client certificate is a link to a dated file, named from inside the machine too.
    let current = kubelet.join("pki/kubelet-client-current.pem");
    let dated = std::fs::read_link(&current).unwrap();
    let dated = kubelet.join("pki").join(dated.file_name().unwrap());
    let kc = std::fs::read_to_string(kubelet.join("kubeconfig"))
        .unwrap()
        .replace(
            "/var/lib/kubelet/pki/kubelet-client-current.pem",
            dated.to_str().unwrap(),
        )
        .replace("/var/lib/kubelet", kubelet.to_str().unwrap());
    let kc_path = machine.join("attacker.kubeconfig");
    std::fs::write(&kc_path, kc).unwrap();
    let kube = testbed::k8s::binaries().unwrap().kube();
    let a = a.to_string();
    move |args: &[&str]| {
        let mut all = vec!["kubectl", "--kubeconfig", kc_path.to_str().unwrap()];
        all.extend_from_slice(args);
        b.on_node(&a, kube.to_str().unwrap(), &all).unwrap()
    }
}

/// Issue 36, attack 5: node `a`, with its own kubelet credentials, names the broker's public
/// address as its own (the annotation agents once read) and tries to write the broker's
/// ConfigMap of node addresses. Node `z` routes neither to it: peers take addresses from
/// the broker only, and only inside the node range.
fn a_node_names_no_address_but_its_own(b: &Broker<'_>, u: &User, a: &str, z: &str) {
    let ips = node_ips(u, b);
    let as_node = as_node(b, a);
    let broker_addr = OPERATOR_ADDR.to_string();
    let o = as_node(&[
        "annotate",
        "node",
        a,
        "--overwrite",
        &format!("socialweb.computer/mesh-node-ip={broker_addr}"),
    ]);
    assert!(
        o.status.success(),
        "a node annotates its own Node: {}",
        text(&o)
    );
    let o = as_node(&[
        "-n",
        "kube-system",
        "patch",
        "configmap",
        "socialweb-node-addresses",
        "--type=merge",
        "-p",
        &format!(r#"{{"data": {{"{a}": "{broker_addr}"}}}}"#),
    ]);
    assert!(
        !o.status.success() && text(&o).contains("forbidden"),
        "a node wrote the broker's node addresses: {}",
        text(&o)
    );
    // What it may read: every node's address, as the broker assigned it.
    let o = as_node(&[
        "-n",
        "kube-system",
        "get",
        "configmap",
        "socialweb-node-addresses",
        "-o",
        "jsonpath={.data}",
    ]);
    let published: BTreeMap<String, String> = serde_json::from_str(&text(&o))
        .unwrap_or_else(|e| panic!("the node addresses as a node reads them: {e}: {}", text(&o)));
    let published: BTreeMap<String, String> = PublishedNodes::from_data(&published)
        .addresses
        .into_iter()
        .map(|(node, ip)| (node, ip.to_string()))
        .collect();
    assert_eq!(
        published, ips,
        "the broker's node addresses are the Nodes' InternalIPs"
    );
    // A peer that believed the annotation routed it into the mesh within a second (the
    // directory is a watch); give it three.
    std::thread::sleep(Duration::from_secs(3));
    // The mesh's TUN device is the one holding z's own node address.
    let o = b
        .on_node(z, "ip", &["-o", "-4", "addr", "show", "to", &ips[z]])
        .unwrap();
    let tun = text(&o)
        .split_whitespace()
        .nth(1)
        .unwrap_or_else(|| panic!("no device holds {z}'s {}: {}", ips[z], text(&o)))
        .to_string();
    assert_eq!(
        route_dev(b, z, &ips[a]),
        tun,
        "{z} routes {a}'s address {} into the mesh",
        ips[a]
    );
    assert_ne!(
        route_dev(b, z, &broker_addr),
        tun,
        "{z} routes the broker's address {broker_addr} into the mesh, as {a} asked"
    );
    // The node range alone refuses the broker's address; an unused one inside it is refused
    // because the address comes from the broker, not from the annotation.
    let unused = "10.41.200.1";
    let o = as_node(&[
        "annotate",
        "node",
        a,
        "--overwrite",
        &format!("socialweb.computer/mesh-node-ip={unused}"),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(route_dev(b, z, &ips[a]), tun, "{a}'s own address, after");
    assert_ne!(
        route_dev(b, z, unused),
        tun,
        "{z} routes {unused} into the mesh, as {a} asked"
    );
    // Nor may a node create the broker's ConfigMaps (were one missing).
    let o = as_node(&[
        "-n",
        "kube-system",
        "create",
        "configmap",
        "socialweb-node-addresses-2",
    ]);
    assert!(!o.status.success(), "{}", text(&o));
    let st: Value =
        serde_json::from_str(&b.agent_cli(z, &["mesh", "status", "--json"]).unwrap()).unwrap();
    assert_eq!(st["peers"][0]["node"], a, "{st}");
    assert_eq!(
        st["peers"][0]["connected"], true,
        "{z} still reaches {a}: {st}"
    );
    let o = as_node(&["annotate", "node", a, "socialweb.computer/mesh-node-ip-"]);
    assert!(o.status.success(), "{}", text(&o));
}

/// `logs -f` streams, and the apiserver's pods/proxy and services/proxy reach the Pod.
fn streams_and_proxies(b: &Broker<'_>, u: &User) {
    let mut logs = b
        .kubectl_as(&u.kubeconfig, &[], &["logs", "-f", "web-1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(logs.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let second = lines.next().unwrap().unwrap();
    assert!(
        first.starts_with("tick ") && second.starts_with("tick "),
        "{first} / {second}"
    );
    let _ = logs.kill();
    let _ = logs.wait();
    let via_pod = u.ok(
        b,
        &[
            "get",
            "--raw",
            "/api/v1/namespaces/default/pods/web-1:8080/proxy/",
        ],
    );
    assert_eq!(via_pod.trim(), "hello from web-1");
    let via_service = u.ok(
        b,
        &[
            "get",
            "--raw",
            "/api/v1/namespaces/default/services/web-2:http/proxy/",
        ],
    );
    assert_eq!(via_service.trim(), "hello from web-2");
}

/// A validating admission webhook served by a Pod behind a Service: one ConfigMap admitted,
/// another refused with the webhook's message.
fn webhook(b: &Broker<'_>, u: &User, dir: &Path) {
    let pki = socialweb_broker::pki::Pki::open_or_create(&dir.join("hook"), "hook CA").unwrap();
    let pair = pki
        .server("hook", &["probe-hook.default.svc".to_string()])
        .unwrap();
    u.ok(
        b,
        &[
            "create",
            "secret",
            "tls",
            "hook-tls",
            "--cert",
            pair.cert.to_str().unwrap(),
            "--key",
            pair.key.to_str().unwrap(),
        ],
    );
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.encode(pki.ca_pem());
    let manifest = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: probe-hook, namespace: default, labels: {{app: probe-hook}}}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: hook
    image: socialweb.local/busybox:1
    imagePullPolicy: Never
    command: ["probe", "webhook", "--cert", "/tls/tls.crt", "--key", "/tls/tls.key", "--deny", "refused-cm"]
    readinessProbe: {{tcpSocket: {{port: 8443}}, periodSeconds: 1}}
    volumeMounts: [{{name: tls, mountPath: /tls}}]
  volumes: [{{name: tls, secret: {{secretName: hook-tls}}}}]
---
apiVersion: v1
kind: Service
metadata: {{name: probe-hook, namespace: default}}
spec:
  selector: {{app: probe-hook}}
  ports: [{{port: 443, targetPort: 8443}}]
---
apiVersion: v1
kind: Namespace
metadata: {{name: hooked, labels: {{webhook-test: "true"}}}}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {{name: probe-hook}}
webhooks:
- name: probe-hook.socialweb.test
  clientConfig:
    service: {{name: probe-hook, namespace: default, path: /validate}}
    caBundle: {ca}
  rules: [{{apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [configmaps]}}]
  namespaceSelector: {{matchLabels: {{webhook-test: "true"}}}}
  failurePolicy: Fail
  sideEffects: None
  admissionReviewVersions: [v1]
  timeoutSeconds: 10
"#
    );
    let f = dir.join("hook.yaml");
    std::fs::write(&f, manifest).unwrap();
    u.ok(b, &["apply", "-f", f.to_str().unwrap()]);
    u.ok(
        b,
        &[
            "wait",
            "--for=condition=Ready",
            "pod/probe-hook",
            "--timeout=120s",
        ],
    );
    // The endpoint takes a moment to be published after the Pod is Ready.
    wait_for("the webhook to admit", Duration::from_secs(30), || {
        let o = b
            .kubectl_as(
                &u.kubeconfig,
                &[],
                &["create", "configmap", "allowed-cm", "-n", "hooked"],
            )
            .output()?;
        Ok(o.status.success().then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", b.diagnostics()));
    let o = b
        .kubectl_as(
            &u.kubeconfig,
            &[],
            &["create", "configmap", "refused-cm", "-n", "hooked"],
        )
        .output()
        .unwrap();
    assert!(!o.status.success(), "the webhook refuses refused-cm");
    assert!(
        text(&o).contains("probe webhook refuses refused-cm"),
        "{}",
        text(&o)
    );
}

/// The operator's host reaches no node address and no Pod; a node reaches the operator's
/// host on its public listeners only.
fn isolation(b: &Broker<'_>, u: &User, pod_ip: &str) {
    for (node, ip) in node_ips(u, b) {
        let o = b
            .host
            .output(
                "curl",
                &[
                    "-sk",
                    "--max-time",
                    "3",
                    &format!("https://{ip}:10250/healthz"),
                ],
            )
            .unwrap();
        assert!(
            !o.status.success(),
            "the operator's host reached {node}'s kubelet at {ip}"
        );
    }
    let o = b
        .host
        .output(
            "curl",
            &["-s", "--max-time", "3", &format!("http://{pod_ip}:8080/")],
        )
        .unwrap();
    assert!(
        !o.status.success(),
        "the operator's host reached a Pod at {pod_ip}"
    );
    // Every TCP port the operator's host listens on, tried from a node.
    let listening = b.host.exec("ss", &["-Hltn"]).unwrap();
    let ports: std::collections::BTreeSet<u16> = listening
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3))
        .filter_map(|a| a.rsplit(':').next()?.parse().ok())
        .collect();
    let node = node_ips(u, b).into_keys().next().unwrap();
    let mut reached = Vec::new();
    for port in &ports {
        // A TCP handshake with bash's /dev/tcp, from the node's own network.
        let o = b
            .on_node(
                &node,
                "timeout",
                &[
                    "3",
                    "bash",
                    "-c",
                    &format!("exec 3<>/dev/tcp/{OPERATOR_ADDR}/{port}"),
                ],
            )
            .unwrap();
        if o.status.success() {
            reached.push(*port);
        }
    }
    assert_eq!(
        reached,
        [3340, testbed::broker::FRONT_PORT],
        "a node reaches only the relay and the front among {ports:?}"
    );
}

#[test]
fn nodes_come_back_after_the_broker_restarts_and_after_a_minute_cut_off() {
    let t = Instant::now();
    let world = World::new(2).unwrap();
    let (mut b, _dir, u) = up(&world);
    let restarts = |b: &Broker<'_>| -> Vec<i64> {
        u.json(b, &["get", "pods", "-l", "app=web"])["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                p["status"]["containerStatuses"][0]["restartCount"]
                    .as_i64()
                    .unwrap()
            })
            .collect()
    };
    let uids = |b: &Broker<'_>| -> Vec<String> {
        u.json(b, &["get", "pods", "-l", "app=web"])["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["metadata"]["uid"].as_str().unwrap().to_string())
            .collect()
    };
    let before = uids(&b);
    step(t, "two nodes, the pods Running");

    b.kill_broker();
    std::thread::sleep(Duration::from_secs(3));
    b.start_broker().unwrap();
    // Each node dials the broker again by itself (within its 5 s backoff).
    wait_for(
        "exec to work again on both nodes",
        Duration::from_secs(60),
        || {
            let both = ["web-1", "web-2"]
                .iter()
                .all(|p| u.exec(&b, p, &["cat", "/www/index.html"]).status.success());
            Ok(both.then_some(()))
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}\n{}", b.diagnostics()));
    let o = b
        .kubectl_as(&u.kubeconfig, &[], &["logs", "--tail=1", "web-2"])
        .output()
        .unwrap();
    assert!(text(&o).starts_with("tick "), "{}", text(&o));
    assert_eq!(uids(&b), before, "the pods never stopped");
    assert_eq!(restarts(&b), [0, 0], "nor restarted");
    step(
        t,
        "the broker killed and started again: the tunnels came back, exec and logs work",
    );

    // Cut one node from the broker for a minute: its NAT gateway drops what goes to the
    // operator's host.
    let pods = u.json(&b, &["get", "pod", "web-1"]);
    let node = pods["spec"]["nodeName"].as_str().unwrap().to_string();
    // The node is `<prefix>n<slot>`, its NAT gateway `<prefix>g<slot>`.
    let ns = b.node_netns(&node).unwrap();
    let (prefix, slot) = ns.rsplit_once('n').unwrap();
    let gw = format!("{prefix}g{slot}");
    let nft = |rules: &str| {
        let o = Command::new("ip")
            .args(["netns", "exec", &gw, "nft", rules])
            .output()
            .unwrap();
        assert!(o.status.success(), "nft {rules}: {}", text(&o));
    };
    nft(&format!(
        "add table ip cut; add chain ip cut block {{ type filter hook forward priority -10; }}; add rule ip cut block ip daddr {OPERATOR_ADDR} drop"
    ));
    std::thread::sleep(Duration::from_secs(60));
    nft("delete table ip cut");
    wait_for(
        "the node Ready again and exec working",
        Duration::from_secs(90),
        || {
            let ready = b.ready_nodes("any").unwrap_or_default().contains(&node);
            let exec = u
                .exec(&b, "web-1", &["cat", "/www/index.html"])
                .status
                .success();
            Ok((ready && exec).then_some(()))
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}\n{}", b.diagnostics()));
    assert_eq!(uids(&b), before, "the pods survived the cut");
    assert_eq!(restarts(&b), [0, 0]);
    step(
        t,
        "a node cut from the broker for a minute recovered; its pods kept running",
    );
}

/// Issue 58, attack 4: a node, with its own kubelet credentials, annotates its Node with
/// another node's mesh endpoint id. Agents that took endpoint ids from the annotations took
/// the nodes in name order, gave the victim's id to the attacker (named before it) and
/// refused the victim as a duplicate, so a third node lost the victim's Pods until the
/// annotation was put back. They take them from the broker's ConfigMap alone now: every
/// directory stays as it was, and every Pod reaches every other.
#[test]
fn a_node_that_claims_another_nodes_endpoint_cuts_no_one_off() {
    let t = Instant::now();
    let world = World::new(2).unwrap();
    let b = Broker::start(
        &world,
        BrokerOptions {
            providers: 2,
            provider_capacity: 2,
            max_nodes: 3,
            hold: Duration::from_secs(600),
            ..Default::default()
        },
    )
    .unwrap();
    let dir = TempDir::new("claim").unwrap();
    let u = User::new(&b, dir.path(), "claim");
    let manifest = dir.path().join("pods.yaml");
    let pods = ["p1", "p2", "p3"].map(|p| apart("claim", p));
    std::fs::write(&manifest, pods.join("---\n")).unwrap();
    u.ok(&b, &["apply", "-f", manifest.to_str().unwrap()]);
    u.ok(
        &b,
        &[
            "wait",
            "--for=condition=Ready",
            "pod",
            "-l",
            "app=claim",
            "--timeout=240s",
        ],
    );
    step(t, "three nodes, a Pod on each");

    // Each node's Pod and the Pod's IP, by node name; the nodes in name order, the order a
    // directory takes them in: the attacker is named before its victim.
    let pod_on: BTreeMap<String, (String, String)> = u
        .json(&b, &["get", "pods", "-l", "app=claim"])["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let s = |v: &Value| v.as_str().unwrap().to_string();
            let pod = (s(&p["metadata"]["name"]), s(&p["status"]["podIP"]));
            (s(&p["spec"]["nodeName"]), pod)
        })
        .collect();
    let nodes: Vec<&String> = pod_on.keys().collect();
    assert_eq!(nodes.len(), 3, "a Pod on each of three nodes: {pod_on:?}");
    let (attacker, victim) = (nodes[0].as_str(), nodes[1].as_str());
    let status = |n: &str| -> Value {
        serde_json::from_str(&b.agent_cli(n, &["mesh", "status", "--json"]).unwrap()).unwrap()
    };
    let endpoint: BTreeMap<String, String> = nodes
        .iter()
        .map(|n| {
            (
                n.to_string(),
                status(n)["endpoint"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let pod_cidr: BTreeMap<String, String> = u.json(&b, &["get", "nodes"])["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            let s = |v: &Value| v.as_str().unwrap().to_string();
            (s(&n["metadata"]["name"]), s(&n["spec"]["podCIDR"]))
        })
        .collect();

    let as_attacker = as_node(&b, attacker);
    let claim = |id: &str| {
        let o = as_attacker(&[
            "annotate",
            "node",
            attacker,
            "--overwrite",
            &format!("{ENDPOINT_ANNOTATION}={id}"),
        ]);
        assert!(
            o.status.success(),
            "{attacker} annotates its Node: {}",
            text(&o)
        );
    };
    // What every node's directory must say, before the attack and after: each other node
    // at its own endpoint id and pod CIDR, connected, and no one refused. What is not so.
    let wrong = || -> Vec<String> {
        let mut out = Vec::new();
        for n in &nodes {
            let st = status(n);
            let peers: BTreeMap<String, (String, String, bool)> = st["peers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| {
                    let s = |v: &Value| v.as_str().unwrap().to_string();
                    let seen = (s(&p["endpoint"]), s(&p["pod_cidr"]), p["connected"] == true);
                    (s(&p["node"]), seen)
                })
                .collect();
            let want: BTreeMap<String, (String, String, bool)> = nodes
                .iter()
                .filter(|m| *m != n)
                .map(|m| {
                    let m = m.as_str();
                    (
                        m.to_string(),
                        (endpoint[m].clone(), pod_cidr[m].clone(), true),
                    )
                })
                .collect();
            if peers != want || st["rejected"] != serde_json::json!([]) {
                out.push(format!("{n}'s peers {peers:?}, want {want:?}: {st}"));
            }
        }
        out
    };
    wait_for(
        "every node connected to every other",
        Duration::from_secs(30),
        || Ok(wrong().is_empty().then_some(())),
    )
    .unwrap_or_else(|e| panic!("{e:#}: {:?}\n{}", wrong(), b.diagnostics()));

    claim(&endpoint[victim]);
    // A directory that believed the annotation changed within a second (it is a watch).
    std::thread::sleep(Duration::from_secs(3));
    step(
        t,
        &format!("{attacker} annotated its Node with {victim}'s endpoint id"),
    );
    let after = wrong();
    assert!(
        after.is_empty(),
        "after {attacker} claimed {victim}'s endpoint:\n{}",
        after.join("\n")
    );
    // And every Pod reaches every other, the victim's from the third node's above all.
    for from in &nodes {
        for to in nodes.iter().filter(|to| *to != from) {
            let (pod, ip) = (&pod_on[*from].0, &pod_on[*to].1);
            let o = u.exec(&b, pod, &["ping", "-c", "1", "-W", "3", ip]);
            assert!(
                o.status.success(),
                "{pod} on {from} pings {to}'s Pod {ip} after {attacker} claimed {victim}'s endpoint: {}",
                text(&o)
            );
        }
    }
    step(
        t,
        "every directory unchanged, every Pod reaches every other",
    );

    // Where the ids come from: the broker's ConfigMap, which nodes read and cannot write.
    let o = as_attacker(&[
        "-n",
        "kube-system",
        "get",
        "configmap",
        "socialweb-node-addresses",
        "-o",
        "jsonpath={.data}",
    ]);
    let data: BTreeMap<String, String> = serde_json::from_str(&text(&o)).unwrap_or_else(|e| {
        panic!(
            "the published nodes as a node reads them: {e}: {}",
            text(&o)
        )
    });
    let published = PublishedNodes::from_data(&data).endpoints;
    assert_eq!(
        published, endpoint,
        "the broker publishes every node's endpoint id"
    );
    let o = as_attacker(&[
        "-n",
        "kube-system",
        "patch",
        "configmap",
        "socialweb-node-addresses",
        "--type=merge",
        "-p",
        &format!(
            r#"{{"data": {{"endpoint_{attacker}": "{}"}}}}"#,
            endpoint[victim]
        ),
    ]);
    assert!(
        !o.status.success() && text(&o).contains("forbidden"),
        "a node wrote the broker's endpoint ids: {}",
        text(&o)
    );
    claim(&endpoint[attacker]);
}
