//! `cluster rotate-ca` (issue 62; docs/operations.md, "Rotating a cluster's CAs") on a
//! cluster with a node: the node adopts the new CA, has its certificates issued again and
//! stays Ready with its Pod running; then the old cluster CA is retired, and a certificate
//! its key signs (a leaked key) no longer reaches the apiserver. The user's kubeconfig of the
//! old users CA works for the overlap and is refused after it, naming the rotation; a new
//! one works; Pods see the new CA; a node rented afterwards joins; at zero nodes a second
//! rotation replaces the CAs at once.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use testbed::broker::{Broker, BrokerOptions};
use testbed::k8s::wait_for;
use testbed::tmp::TempDir;
use testbed::user::{User, text};
use testbed::world::World;

const CLUSTER: &str = "rot";
const OVERLAP: Duration = Duration::from_secs(45);

/// The HTTP status the apiserver (on loopback) answers a client certificate with, or
/// `unreachable`; the server is not verified: only the client is in question.
fn apiserver_answers(b: &Broker<'_>, url: &str, cert: &Path, key: &Path) -> String {
    b.host
        .exec(
            "curl",
            &[
                "-sk",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--cert",
                cert.to_str().unwrap(),
                "--key",
                key.to_str().unwrap(),
                &format!("{url}/api"),
            ],
        )
        // Not answering at all: its control plane starting again.
        .unwrap_or_else(|_| "unreachable".into())
}

/// A `system:masters` client certificate signed by the CA in `ca_dir` (a copy of its key),
/// as whoever holds a leaked key can make one.
fn forged(b: &Broker<'_>, ca_dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (key, csr, crt) = (
        ca_dir.join("forged.key"),
        ca_dir.join("forged.csr"),
        ca_dir.join("forged.crt"),
    );
    let p = |x: &Path| x.to_str().unwrap().to_string();
    b.host
        .exec(
            "openssl",
            &[
                "req",
                "-new",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-subj",
                "/O=system:masters/CN=intruder",
                "-keyout",
                &p(&key),
                "-out",
                &p(&csr),
            ],
        )
        .unwrap();
    b.host
        .exec(
            "openssl",
            &[
                "x509",
                "-req",
                "-in",
                &p(&csr),
                "-CA",
                &p(&ca_dir.join("ca.crt")),
                "-CAkey",
                &p(&ca_dir.join("ca.key")),
                "-set_serial",
                "7",
                "-days",
                "1",
                "-out",
                &p(&crt),
            ],
        )
        .unwrap();
    (crt, key)
}

