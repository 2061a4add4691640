//! The broker against hostile tenants, strangers and providers (docs/security.md): each
//! test performs an attack a review of the broker found, against the real daemon, its real
//! front and the Kubernetes we ship, and checks that it fails and says why.

#[path = "hostile/relay.rs"]
mod relay;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};
use socialweb_broker::api::{CREATE_CLUSTER, LIST_CLUSTERS};
use socialweb_broker::auth::token::{SigningKey, sign};
use socialweb_broker::config::{Access, ClusterDefaults, Front, Registration};
use testbed::broker::{Broker, BrokerOptions};
use testbed::k8s::wait_for;
use testbed::tmp::TempDir;
use testbed::world::World;

#[path = "hostile/budgets.rs"]
mod budgets;
#[path = "hostile/rights.rs"]
mod rights;

/// A new did:key, its key written where `socialweb-broker api --key` reads it.
fn user(dir: &Path, name: &str) -> (PathBuf, SigningKey) {
    let key = SigningKey::generate(atrium_crypto::Algorithm::P256);
    let path = dir.join(format!("{name}.key"));
    std::fs::write(&path, key.to_multibase()).unwrap();
    (path, key)
}

/// A new DID's cluster `name`, made through the gateway API, and the DID's kubeconfig for
/// it (the owners' group, through the front): a tenant.
fn tenant_cluster(b: &Broker<'_>, dir: &Path, name: &str) -> PathBuf {
    let (key_file, _) = user(dir, name);
    b.api(&key_file, &["create-cluster", name, "--wait", "2m"])
        .unwrap();
    let kc = dir.join(format!("{name}.kubeconfig"));
    b.api(
        &key_file,
        &["kubeconfig", name, "--out", kc.to_str().unwrap()],
    )
    .unwrap();
    kc
}

/// The broker's DID (the tokens' audience), from describeServer.
fn audience(b: &Broker<'_>) -> String {
    let v = curl_json(
        b,
        &format!("{}/xrpc/computer.socialweb.describeServer", b.front_url()),
        &[],
    );
    v.1["did"].as_str().unwrap().to_string()
}

