//! Nodes that join by themselves: machines that get nothing but an identity document and
//! `socialweb-agent run`, against a real control plane. The agent brings up containerd, the
//! kubelet (TLS bootstrapping with the identity's token) and kube-proxy, and keeps them up.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use testbed::k8s::{CaMode, Cluster, KubeNode, run_pod, wait_for, wait_node_ready};
use testbed::topology::HOST_SERVICE_ADDR;
use testbed::{Reach, Topology};

/// dnsmasq on the host: the resolver the identities name upstream. `example.test` is a name
/// only it knows.
fn upstream(topo: &Topology) -> testbed::process::Spawned {
    testbed::resolver::dnsmasq(
        &topo.host,
        HOST_SERVICE_ADDR,
        &["--address=/example.test/192.0.2.77"],
    )
    .unwrap()
}

/// Runs a command in a pod through the API (kubectl exec) and returns stdout, or the error.
fn exec(c: &Cluster<'_>, pod: &str, cmd: &[&str]) -> anyhow::Result<String> {
    let mut args = vec!["exec", pod, "--"];
    args.extend_from_slice(cmd);
    c.cp.kubectl(&args)
}

/// A web server pod on `node` and a ClusterIP Service `<name>-svc` for it.
fn web(c: &Cluster<'_>, name: &str, node: &str) -> String {
    let ip = run_pod(
        &c.cp,
        name,
        node,
        &[
            "sh",
            "-c",
            "mkdir -p /www && echo \"hello from $(hostname)\" > /www/index.html && httpd -f -p 8080 -h /www",
        ],
    )
    .unwrap();
    c.cp.apply(&format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}-svc, namespace: default}}\nspec:\n  selector: {{app: {name}}}\n  ports: [{{name: http, port: 80, targetPort: 8080}}]\n"
    ))
    .unwrap();
    ip
}

