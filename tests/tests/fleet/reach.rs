//! A fleet host cut off from its users but not from the store (issue 61; docs/operations.md,
//! "A fleet's failure modes"): its peers' probes no longer reach it while they reach each
//! other, so it gives its clusters up and another host serves them. It used to keep every
//! lease for ever, its clusters unserved.

use std::time::{Duration, Instant};

use testbed::broker::Broker;
use testbed::world::OPERATOR_ADDR;

use super::{alive, broker_id, fleet_host, fleet_of, light, owner, pid_of, step};

/// On host `b`, everything but its store's connections (PostgreSQL on the operator's host)
/// and its own loopback is dropped, both ways: no user, node or peer reaches it.
fn cut_all_but_the_store(b: &Broker<'_>) {
    b.host
        .exec_with_stdin(
            "nft",
            &["-f", "-"],
            format!(
                "table inet cut {{\n\
                 chain in {{ type filter hook input priority 0; policy drop; iifname \"lo\" accept; \
                 ip saddr {OPERATOR_ADDR} tcp sport 5432 accept; }}\n\
                 chain out {{ type filter hook output priority 0; policy drop; oifname \"lo\" accept; \
                 ip daddr {OPERATOR_ADDR} tcp dport 5432 accept; }}\n}}\n"
            )
            .as_bytes(),
        )
        .unwrap();
}

/// Watches host 1's apiserver (`apiserver`) until another host of `ids` claims the cluster,
/// within `within` of now: the apiserver must have stopped first. When it stopped, when the
/// claim came, and the index of the claiming host.
fn stopped_then_claimed(
    world: &testbed::world::World,
    a: &Broker<'_>,
    ids: &[String],
    apiserver: u32,
    within: Duration,
) -> (Duration, Duration, usize) {
    let cut = Instant::now();
    let mut stopped = None;
    let (claimed, n) = loop {
        if stopped.is_none() && !alive(apiserver) {
            stopped = Some(cut.elapsed());
        }
        let o = owner(&world.operator, "cut");
        if let Some(i) = ids[1..].iter().position(|id| o.starts_with(id.as_str())) {
            break (cut.elapsed(), i + 1);
        }
        assert!(
            cut.elapsed() < within,
            "no other host claimed the cluster within 3 TTLs of the cut (lease: {o})\n{}",
            std::fs::read_to_string(a.log("broker")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let stopped = stopped.unwrap_or_else(|| {
        panic!("host 1's apiserver still ran when another host claimed the cluster")
    });
    (stopped, claimed, n)
}

/// Three hosts; host 1 runs a cluster and is then cut from everything but PostgreSQL: its
/// peers reach each other and not it, so within three lease TTLs it has stopped the
/// control plane and another host serves the cluster with what host 1 wrote. While cut off,
/// host 1 claims nothing back; reached again, it follows the new owner.
#[test]
fn a_host_cut_off_from_its_users_but_not_the_store_gives_its_clusters_to_another() {
    let _shared = light();
    let t = Instant::now();
    let (world, pg, _keys, key) = fleet_of(3, 0);
    let ttl = Duration::from_secs(10);
    let hosts: Vec<Broker<'_>> = (1..=3)
        .map(|i| Broker::start(&world, fleet_host(&pg, &key, i)).unwrap())
        .collect();
    let ids: Vec<String> = hosts.iter().map(broker_id).collect();
    let a = &hosts[0];
    let c = a.cli_json(&["cluster", "create", "cut"]).unwrap();
    assert_eq!(c["state"], "ready", "{c}\n{}", a.diagnostics());
    for b in &hosts[1..] {
        b.wait_state("cut", "elsewhere", Duration::from_secs(30));
    }
    a.kubectl("cut", &["create", "configmap", "one", "--from-literal=k=1"])
        .unwrap();
    // The fleet has probed itself long enough for a verdict.
    std::thread::sleep(ttl);
    assert_eq!(
        a.metric("socialweb_broker_fleet_cut_off"),
        Some(0.0),
        "{}",
        a.diagnostics()
    );
    let apiserver = pid_of(&a.cluster_dir("cut").join("run/apiserver.pid"));
    step(t, "three hosts; host 1 runs the cluster");

    cut_all_but_the_store(a);
    let cut = Instant::now();
    let (stopped, claimed, n) = stopped_then_claimed(&world, a, &ids, apiserver, ttl * 3);
    let by = &hosts[n];
    by.wait_state("cut", "ready", Duration::from_secs(120));
    step(
        t,
        &format!(
            "cut off: host 1's apiserver stopped {:.1}s after the cut, host {} claimed at \
             {:.1}s, ready at {:.1}s",
            stopped.as_secs_f64(),
            n + 1,
            claimed.as_secs_f64(),
            cut.elapsed().as_secs_f64()
        ),
    );
    assert_eq!(
        by.kubectl(
            "cut",
            &["get", "configmap", "one", "-o", "jsonpath={.data.k}"]
        )
        .unwrap(),
        "1",
        "the new owner serves what host 1 wrote"
    );
    assert_eq!(a.metric("socialweb_broker_fleet_cut_off"), Some(1.0));
    let log = std::fs::read_to_string(a.log("broker")).unwrap();
    assert!(log.contains("this host is cut off from its users"), "{log}");

    // Still cut off for another TTL, host 1 claims nothing back.
    let taken = owner(&world.operator, "cut");
    std::thread::sleep(ttl);
    assert_eq!(owner(&world.operator, "cut"), taken);
    a.host
        .exec("nft", &["delete", "table", "inet", "cut"])
        .unwrap();
    testbed::k8s::wait_for("host 1 reached again", ttl * 3, || {
        Ok((a.metric("socialweb_broker_fleet_cut_off") == Some(0.0)).then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", a.diagnostics()));
    let seen = a.wait_state("cut", "elsewhere", Duration::from_secs(30));
    assert_eq!(seen["host"], ids[n].as_str(), "{seen}");
    assert_eq!(
        owner(&world.operator, "cut"),
        taken,
        "host 1 took nothing back"
    );
    step(t, "reached again: host 1 follows the new owner");
}