/// curl from the internet: the status and the JSON body.
fn curl_json(b: &Broker<'_>, url: &str, extra: &[&str]) -> (u16, Value) {
    let ca = b.front_ca();
    let mut args = vec![
        "-sS",
        "-o",
        "-",
        "-w",
        "\n%{http_code}",
        "--cacert",
        ca.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    args.push(url);
    let o = b.world.internet.output("curl", &args).unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let (body, code) = out.rsplit_once('\n').unwrap_or(("", "0"));
    (
        code.trim().parse().unwrap_or(0),
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}

/// A gateway API call with a token `key` signs as `iss`.
fn call(
    b: &Broker<'_>,
    key: &SigningKey,
    iss: &str,
    method: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let token = sign(key, iss, &audience(b), method, 60, SystemTime::now());
    let auth = format!("Authorization: Bearer {token}");
    let url = format!("{}/xrpc/{method}", b.front_url());
    match body {
        Some(v) => {
            let data = v.to_string();
            curl_json(
                b,
                &url,
                &[
                    "-H",
                    &auth,
                    "-H",
                    "Content-Type: application/json",
                    "--data",
                    &data,
                ],
            )
        }
        None => curl_json(b, &url, &["-H", &auth]),
    }
}

fn message(v: &Value) -> &str {
    v["message"].as_str().unwrap_or("")
}

#[test]
fn who_may_have_a_cluster_is_the_operators_choice() {
    let world = World::new(0).unwrap();
    let dir = TempDir::new("registration").unwrap();
    let (_, mallory) = user(dir.path(), "mallory");

    // The defaults: namespace nodes, tenants not trusted: the API serves no user at all.
    let b = Broker::start(
        &world,
        BrokerOptions {
            access: Access::default(),
            ..Default::default()
        },
    )
    .unwrap();
    let (code, v) = call(
        &b,
        &mallory,
        &mallory.did(),
        CREATE_CLUSTER,
        Some(json!({"name": "escape"})),
    );
    assert_eq!(code, 403, "{v}");
    assert!(message(&v).contains("access.tenants_trusted"), "{v}");
    assert!(
        b.cli_json(&["cluster", "list"])
            .unwrap()
            .as_array()
            .unwrap()
            .is_empty()
    );
    drop(b);

    // Trusted tenants, registration closed (the default): a stranger is refused, naming the
    // policy; the operator's own cluster for a DID still works, and its owner gets in.
    let b = Broker::start(
        &world,
        BrokerOptions {
            access: Access {
                tenants_trusted: true,
                ..Access::default()
            },
            ..Default::default()
        },
    )
    .unwrap();
    let (code, v) = call(
        &b,
        &mallory,
        &mallory.did(),
        CREATE_CLUSTER,
        Some(json!({"name": "mine"})),
    );
    assert_eq!(code, 403, "{v}");
    assert!(
        message(&v).contains("registration at this broker is closed"),
        "{v}"
    );
    let (alice_file, alice) = user(dir.path(), "alice");
    b.cli(&["cluster", "create", "given", "--owner", &alice.did()])
        .unwrap();
    let listed = b.api(&alice_file, &["list-clusters"]).unwrap();
    assert_eq!(listed["clusters"][0]["name"], "given", "{listed}");
    drop(b);

    // By invite: one code admits one DID, once.
    let b = Broker::start(
        &world,
        BrokerOptions {
            access: Access {
                tenants_trusted: true,
                registration: Registration::Invite,
                ..Access::default()
            },
            ..Default::default()
        },
    )
    .unwrap();
    let (code, v) = call(
        &b,
        &mallory,
        &mallory.did(),
        CREATE_CLUSTER,
        Some(json!({"name": "m1"})),
    );
    assert_eq!(code, 403, "{v}");
    assert!(
        message(&v).contains("by invite") && message(&v).contains("`invite`"),
        "{v}"
    );
    let inv = b
        .cli_json(&["invite", "create", "--expires", "1h", "--note", "bob"])
        .unwrap();
    let code_text = inv["code"].as_str().unwrap().to_string();
    let (code, v) = call(
        &b,
        &mallory,
        &mallory.did(),
        CREATE_CLUSTER,
        Some(json!({"name": "m1", "invite": "0a1b2c3d.00000000000000000000000000000000"})),
    );
    assert_eq!(code, 403, "{v}");
    assert!(message(&v).contains("not a good invite"), "{v}");
    let (bob_file, bob) = user(dir.path(), "bob");
    let created = b
        .api(&bob_file, &["create-cluster", "b1", "--invite", &code_text])
        .unwrap();
    assert_eq!(created["name"], "b1", "{created}");
    let (code, v) = call(
        &b,
        &mallory,
        &mallory.did(),
        CREATE_CLUSTER,
        Some(json!({"name": "m1", "invite": code_text})),
    );
    assert_eq!(code, 403, "a used invite admits no one else: {v}");
    let (code, v) = call(
        &b,
        &bob,
        &bob.did(),
        CREATE_CLUSTER,
        Some(json!({"name": "b2"})),
    );
    assert_eq!(code, 200, "an admitted DID needs no invite again: {v}");
    let list = b.cli_json(&["invite", "list"]).unwrap();
    assert_eq!(list[0]["used_by"], bob.did(), "{list}");
}

#[test]
fn concurrent_creates_stop_at_the_limit_and_requests_at_the_rate() {
    let world = World::new(0).unwrap();
    let dir = TempDir::new("limits").unwrap();
    let b = Broker::start(
        &world,
        BrokerOptions {
            access: Access {
                tenants_trusted: true,
                registration: Registration::Open,
                max_clusters_per_did: 2,
                requests_per_minute_per_source: 30,
                ..Access::default()
            },
            ..Default::default()
        },
    )
    .unwrap();
    let (key_file, _) = user(dir.path(), "mallory");
    // Eight createCluster calls at once, from one DID allowed two.
    let got: Vec<Result<Value, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let (b, key_file) = (&b, &key_file);
                s.spawn(move || {
                    b.api(key_file, &["create-cluster", &format!("c{i}")])
                        .map_err(|e| e.to_string())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let made = got.iter().filter(|r| r.is_ok()).count();
    assert_eq!(made, 2, "{got:?}");
    for e in got.iter().filter_map(|r| r.as_ref().err()) {
        assert!(e.contains("the most this broker allows one DID"), "{e}");
    }
    assert_eq!(
        b.cli_json(&["cluster", "list"])
            .unwrap()
            .as_array()
            .unwrap()
            .len(),
        2
    );

    // Requests from one address past its rate are refused before any token is looked at.
    let url = format!("{}/xrpc/computer.socialweb.describeServer", b.front_url());
    let mut limited = None;
    for _ in 0..40 {
        let o = b
            .world
            .internet
            .output(
                "curl",
                &[
                    "-s",
                    "-o",
                    "/dev/null",
                    "-D",
                    "-",
                    "--cacert",
                    b.front_ca().to_str().unwrap(),
                    &url,
                ],
            )
            .unwrap();
        let head = String::from_utf8_lossy(&o.stdout).to_lowercase();
        if head.starts_with("http/2 429") || head.starts_with("http/1.1 429") {
            limited = Some(head);
            break;
        }
    }
    let head = limited.expect("no 429 within 40 requests of a 30-a-minute budget");
    assert!(head.contains("retry-after:"), "{head}");
    // Another address is not held to that one's budget.
    assert_eq!(status_from_host(&b, &url), "200");
}

/// The HTTP status the operator's host gets for `url` at the front ("000": no answer in
/// 10 s).
fn status_from_host(b: &Broker<'_>, url: &str) -> String {
    let o = b
        .host
        .output(
            "curl",
            &[
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--max-time",
                "10",
                "--cacert",
                b.front_ca().to_str().unwrap(),
                url,
            ],
        )
        .unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Whether the front has closed `s`, or answered on it, within `wait`.
fn closed_or_answered(
    s: &mut rustls::StreamOwned<rustls::ClientConnection, TcpStream>,
    wait: Duration,
) -> bool {
    s.sock.set_read_timeout(Some(wait)).unwrap();
    let mut buf = [0u8; 256];
    !matches!(
        s.read(&mut buf),
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
    )
}

/// A Pod manifest with `spec` merged in.
fn pod(name: &str, spec: Value) -> String {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
                       "spec": {"containers": [{"name": "c", "image": "socialweb.local/busybox:1", "command": ["sleep", "1"]}]}});
    socialweb_agent_merge(&mut p["spec"], &spec);
    // A container a spec names without an image runs busybox.
    for c in p["spec"]["containers"].as_array_mut().into_iter().flatten() {
        if c.get("image").is_none() {
            c["image"] = "socialweb.local/busybox:1".into();
        }
    }
    p.to_string()
}

/// RFC 7386 merge, as the agent's kubelet patch (a copy: the tests do not link the agent).
fn socialweb_agent_merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().unwrap();
            for (k, v) in p {
                socialweb_agent_merge(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        other => *target = other.clone(),
    }
}

#[test]
fn an_escape_pod_is_refused_and_its_owner_cannot_lift_the_policy() {
    let world = World::new(0).unwrap();
    let dir = TempDir::new("escape").unwrap();
    let b = Broker::start(&world, BrokerOptions::default()).unwrap();
    let kc = tenant_cluster(&b, dir.path(), "t");
    control_plane_in_its_budget(&b, "t");
    let kubectl = |args: &[&str], stdin: Option<&str>| kubectl_with(&b, &kc, args, stdin);
    // The attack as it was done: privileged, hostPID, the host's / mounted.
    let escape = pod(
        "escape",
        json!({"hostPID": true, "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
               "containers": [{"name": "c", "image": "socialweb.local/busybox:1", "command": ["nsenter", "-t", "1", "-a", "sh"],
                               "securityContext": {"privileged": true}, "volumeMounts": [{"name": "root", "mountPath": "/host"}]}]}),
    );
    let (ok, out) = kubectl(&["create", "--dry-run=server", "-f", "-"], Some(&escape));
    assert!(!ok, "the escape Pod was admitted: {out}");
    // The apiserver runs with --allow-privileged=false: refused before any policy.
    assert!(
        out.contains("privileged: Forbidden: disallowed by cluster policy"),
        "{out}"
    );
    // Without `privileged`, the policy refuses the rest of it.
    let unprivileged = escape.replace(r#""securityContext":{"privileged":true},"#, "");
    assert_ne!(unprivileged, escape);
    let (ok, out) = kubectl(
        &["create", "--dry-run=server", "-f", "-"],
        Some(&unprivileged),
    );
    assert!(!ok, "{out}");
    // PodSecurity admission, `baseline` by default in every namespace.
    assert!(
        out.contains(r#"violates PodSecurity "baseline:latest""#)
            && out.contains("hostPID=true")
            && out.contains("hostPath volumes"),
        "{out}"
    );
    for (what, spec, needle) in [
        (
            "privileged",
            json!({"containers": [{"name": "c", "securityContext": {"privileged": true}}]}),
            "privileged",
        ),
        ("hostNetwork", json!({"hostNetwork": true}), "hostNetwork"),
        ("hostIPC", json!({"hostIPC": true}), "hostIPC"),
        (
            "hostPath",
            json!({"volumes": [{"name": "h", "hostPath": {"path": "/etc"}}]}),
            "hostPath",
        ),
        (
            "SYS_ADMIN",
            json!({"containers": [{"name": "c", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]}),
            "capabilities",
        ),
        (
            "a privileged init container",
            json!({"initContainers": [{"name": "i", "image": "socialweb.local/busybox:1", "securityContext": {"privileged": true}}]}),
            "privileged",
        ),
        (
            "seccomp Unconfined",
            json!({"securityContext": {"seccompProfile": {"type": "Unconfined"}}}),
            "seccompProfile",
        ),
        (
            "a host port",
            json!({"containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 80}]}]}),
            "hostPort",
        ),
        (
            "an nfs volume (the kubelet mounts it on the host)",
            json!({"volumes": [{"name": "n", "nfs": {"server": "10.0.2.2", "path": "/"}}]}),
            "volumes may be",
        ),
    ] {
        let (ok, out) = kubectl(
            &["create", "--dry-run=server", "-f", "-"],
            Some(&pod("p", spec)),
        );
        assert!(!ok && out.contains(needle), "{what}: {out}");
    }
    let (ok, out) = kubectl(
        &["create", "--dry-run=server", "-f", "-"],
        Some(&pod("fine", json!({}))),
    );
    assert!(ok, "an ordinary Pod is admitted: {out}");

    // A PersistentVolume of the host's disk, and a claim on it: refused at the volume.
    let pv = |name: &str, spec: Value| {
        let mut spec = spec;
        socialweb_agent_merge(
            &mut spec,
            &json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"]}),
        );
        json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name}, "spec": spec})
            .to_string()
    };
    let csi = json!({"csi": {"driver": "disk.example.com", "volumeHandle": "v1"}});
    for (what, spec, needle) in [
        (
            "hostPath /",
            json!({"hostPath": {"path": "/"}}),
            "PersistentVolumes may only be csi",
        ),
        (
            "local /",
            json!({"local": {"path": "/"}, "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["x"]}]}]}}}),
            "PersistentVolumes may only be csi",
        ),
        (
            "a raw block device",
            {
                let mut s = csi.clone();
                s["volumeMode"] = "Block".into();
                s
            },
            "volumeMode Filesystem",
        ),
    ] {
        let (ok, out) = kubectl(
            &["create", "--dry-run=server", "-f", "-"],
            Some(&pv("host", spec)),
        );
        assert!(!ok && out.contains(needle), "a PV of {what}: {out}");
    }
    let (ok, out) = kubectl(
        &["create", "--dry-run=server", "-f", "-"],
        Some(&pv("disk", csi)),
    );
    assert!(ok, "a CSI PersistentVolume is admitted: {out}");

    // A built-in API group repointed at a Service of the tenant's: refused; its own group
    // and the metrics groups are the tenant's to register.
    let apiservice = |name: &str| {
        json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": name},
               "spec": {"service": {"namespace": "default", "name": "mine"}, "group": name.split_once('.').unwrap().1,
                        "version": name.split_once('.').unwrap().0, "insecureSkipTLSVerify": true,
                        "groupPriorityMinimum": 1000, "versionPriority": 15}})
        .to_string()
    };
    let repoint = r#"{"spec":{"service":{"namespace":"default","name":"mine"},"insecureSkipTLSVerify":true,"caBundle":null}}"#;
    for args in [
        vec![
            "patch",
            "apiservice",
            "v1.admissionregistration.k8s.io",
            "--dry-run=server",
            "--type=merge",
            "-p",
            repoint,
        ],
        vec![
            "patch",
            "apiservice",
            "v1.",
            "--dry-run=server",
            "--type=merge",
            "-p",
            repoint,
        ],
        vec![
            "delete",
            "apiservice",
            "v1.certificates.k8s.io",
            "--dry-run=server",
        ],
        vec!["delete", "apiservices", "--all", "--dry-run=server"],
    ] {
        let (ok, out) = kubectl(&args, None);
        assert!(
            !ok && out.contains("APIServices of Kubernetes' own groups"),
            "{args:?}: {out}"
        );
    }
    for (name, allowed) in [
        ("v1alpha9.storage.k8s.io", false),
        ("v1.evil.kubernetes.io", false),
        ("v1alpha9.socialweb.computer", false),
        ("v1alpha1.wardle.example.com", true),
        ("v1beta1.metrics.k8s.io", true),
    ] {
        let (ok, out) = kubectl(
            &["create", "--dry-run=server", "-f", "-"],
            Some(&apiservice(name)),
        );
        assert_eq!(ok, allowed, "creating APIService {name}: {out}");
        if !allowed {
            assert!(out.contains("socialweb-apiservices"), "{name}: {out}");
        }
    }

    // The level a namespace chooses: baseline or restricted, at the latest version.
    for (labels, allowed) in [
        ("pod-security.kubernetes.io/enforce=privileged", false),
        ("pod-security.kubernetes.io/enforce-version=v1.0", false),
        ("pod-security.kubernetes.io/enforce=restricted", true),
        ("pod-security.kubernetes.io/enforce=baseline", true),
    ] {
        let (ok, out) = kubectl(
            &[
                "label",
                "--dry-run=server",
                "--overwrite",
                "namespace",
                "default",
                labels,
            ],
            None,
        );
        assert_eq!(ok, allowed, "{labels}: {out}");
        if !allowed {
            assert!(
                out.contains("socialweb-pod-security-labels"),
                "{labels}: {out}"
            );
        }
    }
    let privileged_ns =
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "wide-open",
        "labels": {"pod-security.kubernetes.io/enforce": "privileged"}}})
        .to_string();
    let (ok, out) = kubectl(
        &["create", "--dry-run=server", "-f", "-"],
        Some(&privileged_ns),
    );
    assert!(!ok && out.contains("baseline or restricted"), "{out}");

    // Its owner is cluster-admin, and still cannot lift the policy by any way round.
    for args in [
        vec![
            "delete",
            "validatingadmissionpolicy",
            "socialweb-pod-security-labels",
        ],
        vec![
            "delete",
            "validatingadmissionpolicy",
            "socialweb-persistent-volumes",
        ],
        vec![
            "delete",
            "validatingadmissionpolicybinding",
            "socialweb-apiservices",
        ],
        vec![
            "delete",
            "validatingadmissionpolicy",
            "socialweb-node-isolation",
        ],
        vec![
            "delete",
            "validatingadmissionpolicybinding",
            "socialweb-node-isolation",
        ],
        vec!["delete", "validatingadmissionpolicies", "--all"],
        vec![
            "patch",
            "validatingadmissionpolicybinding",
            "socialweb-node-isolation",
            "--type=merge",
            "-p",
            r#"{"spec":{"validationActions":["Warn"]}}"#,
        ],
        vec![
            "--as=mallory",
            "--as-group=system:masters",
            "delete",
            "validatingadmissionpolicy",
            "socialweb-node-isolation",
        ],
    ] {
        let (ok, out) = kubectl(&args, None);
        assert!(!ok, "{args:?} succeeded: {out}");
        assert!(
            out.contains("Forbidden") || out.contains("forbidden"),
            "{args:?}: {out}"
        );
    }
    // A client certificate for system:masters by CSR: Kubernetes refuses the request itself;
    // and the owner cannot approve any CSR (the broker approves nodes' only).
    let (ok, out) = kubectl(
        &["create", "-f", "-"],
        Some(&client_csr(
            dir.path(),
            "masters",
            "/CN=mallory/O=system:masters",
        )),
    );
    assert!(
        !ok && out.contains("system:masters group is not allowed"),
        "{out}"
    );
    let (ok, out) = kubectl(
        &["create", "-f", "-"],
        Some(&client_csr(dir.path(), "admin", "/CN=mallory/O=admins")),
    );
    assert!(ok, "{out}");
    let (ok, out) = kubectl(&["certificate", "approve", "admin"], None);
    assert!(!ok && out.to_lowercase().contains("forbidden"), "{out}");
    let (_, can) = kubectl(
        &[
            "auth",
            "can-i",
            "delete",
            "validatingadmissionpolicies/socialweb-node-isolation",
        ],
        None,
    );
    assert!(
        can.lines()
            .any(|l| l.starts_with("no - the broker's admission policies")),
        "{can}"
    );
    // The policy stands, as the broker applied it.
    let v = b
        .kubectl_json(
            "t",
            &[
                "get",
                "validatingadmissionpolicybinding",
                "socialweb-node-isolation",
            ],
        )
        .unwrap();
    assert_eq!(v["spec"]["validationActions"], json!(["Deny"]));
}

/// A tenant's kubectl: (success, stdout and stderr), `stdin` piped in when given.
fn kubectl_with(
    b: &Broker<'_>,
    kubeconfig: &Path,
    args: &[&str],
    stdin: Option<&str>,
) -> (bool, String) {
    let mut c = b.kubectl_as(kubeconfig, &[], args);
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    if let Some(s) = stdin {
        // A kubectl that gave up before reading it all says why on stderr.
        let _ = child.stdin.take().unwrap().write_all(s.as_bytes());
    } else {
        drop(child.stdin.take());
    }
    let o = child.wait_with_output().unwrap();
    (
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

/// Issue 36, attack 8: a tenant fills its datastore with Secrets. At the quota (48 MiB here,
/// 2048 by default) its writes are refused with the reason, reads and deletes are served,
/// it cannot lift the quota, the broker's own writes go on, and another tenant's cluster on
/// the same broker is not affected.
#[test]
fn a_tenant_filling_its_datastore_is_stopped_at_the_quota_and_no_one_else_is() {
    const QUOTA_MIB: u64 = 48;
    let world = World::new(0).unwrap();
    let dir = TempDir::new("quota").unwrap();
    let b = Broker::start(
        &world,
        BrokerOptions {
            clusters: ClusterDefaults {
                datastore_quota_mib: QUOTA_MIB,
                ..ClusterDefaults::default()
            },
            ..Default::default()
        },
    )
    .unwrap();
    let (full, other) = (
        &tenant_cluster(&b, dir.path(), "full"),
        &tenant_cluster(&b, dir.path(), "other"),
    );
    // ConfigMaps held by a finalizer of the tenant's, deleted: an update of an object being
    // deleted is the control plane's kind of write (finalizers removed), which the quota
    // lets through at the quota -- and, since issue 58, not past its headroom.
    for i in 0..12 {
        let cm = format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: held-{i}, namespace: default, finalizers: [example.com/hold]}}\n"
        );
        let (ok, out) = kubectl_with(&b, full, &["create", "-f", "-"], Some(&cm));
        assert!(ok, "{out}");
        let (ok, out) = kubectl_with(
            &b,
            full,
            &["delete", "configmap", &format!("held-{i}"), "--wait=false"],
            None,
        );
        assert!(ok, "{out}");
    }
    // The tenant cannot create a ConfigMap of the broker's names (were one missing).
    let (ok, out) = kubectl_with(
        &b,
        full,
        &[
            "-n",
            "kube-system",
            "create",
            "configmap",
            "socialweb-datastore-quota-2",
        ],
        None,
    );
    assert!(
        !ok && out.contains("the control plane's namespaces"),
        "{out}"
    );
    // Secrets of 960 KiB (a Secret holds at most 1 MiB), eight to a kubectl call.
    let blob = "A".repeat(960 * 1024 / 3 * 4);
    let batch = |from: usize| -> String {
        (from..from + 8)
            .map(|i| {
                format!(
                    "apiVersion: v1\nkind: Secret\nmetadata: {{name: s-{i}, namespace: default}}\ndata: {{blob: {blob}}}\n"
                )
            })
            .collect::<Vec<_>>()
            .join("---\n")
    };
    let db = b.cluster_dir("full").join("kine/state.db");
    let mut written = 0;
    let t = Instant::now();
    let refusal = loop {
        let (ok, out) = kubectl_with(&b, full, &["create", "-f", "-"], Some(&batch(written)));
        let created = out.matches("created").count();
        written += created;
        eprintln!(
            "[{:>6.1}s] {written} written, the database file {} MiB",
            t.elapsed().as_secs_f64(),
            std::fs::metadata(&db).map(|m| m.len() >> 20).unwrap_or(0)
        );
        if !ok {
            break out;
        }
        assert!(
            written < 4 * QUOTA_MIB as usize,
            "{written} Secrets of 960 KiB written, none refused; the database is {} bytes",
            std::fs::metadata(&db).map(|m| m.len()).unwrap_or(0)
        );
    };
    let size = std::fs::metadata(&db).unwrap().len();
    eprintln!(
        "{written} Secrets of 960 KiB written before the first refusal; kine's database file: {} MiB",
        size >> 20
    );
    assert!(
        refusal.contains(&format!("at its quota of {QUOTA_MIB} MiB")),
        "{refusal}"
    );
    assert!(
        written >= 8,
        "the quota refused the first writes: {refusal}"
    );
    assert!(
        size < (QUOTA_MIB + 16) << 20,
        "the database grew to {size} bytes past a quota of {QUOTA_MIB} MiB"
    );
    // Any write is refused, not just big ones.
    let (ok, out) = kubectl_with(&b, full, &["create", "configmap", "small"], None);
    assert!(!ok && out.contains("quota"), "{out}");
    // Reads and deletes are served.
    let (ok, out) = kubectl_with(&b, full, &["get", "secret", "s-0", "-o", "name"], None);
    assert!(ok, "{out}");
    let (ok, out) = kubectl_with(&b, full, &["delete", "secret", "s-1"], None);
    assert!(ok, "{out}");
    // The tenant cannot lift the quota.
    let (ok, out) = kubectl_with(
        &b,
        full,
        &[
            "-n",
            "kube-system",
            "patch",
            "configmap",
            "socialweb-datastore-quota",
            "--type=merge",
            "-p",
            r#"{"data": {"full": "false"}}"#,
        ],
        None,
    );
    assert!(
        !ok && out.contains("the control plane's namespaces"),
        "{out}"
    );
    let (ok, out) = kubectl_with(
        &b,
        full,
        &[
            "delete",
            "validatingadmissionpolicybinding",
            "socialweb-datastore-quota",
        ],
        None,
    );
    assert!(!ok && out.contains("admission policies"), "{out}");
    for who in [
        vec!["--as=system:kube-scheduler"],
        vec!["--as=x", "--as-group=system:nodes"],
        vec!["--as=system:node:n1"],
    ] {
        let mut args = who.clone();
        args.extend(["create", "configmap", "as-someone"]);
        // The front drops Impersonate-* headers (the request is the tenant's own, and refused
        // as such); in-cluster clients with the right to impersonate meet the guard, which
        // refuses these identities (broker/core/src/guard.rs).
        let (ok, out) = kubectl_with(&b, full, &args, None);
        assert!(!ok && out.contains("datastore quota"), "{who:?}: {out}");
    }
    // The broker's own writes (system:masters) go on.
    b.kubectl("full", &["create", "configmap", "the-brokers"])
        .unwrap();
    // The other cluster is not affected.
    let (ok, out) = kubectl_with(&b, other, &["create", "-f", "-"], Some(&batch(0)));
    assert!(ok, "the other cluster refused a write: {out}");

    // Updates of the objects being deleted go on past the quota, and stop at its headroom
    // (an eighth of the quota, at least 16 MiB): no writer is exempt without end.
    let patch = dir.path().join("grow.json");
    let mut grown = 0;
    let stopped = loop {
        let fill = char::from(b'a' + (grown % 26) as u8)
            .to_string()
            .repeat(900 * 1024);
        std::fs::write(&patch, json!({"data": {"blob": fill}}).to_string()).unwrap();
        let (ok, out) = kubectl_with(
            &b,
            full,
            &[
                "patch",
                "configmap",
                &format!("held-{}", grown % 12),
                "--type=merge",
                "--patch-file",
                patch.to_str().unwrap(),
            ],
            None,
        );
        if !ok {
            break out;
        }
        grown += 1;
        assert!(
            grown < 48,
            "{grown} updates of 900 KiB to ConfigMaps being deleted, none refused; the database \
             is {} bytes",
            std::fs::metadata(&db).map(|m| m.len()).unwrap_or(0)
        );
    };
    let size = std::fs::metadata(&db).unwrap().len();
    eprintln!(
        "{grown} updates of 900 KiB to objects being deleted before the refusal; the database \
         file: {} MiB",
        size >> 20
    );
    assert!(stopped.contains("every write is refused"), "{stopped}");
    assert!(
        grown >= 1,
        "the headroom refused the first update: {stopped}"
    );
    assert!(
        size < (QUOTA_MIB + 16 + 16) << 20,
        "the database grew to {size} bytes past a quota of {QUOTA_MIB} MiB and 16 of headroom"
    );
    // Reads and deletes are still served, and the broker's own writes.
    let (ok, out) = kubectl_with(
        &b,
        full,
        &["get", "configmap", "held-0", "-o", "name"],
        None,
    );
    assert!(ok, "{out}");
    b.kubectl("full", &["create", "configmap", "the-brokers-too"])
        .unwrap();
}

/// Every component of `cluster`'s control plane is in one cgroup of its own whose memory
/// limit is the default `clusters.memory_max_mib` (2048) and process limit `pids_max` (8192).
fn control_plane_in_its_budget(b: &Broker<'_>, cluster: &str) {
    let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let cgroup_of = |component: &str| -> String {
        let pidfile = b.cluster_dir(cluster).join(format!("run/{component}.pid"));
        let text = std::fs::read_to_string(&pidfile)
            .unwrap_or_else(|e| panic!("{}: {e}", pidfile.display()));
        let pid = text.split_whitespace().next().unwrap();
        let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        let want = if v2 { "0::" } else { ":memory:" };
        cgroups
            .lines()
            .find_map(|l| l.split_once(want).map(|(_, p)| p.to_string()))
            .unwrap_or_else(|| panic!("{component}: no memory cgroup in {cgroups}"))
    };
    let apiserver = cgroup_of("apiserver");
    assert!(
        apiserver.starts_with("/socialweb-cluster-"),
        "the apiserver's cgroup: {apiserver}"
    );
    for c in ["kine", "controller-manager", "scheduler"] {
        assert_eq!(cgroup_of(c), apiserver, "{c} shares the apiserver's budget");
    }
    let read = |dir: &str, file: &str| {
        let p = format!("/sys/fs/cgroup/{dir}{apiserver}/{file}");
        std::fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("{p}: {e}"))
            .trim()
            .to_string()
    };
    let (memory, pids) = if v2 {
        (read("", "memory.max"), read("", "pids.max"))
    } else {
        (
            read("memory", "memory.limit_in_bytes"),
            read("pids", "pids.max"),
        )
    };
    assert_eq!(memory, (2048u64 << 20).to_string());
    assert_eq!(pids, "8192");
}

