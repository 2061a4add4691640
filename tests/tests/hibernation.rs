//! Hibernation (docs/hibernation.md), end to end with the real control plane and `kubectl`
//! through the front: an idle cluster's components exit and its ports stay leased; the first
//! request wakes it and is answered as if nothing happened; a watch held through a wake
//! gets its events; many requests share one wake; a CronJob keeps the cluster awake until
//! it is suspended; a Pod created by the waking request rents a node as usual; a broker
//! killed in the middle of a wake is followed by one that finishes it; and a cluster on
//! either datastore (kine by default, etcd by choice) keeps its objects through it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use socialweb_broker::config::ClusterDefaults;
use testbed::broker::{Broker, BrokerOptions};
use testbed::k8s::wait_for;
use testbed::tmp::TempDir;
use testbed::user::{User, text};
use testbed::world::World;

fn step(t: Instant, what: &str) {
    eprintln!("[{:>6.1}s] {what}", t.elapsed().as_secs_f64());
}

/// A broker whose clusters hibernate after `after` idle.
fn options(after: &str) -> BrokerOptions {
    BrokerOptions {
        max_nodes: 1,
        clusters: ClusterDefaults {
            hibernate_after: humantime::parse_duration(after).expect("a duration"),
            ..ClusterDefaults::default()
        },
        ..Default::default()
    }
}

/// Every process whose command line names the cluster's directory (its components).
fn processes_of(dir: &Path) -> Vec<u32> {
    let needle = dir.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(&needle))
                .unwrap_or(false)
        })
        .collect()
}

/// How often the broker's log says `what`.
fn logged(b: &Broker<'_>, what: &str) -> usize {
    std::fs::read_to_string(b.log("broker"))
        .unwrap_or_default()
        .matches(what)
        .count()
}

const WOKEN: &str = "woken: the apiserver answers";

/// The lines of a long-running kubectl's stdout, as they come.
fn lines_of(child: &mut std::process::Child) -> std::sync::mpsc::Receiver<String> {
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                return;
            }
        }
    });
    rx
}

fn wait_line(rx: &std::sync::mpsc::Receiver<String>, want: &str, within: Duration) {
    let deadline = Instant::now() + within;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(l) if l.contains(want) => return,
            Ok(_) => {}
            Err(e) => panic!("the watch ended or went quiet before {want:?}: {e}"),
        }
    }
    panic!("no {want:?} within {within:?}");
}

const POD: &str = r#"apiVersion: v1
kind: Pod
metadata: {name: after-wake, namespace: default}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: job
    image: socialweb.local/busybox:1
    imagePullPolicy: Never
    command: ["sh", "-c", "sleep 3600"]
"#;