fn cluster_ip(c: &Cluster<'_>, svc: &str) -> String {
    c.cp.kubectl_json(&["get", "svc", svc]).unwrap()["spec"]["clusterIP"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn two_nodes_join_from_identity_documents_alone_and_serve_pods_services_and_names() {
    let t0 = Instant::now();
    let topo = Topology::new(2, Reach::HostOnly).unwrap();
    let _dns = upstream(&topo);
    let c = Cluster::start(&topo, |_| {}).unwrap();
    c.wait_ready(Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("{e:#}\n{}", c.diagnostics()));
    eprintln!("both nodes ready after {:.1}s", t0.elapsed().as_secs_f64());

    // Joined with the kubelet's own bootstrapped credentials, with our labels.
    for n in &c.nodes {
        let node = c.cp.kubectl_json(&["get", "node", &n.name]).unwrap();
        let labels = &node["metadata"]["labels"];
        assert_eq!(labels["socialweb.computer/node-local-dns"], "true");
        assert_eq!(labels["socialweb.computer/pool"], "test");
        assert_eq!(
            node["metadata"]["annotations"]["socialweb.computer/mesh-endpoint"],
            n.endpoint.as_str()
        );
        let status = n.status().unwrap();
        let trust = status["steps"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == "trust")
            .unwrap();
        assert!(
            trust["detail"]
                .as_str()
                .unwrap()
                .contains("accepted as system:bootstrap:"),
            "{trust}"
        );
        let children: Vec<&str> = status["children"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(children, ["containerd", "kubelet", "kube-proxy"]);
    }
    let csrs = c.cp.kubectl_json(&["get", "csr"]).unwrap();
    let approved = csrs["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|csr| {
            csr["status"]["conditions"]
                .as_array()
                .is_some_and(|cs| cs.iter().any(|x| x["type"] == "Approved"))
        })
        .count();
    assert!(approved >= 2, "each kubelet's CSR approved: {csrs}");

    // A pod on each node; each reaches the other by pod IP and through a Service, by
    // ClusterIP and by name.
    let ip_a = web(&c, "a", "node-1");
    let ip_b = web(&c, "b", "node-2");
    let ping = wait_for("a to ping b", Duration::from_secs(30), || {
        Ok(exec(&c, "a", &["ping", "-c", "2", "-W", "2", &ip_b]).ok())
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", c.diagnostics()));
    assert!(ping.contains("2 packets received"), "{ping}");
    let back = exec(&c, "b", &["ping", "-c", "1", "-W", "2", &ip_a]).unwrap();
    assert!(back.contains("1 packets received"), "{back}");
    let path = c.node(1).cli(&["mesh", "status", "--json"]).unwrap();
    assert!(
        path.contains("\"relay "),
        "nodes reach only the host: {path}"
    );

    let vip = cluster_ip(&c, "b-svc");
    let by_ip = wait_for(
        "a to reach b through its ClusterIP",
        Duration::from_secs(30),
        || {
            // (busybox-static's wget crashes with -T: no timeout flag.)
            Ok(exec(&c, "a", &["wget", "-qO-", &format!("http://{vip}/")]).ok())
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}\n{}", c.diagnostics()));
    assert_eq!(by_ip.trim(), "hello from b");
    let by_name = exec(&c, "a", &["probe", "get", "http://b-svc/"]).unwrap();
    assert_eq!(by_name.trim(), "200 hello from b");
    let back = exec(
        &c,
        "b",
        &["probe", "get", "http://a-svc.default.svc.cluster.local/"],
    )
    .unwrap();
    assert_eq!(back.trim(), "200 hello from a");

    // An external name, served only by the resolver the identity names.
    let ext = exec(&c, "a", &["probe", "lookup", "example.test"]).unwrap();
    assert_eq!(ext.trim(), "192.0.2.77");

    // The API from a Pod, with its ServiceAccount token, by name, verifying the cluster CA.
    let api = exec(
        &c,
        "b",
        &[
            "probe",
            "get",
            "--ca",
            "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
            "--bearer-file",
            "/var/run/secrets/kubernetes.io/serviceaccount/token",
            "https://kubernetes.default.svc/api",
        ],
    )
    .unwrap();
    assert!(api.starts_with("200 "), "{api}");
    assert!(api.contains("\"kind\":\"APIVersions\""), "{api}");

    // No log line carries a token's secret.
    for n in &c.nodes {
        assert!(
            !n.all_logs().contains(&n.token_secret),
            "{}'s logs carry its join token",
            n.name
        );
    }
}

/// Pods' DNS answers over and over; returns how many of `tries` failed.
fn dns_failures(node: &KubeNode, pod: &str, tries: u32) -> u32 {
    let mut failed = 0;
    for _ in 0..tries {
        let ok = node
            .pod_command(
                "default",
                pod,
                "dig",
                &[
                    "+short",
                    "+time=1",
                    "+tries=1",
                    "a-svc.default.svc.cluster.local",
                ],
            )
            .and_then(|mut c| Ok(c.output()?))
            .map(|o| o.status.success() && !o.stdout.is_empty())
            .unwrap_or(false);
        if !ok {
            failed += 1;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    failed
}

/// What the agent installs on its node, counted.
fn installed(node: &KubeNode) -> BTreeMap<&'static str, usize> {
    let run =
        |p: &str, a: &[&str]| String::from_utf8(node.enter(p, a).output().unwrap().stdout).unwrap();
    let routes = run("ip", &["-4", "route", "show", "proto", "83"]);
    let lo = run("ip", &["-4", "-o", "addr", "show", "dev", "lo"]);
    let cni0 = run("ip", &["-4", "-o", "addr", "show", "dev", "cni0"]);
    let ours = run("nft", &["list", "table", "ip", "socialweb"]);
    let tables = run("nft", &["list", "tables"]);
    let mut m = BTreeMap::new();
    m.insert("mesh routes", routes.lines().count());
    m.insert(
        "169.254.20.10 on lo",
        lo.matches("169.254.20.10/32").count(),
    );
    m.insert("cni0 addresses", cni0.lines().count());
    m.insert("masquerade rules", ours.matches("masquerade").count());
    m.insert(
        "our nft tables",
        tables
            .lines()
            .filter(|l| l.ends_with(" socialweb") || l.ends_with(" kube-proxy"))
            .count(),
    );
    for p in ["containerd", "kubelet", "kube-proxy", "socialweb-agent"] {
        m.insert(p, node.pids_of(p).len());
    }
    m
}

#[test]
fn children_are_kept_running_and_a_killed_agent_converges_without_duplicates() {
    let topo = Topology::new(2, Reach::HostOnly).unwrap();
    let _dns = upstream(&topo);
    let mut c = Cluster::start(&topo, |_| {}).unwrap();
    c.wait_ready(Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("{e:#}\n{}", c.diagnostics()));
    web(&c, "a", "node-1");
    run_pod(&c.cp, "client", "node-2", &["sleep", "3600"]).unwrap();
    assert_eq!(dns_failures(c.node(2), "client", 3), 0);

    // The kubelet of node-1 killed: the agent restarts it, the Node comes back Ready, and
    // the pods on the other node keep resolving names all along.
    let kubelet = c
        .node(1)
        .child_pid("kubelet")
        .unwrap()
        .expect("kubelet runs");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(kubelet as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let failures = dns_failures(c.node(2), "client", 30);
    let restarted = wait_for("the kubelet restarted", Duration::from_secs(30), || {
        let s = c.node(1).status()?;
        let k = s["children"]
            .as_array()
            .and_then(|cs| cs.iter().find(|x| x["name"] == "kubelet").cloned())
            .unwrap_or(Value::Null);
        Ok((k["running"] == true && k["restarts"].as_u64() >= Some(1)).then_some(k))
    })
    .unwrap();
    assert_ne!(restarted["pid"].as_u64(), Some(u64::from(kubelet)));
    wait_node_ready(&c.cp, c.node(1), Duration::from_secs(60)).unwrap();
    assert_eq!(
        failures, 0,
        "node-2's pod lost DNS while node-1's kubelet restarted"
    );
    assert_eq!(
        dns_failures(c.node(1), "a", 3),
        0,
        "node-1's own pod resolves"
    );

    // The agent SIGKILLed and started again: it converges and duplicates nothing.
    let before = installed(c.node(1));
    assert_eq!(before["containerd"], 1, "{before:?}");
    assert_eq!(before["kubelet"], 1, "{before:?}");
    assert_eq!(before["kube-proxy"], 1, "{before:?}");
    assert_eq!(before["mesh routes"], 1, "{before:?}");
    c.node_mut(1).kill_agent();
    c.node_mut(1).start_agent().unwrap();
    c.node(1)
        .wait_ready(Duration::from_secs(90))
        .unwrap_or_else(|e| panic!("{e:#}"));
    wait_node_ready(&c.cp, c.node(1), Duration::from_secs(60)).unwrap();
    wait_for("the mesh route back", Duration::from_secs(30), || {
        Ok((installed(c.node(1))["mesh routes"] == 1).then_some(()))
    })
    .unwrap();
    let after = installed(c.node(1));
    assert_eq!(before, after, "after the agent's restart");
    let ping = wait_for(
        "node-2's pod to reach node-1's",
        Duration::from_secs(30),
        || Ok(exec(&c, "client", &["probe", "get", "http://a-svc/"]).ok()),
    )
    .unwrap();
    assert_eq!(ping.trim(), "200 hello from a");

    // SIGTERM: children stopped in order, everything the agent installed removed; the node
    // starts again afterwards.
    let status = c.node_mut(1).stop_agent(Duration::from_secs(60)).unwrap();
    assert!(status.success(), "agent exit: {status}");
    let gone = installed(c.node(1));
    for (what, n) in &gone {
        let expected = match *what {
            // The bridge stays (pods are still attached to it) and so does its address.
            "cni0 addresses" => 1,
            // Processes, routes, the DNS address, our and kube-proxy's nft tables.
            _ => 0,
        };
        assert_eq!(
            *n,
            expected,
            "{what} after SIGTERM: {gone:?}\n{}",
            c.node(1).diagnostics()
        );
    }
    c.node_mut(1).start_agent().unwrap();
    c.node(1).wait_ready(Duration::from_secs(90)).unwrap();
    // kube-proxy writes its tables and the mesh its route moments after the agent is ready.
    wait_for(
        "the node to converge again",
        Duration::from_secs(30),
        || {
            let now = installed(c.node(1));
            Ok((now == before).then_some(()))
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}: {:?} vs {before:?}", installed(c.node(1))));
}

#[test]
fn a_wrong_pin_a_wrong_token_and_an_unreachable_server_are_refused_with_a_clear_status() {
    let topo = Topology::new(4, Reach::HostOnly).unwrap();
    let c = Cluster::start(&topo, |o| {
        let over = &mut o.identity_overrides;
        match o.name.as_str() {
            "node-1" => {
                over.insert(
                    "ca_cert_sha256".into(),
                    json!(format!("sha256:{}", "ab".repeat(32))),
                );
            }
            "node-2" => {
                over.insert("join_token".into(), json!("wrong1.0123456789abcdef"));
            }
            "node-3" => {
                over.insert("server_url".into(), json!("https://172.31.255.1:6444"));
            }
            _ => o.ca = CaMode::Pem,
        }
    })
    .unwrap();
    let expect = [
        (1, "does not match the identity's ca_cert_sha256"),
        (2, "refused join token wrong1.<secret>"),
        (3, "unreachable"),
    ];
    for (i, needle) in expect {
        let n = c.node(i);
        let step = wait_for(
            &format!("{} to report its trust step", n.name),
            Duration::from_secs(60),
            || {
                let st = n.step("trust")?;
                Ok((st["state"] == "retrying" && st["attempts"].as_u64() >= Some(2)).then_some(st))
            },
        )
        .unwrap_or_else(|e| panic!("{e:#}\n{}", n.diagnostics()));
        let err = step["last_error"].as_str().unwrap();
        assert!(err.contains(needle), "{}: {err}", n.name);
        assert_eq!(
            n.child_pid("kubelet").unwrap(),
            None,
            "{} started a kubelet",
            n.name
        );
        let human = n.cli(&["status"]).unwrap();
        assert!(human.contains(needle), "{human}");
    }
    // The one with the CA given in full joins.
    c.node(4).wait_ready(Duration::from_secs(120)).unwrap();
    // No secret in any log: not the tokens of the refused nodes, not the one that joined.
    for n in &c.nodes {
        assert!(
            !n.all_logs().contains(&n.token_secret),
            "{}'s logs carry its token",
            n.name
        );
    }
    assert!(!c.node(2).all_logs().contains("0123456789abcdef"));
    assert_eq!(c.cp.node_names().unwrap(), vec!["node-4"]);
}