/// A CSR `name` for a client certificate of `subject` (kube-apiserver-client signer).
fn client_csr(dir: &Path, name: &str, subject: &str) -> String {
    let key = dir.join(format!("{name}.key"));
    let req = dir.join(format!("{name}.csr"));
    let o = std::process::Command::new("openssl")
        .args([
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            subject,
            "-keyout",
        ])
        .arg(&key)
        .arg("-out")
        .arg(&req)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    use base64::Engine;
    let pem = std::fs::read(&req).unwrap();
    json!({"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
           "metadata": {"name": name},
           "spec": {"request": base64::engine::general_purpose::STANDARD.encode(pem),
                    "signerName": "kubernetes.io/kube-apiserver-client", "usages": ["client auth"]}})
    .to_string()
}

/// The front's describeServer URL.
fn describe_server(b: &Broker<'_>) -> String {
    format!("{}/xrpc/computer.socialweb.describeServer", b.front_url())
}

/// The front's address.
fn front_addr(b: &Broker<'_>) -> SocketAddr {
    b.front_url()
        .trim_start_matches("https://")
        .parse()
        .unwrap()
}

/// A TLS client connection to the front, from the internet, with its handshake done.
fn handshaken(
    b: &Broker<'_>,
    from: &testbed::Netns,
) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    let addr = front_addr(b);
    let tcp = from
        .run(|| TcpStream::connect_timeout(&addr, Duration::from_secs(5)))
        .unwrap()
        .unwrap();
    tls_over(b, tcp)
}

