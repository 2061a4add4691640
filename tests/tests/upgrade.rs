//! Upgrades (docs/operations.md, "Upgrades and skew"): the previous release's broker
//! (`testbed::release`: v0.1.0, built from its commit) runs a state directory with three
//! clusters -- awake with a node rented from a provider machine and a Pod on it, hibernated,
//! awake with none -- and is stopped as `systemctl restart` stops it (SIGTERM); this commit's
//! broker starts on the same configuration file and state directory. Its store, the clusters'
//! datastores and keys, the identities its nodes hold and its configuration are the previous
//! release's: every cluster is back in its state, the same kubeconfigs answer, the node
//! reconnects by itself with its Pod never restarted, and the hibernated cluster wakes at its
//! user's first request. The provider machine runs this commit's provider throughout (the
//! order docs/operations.md gives: providers first); its node runs the previous release's
//! agent and CNI plugin throughout (a VM node keeps the agent of the image it booted).

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use testbed::broker::{Broker, BrokerOptions};
use testbed::k8s::wait_for;
use testbed::release::{PREVIOUS_COMMIT, PREVIOUS_VERSION, previous};
use testbed::tmp::TempDir;
use testbed::user::{User, text};
use testbed::world::World;

fn step(t: Instant, what: &str) {
    eprintln!("[{:>6.1}s] {what}", t.elapsed().as_secs_f64());
}

fn listed(b: &Broker<'_>, name: &str) -> Value {
    let all = b.cli_json(&["cluster", "list"]).unwrap_or(Value::Null);
    all.as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == name)
        .cloned()
        .unwrap_or(Value::Null)
}

fn wait_state(b: &Broker<'_>, name: &str, state: &str, within: Duration) {
    wait_for(&format!("cluster {name} {state}"), within, || {
        Ok((listed(b, name)["state"] == state).then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}: {}\n{}", listed(b, name), b.diagnostics()));
}

/// Whether a process runs `program`.
fn runs(program: &std::path::Path) -> bool {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| std::fs::read_link(e.path().join("exe")).is_ok_and(|exe| exe == program))
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

#[test]
fn this_broker_takes_over_the_previous_releases_state_with_clusters_awake_hibernated_and_with_nodes()
 {
    let t = Instant::now();
    let old = previous().unwrap();
    let said = Command::new(&old.broker).arg("--version").output().unwrap();
    let said = text(&said);
    // Built from `git archive` of the pinned commit: a source tarball's broker says
    // `commit unknown` (its build.rs finds no checkout), and the version is the release's.
    assert!(
        said.contains(&format!(" {PREVIOUS_VERSION} ")) && said.contains("commit unknown"),
        "the previous release's broker ({}) says {said}",
        &PREVIOUS_COMMIT[..12]
    );
    step(
        t,
        &format!("the previous release's broker: {}", said.trim()),
    );

    let world = World::new(1).unwrap();
    let mut b = Broker::start(
        &world,
        BrokerOptions {
            providers: 1,
            max_nodes: 1,
            hold: Duration::from_secs(600),
            broker_bin: Some(old.broker.clone()),
            // Its nodes run the previous release's agent and CNI plugin throughout, as a VM
            // node booted from the previous node image does after the upgrade.
            node_bins: Some((old.agent.clone(), old.cni.clone())),
            ..Default::default()
        },
    )
    .unwrap();
    let dir = TempDir::new("upgrade").unwrap();
    for user in ["work", "sleepy"] {
        std::fs::create_dir_all(dir.path().join(user)).unwrap();
    }
    // Awake, with a node.
    let work = User::new(&b, &dir.path().join("work"), "work");
    let manifest = dir.path().join("ticker.yaml");
    std::fs::write(&manifest, TICKER).unwrap();
    work.ok(&b, &["apply", "-f", manifest.to_str().unwrap()]);
    work.ok(
        &b,
        &[
            "wait",
            "--for=condition=Ready",
            "pod/ticker",
            "--timeout=240s",
        ],
    );
    let pod = work.json(&b, &["get", "pod", "ticker"]);
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
    let node = pod["spec"]["nodeName"].as_str().unwrap().to_string();
    let admin = std::fs::read(b.kubeconfig("work")).unwrap();
    // Hibernated, with an object its user will ask for.
    let sleepy = User::new(&b, &dir.path().join("sleepy"), "sleepy");
    sleepy.ok(&b, &["create", "configmap", "kept", "--from-literal=k=v"]);
    b.cli(&["cluster", "set", "sleepy", "--hibernate-after", "3s"])
        .unwrap();
    // Awake, no node, never hibernating.
    b.cli_json(&["cluster", "create", "idle", "--hibernate-after", "0"])
        .unwrap();
    b.kubectl(
        "idle",
        &["create", "configmap", "kept", "--from-literal=k=v"],
    )
    .unwrap();
    wait_state(&b, "sleepy", "hibernating", Duration::from_secs(90));
    step(
        t,
        &format!(
            "v{PREVIOUS_VERSION}: work (node {node}, a Pod), sleepy (hibernating), idle (awake)"
        ),
    );

    // The upgrade: stopped as systemd stops it, this build started on the same files.
    b.stop_broker().unwrap();
    b.opts.broker_bin = None;
    b.start_broker().unwrap();
    wait_state(&b, "work", "ready", Duration::from_secs(120));
    wait_state(&b, "idle", "ready", Duration::from_secs(120));
    assert_eq!(listed(&b, "sleepy")["state"], "hibernating", "asleep still");
    step(t, "this build took over: every cluster in its state");

    assert_eq!(
        std::fs::read(b.kubeconfig("work")).unwrap(),
        admin,
        "the same admin kubeconfig"
    );
    let kept = b
        .kubectl(
            "idle",
            &["get", "configmap", "kept", "-o", "jsonpath={.data.k}"],
        )
        .unwrap();
    assert_eq!(kept, "v");
    wait_for(
        "the node Ready again and exec working through the tunnel",
        Duration::from_secs(120),
        || {
            let ready = b.ready_nodes("work").unwrap_or_default().contains(&node);
            let exec = work.exec(&b, "ticker", &["echo", "back"]);
            Ok((ready && exec.status.success()).then_some(()))
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}\n{}", b.diagnostics()));
    let pod = work.json(&b, &["get", "pod", "ticker"]);
    assert_eq!(pod["metadata"]["uid"], uid.as_str(), "the same Pod");
    assert_eq!(
        pod["status"]["containerStatuses"][0]["restartCount"], 0,
        "never restarted"
    );
    let logs = b
        .kubectl_as(&work.kubeconfig, &[], &["logs", "--tail=1", "ticker"])
        .output()
        .unwrap();
    assert!(text(&logs).starts_with("tick"), "{}", text(&logs));
    assert_eq!(b.live_leases().unwrap().len(), 1, "the same one lease");
    assert!(
        runs(&old.agent),
        "the node's agent is the previous release's ({})",
        old.agent.display()
    );
    step(
        t,
        "the node (the previous release's agent) reconnected: Ready, the same Pod, logs and exec \
         through the tunnel",
    );

    // The hibernated cluster wakes at its user's first request, with its object.
    let got = sleepy.ok(
        &b,
        &["get", "configmap", "kept", "-o", "jsonpath={.data.k}"],
    );
    assert_eq!(got, "v");
    // (The store says `starting` until the wake's bookkeeping is done, after the answer.)
    wait_state(&b, "sleepy", "ready", Duration::from_secs(30));
    step(t, "the hibernated cluster woke at its user's request");
}
