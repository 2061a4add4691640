//! `socialweb-broker backup` and `restore` (docs/operations.md, "Backup and restore"), end to
//! end with the real broker and control plane: a backup taken while the broker and its
//! cluster serve, with a node rented from a provider machine and a Pod on it, the state
//! directory destroyed, restored, and the same kubeconfigs (the admin's and a user's through
//! the front) answer with the object created before, and the node reconnects by itself: Ready
//! again, the same Pod never restarted, its logs and exec through the tunnel.

use std::time::{Duration, Instant};

use serde_json::Value;
use testbed::broker::{Broker, BrokerOptions};
use testbed::k8s::wait_for;
use testbed::tmp::TempDir;
use testbed::user::User;
use testbed::world::World;

fn step(t: Instant, what: &str) {
    eprintln!("[{:>6.1}s] {what}", t.elapsed().as_secs_f64());
}

fn state_of(b: &Broker<'_>, name: &str) -> Value {
    let all = b.cli_json(&["cluster", "list"]).unwrap_or(Value::Null);
    all.as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == name)
        .map(|c| c["state"].clone())
        .unwrap_or(Value::Null)
}

#[test]
fn a_backup_taken_while_serving_brings_the_cluster_back_into_an_empty_state_directory() {
    let t = Instant::now();
    let world = World::new(1).unwrap();
    let mut b = Broker::start(
        &world,
        BrokerOptions {
            providers: 1,
            max_nodes: 1,
            // The node stays through the broker's absence.
            hold: Duration::from_secs(600),
            ..Default::default()
        },
    )
    .unwrap();
    let dir = TempDir::new("backup").unwrap();
    let u = User::new(&b, dir.path(), "keep");
    b.kubectl(
        "keep",
        &["create", "configmap", "kept", "--from-literal=k=v"],
    )
    .unwrap();
    let admin = dir.path().join("admin.kubeconfig");
    std::fs::copy(b.kubeconfig("keep"), &admin).unwrap();
    let manifest = dir.path().join("ticker.yaml");
    std::fs::write(&manifest, TICKER).unwrap();
    u.ok(&b, &["apply", "-f", manifest.to_str().unwrap()]);
    u.ok(
        &b,
        &[
            "wait",
            "--for=condition=Ready",
            "pod/ticker",
            "--timeout=240s",
        ],
    );
    let pod = u.json(&b, &["get", "pod", "ticker"]);
    let (uid, node) = (
        pod["metadata"]["uid"].as_str().unwrap().to_string(),
        pod["spec"]["nodeName"].as_str().unwrap().to_string(),
    );
    step(
        t,
        &format!("a cluster with a ConfigMap, a Pod on node {node}"),
    );

    // While it serves.
    let to = dir.path().join("b");
    let t0 = Instant::now();
    let m: Value = serde_json::from_str(
        &b.operator("backup", &["--to", to.to_str().unwrap(), "--json"])
            .unwrap(),
    )
    .unwrap();
    let took = t0.elapsed();
    assert_eq!(state_of(&b, "keep"), "ready", "it served on");
    let files: Vec<&str> = m["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    for want in [
        "broker.db",
        "tunnel.key",
        "front/ca.key",
        "/kine/state.db",
        "/pki/ca.key",
    ] {
        assert!(
            files.iter().any(|f| f.contains(want)),
            "{want} in {files:?}"
        );
    }
    assert!(
        !files
            .iter()
            .any(|f| f.ends_with(".log") || f.ends_with(".pid") || f.ends_with(".sock")),
        "{files:?}"
    );
    step(
        t,
        &format!(
            "backup: {} files, {} bytes in {took:.1?}",
            files.len(),
            m["bytes"]
        ),
    );

    b.stop_broker().unwrap();
    std::fs::remove_dir_all(&b.state).unwrap();
    let out = b
        .operator("restore", &["--from", to.to_str().unwrap()])
        .unwrap();
    assert!(out.contains("restored"), "{out}");
    let again = b
        .operator("restore", &["--from", to.to_str().unwrap()])
        .unwrap_err();
    assert!(
        format!("{again:#}").contains(&format!("{} is not empty", b.state.display())),
        "{again:#}"
    );
    step(t, "stopped, state directory removed, restored");

    b.start_broker().unwrap();
    wait_for("cluster keep ready", Duration::from_secs(120), || {
        Ok((state_of(&b, "keep") == "ready").then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", b.diagnostics()));
    assert_eq!(
        std::fs::read(&admin).unwrap(),
        std::fs::read(b.kubeconfig("keep")).unwrap(),
        "the same admin kubeconfig"
    );
    let got = b
        .host
        .command(&testbed::k8s::binaries().unwrap().kube().to_string_lossy())
        .arg("kubectl")
        .arg(format!("--kubeconfig={}", admin.display()))
        .args(["get", "configmap", "kept", "-o", "jsonpath={.data.k}"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&got.stdout),
        "v",
        "{}\n{}",
        String::from_utf8_lossy(&got.stderr),
        b.diagnostics()
    );
    let through_front = u.ok(&b, &["get", "configmap", "kept", "-o", "name"]);
    assert!(through_front.contains("configmap/kept"), "{through_front}");
    step(t, "the same kubeconfigs answer, the ConfigMap is there");

    // The node was never told anything: it dials the restored broker's tunnel endpoint (the
    // same key, so the same endpoint id its identity names) and is Ready again.
    wait_for(
        "the node Ready again and exec working through the tunnel",
        Duration::from_secs(120),
        || {
            let ready = b.ready_nodes("keep").unwrap_or_default().contains(&node);
            let exec = u.exec(&b, "ticker", &["echo", "back"]);
            Ok((ready && exec.status.success()).then_some(()))
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}\n{}", b.diagnostics()));
    let logs = b
        .kubectl_as(&u.kubeconfig, &[], &["logs", "--tail=1", "ticker"])
        .output()
        .unwrap();
    assert!(
        testbed::user::text(&logs).starts_with("tick"),
        "{}",
        testbed::user::text(&logs)
    );
    let pod = u.json(&b, &["get", "pod", "ticker"]);
    assert_eq!(pod["metadata"]["uid"], uid.as_str(), "the same Pod");
    assert_eq!(
        pod["status"]["containerStatuses"][0]["restartCount"], 0,
        "never restarted"
    );
    assert_eq!(
        b.live_leases().unwrap().len(),
        1,
        "the same one lease, no other rented"
    );
    step(
        t,
        "the node reconnected by itself: Ready, the same Pod, logs and exec through the tunnel",
    );
}

/// A Pod that says it is alive every second.
const TICKER: &str = r#"apiVersion: v1
kind: Pod
metadata: {name: ticker, namespace: default}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: socialweb.local/busybox:1
    imagePullPolicy: Never
    command: ["sh", "-c", "while true; do echo tick; sleep 1; done"]
"#;