/// A TCP connection to the front from `from`'s address `source`.
fn connect_from(b: &Broker<'_>, from: &testbed::Netns, source: std::net::Ipv4Addr) -> TcpStream {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, SockaddrIn, bind, connect, socket};
    use std::os::fd::AsRawFd;
    let SocketAddr::V4(to) = front_addr(b) else {
        panic!("the front is on IPv4")
    };
    from.run(|| -> nix::Result<TcpStream> {
        let fd = socket(
            AddressFamily::Inet,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )?;
        bind(
            fd.as_raw_fd(),
            &SockaddrIn::from(std::net::SocketAddrV4::new(source, 0)),
        )?;
        connect(fd.as_raw_fd(), &SockaddrIn::from(to))?;
        Ok(TcpStream::from(fd))
    })
    .unwrap()
    .unwrap()
}

/// `tcp` to the front, its TLS handshake done.
fn tls_over(
    b: &Broker<'_>,
    tcp: TcpStream,
) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    for c in socialweb_wire::ca::certificates(&std::fs::read(b.front_ca()).unwrap()).unwrap() {
        roots
            .add(rustls::pki_types::CertificateDer::from(c.der))
            .unwrap();
    }
    let cfg = Arc::new(
        rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    );
    let addr = front_addr(b);
    tcp.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    let conn = rustls::ClientConnection::new(cfg, name).unwrap();
    let mut s = rustls::StreamOwned::new(conn, tcp);
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock).unwrap();
    }
    s
}