#[test]
fn an_idle_cluster_hibernates_and_its_first_request_wakes_it() {
    let t = Instant::now();
    let world = World::new(0).unwrap();
    let b = Broker::start(&world, options("3s")).unwrap();
    let dir = TempDir::new("hibernation").unwrap();
    let u = User::new(&b, dir.path(), "ci");
    let cluster_dir = b.cluster_dir("ci");
    let server = b.listed("ci")["server"].clone();
    assert_eq!(b.listed("ci")["hibernate_after_secs"], 3);
    assert_eq!(
        processes_of(&cluster_dir).len(),
        4,
        "etcd, apiserver, kcm, scheduler"
    );
    step(t, "created");

    // Idle: its components exit, its ports stay, the store says since when.
    let c = b.wait_state("ci", "hibernating", Duration::from_secs(60));
    assert!(c["since"].as_i64().unwrap() > 0, "{c}");
    assert_eq!(c["server"], server, "its ports stay leased");
    assert_eq!(
        processes_of(&cluster_dir),
        Vec::<u32>::new(),
        "no component runs"
    );
    let pidfiles: Vec<PathBuf> = std::fs::read_dir(cluster_dir.join("run"))
        .unwrap()
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "pid"))
        .collect();
    assert!(pidfiles.is_empty(), "{pidfiles:?}");
    step(t, "hibernating");

    // The first request wakes it and is answered.
    let t0 = Instant::now();
    let pods = u.ok(&b, &["get", "pods", "-A"]);
    step(
        t,
        &format!("kubectl get pods woke it in {:?}: {pods:?}", t0.elapsed()),
    );
    // Answered once the apiserver was; ready once the rest is up too.
    b.wait_state("ci", "ready", Duration::from_secs(60));
    assert_eq!(logged(&b, WOKEN), 1);
    assert_eq!(processes_of(&cluster_dir).len(), 4);

    // Asleep again; a watch and ten requests arrive together: one wake, every answer, and
    // the held watch gets its events.
    b.wait_state("ci", "hibernating", Duration::from_secs(60));
    let mut watch = b
        .kubectl_as(
            &u.kubeconfig,
            &[],
            &[
                "get",
                "configmaps",
                "-w",
                "--request-timeout=0",
                "-o",
                "name",
            ],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let events = lines_of(&mut watch);
    let many: Vec<_> = (0..10)
        .map(|_| {
            b.kubectl_as(&u.kubeconfig, &[], &["get", "namespaces", "-o", "name"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for c in many {
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "{}\n{}", text(&o), b.diagnostics());
        assert!(String::from_utf8_lossy(&o.stdout).contains("namespace/default"));
    }
    assert_eq!(logged(&b, WOKEN), 2, "eleven requests, one wake");
    u.ok(&b, &["create", "configmap", "during-wake"]);
    wait_line(&events, "configmap/during-wake", Duration::from_secs(20));
    step(
        t,
        "ten requests and a watch: one wake, the watch got its event",
    );

    // An open watch is a connection at the front: the cluster stays awake.
    std::thread::sleep(Duration::from_secs(8));
    assert_eq!(b.listed("ci")["state"], "ready", "a watch is open");
    let _ = watch.kill();
    let _ = watch.wait();
    b.wait_state("ci", "hibernating", Duration::from_secs(60));
    step(t, "hibernating once the watch closed");

    // A CronJob keeps it awake (docs/hibernation.md says why) until it is suspended.
    u.ok(
        &b,
        &[
            "create",
            "cronjob",
            "nightly",
            "--image=socialweb.local/busybox:1",
            "--schedule=0 0 1 1 *",
            "--",
            "true",
        ],
    );
    std::thread::sleep(Duration::from_secs(12));
    assert_eq!(b.listed("ci")["state"], "ready", "a CronJob keeps it awake");
    assert!(
        logged(&b, "CronJob(s) not suspended: default/nightly") >= 1,
        "the log says why"
    );
    u.ok(
        &b,
        &[
            "patch",
            "cronjob",
            "nightly",
            "-p",
            r#"{"spec":{"suspend":true}}"#,
        ],
    );
    b.wait_state("ci", "hibernating", Duration::from_secs(60));
    step(t, "a suspended CronJob lets it hibernate");

    // The request that wakes it creates a Pod: a node is rented as usual; once the Pod is
    // gone and the node released, it hibernates again.
    let manifest = dir.path().join("pod.yaml");
    std::fs::write(&manifest, POD).unwrap();
    u.ok(&b, &["apply", "-f", manifest.to_str().unwrap()]);
    wait_for(
        "the Pod Running on a rented node",
        Duration::from_secs(180),
        || {
            let p = u.json(&b, &["get", "pod", "after-wake"]);
            Ok((p["status"]["phase"] == "Running").then_some(()))
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}\n{}", b.diagnostics()));
    step(
        t,
        "a Pod created by the waking request runs on a rented node",
    );
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(b.listed("ci")["state"], "ready", "a node keeps it awake");
    u.ok(&b, &["delete", "pod", "after-wake", "--wait=true"]);
    wait_for("zero live leases", Duration::from_secs(90), || {
        Ok(b.live_leases()?.is_empty().then_some(()))
    })
    .unwrap();
    b.wait_state("ci", "hibernating", Duration::from_secs(60));
    step(t, "back to zero, and hibernating");

    // The operator wakes it by name (its admin kubeconfig does not pass the front).
    let woke = b
        .cli_json(&["cluster", "wake", "ci", "--wait", "60s"])
        .unwrap();
    assert_eq!(woke["state"], "ready", "{woke}");
    b.kubectl("ci", &["get", "namespaces"]).unwrap();
    step(t, "cluster wake");
}

#[test]
fn a_broker_killed_during_a_wake_is_followed_by_one_that_finishes_it() {
    let t = Instant::now();
    let world = World::new(0).unwrap();
    let mut b = Broker::start(
        &world,
        BrokerOptions {
            broker_failpoints: Some("broker::wake_apiserver_ready=return".into()),
            ..options("3s")
        },
    )
    .unwrap();
    let dir = TempDir::new("hibernation-crash").unwrap();
    let u = User::new(&b, dir.path(), "crash");
    let cluster_dir = b.cluster_dir("crash");
    b.wait_state("crash", "hibernating", Duration::from_secs(60));
    // A setting of its own: never again, once woken.
    let set = b
        .cli_json(&["cluster", "set", "crash", "--hibernate-after", "0"])
        .unwrap();
    assert_eq!(set["hibernate_after_secs"], 0, "{set}");
    step(t, "hibernating");

    // A request starts a wake; the broker dies in the middle of it (its apiserver answers,
    // the front is not told yet).
    let waker = b
        .kubectl_as(&u.kubeconfig, &[], &["get", "pods"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    b.wait_broker_exit(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e:#}\n{}", b.diagnostics()));
    assert!(
        processes_of(&cluster_dir).len() >= 2,
        "the datastore and the apiserver outlive the broker"
    );
    drop(waker);
    step(t, "broker killed mid-wake");

    b.set_failpoints(None);
    b.start_broker().unwrap();
    let c = b.wait_state("crash", "ready", Duration::from_secs(90));
    assert_eq!(c["hibernate_after_secs"], 0);
    let procs = processes_of(&cluster_dir);
    assert_eq!(procs.len(), 4, "each component once, not twice: {procs:?}");
    let names = u.ok(&b, &["get", "namespaces", "-o", "name"]);
    assert!(names.contains("namespace/default"), "{names}");
    step(t, "the next broker finished the wake");

    // hibernate_after 0: it stays awake.
    std::thread::sleep(Duration::from_secs(8));
    assert_eq!(b.listed("crash")["state"], "ready");
    let bad = b
        .cli(&["cluster", "set", "crash", "--hibernate-after", "10ms"])
        .unwrap_err();
    assert!(
        format!("{bad:#}").contains("hibernate_after: 10ms is too short: give 0 (never)"),
        "{bad:#}"
    );
    b.cli(&["cluster", "set", "crash", "--hibernate-after", "default"])
        .unwrap();
    b.wait_state("crash", "hibernating", Duration::from_secs(60));
    step(t, "back to the broker's hibernate_after, and hibernating");

    // A broker that stops while the cluster hibernates is followed by one that keeps it so;
    // its first wake fails: the request is answered 503 with the reason and a Retry-After,
    // which client-go honours, and its retry wakes the cluster.
    b.kill_broker();
    b.set_failpoints(Some("broker::wake=1*return"));
    b.start_broker().unwrap();
    b.wait_state("crash", "hibernating", Duration::from_secs(30));
    assert_eq!(processes_of(&cluster_dir), Vec::<u32>::new());
    let o = b
        .kubectl_as(
            &u.kubeconfig,
            &[],
            &["get", "namespaces", "-o", "name", "-v=6"],
        )
        .output()
        .unwrap();
    let said = text(&o);
    assert!(o.status.success(), "{said}\n{}", b.diagnostics());
    assert!(said.contains("503 Service Unavailable"), "{said}");
    assert!(said.contains("Retry-After"), "{said}");
    assert!(logged(&b, "waking: failpoint broker::wake") >= 1);
    b.wait_state("crash", "ready", Duration::from_secs(60));
    step(
        t,
        "a failed wake: 503 with Retry-After, and the retry woke it",
    );
}

#[test]
fn a_cluster_on_etcd_keeps_its_objects_through_hibernation() {
    let t = Instant::now();
    let world = World::new(0).unwrap();
    let b = Broker::start(&world, options("3s")).unwrap();
    let c = b
        .cli_json(&["cluster", "create", "kv", "--datastore", "etcd"])
        .unwrap();
    assert_eq!(
        (&c["state"], &c["datastore"]),
        (&"ready".into(), &"etcd".into()),
        "{c}"
    );
    let cluster_dir = b.cluster_dir("kv");
    assert!(cluster_dir.join("etcd/member").is_dir());
    assert!(!cluster_dir.join("kine").exists(), "no kine beside etcd");
    let procs = processes_of(&cluster_dir);
    assert_eq!(procs.len(), 4, "etcd, apiserver, kcm, scheduler: {procs:?}");
    b.kubectl("kv", &["create", "configmap", "kept", "--from-literal=k=v"])
        .unwrap();
    step(t, "created on etcd");

    b.wait_state("kv", "hibernating", Duration::from_secs(60));
    assert_eq!(processes_of(&cluster_dir), Vec::<u32>::new());
    let woke = b
        .cli_json(&["cluster", "wake", "kv", "--wait", "60s"])
        .unwrap();
    assert_eq!(woke["state"], "ready", "{woke}");
    let v = b
        .kubectl(
            "kv",
            &["get", "configmap", "kept", "-o", "jsonpath={.data.k}"],
        )
        .unwrap();
    assert_eq!(v, "v", "the object outlived the hibernation");
    step(t, "woken with its objects");
    let bad = b
        .cli(&["cluster", "create", "bad", "--datastore", "mysql"])
        .unwrap_err();
    assert!(format!("{bad:#}").contains("mysql"), "{bad:#}");
}
