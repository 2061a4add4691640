//! `cluster rotate-ca` (issue 62; docs/operations.md, "Rotating a cluster's CAs"): refused
//! while the cluster has a node, then, once it has scaled to zero, new CAs. The user's
//! kubeconfig of the old users CA works for the overlap and is refused after it, naming the
//! rotation; a new one works; a certificate the old cluster CA's key signs (a leaked key)
//! no longer reaches the apiserver; Pods see the new CA; a node rented afterwards joins.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use testbed::broker::{Broker, BrokerOptions};
use testbed::k8s::wait_for;
use testbed::tmp::TempDir;
use testbed::user::{User, text};
use testbed::world::World;

const CLUSTER: &str = "rot";
const OVERLAP: Duration = Duration::from_secs(45);

/// The HTTP status the apiserver (on loopback) answers a client certificate with; the
/// server is not verified: only the client is in question.
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
        .unwrap()
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

/// With a Pod on a rented node: refused, naming the node, nothing changed. The Pod is
/// deleted; returns the node's name.
fn refused_with_a_node(b: &Broker<'_>, pki: &Path, stolen: &Stolen) -> String {
    b.apply(CLUSTER, &super::pod("job", "sleep 3600")).unwrap();
    let node = super::verdict::running_on(b, CLUSTER, "job", Duration::from_secs(180));
    let e = rotate(b).unwrap_err().to_string();
    assert!(e.contains("has 1 node(s)") && e.contains(&node), "{e}");
    let ca = std::fs::read_to_string(pki.join("ca.crt")).unwrap();
    assert!(same_pem(&ca, &stolen.ca), "the CA unchanged");
    b.kubectl(CLUSTER, &["delete", "pod", "job", "--wait=false"])
        .unwrap();
    node
}

/// Rotates as soon as the node is gone: the reply and how long the call that did took.
fn rotated_at_zero(b: &Broker<'_>) -> (serde_json::Value, Duration) {
    let took = std::cell::Cell::new(Duration::ZERO);
    let r = wait_for(
        "a rotation once the node is gone",
        Duration::from_secs(240),
        || {
            let t0 = Instant::now();
            let r = rotate(b);
            took.set(t0.elapsed());
            match r {
                Ok(r) => Ok(Some(r)),
                Err(e) if e.to_string().contains("node(s)") => Ok(None),
                Err(e) => Err(e),
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}\n{}", b.diagnostics()));
    assert_eq!(r["cluster_cas"], "made", "{r}");
    assert_eq!(r["info"]["state"], "ready", "{r}");
    assert_ne!(r["users_ca_sha256"], r["previous_users_ca_sha256"]);
    (r, took.get())
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
fn rotate_ca_waits_for_zero_nodes_then_retires_the_old_cas_after_the_overlap() {
    let t = Instant::now();
    let step = |what: &str| eprintln!("[{:>6.1}s] {what}", t.elapsed().as_secs_f64());
    let world = World::new(1).unwrap();
    let b = Broker::start(&world, BrokerOptions::default()).unwrap();
    let dir = TempDir::new("rotate-ca").unwrap();
    let u = User::new(&b, dir.path(), CLUSTER);
    let pki = b.cluster_dir(CLUSTER).join("pki");
    let stolen = steal(&b, &pki, dir.path());

    let node = refused_with_a_node(&b, &pki, &stolen);
    step(&format!("refused while {node} is up"));
    let (r, took) = rotated_at_zero(&b);
    let until = SystemTime::UNIX_EPOCH
        + Duration::from_millis(r["previous_admitted_until"].as_u64().unwrap());
    step(&format!(
        "rotated in {:.1} s (its control plane restarted): {r}",
        took.as_secs_f64()
    ));

    u.ok(&b, &["get", "pods"]);
    let new_user = fresh_kubeconfig(&b, dir.path());
    new_user.ok(&b, &["get", "pods"]);
    step("the old and the new kubeconfig both work within the overlap");

    cluster_ca_replaced(&b, &pki, &stolen);
    step("the cluster CA is new: the old key's certificate refused, Pods given the new CA");
    b.apply(CLUSTER, &super::pod("after", "sleep 3600"))
        .unwrap();
    let node = super::verdict::running_on(&b, CLUSTER, "after", Duration::from_secs(180));
    step(&format!("a Pod runs on {node}, rented after the rotation"));

    refused_after(&b, &u, until);
    new_user.ok(&b, &["get", "pods"]);
    step("after the overlap: the old kubeconfig refused naming the rotation, the new one works");
}

fn base64_of(pem: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(pem)
}