/// Reads until the peer closes; how long that took.
fn closed_after(mut r: impl Read) -> Duration {
    let t = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match r.read(&mut buf) {
            Ok(0) | Err(_) => return t.elapsed(),
            Ok(_) => {}
        }
    }
}

#[test]
fn the_front_bounds_every_connection() {
    let world = World::new(0).unwrap();
    let b = Broker::start(
        &world,
        BrokerOptions {
            front: Front {
                max_connections: 4,
                max_connections_per_source: 4,
                handshake_timeout: Duration::from_secs(2),
                header_read_timeout: Duration::from_secs(2),
                idle_timeout: Duration::from_secs(3),
                ..Front::default()
            },
            ..Default::default()
        },
    )
    .unwrap();
    let addr: SocketAddr = b
        .front_url()
        .trim_start_matches("https://")
        .parse()
        .unwrap();
    // A slowloris after the handshake: half a request, then nothing. Closed, not held.
    let mut slow = handshaken(&b, &world.internet);
    slow.write_all(b"GET /xrpc/computer.socialweb.describeServer HTTP/1.1\r\nHost: front\r\n")
        .unwrap();
    slow.flush().unwrap();
    let held = closed_after(slow);
    assert!(
        held < Duration::from_secs(30),
        "a half-sent request held its connection for {held:?}"
    );
    // No handshake at all: closed too.
    let tcp = world
        .internet
        .run(|| TcpStream::connect(addr))
        .unwrap()
        .unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    assert!(closed_after(&tcp) < Duration::from_secs(30));
    // A kept-alive connection that goes quiet after its answer is closed.
    let mut idle = handshaken(&b, &world.internet);
    idle.write_all(b"GET /xrpc/computer.socialweb.describeServer HTTP/1.1\r\nHost: front\r\n\r\n")
        .unwrap();
    let mut first = [0u8; 12];
    idle.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    assert!(closed_after(idle) < Duration::from_secs(30));

    // One address holds at most four connections; the fifth is closed before its handshake.
    // The four fill the front (max_connections = 4), idle: another address that sends a
    // request is served in the place of the one idle longest, which is closed.
    let mut held: Vec<_> = (0..4).map(|_| handshaken(&b, &world.internet)).collect();
    let fifth = world
        .internet
        .run(|| TcpStream::connect(addr))
        .unwrap()
        .unwrap();
    fifth
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut probe = [0u8; 1];
    (&fifth).write_all(b"\x16\x03\x01\x00\x05hello").unwrap();
    let n = (&fifth).read(&mut probe).unwrap_or(0);
    assert_eq!(n, 0, "a fifth connection from one address was served");
    assert_eq!(
        status_from_host(&b, &describe_server(&b)),
        "200",
        "another address is served at max_connections"
    );
    let shed = held
        .iter_mut()
        .map(|s| closed_or_answered(s, Duration::from_millis(500)))
        .filter(|closed| *closed)
        .count();
    assert_eq!(shed, 1, "one idle connection made room, the others held");
    drop(held);
}

