//! A fleet's gray failures (issue 61; docs/operations.md, "A fleet's failure modes"): an
//! owner that is frozen rather than dead, and a host whose clock is wrong. Both used to end
//! with two hosts acting on one cluster.

use std::path::Path;
use std::time::{Duration, Instant};

use testbed::broker::{Broker, BrokerOptions};

/// A series' value at host `b` (one without labels), which must be served.
fn metric(b: &Broker<'_>, name: &str) -> f64 {
    b.metric(name)
        .unwrap_or_else(|| panic!("no {name} at {}", b.diagnostics()))
}

use super::{alive, broker_id, fleet_host, fleet_of, light, owner, pid_of, step};

/// The components a fleet's cluster runs (its datastore is the fleet's PostgreSQL, through
/// kine), each with its pidfile under `run/`.
const COMPONENTS: [&str; 4] = ["kine", "apiserver", "controller-manager", "scheduler"];

/// The Pods carrying label `selector` in the cluster, as host `b` sees them.
fn pods(b: &Broker<'_>, cluster: &str, selector: &str) -> Vec<String> {
    b.kubectl(cluster, &["get", "pods", "-l", selector, "-o", "name"])
        .unwrap_or_else(|e| panic!("{e:#}"))
        .lines()
        .map(str::to_string)
        .collect()
}

/// Waits until `selector`'s Pods number at least `n`, then a while more, and returns them:
/// a second acting controller-manager would have made more by then.
fn settled_pods(b: &Broker<'_>, cluster: &str, selector: &str, n: usize) -> Vec<String> {
    testbed::k8s::wait_for(
        &format!("{n} Pod(s) of {selector}"),
        Duration::from_secs(180),
        || Ok((pods(b, cluster, selector).len() >= n).then_some(())),
    )
    .unwrap_or_else(|e| panic!("{e:#}\n{}", b.diagnostics()));
    std::thread::sleep(Duration::from_secs(10));
    pods(b, cluster, selector)
}

/// The pids of the cluster's components in `dir`.
fn component_pids(dir: &Path) -> Vec<(&'static str, u32)> {
    COMPONENTS
        .iter()
        .map(|c| (*c, pid_of(&dir.join(format!("run/{c}.pid")))))
        .collect()
}

/// The owner's broker is frozen (SIGSTOP) for three lease TTLs while its control plane's
/// processes go on: its watchdog kills them before the other host may claim the cluster, the
/// other host serves it, the controllers and the scheduler act once (leader election), and
/// the thawed broker follows the new owner without recording anything over it.
#[test]
fn a_frozen_owner_is_down_before_another_host_takes_its_cluster_and_nothing_acts_twice() {
    let _shared = light();
    let t = Instant::now();
    let (world, pg, _keys, key) = fleet_of(2, 0);
    let ttl = Duration::from_secs(10);
    let a = Broker::start(&world, fleet_host(&pg, &key, 1)).unwrap();
    let b = Broker::start(&world, fleet_host(&pg, &key, 2)).unwrap();
    let id_b = broker_id(&b);
    let c = a.cli_json(&["cluster", "create", "frozen"]).unwrap();
    assert_eq!(c["state"], "ready", "{c}\n{}", a.diagnostics());
    b.wait_state("frozen", "elsewhere", Duration::from_secs(30));
    a.kubectl(
        "frozen",
        &[
            "create",
            "deployment",
            "web",
            "--image=registry.invalid/web",
            "--replicas=2",
        ],
    )
    .unwrap();
    let web = settled_pods(&a, "frozen", "app=web", 2);
    assert_eq!(web.len(), 2, "{web:?}");
    let dir = a.cluster_dir("frozen");
    let pids = component_pids(&dir);
    step(
        t,
        "host 1 runs the cluster with a Deployment of 2; host 2 follows",
    );

    a.freeze_broker().unwrap();
    let frozen = Instant::now();
    let (dead_by, claimed) = killed_before_claimed(&world, &a, &pids, &id_b, ttl * 6);
    b.wait_state("frozen", "ready", Duration::from_secs(120));
    step(
        t,
        &format!(
            "frozen: host 1's components dead by {:.1}s (the watchdog), host 2 claimed at \
             {:.1}s, ready at {:.1}s",
            dead_by.as_secs_f64(),
            claimed.as_secs_f64(),
            frozen.elapsed().as_secs_f64()
        ),
    );
    one_pod_per_job(&b, "frozen");
    let web = pods(&b, "frozen", "app=web");
    assert_eq!(web.len(), 2, "the Deployment keeps 2: {web:?}");

    // Thawed after three TTLs, host 1 finds its lease gone and follows host 2.
    if let Some(left) = (ttl * 3).checked_sub(frozen.elapsed()) {
        std::thread::sleep(left);
    }
    a.thaw_broker().unwrap();
    let seen = a.wait_state("frozen", "elsewhere", Duration::from_secs(60));
    assert_eq!(seen["host"], id_b.as_str(), "{seen}");
    step(t, "thawed: host 1 follows host 2");
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        owner(&world.operator, "frozen"),
        format!("{id_b}|2"),
        "one takeover, nothing since"
    );
    nothing_of_it_runs(&a, &dir, &pids);
    let state = testbed::postgres::query(
        &world.operator,
        "broker",
        "select state from clusters where name = 'frozen'",
    )
    .unwrap();
    assert_eq!(state, "active", "host 1 recorded nothing over host 2");
    for j in JOBS {
        let made = pods(&b, "frozen", &format!("job-name={j}"));
        assert_eq!(made.len(), 1, "Job {j}: {made:?}");
    }
    assert_eq!(metric(&b, "socialweb_broker_fleet_takeovers_total"), 1.0);
    assert_eq!(metric(&a, "socialweb_broker_fleet_leases_lost_total"), 1.0);
}

