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

use testbed::broker::{Broker, BrokerOptions};
use testbed::release::{PREVIOUS_COMMIT, PREVIOUS_VERSION, previous};
use testbed::ticker::Ticker;
use testbed::tmp::TempDir;
use testbed::user::{User, text};
use testbed::world::World;

fn step(t: Instant, what: &str) {
    eprintln!("[{:>6.1}s] {what}", t.elapsed().as_secs_f64());
}

/// Whether a process runs `program`.
fn runs(program: &std::path::Path) -> bool {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| std::fs::read_link(e.path().join("exe")).is_ok_and(|exe| exe == program))
}

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
    let ticker = Ticker::start(&b, &work, dir.path());
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
    b.wait_state("sleepy", "hibernating", Duration::from_secs(90));
    step(
        t,
        &format!(
            "v{PREVIOUS_VERSION}: work (node {}, a Pod), sleepy (hibernating), idle (awake)",
            ticker.node
        ),
    );

    // The upgrade: stopped as systemd stops it, this build started on the same files.
    b.stop_broker().unwrap();
    b.opts.broker_bin = None;
    b.start_broker().unwrap();
    b.wait_state("work", "ready", Duration::from_secs(120));
    b.wait_state("idle", "ready", Duration::from_secs(120));
    assert_eq!(b.listed("sleepy")["state"], "hibernating", "asleep still");
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
    ticker.assert_back(&b, &work, "work");
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
    b.wait_state("sleepy", "ready", Duration::from_secs(30));
    step(t, "the hibernated cluster woke at its user's request");
}