#[test]
fn slow_bodies_from_many_addresses_are_cut_and_make_room_for_a_client_that_works() {
    let world = World::new(0).unwrap();
    let b = Broker::start(
        &world,
        BrokerOptions {
            front: Front {
                max_connections: 8,
                max_connections_per_source: 2,
                body_read_timeout: Duration::from_secs(4),
                min_body_bytes_per_sec: 1024,
                ..Front::default()
            },
            ..Default::default()
        },
    )
    .unwrap();
    // Four addresses on the internet, two connections each: the front is full of POSTs
    // whose bodies (60,000 bytes announced) come one byte a second.
    let sources: Vec<std::net::Ipv4Addr> = (1..=4).map(|i| [192, 0, 2, i].into()).collect();
    for s in &sources {
        testbed::link::addr(&world.internet, "lo", &format!("{s}/32")).unwrap();
    }
    let mut slow: Vec<_> = sources
        .iter()
        .flat_map(|s| [*s, *s])
        .map(|s| {
            let mut c = tls_over(&b, connect_from(&b, &world.internet, s));
            c.write_all(
                b"POST /xrpc/computer.socialweb.describeServer HTTP/1.1\r\nHost: front\r\n\
                  Content-Type: application/json\r\nContent-Length: 60000\r\n\r\n{",
            )
            .unwrap();
            c.flush().unwrap();
            c
        })
        .collect();
    let t0 = Instant::now();
    // Another party's request is served: a connection receiving its body is no work of
    // the front's, so one of them makes room. (Before, all eight counted as busy and the
    // new connection was refused.)
    assert_eq!(
        status_from_host(&b, &describe_server(&b)),
        "200",
        "another address is served while the front is full of slow bodies"
    );
    // Every slow body ends: one byte a second earns nothing past body_read_timeout (4 s).
    let mut ended = vec![None; slow.len()];
    while ended.iter().any(Option::is_none) && t0.elapsed() < Duration::from_secs(40) {
        std::thread::sleep(Duration::from_secs(1));
        for (i, c) in slow.iter_mut().enumerate() {
            if ended[i].is_some() {
                continue;
            }
            if closed_or_answered(c, Duration::from_millis(10))
                || c.write_all(b" ").and_then(|_| c.flush()).is_err()
            {
                ended[i] = Some(t0.elapsed());
            }
        }
    }
    let ended: Vec<Duration> = ended
        .into_iter()
        .map(|e| e.expect("a slow body still open after 40 s"))
        .collect();
    eprintln!("slow bodies ended after {ended:?}");
    assert!(
        ended.iter().all(|d| *d < Duration::from_secs(20)),
        "body_read_timeout is 4 s: {ended:?}"
    );
}