/// The CA certificate Pods of namespace `default` are given.
fn pods_ca(b: &Broker<'_>) -> String {
    let cm = b
        .kubectl_json(
            CLUSTER,
            &["get", "configmap", "kube-root-ca.crt", "-n", "default"],
        )
        .unwrap();
    cm["data"]["ca.crt"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn same_pem(a: &str, b: &str) -> bool {
    a.trim() == b.trim()
}

/// What a thief of the cluster CA's key would hold: the CA (PEM) and a `system:masters`
/// certificate signed with a copy of its key, which the apiserver at `url` admits now.
struct Stolen {
    ca: String,
    url: String,
    cert: PathBuf,
    key: PathBuf,
}

fn steal(b: &Broker<'_>, pki: &Path, dir: &Path) -> Stolen {
    let old = dir.join("old-ca");
    std::fs::create_dir_all(&old).unwrap();
    for f in ["ca.crt", "ca.key"] {
        std::fs::copy(pki.join(f), old.join(f)).unwrap();
    }
    let admin: serde_json::Value =
        serde_json::from_slice(&std::fs::read(b.kubeconfig(CLUSTER)).unwrap()).unwrap();
    let url = admin["clusters"][0]["cluster"]["server"].as_str().unwrap();
    let (cert, key) = forged(b, &old);
    let s = Stolen {
        ca: std::fs::read_to_string(old.join("ca.crt")).unwrap(),
        url: url.to_string(),
        cert,
        key,
    };
    assert_eq!(s.answer(b), "200", "the old key signs an admin");
    s
}

impl Stolen {
    fn answer(&self, b: &Broker<'_>) -> String {
        apiserver_answers(b, &self.url, &self.cert, &self.key)
    }
}

fn rotate(b: &Broker<'_>) -> anyhow::Result<serde_json::Value> {
    let overlap = format!("{}s", OVERLAP.as_secs());
    b.cli_json(&["cluster", "rotate-ca", CLUSTER, "--overlap", &overlap])
}

/// The Node's Ready condition: its status and since when.
fn ready_since(b: &Broker<'_>, node: &str) -> (String, String) {
    let n = b.kubectl_json(CLUSTER, &["get", "node", node]).unwrap();
    let c = n["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .cloned()
        .unwrap_or_default();
    (
        c["status"].as_str().unwrap_or_default().to_string(),
        c["lastTransitionTime"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

/// The Pod's uid, phase and restarts.
fn pod_state(b: &Broker<'_>, pod: &str) -> (String, String, u64) {
    let p = b.kubectl_json(CLUSTER, &["get", "pod", pod]).unwrap();
    (
        p["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        p["status"]["phase"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        p["status"]["containerStatuses"][0]["restartCount"]
            .as_u64()
            .unwrap_or(99),
    )
}

/// Rotates with a node up: the reply names it, the new CA signs at once.
fn rotated_with_a_node(b: &Broker<'_>, node: &str) -> (serde_json::Value, Duration) {
    let t0 = Instant::now();
    let r = rotate(b).unwrap_or_else(|e| panic!("{e:#}\n{}", b.diagnostics()));
    let took = t0.elapsed();
    assert_eq!(r["cluster_cas"], "overlap", "{r}");
    assert_eq!(r["nodes"], serde_json::json!([node]), "{r}");
    assert_eq!(r["info"]["state"], "ready", "{r}");
    assert_ne!(r["users_ca_sha256"], r["previous_users_ca_sha256"]);
    (r, took)
}

/// Waits for the old cluster CA's retirement: the leaked key's admin refused; the node
/// annotated with the new CA's pin. Returns how long it took.
fn retired(b: &Broker<'_>, pki: &Path, stolen: &Stolen, node: &str) -> Duration {
    let t0 = Instant::now();
    wait_for(
        "the old cluster CA retired",
        Duration::from_secs(240),
        || Ok((!pki.join("previous").exists() && stolen.answer(b) == "401").then_some(())),
    )
    .unwrap_or_else(|e| panic!("{e:#}\n{}", b.diagnostics()));
    let took = t0.elapsed();
    // The retirement started the control plane again.
    wait_for(
        "the apiserver ready again",
        Duration::from_secs(120),
        || Ok(b.kubectl(CLUSTER, &["get", "--raw", "/readyz"]).ok()),
    )
    .unwrap_or_else(|e| panic!("{e:#}\n{}", b.diagnostics()));
    let n = b.kubectl_json(CLUSTER, &["get", "node", node]).unwrap();
    let pem = std::fs::read_to_string(pki.join("ca.crt")).unwrap();
    let pin = pin_of(b, &pem);
    assert_eq!(
        n["metadata"]["annotations"]["socialweb.computer/cluster-ca"], pin,
        "the node says it moved to the new CA"
    );
    took
}

/// `sha256:<hex>` of the certificate's public key, as openssl computes it.
fn pin_of(b: &Broker<'_>, pem: &str) -> String {
    let dir = TempDir::new("pin").unwrap();
    let f = dir.path().join("ca.crt");
    std::fs::write(&f, pem).unwrap();
    let script = format!(
        "openssl x509 -pubkey -noout -in {} | openssl pkey -pubin -outform der | sha256sum",
        f.display()
    );
    let out = b.host.exec("sh", &["-c", &script]).unwrap();
    format!("sha256:{}", out.split_whitespace().next().unwrap())
}

/// Once the cluster has no node: a rotation makes the CAs again at once.
fn rotated_at_zero(b: &Broker<'_>) {
    wait_for(
        "no node left, none released",
        Duration::from_secs(240),
        || {
            let n = b.kubectl_json(CLUSTER, &["get", "nodes"])?;
            let show = b.cli_json(&["cluster", "show", CLUSTER])?;
            let live = show["provisions"].as_array().into_iter().flatten();
            let live = live
                .filter(|p| !matches!(p["state"].as_str(), Some("released" | "failed")))
                .count();
            let none = n["items"].as_array().is_some_and(Vec::is_empty);
            Ok((none && live == 0).then_some(()))
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}\n{}", b.diagnostics()));
    let r = rotate(b).unwrap_or_else(|e| panic!("{e:#}\n{}", b.diagnostics()));
    assert_eq!(r["cluster_cas"], "made", "{r}");
    assert_eq!(r["nodes"], serde_json::json!([]), "{r}");
    assert_eq!(r["info"]["state"], "ready", "{r}");
}

/// A kubeconfig of the new users CA, for the user whose key is in `dir`.
fn fresh_kubeconfig(b: &Broker<'_>, dir: &Path) -> User {
    let fresh = dir.join("fresh.kubeconfig");
    let out = ["--out", fresh.to_str().unwrap()];
    let key = dir.join("user.key");
    b.api(
        &key,
        &[&["kubeconfig", CLUSTER, "--lifetime", "2h"][..], &out].concat(),
    )
    .unwrap();
    User { kubeconfig: fresh }
}

/// The cluster CA is new: the old key's admin is refused, the admin kubeconfig works, Pods
/// and joining nodes are given the new CA.
fn cluster_ca_replaced(b: &Broker<'_>, pki: &Path, stolen: &Stolen) {
    let new_ca = std::fs::read_to_string(pki.join("ca.crt")).unwrap();
    assert!(!same_pem(&new_ca, &stolen.ca), "a new cluster CA");
    assert_eq!(stolen.answer(b), "401", "the old key's admin");
    b.kubectl(CLUSTER, &["get", "--raw", "/readyz"]).unwrap();
    wait_for("Pods given the new CA", Duration::from_secs(60), || {
        Ok(same_pem(&pods_ca(b), &new_ca).then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}: {}", pods_ca(b)));
    let info = b
        .kubectl_json(
            CLUSTER,
            &["get", "configmap", "cluster-info", "-n", "kube-public"],
        )
        .unwrap();
    assert!(
        info.to_string().contains(&base64_of(&new_ca)),
        "cluster-info names the new CA"
    );
}

/// After the overlap ends (`until`): `old` is refused, naming the rotation.
fn refused_after(b: &Broker<'_>, old: &User, until: SystemTime) {
    if let Ok(left) = (until + Duration::from_secs(2)).duration_since(SystemTime::now()) {
        std::thread::sleep(left);
    }
    let o = b
        .kubectl_as(&old.kubeconfig, &[], &["get", "pods"])
        .output()
        .unwrap();
    assert!(!o.status.success(), "the old kubeconfig after the overlap");
    let m = text(&o);
    assert!(
        m.contains("previous users CA, retired at") && m.contains("rotate-ca"),
        "{m}"
    );
}

#[test]
fn rotate_ca_moves_a_node_to_the_new_ca_then_retires_the_old_ones() {
    let t = Instant::now();
    let step = |what: &str| eprintln!("[{:>6.1}s] {what}", t.elapsed().as_secs_f64());
    let world = World::new(1).unwrap();
    let b = Broker::start(&world, BrokerOptions::default()).unwrap();
    let dir = TempDir::new("rotate-ca").unwrap();
    let u = User::new(&b, dir.path(), CLUSTER);
    let pki = b.cluster_dir(CLUSTER).join("pki");
    let stolen = steal(&b, &pki, dir.path());
    // One job per node (the seeds' GitLab affinity): the second job needs a second node.
    let (job, after) = ("scale-check-1", "scale-check-2");
    b.apply(CLUSTER, &super::gitlab_job(1, 3600)).unwrap();
    let node = super::verdict::running_on(&b, CLUSTER, job, Duration::from_secs(180));
    let (ready, pod) = (ready_since(&b, &node), pod_state(&b, job));
    step(&format!("a Pod runs on {node}, Ready since {}", ready.1));

    let (r, took) = rotated_with_a_node(&b, &node);
    let until = SystemTime::UNIX_EPOCH
        + Duration::from_millis(r["previous_admitted_until"].as_u64().unwrap());
    step(&format!(
        "rotated in {:.1} s with {node} up: {r}",
        took.as_secs_f64()
    ));
    u.ok(&b, &["get", "pods"]);
    let new_user = fresh_kubeconfig(&b, dir.path());
    new_user.ok(&b, &["get", "pods"]);
    step("the old and the new kubeconfig both work within the overlap");

    let took = retired(&b, &pki, &stolen, &node);
    step(&format!(
        "{node} moved and the old cluster CA retired {:.1} s after the rotation",
        took.as_secs_f64()
    ));
    cluster_ca_replaced(&b, &pki, &stolen);
    // Past the node-monitor grace (40 s): a kubelet still on the old CA would be NotReady.
    std::thread::sleep(Duration::from_secs(45));
    assert_eq!(ready_since(&b, &node), ready, "{node} Ready throughout");
    assert_eq!(
        pod_state(&b, job),
        pod,
        "the Pod, its uid, phase and restarts"
    );
    let logs = b.kubectl(CLUSTER, &["logs", job]);
    assert!(logs.is_ok(), "the apiserver reaches the kubelet: {logs:?}");
    step(&format!(
        "{node} Ready throughout, its Pod untouched, its kubelet reached"
    ));

    b.apply(CLUSTER, &super::gitlab_job(2, 3600)).unwrap();
    let second = super::verdict::running_on(&b, CLUSTER, after, Duration::from_secs(180));
    assert_ne!(second, node, "a second node");
    step(&format!(
        "a Pod runs on {second}, rented after the rotation"
    ));

    refused_after(&b, &u, until);
    new_user.ok(&b, &["get", "pods"]);
    step("after the overlap: the old kubeconfig refused naming the rotation, the new one works");
    for p in [job, after] {
        b.kubectl(CLUSTER, &["delete", "pod", p, "--wait=false"])
            .unwrap();
    }
    rotated_at_zero(&b);
    step("at zero nodes a rotation makes the CAs again at once");
}

fn base64_of(pem: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(pem)
}
