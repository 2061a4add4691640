//! Certificates that end (`[certificates]`, issue 62; docs/operations.md, "Certificates"): a
//! cluster whose leaves live 150 s, renewed with 90 s left, runs a Pod on a rented node past
//! the end of every certificate it started with. Each renewal restarts its control plane
//! with new leaves while the front holds the user's requests; the Pod, its node and the
//! user's kubeconfig are untouched.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime};

use socialweb_broker::config::Certificates;
use testbed::broker::{Broker, BrokerOptions};
use testbed::k8s::wait_for;
use testbed::tmp::TempDir;
use testbed::user::User;
use testbed::world::World;

const LEAF: Duration = Duration::from_secs(150);
const RENEW_BEFORE: Duration = Duration::from_secs(90);
const LEAF_SERIES: &str =
    r#"socialweb_broker_certificate_earliest_expiry_timestamp_seconds{kind="leaf"}"#;

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// When the certificate the apiserver of `cluster` serves on loopback ends (Unix time), as
/// openssl reads it from a TLS handshake.
fn served_until(b: &Broker<'_>, cluster: &str) -> u64 {
    let kc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(b.kubeconfig(cluster)).unwrap()).unwrap();
    let server = kc["clusters"][0]["cluster"]["server"].as_str().unwrap();
    let addr = server.trim_start_matches("https://");
    let end = b
        .host
        .exec(
            "sh",
            &[
                "-c",
                &format!(
                    "echo | openssl s_client -connect {addr} 2>/dev/null \
                     | openssl x509 -noout -enddate | cut -d= -f2"
                ),
            ],
        )
        .unwrap();
    let secs = b.host.exec("date", &["-d", end.trim(), "+%s"]).unwrap();
    secs.trim().parse().unwrap()
}

/// The pod's uid, phase, node and restarts, through the user's kubeconfig.
fn pod(b: &Broker<'_>, u: &User) -> (String, String, String, u64) {
    let p = u.json(b, &["get", "pod", "job"]);
    (
        p["metadata"]["uid"].as_str().unwrap_or("").to_string(),
        p["status"]["phase"].as_str().unwrap_or("").to_string(),
        p["spec"]["nodeName"].as_str().unwrap_or("").to_string(),
        p["status"]["containerStatuses"][0]["restartCount"]
            .as_u64()
            .unwrap_or(99),
    )
}

/// The node's uid and whether it is Ready.
fn node(b: &Broker<'_>, u: &User, name: &str) -> (String, bool) {
    let n = u.json(b, &["get", "node", name]);
    let ready = n["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True");
    (n["metadata"]["uid"].as_str().unwrap().to_string(), ready)
}

#[test]
fn leaves_renewed_before_they_end_leave_pods_nodes_and_users_untouched() {
    let t = Instant::now();
    let step = |what: &str| eprintln!("[{:>6.1}s] {what}", t.elapsed().as_secs_f64());
    let world = World::new(1).unwrap();
    let b = Broker::start(
        &world,
        BrokerOptions {
            certificates: Some(Certificates {
                leaf_validity: LEAF,
                renew_before: RENEW_BEFORE,
                ..Certificates::default()
            }),
            ..BrokerOptions::default()
        },
    )
    .unwrap();
    let dir = TempDir::new("certs").unwrap();
    let u = User::new(&b, dir.path(), "certs");
    // Every leaf the cluster started with ends by then.
    let first_end = wait_for("the leaves' earliest end", Duration::from_secs(10), || {
        Ok(b.metric(LEAF_SERIES).filter(|v| *v > 0.0))
    })
    .unwrap() as u64;
    assert!(
        first_end <= unix_now() + LEAF.as_secs() + 5,
        "a leaf lives {LEAF:?}: {first_end}"
    );
    let first_served = served_until(&b, "certs");
    step("cluster ready; its leaves end within 150 s");

    let (uid, node_name) = run_pod(&b, &u);
    let (node_uid, _) = node(&b, &u, &node_name);
    step(&format!("the pod runs on {node_name}"));

    // The user reads the pod through the front every second while the leaves are renewed.
    let reader = Reader::start(&b, &u);

    // Past the end of every certificate the cluster started with, and renewed twice.
    let renewals = renewed_past(&b, first_end);
    step(&format!("{renewals} renewals; every first leaf has ended"));
    b.wait_state("certs", "ready", Duration::from_secs(120));
    let (reads, failed, slowest) = reader.stop();
    step(&format!(
        "the user's reads through the front: {reads}, {failed} failed, the slowest {:.1} s",
        slowest.as_secs_f64()
    ));

    untouched(&b, &u, (&uid, &node_name, &node_uid));
    let served = served_until(&b, "certs");
    assert!(
        served > first_served,
        "the apiserver serves a renewed certificate: {served} after {first_served}"
    );
    let leaf_end = b.metric(LEAF_SERIES).unwrap() as u64;
    assert!(leaf_end > first_end + 30, "{leaf_end} after {first_end}");
    assert!(leaf_end > unix_now(), "no leaf it uses has ended");
    // Reads went through every renewal; a read in flight as the apiserver stopped may fail.
    assert!(
        failed * 10 <= reads,
        "{failed} of {reads} reads through the front failed\n{}",
        b.diagnostics()
    );
    // The admin's kubeconfig names the renewed files.
    b.kubectl("certs", &["get", "--raw", "/readyz"]).unwrap();
    step("pod, node and kubeconfigs untouched; new certificates served");
}