#[test]
fn did_documents_come_only_from_the_internet_and_only_so_big() {
    let world = World::new(0).unwrap();
    let dir = TempDir::new("didattack").unwrap();
    let ca = socialweb_broker::pki::Pki::new(&dir.path().join("ca")).unwrap();
    let pair = ca
        .server(
            "users",
            &[
                format!("flood.{}", testbed::world::USERS_DOMAIN),
                format!("echo.{}", testbed::world::USERS_DOMAIN),
            ],
        )
        .unwrap();
    // A document without end (no length, never closed), and one that names another DID
    // with markup in it.
    let flood_sh = dir.path().join("flood.sh");
    std::fs::write(
        &flood_sh,
        "printf 'HTTP/1.1 200 OK\\r\\nContent-Type: application/json\\r\\n\\r\\n['\nexec yes '{}'\n",
    )
    .unwrap();
    let flood = world
        .internet
        .command("socat")
        .arg(format!(
            "OPENSSL-LISTEN:8445,reuseaddr,fork,bind={},cert={},key={},verify=0",
            testbed::world::USERS_ADDR,
            pair.cert.display(),
            pair.key.display()
        ))
        .arg(format!("SYSTEM:sh {}", flood_sh.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _kill_flood = testbed::process::Spawned::from_child(flood, "the flood");
    let www = dir.path().join("www");
    std::fs::create_dir_all(www.join(".well-known")).unwrap();
    std::fs::write(
        www.join(".well-known/did.json"),
        r#"{"id": "did:web:<script>alert(1)</script>", "verificationMethod": []}"#,
    )
    .unwrap();
    let echo = world
        .internet
        .command("openssl")
        .args(["s_server", "-quiet", "-WWW", "-accept"])
        .arg(format!("{}:8446", testbed::world::USERS_ADDR))
        .arg("-cert")
        .arg(&pair.cert)
        .arg("-key")
        .arg(&pair.key)
        .current_dir(&www)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _kill_echo = testbed::process::Spawned::from_child(echo, "the echo");
    let b = Broker::start(
        &world,
        BrokerOptions {
            front: Front {
                did_web_roots: vec![ca.ca_cert()],
                ..Front::default()
            },
            ..Default::default()
        },
    )
    .unwrap();
    let key = SigningKey::generate(atrium_crypto::Algorithm::P256);
    let users = testbed::world::USERS_DOMAIN;
    for (did, needle) in [
        (
            "did:web:127.0.0.1%3A8443".to_string(),
            "not a valid did:web",
        ),
        (
            "did:web:localhost%3A8443".to_string(),
            "not a valid did:web",
        ),
        (
            format!("did:web:{}%3A8443", testbed::world::LOOPBACK_NAME),
            "no public address",
        ),
        (
            format!("did:web:{}", testbed::world::PRIVATE_NAME),
            "no public address",
        ),
        (format!("did:web:{users}:a?b"), "not a valid did:web"),
        (format!("did:web:{users}:..:admin"), "not a valid did:web"),
        (format!("did:web:flood.{users}%3A8445"), "over 64 KiB"),
        (format!("did:web:echo.{users}%3A8446"), "for another DID"),
        ("did:plc:../../admin".to_string(), "not a valid did:plc"),
    ] {
        let t = Instant::now();
        let (code, v) = call(&b, &key, &did, LIST_CLUSTERS, None);
        assert_eq!(code, 401, "{did}: {v}");
        assert!(message(&v).contains(needle), "{did}: {v}");
        assert!(
            !message(&v).contains("<script>"),
            "{did}: fetched content echoed: {v}"
        );
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{did} took {:?}",
            t.elapsed()
        );
    }
}

#[test]
fn a_kubeconfig_minted_while_a_cluster_is_deleted_opens_no_later_cluster_of_its_name() {
    let world = World::new(0).unwrap();
    let dir = TempDir::new("race").unwrap();
    let b = Broker::start(&world, BrokerOptions::default()).unwrap();
    let (mallory_file, _) = user(dir.path(), "mallory");
    b.api(&mallory_file, &["create-cluster", "shared", "--wait", "2m"])
        .unwrap();
    let first_dir = b.cluster_dir("shared");
    // getKubeconfig calls racing the deletion.
    let minted: Vec<PathBuf> = std::thread::scope(|s| {
        let getters: Vec<_> = (0..6)
            .map(|i| {
                let (b, f, d) = (&b, &mallory_file, dir.path());
                s.spawn(move || {
                    std::thread::sleep(Duration::from_millis(50 * i));
                    let out = d.join(format!("m{i}.kubeconfig"));
                    b.api(f, &["kubeconfig", "shared", "--out", out.to_str().unwrap()])
                        .ok()
                        .map(|_| out)
                })
            })
            .collect();
        let deleter = s.spawn(|| b.api(&mallory_file, &["delete-cluster", "shared"]));
        deleter.join().unwrap().unwrap();
        getters
            .into_iter()
            .filter_map(|h| h.join().unwrap())
            .collect()
    });
    // Someone else takes the name.
    b.cli(&[
        "cluster",
        "create",
        "shared",
        "--owner",
        "did:key:zSomeoneElse",
    ])
    .unwrap();
    assert_ne!(
        b.cluster_dir("shared"),
        first_dir,
        "a new cluster of the name has a directory of its own"
    );
    for kc in &minted {
        // The mount path is the old owner's; pointed at the new cluster, still refused.
        let o = b.kubectl_as(kc, &[], &["get", "ns"]).output().unwrap();
        assert!(
            !o.status.success(),
            "{} opened the new cluster",
            kc.display()
        );
    }
    wait_for("the new cluster", Duration::from_secs(120), || {
        Ok(b.kubectl("shared", &["get", "--raw", "/readyz"])
            .ok()
            .filter(|s| s.trim() == "ok"))
    })
    .unwrap();
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn secrets_at_rest_are_owner_only_and_the_datastore_wants_its_own_certificate() {
    let world = World::new(0).unwrap();
    let b = Broker::start(&world, BrokerOptions::default()).unwrap();
    b.cli(&["cluster", "create", "secrets"]).unwrap();
    b.apply(
        "secrets",
        &pod("w", json!({})).replace("\"sleep\",\"1\"", "\"sleep\",\"3600\""),
    )
    .unwrap();
    wait_for("a node for the pod", Duration::from_secs(180), || {
        Ok((!b.ready_nodes("secrets")?.is_empty()).then_some(()))
    })
    .unwrap();
    assert_eq!(mode(&b.state), 0o700, "the state directory");
    assert_eq!(mode(&b.state.join("broker.db")), 0o600, "the store");
    for wal in ["broker.db-wal", "broker.db-shm"] {
        if b.state.join(wal).exists() {
            assert_eq!(mode(&b.state.join(wal)) & 0o077, 0, "{wal}");
        }
    }
    let records = &b.paths.provider_records;
    assert_eq!(mode(records.parent().unwrap()), 0o700);
    assert_eq!(mode(records), 0o600, "the provider's records");

    // The datastore (kine by default, etcd by choice): TLS, and only its own CA's client
    // certificate opens it (not the cluster CA's, which nodes' certificates are of). Asked
    // as the apiserver asks, over gRPC: an empty Range, whose answer is HTTP 200 with a
    // gRPC status once TLS let the request in.
    let pki = b.cluster_dir("secrets").join("pki");
    let port = datastore_port(&b.cluster_dir("secrets"));
    let url = format!("https://127.0.0.1:{port}/etcdserverpb.KV/Range");
    let frame = b.cluster_dir("secrets").join("empty-grpc-frame");
    std::fs::write(&frame, [0u8; 5]).unwrap();
    let body = format!("@{}", frame.display());
    let try_store = |extra: &[&str]| {
        let mut args = vec![
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "5",
            "--http2",
            "-H",
            "content-type: application/grpc",
            "-H",
            "te: trailers",
            "--cacert",
        ];
        let ca = pki.join("etcd/ca.crt");
        args.push(ca.to_str().unwrap());
        args.extend_from_slice(extra);
        args.extend(["--data-binary", &body, &url]);
        let o = b.host.output("curl", &args).unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let (admin_crt, admin_key) = (pki.join("admin.crt"), pki.join("admin.key"));
    assert_eq!(try_store(&[]), "000", "no client certificate");
    assert_eq!(
        try_store(&[
            "--cert",
            admin_crt.to_str().unwrap(),
            "--key",
            admin_key.to_str().unwrap()
        ]),
        "000",
        "the cluster CA's"
    );
    let (c, k) = (
        pki.join("etcd/apiserver.crt"),
        pki.join("etcd/apiserver.key"),
    );
    assert_eq!(
        try_store(&["--cert", c.to_str().unwrap(), "--key", k.to_str().unwrap()]),
        "200",
        "the datastore's own"
    );
    let plain = b
        .host
        .output(
            "curl",
            &[
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--max-time",
                "5",
                "--http2-prior-knowledge",
                "--data-binary",
                &body,
                &url.replace("https", "http"),
            ],
        )
        .unwrap();
    assert_ne!(
        String::from_utf8_lossy(&plain.stdout),
        "200",
        "no plain HTTP"
    );

    // The node's bootstrap token is gone once it joined; a CSR for a node the broker did
    // not plan is denied.
    let secrets = b
        .kubectl_json(
            "secrets",
            &[
                "get",
                "secrets",
                "-n",
                "kube-system",
                "--field-selector",
                "type=bootstrap.kubernetes.io/token",
            ],
        )
        .unwrap();
    wait_for(
        "the joined node's token deleted",
        Duration::from_secs(30),
        || {
            let v = b.kubectl_json(
                "secrets",
                &[
                    "get",
                    "secrets",
                    "-n",
                    "kube-system",
                    "--field-selector",
                    "type=bootstrap.kubernetes.io/token",
                ],
            )?;
            Ok(v["items"]
                .as_array()
                .is_some_and(|i| i.is_empty())
                .then_some(()))
        },
    )
    .unwrap_or_else(|e| panic!("{e}: {secrets}"));
    let ghost = ghost_csr(b.cluster_dir("secrets").as_path());
    b.apply("secrets", &ghost).unwrap();
    wait_for("the ghost CSR denied", Duration::from_secs(30), || {
        let v = b.kubectl_json("secrets", &["get", "csr", "ghost"])?;
        Ok(v["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Denied"))
            .map(|c| c["message"].clone()))
    })
    .unwrap();
}

/// The datastore's client port of a cluster (kine's or etcd's), from its command line.
fn datastore_port(cluster_dir: &Path) -> u16 {
    let (pidfile, flag) = [
        ("run/kine.pid", "--listen-address=127.0.0.1:"),
        ("run/etcd.pid", "--listen-client-url=https://127.0.0.1:"),
    ]
    .into_iter()
    .find(|(p, _)| cluster_dir.join(p).is_file())
    .expect("a kine or etcd pidfile");
    let pid: u32 = std::fs::read_to_string(cluster_dir.join(pidfile))
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    text.split(flag)
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// A kubelet client CSR for a node no one planned.
fn ghost_csr(dir: &Path) -> String {
    let (key, req) = (dir.join("ghost.key"), dir.join("ghost.csr"));
    let o = std::process::Command::new("openssl")
        .args([
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            "/CN=system:node:ghost/O=system:nodes",
            "-keyout",
        ])
        .arg(&key)
        .arg("-out")
        .arg(&req)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    use base64::Engine;
    json!({"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest", "metadata": {"name": "ghost"},
           "spec": {"request": base64::engine::general_purpose::STANDARD.encode(std::fs::read(&req).unwrap()),
                    "signerName": "kubernetes.io/kube-apiserver-client-kubelet", "usages": ["digital signature", "client auth"]}})
    .to_string()
}

#[test]
fn a_providers_market_port_serves_only_the_brokers_it_lists() {
    let world = World::new(1).unwrap();
    let dir = TempDir::new("provider-auth").unwrap();
    let b = Broker::start(
        &world,
        BrokerOptions {
            providers: 1,
            ..Default::default()
        },
    )
    .unwrap();
    let p = &b.providers[0];
    let leases = format!("{}/v1/leases", p.url);
    // From the internet, as anyone could: no client key, another key, plain HTTP.
    let stranger =
        socialweb_market_tls::Identity::load_or_create(&dir.path().join("stranger"), &[]).unwrap();
    let (cert, key) = (
        dir.path().join("stranger/cert.pem"),
        dir.path().join("stranger/key.pem"),
    );
    let code = |args: &[&str]| {
        let mut a = vec![
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "5",
        ];
        a.extend_from_slice(args);
        let o = world.internet.output("curl", &a).unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    assert_eq!(code(&["-k", &leases]), "000", "no client certificate");
    assert_eq!(
        code(&[
            "-k",
            "--cert",
            cert.to_str().unwrap(),
            "--key",
            key.to_str().unwrap(),
            &leases
        ]),
        "000",
        "a key the provider does not list ({})",
        stranger.pin_text()
    );
    assert_ne!(
        code(&[&leases.replace("https://", "http://")]),
        "200",
        "plain HTTP"
    );
    for (method, path) in [("DELETE", "/v1/leases/x"), ("POST", "/v1/rfps")] {
        let url = format!("{}{path}", p.url);
        assert_eq!(code(&["-k", "-X", method, &url]), "000", "{method} {path}");
    }
    // The broker's key gets in, from anywhere.
    let mut mine = vec!["-k".to_string()];
    mine.extend(b.provider_curl_args().into_iter().filter(|a| a != "-k"));
    let mut args: Vec<&str> = mine.iter().map(String::as_str).collect();
    args.push(&leases);
    assert_eq!(code(&args), "200");
    // What `provider-pin` prints on the provider machine is the key the broker pinned.
    let out = std::process::Command::new(testbed::cni::workspace_bin("socialweb-broker"))
        .args(["provider-pin", "--config"])
        .arg(&p.config)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        p.pin,
        "{out:?}"
    );
    // A provider machine with no brokers listed refuses to start, saying what to list.
    let lonely = dir.path().join("lonely.toml");
    let mut config = testbed::broker::read_config(&p.config).unwrap();
    config.local_provider.brokers.clear();
    testbed::broker::write_config(&lonely, &config).unwrap();
    let out = std::process::Command::new(testbed::cni::workspace_bin("socialweb-broker"))
        .args(["provider", "--config"])
        .arg(&lonely)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("local_provider.brokers"),
        "{out:?}"
    );
}

#[test]
fn the_embedded_provider_answers_only_its_owner() {
    let world = World::new(0).unwrap();
    let b = Broker::start(&world, BrokerOptions::default()).unwrap();
    let sock = b.provider_socket();
    let meta = std::fs::metadata(&sock).unwrap();
    use std::os::unix::fs::FileTypeExt;
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(mode(sock.parent().unwrap()), 0o700);
    let as_nobody = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "curl",
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--unix-socket",
        ])
        .arg(&sock)
        .arg("http://local-provider/v1/leases")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&as_nobody.stdout),
        "000",
        "another user reached the provider: {as_nobody:?}"
    );
    let o = b
        .host
        .output(
            "curl",
            &[
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--unix-socket",
                sock.to_str().unwrap(),
                "http://local-provider/v1/leases",
            ],
        )
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "200");
    let tcp = b
        .host
        .output(
            "curl",
            &[
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--max-time",
                "3",
                "http://127.0.0.1:7480/v1/leases",
            ],
        )
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&tcp.stdout), "000", "no TCP port");
}