/// Watches the frozen host's components until host `id_b` claims the cluster (within
/// `within`): each must be dead before. When the last died, and when the claim came, from
/// the freeze.
fn killed_before_claimed(
    world: &testbed::world::World,
    a: &Broker<'_>,
    pids: &[(&'static str, u32)],
    id_b: &str,
    within: Duration,
) -> (Duration, Duration) {
    let frozen = Instant::now();
    let mut dead: Vec<Option<Duration>> = vec![None; pids.len()];
    let claimed = loop {
        for (i, (_, pid)) in pids.iter().enumerate() {
            if dead[i].is_none() && !alive(*pid) {
                dead[i] = Some(frozen.elapsed());
            }
        }
        if owner(&world.operator, "frozen").starts_with(id_b) {
            break frozen.elapsed();
        }
        assert!(
            frozen.elapsed() < within,
            "host 2 never claimed the cluster"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    for ((name, pid), d) in pids.iter().zip(&dead) {
        let d = d.unwrap_or_else(|| {
            panic!(
                "host 1's {name} ({pid}) still ran when host 2 claimed the cluster, {:.1}s \
                 into the freeze\n{}",
                claimed.as_secs_f64(),
                std::fs::read_to_string(a.log("broker")).unwrap_or_default()
            )
        });
        assert!(d < claimed, "{name}");
    }
    (
        dead.iter().flatten().max().copied().unwrap_or_default(),
        claimed,
    )
}

/// The one-completion Jobs of the frozen-owner test.
const JOBS: [&str; 3] = ["j1", "j2", "j3"];

/// Creates [`JOBS`] through host `b`: each gets one Pod, not one per controller-manager.
fn one_pod_per_job(b: &Broker<'_>, cluster: &str) {
    for j in JOBS {
        b.kubectl(
            cluster,
            &[
                "create",
                "job",
                j,
                "--image=registry.invalid/job",
                "--",
                "true",
            ],
        )
        .unwrap();
    }
    for j in JOBS {
        let made = settled_pods(b, cluster, &format!("job-name={j}"), 1);
        assert_eq!(made.len(), 1, "Job {j}: {made:?}");
    }
}

/// Nothing of the cluster runs on the thawed host `a`: not the components it ran (`pids`),
/// nor new ones; its watchdog said why, and the deadline file is gone.
fn nothing_of_it_runs(a: &Broker<'_>, dir: &Path, pids: &[(&'static str, u32)]) {
    for (name, pid) in pids {
        assert!(!alive(*pid), "host 1's {name} came back");
    }
    for c in COMPONENTS {
        let f = dir.join(format!("run/{c}.pid"));
        if f.exists() {
            let pid = pid_of(&f);
            assert!(!alive(pid), "host 1 runs a {c} again ({pid})");
        }
    }
    let log = std::fs::read_to_string(a.log("broker")).unwrap();
    assert!(
        log.contains("the broker's lease deadline passed"),
        "the watchdog said nothing:\n{log}"
    );
    assert!(!dir.join("run/lease-deadline").exists());
}

/// A host whose wall clock runs 15 s ahead of the others' (and the store's) takes no live
/// lease: expiry is the store's clock. It still takes the cluster over when the owner dies.
#[test]
fn a_host_whose_clock_runs_ahead_never_takes_a_live_lease() {
    let _shared = light();
    let t = Instant::now();
    let (world, pg, _keys, key) = fleet_of(2, 0);
    let ttl = Duration::from_secs(10);
    let mut a = Broker::start(&world, fleet_host(&pg, &key, 1)).unwrap();
    let c = a.cli_json(&["cluster", "create", "skewed"]).unwrap();
    assert_eq!(c["state"], "ready", "{c}\n{}", a.diagnostics());
    let id_a = broker_id(&a);
    let before = std::time::SystemTime::now();
    let b = Broker::start(
        &world,
        BrokerOptions {
            clock_ahead: Some(Duration::from_secs(15)),
            ..fleet_host(&pg, &key, 2)
        },
    )
    .unwrap();
    let id_b = broker_id(&b);
    // Its clock does run ahead: its first log line is stamped at least 15 s after this
    // test's clock said it was starting.
    let first = first_stamp(&b.log("broker"));
    let ahead = first.duration_since(before).unwrap_or_default().as_millis();
    assert!(ahead > 14_500, "host 2's clock is {ahead} ms ahead");
    let seen = b.wait_state("skewed", "elsewhere", Duration::from_secs(60));
    assert_eq!(seen["host"], id_a.as_str(), "{seen}");
    let watched = Instant::now();
    while watched.elapsed() < ttl * 3 {
        assert_eq!(
            owner(&world.operator, "skewed"),
            format!("{id_a}|1"),
            "host 2 took a live lease {:.1}s after it started following",
            watched.elapsed().as_secs_f64()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    step(
        t,
        &format!("host 2, {ahead} ms ahead, left host 1's lease alone for 3 TTLs"),
    );

    a.kill_host().unwrap();
    let killed = Instant::now();
    b.wait_state("skewed", "ready", Duration::from_secs(120));
    assert!(owner(&world.operator, "skewed").starts_with(&id_b));
    step(
        t,
        &format!(
            "host 1 killed: host 2 serves the cluster {:.1}s later",
            killed.elapsed().as_secs_f64()
        ),
    );
}

/// The time stamped on the first line of a broker's log (tracing's RFC 3339 stamp, its
/// colours taken off).
fn first_stamp(log: &Path) -> std::time::SystemTime {
    let text = std::fs::read_to_string(log).unwrap();
    let mut plain = String::with_capacity(text.len());
    let mut escape = false;
    for c in text.chars() {
        match c {
            '\u{1b}' => escape = true,
            'm' if escape => escape = false,
            _ if escape => {}
            c => plain.push(c),
        }
    }
    plain
        .lines()
        .find_map(|l| humantime::parse_rfc3339(l.split_whitespace().next()?).ok())
        .unwrap_or_else(|| panic!("no stamped line in {}:\n{plain}", log.display()))
}

/// Under systemd (`Type=notify`, `WatchdogSec`): the broker says it serves, then that it is
/// alive every second while its runtime turns; frozen, it says nothing (systemd kills it
/// after `WatchdogSec`); thawed, it goes on. The notify socket is this test's, as systemd's
/// would be.
#[test]
fn a_broker_tells_systemd_it_serves_and_is_alive_and_a_frozen_one_falls_silent() {
    let _shared = light();
    let (world, pg, keys, key) = fleet_of(1, 0);
    let socket = keys.path().join("notify.sock");
    let listener = std::os::unix::net::UnixDatagram::bind(&socket).unwrap();
    listener
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let a = Broker::start(
        &world,
        BrokerOptions {
            env: vec![
                ("NOTIFY_SOCKET".into(), socket.display().to_string()),
                ("WATCHDOG_USEC".into(), "30000000".into()),
            ],
            ..fleet_host(&pg, &key, 1)
        },
    )
    .unwrap();
    let heard = |within: Duration| -> Vec<String> {
        let t = Instant::now();
        let mut got = Vec::new();
        let mut buf = [0u8; 512];
        while t.elapsed() < within {
            if let Ok(n) = listener.recv(&mut buf) {
                got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
        }
        got
    };
    let started = heard(Duration::from_secs(4));
    assert!(
        started.iter().any(|m| m.contains("READY=1")),
        "no READY=1: {started:?}"
    );
    let alive = started.iter().filter(|m| *m == "WATCHDOG=1\n").count();
    assert!(alive >= 2, "{alive} WATCHDOG=1 in 4 s: {started:?}");
    a.freeze_broker().unwrap();
    // What was sent before the freeze may still be read first.
    let _ = heard(Duration::from_millis(600));
    let frozen = heard(Duration::from_secs(3));
    a.thaw_broker().unwrap();
    assert!(frozen.is_empty(), "a frozen broker said {frozen:?}");
    let thawed = heard(Duration::from_secs(3));
    assert!(
        thawed.iter().any(|m| m == "WATCHDOG=1\n"),
        "thawed, it said {thawed:?}"
    );
}