/// The pod runs on as it was (its uid, its node, no restart), and its node is Ready, the
/// same Node object.
fn untouched(b: &Broker<'_>, u: &User, (uid, node_name, node_uid): (&str, &str, &str)) {
    let (now_uid, phase, on, restarts) = pod(b, u);
    assert_eq!(
        (now_uid.as_str(), phase.as_str(), on.as_str(), restarts),
        (uid, "Running", node_name, 0),
        "the pod untouched"
    );
    let now_node_uid = wait_for("the node Ready", Duration::from_secs(60), || {
        let n = node(b, u, node_name);
        Ok(n.1.then_some(n.0))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", b.diagnostics()));
    assert_eq!(
        now_node_uid, node_uid,
        "the same node, not one that joined again"
    );
}

/// A user reading the pod through the front every second, on a thread of its own.
struct Reader {
    done: Arc<AtomicBool>,
    reads: Arc<AtomicU32>,
    failed: Arc<AtomicU32>,
    thread: std::thread::JoinHandle<Duration>,
}

impl Reader {
    fn start(b: &Broker<'_>, u: &User) -> Reader {
        let done = Arc::new(AtomicBool::new(false));
        let (reads, failed) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
        let cmd = b.kubectl_as(&u.kubeconfig, &[], &["get", "pod", "job", "-o", "name"]);
        let program = cmd.get_program().to_owned();
        let args: Vec<std::ffi::OsString> = cmd.get_args().map(|a| a.to_owned()).collect();
        let (d, r, f) = (done.clone(), reads.clone(), failed.clone());
        let thread = std::thread::spawn(move || {
            let mut slowest = Duration::ZERO;
            while !d.load(Ordering::SeqCst) {
                let t0 = Instant::now();
                let o = std::process::Command::new(&program).args(&args).output();
                slowest = slowest.max(t0.elapsed());
                r.fetch_add(1, Ordering::SeqCst);
                if !o.is_ok_and(|o| o.status.success()) {
                    f.fetch_add(1, Ordering::SeqCst);
                }
                std::thread::sleep(Duration::from_secs(1));
            }
            slowest
        });
        Reader {
            done,
            reads,
            failed,
            thread,
        }
    }

    /// The reads, the failed ones, and the slowest.
    fn stop(self) -> (u32, u32, Duration) {
        self.done.store(true, Ordering::SeqCst);
        let slowest = self.thread.join().unwrap();
        (
            self.reads.load(Ordering::SeqCst),
            self.failed.load(Ordering::SeqCst),
            slowest,
        )
    }
}

/// A Pod that sleeps an hour (the broker tests' own), running on a rented node: its uid
/// and its node.
fn run_pod(b: &Broker<'_>, u: &User) -> (String, String) {
    b.apply("certs", &super::pod("job", "sleep 3600")).unwrap();
    let node = super::verdict::running_on(b, "certs", "job", Duration::from_secs(180));
    (pod(b, u).0, node)
}

/// Waits until the broker has renewed the cluster's leaves twice and `first_end` is past:
/// how many renewals its log tells.
fn renewed_past(b: &Broker<'_>, first_end: u64) -> usize {
    let renewals = || {
        std::fs::read_to_string(b.log("broker"))
            .unwrap_or_default()
            .matches("certificates due: its control plane restarts with new ones")
            .count()
    };
    wait_for(
        "two renewals, and every first leaf past its end",
        Duration::from_secs(360),
        || Ok((renewals() >= 2 && unix_now() > first_end + 10).then_some(())),
    )
    .unwrap_or_else(|e| panic!("{e:#}\n{}", b.diagnostics()));
    renewals()
}