/// A second broker the provider's operator also lists: it may rent here, and nothing else.
#[test]
fn a_broker_sees_and_touches_only_its_own_leases_and_no_id_is_a_path() {
    let world = World::new(1).unwrap();
    let dir = TempDir::new("rival-broker").unwrap();
    let mut b = Broker::start(
        &world,
        BrokerOptions {
            providers: 1,
            ..Default::default()
        },
    )
    .unwrap();
    // The first broker rents a node for a Pod of its tenant.
    b.cli(&["cluster", "create", "owned"]).unwrap();
    b.apply(
        "owned",
        &pod(
            "keep",
            json!({"containers": [{"name": "c", "command": ["sleep", "3600"]}]}),
        ),
    )
    .unwrap();
    let lease = wait_for("the first broker's lease", Duration::from_secs(60), || {
        Ok(b.live_leases()?.first().cloned())
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", b.diagnostics()));
    let lease_id = lease["id"].as_str().unwrap().to_string();
    // The provider's operator lists a second broker's key too.
    let rival =
        socialweb_market_tls::Identity::load_or_create(&dir.path().join("rival"), &[]).unwrap();
    let config = b.providers[0].config.clone();
    let text = std::fs::read_to_string(&config).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("brokers = "))
        .unwrap()
        .to_string();
    let listed = line.replacen('[', &format!("[{:?}, ", rival.pin_text()), 1);
    std::fs::write(&config, text.replace(&line, &listed)).unwrap();
    b.kill_provider(0);
    b.start_provider(0).unwrap();
    let url = b.providers[0].url.clone();
    let (cert, key) = (
        dir.path().join("rival/cert.pem").display().to_string(),
        dir.path().join("rival/key.pem").display().to_string(),
    );
    // The rival's calls, from the internet: (status, body).
    let as_rival = |method: &str, path: &str, body: Option<Value>| -> (u16, Value) {
        let target = format!("{url}{path}");
        let mut args = vec![
            "-sk",
            "--max-time",
            "10",
            "--cert",
            &cert,
            "--key",
            &key,
            "-X",
            method,
            "-w",
            "\n%{http_code}",
        ];
        let body = body.map(|b| b.to_string());
        if let Some(b) = &body {
            args.extend(["-H", "content-type: application/json", "--data", b]);
        }
        args.push(&target);
        let out = world.internet.output("curl", &args).unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        let code = code.trim().parse().unwrap_or(0);
        let body = match serde_json::from_str(body) {
            Ok(v) => v,
            // No answer: what curl said instead.
            Err(_) if code == 0 => Value::String(String::from_utf8_lossy(&out.stderr).into_owned()),
            Err(_) => Value::Null,
        };
        (code, body)
    };
    // It sees none of the first broker's leases, and cannot read or release one by its id.
    // (The restarted provider listens before it serves: its first answer is waited for.)
    let (code, list) = wait_for(
        "the restarted provider's answer",
        Duration::from_secs(30),
        || {
            let (code, list) = as_rival("GET", "/v1/leases", None);
            Ok((code != 0).then_some((code, list)))
        },
    )
    .unwrap_or_else(|e| {
        panic!(
            "{e:#}: {}\n{}",
            as_rival("GET", "/v1/leases", None).1,
            b.diagnostics()
        )
    });
    assert_eq!(code, 200, "{list}");
    assert_eq!(list["leases"], json!([]), "another broker's leases listed");
    let path = format!("/v1/leases/{lease_id}");
    assert_eq!(as_rival("GET", &path, None).0, 404);
    assert_eq!(as_rival("DELETE", &path, None).0, 404);
    // It may rent: an RFP of its own gets a bid...
    let rfp = |id: &str| {
        json!({"id": id, "spec": {"vcpu": 1, "memMiB": 256, "diskMiB": 1024}, "image": "local",
               "tags": {}, "bid_deadline_ms": 5000})
    };
    let (code, mine) = as_rival("POST", "/v1/rfps", Some(rfp("rival-1")));
    assert_eq!(code, 201, "{mine}");
    let bid = mine["bids"][0]["id"].as_str().unwrap().to_string();
    // ...but no id of its is a path: not the RFP's, not the lease's.
    for bad in [".", "..", "a/b", ".hidden"] {
        let (code, e) = as_rival("POST", "/v1/rfps", Some(rfp(bad)));
        assert_eq!(code, 400, "RFP id {bad:?}: {e}");
        let (code, e) = as_rival(
            "POST",
            &format!("/v1/bids/{bid}/accept"),
            Some(json!({"lease_id": bad, "identity": {}})),
        );
        assert_eq!(code, 400, "lease id {bad:?}: {e}");
        assert!(
            e["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("lease_id")),
            "{e}"
        );
    }
    // The first broker's lease and its node are untouched.
    assert!(
        b.live_leases()
            .unwrap()
            .iter()
            .any(|l| l["id"] == lease_id.as_str()),
        "the first broker's lease is gone"
    );
    let machines = std::fs::read_dir(&b.providers[0].paths.provider_nodes)
        .map(|d| d.count())
        .expect("the provider's machine directories");
    assert!(machines >= 1, "the provider's machines are gone");
    b.kubectl("owned", &["get", "pod", "keep"]).unwrap();
}
