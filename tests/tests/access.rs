//! The way in (docs/api.md), end to end with the real `kubectl`: a DID creates a cluster
//! through the gateway API, gets a kubeconfig, and reaches the cluster only through the
//! broker's front: requests, watches, `logs -f`, and exec, attach and port-forward over
//! both websocket and SPDY. Revocation cuts it off within a second, open watches included;
//! every other way of being refused is tried and must say why and write nothing.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use socialweb_broker::config::Front;
use testbed::broker::{Broker, BrokerOptions};
use testbed::k8s::wait_for;
use testbed::tmp::TempDir;
use testbed::user::text;
use testbed::world::World;

fn step(t: Instant, what: &str) {
    eprintln!("[{:>6.1}s] {what}", t.elapsed().as_secs_f64());
}

fn world() -> World {
    World::new(0).unwrap()
}

/// A user's did:web document for `did`, naming `key` as #atproto, served over HTTPS on
/// port 8444 at the users' address on the internet (openssl s_server); its CA and the server.
fn did_web_server(
    world: &World,
    dir: &Path,
    did: &str,
    key: &socialweb_broker::auth::token::SigningKey,
) -> (socialweb_broker::pki::Pki, std::process::Child) {
    let web_ca = socialweb_broker::pki::Pki::new(&dir.join("ca")).unwrap();
    let pair = web_ca
        .server("did", &[testbed::world::USERS_DOMAIN.into()])
        .unwrap();
    let multibase = key.did().strip_prefix("did:key:").unwrap().to_string();
    let docs = dir.join("www");
    std::fs::create_dir_all(docs.join(".well-known")).unwrap();
    std::fs::write(
        docs.join(".well-known/did.json"),
        serde_json::json!({
            "@context": ["https://www.w3.org/ns/did/v1", "https://w3id.org/security/multikey/v1"],
            "id": did,
            "verificationMethod": [{"id": format!("{did}#atproto"), "type": "Multikey",
                                    "controller": did, "publicKeyMultibase": multibase}],
        })
        .to_string(),
    )
    .unwrap();
    let server = world
        .internet
        .command("openssl")
        .args(["s_server", "-quiet", "-WWW", "-accept"])
        .arg(format!("{}:8444", testbed::world::USERS_ADDR))
        .arg("-cert")
        .arg(&pair.cert)
        .arg("-key")
        .arg(&pair.key)
        .current_dir(&docs)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    (web_ca, server)
}

fn keygen(dir: &Path, name: &str) -> (PathBuf, String) {
    let path = dir.join(name);
    let out = Command::new(testbed::cni::workspace_bin("socialweb-broker"))
        .args(["api", "keygen", "--out"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let did = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(did.starts_with("did:key:z"), "{did}");
    (path, did)
}

fn run(mut c: Command) -> Output {
    c.output().unwrap()
}

/// Runs `kubectl` and returns stdout, panicking with everything on failure.
fn ok(b: &Broker<'_>, kc: &Path, env: &[(&str, &str)], args: &[&str]) -> String {
    let o = run(b.kubectl_as(kc, env, args));
    assert!(
        o.status.success(),
        "kubectl {}: {}\n{}",
        args.join(" "),
        text(&o),
        b.diagnostics()
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Runs `kubectl` expecting a refusal; returns its message.
fn refused(b: &Broker<'_>, kc: &Path, args: &[&str]) -> String {
    let o = run(b.kubectl_as(kc, &[], args));
    assert!(!o.status.success(), "kubectl {} succeeded", args.join(" "));
    text(&o)
}

fn upgrades(b: &Broker<'_>, protocol: &str) -> usize {
    std::fs::read_to_string(b.log("broker"))
        .unwrap_or_default()
        .matches(&format!("upgrade to {protocol} through the front"))
        .count()
}

/// The `kubectl auth can-i` checks docs/gitlab.md lists, verbatim.
const GITLAB_CHECKS: &[&str] = &[
    "kubectl auth can-i create pods --namespace gitlab-runner",
    "kubectl auth can-i create pods/exec --namespace gitlab-runner",
    "kubectl auth can-i create pods/attach --namespace gitlab-runner",
    "kubectl auth can-i get pods/log --namespace gitlab-runner",
    "kubectl auth can-i create secrets --namespace gitlab-runner",
    "kubectl auth can-i create priorityclasses",
];

const WORKLOAD: &str = r#"apiVersion: v1
kind: Pod
metadata: {name: web, namespace: gitlab-runner}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: socialweb.local/busybox:1
    imagePullPolicy: Never
    stdin: true
    command: ["sh", "-c", "mkdir -p /www && echo served-through-the-front > /www/index.html && httpd -p 8080 -h /www && i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.5; done"]
    resources: {requests: {cpu: 100m, memory: 64Mi}}
"#;

#[test]
fn a_did_reaches_its_cluster_only_through_the_front_and_loses_it_on_revocation() {
    let t = Instant::now();
    let world = world();
    let b = Broker::start(&world, BrokerOptions::default()).unwrap();
    let dir = TempDir::new("access").unwrap();
    let (alice, alice_did) = keygen(dir.path(), "alice.key");
    let (mallory, _) = keygen(dir.path(), "mallory.key");

    let created = b
        .api(&alice, &["create-cluster", "ci", "--wait", "150s"])
        .unwrap_or_else(|e| panic!("{e:#}\n{}", b.diagnostics()));
    assert_eq!(created["state"], "ready", "{created}");
    let hash = socialweb_broker::access::names::account_hash(&alice_did);
    assert_eq!(created["accountHash"], hash.as_str());
    assert_eq!(
        created["mountPath"],
        format!("root:{hash}:ci:clusters").as_str()
    );
    step(t, "createCluster: ready");

    let kc = dir.path().join("ci.kubeconfig");
    let got = b
        .api(
            &alice,
            &[
                "kubeconfig",
                "ci",
                "--lifetime",
                "1h",
                "--out",
                kc.to_str().unwrap(),
            ],
        )
        .unwrap();
    let mode = std::fs::metadata(&kc).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the kubeconfig is owner-only");
    let serial = got["serial"].as_str().unwrap().to_string();
    let server = ok(
        &b,
        &kc,
        &[],
        &[
            "config",
            "view",
            "--minify",
            "-o",
            "jsonpath={.clusters[0].cluster.server}",
        ],
    );
    assert_eq!(
        server,
        format!("{}/clusters/root:{hash}:ci:clusters", b.front_url())
    );

    // The resting state, and the tenant's rights: not cluster-admin, its own namespaces'
    // everything (docs/security.md, "A tenant's rights").
    let nodes = run(b.kubectl_as(&kc, &[], &["get", "nodes"]));
    assert!(nodes.status.success(), "{}", text(&nodes));
    assert!(
        text(&nodes).contains("No resources found"),
        "{}",
        text(&nodes)
    );
    let all = run(b.kubectl_as(&kc, &[], &["auth", "can-i", "*", "*"]));
    assert_eq!(text(&all).trim(), "no", "the tenant is not cluster-admin");
    let ns_all = run(b.kubectl_as(
        &kc,
        &[],
        &["auth", "can-i", "*", "*", "--namespace", "default"],
    ));
    assert_eq!(
        text(&ns_all).trim(),
        "no",
        "nor a wildcard in a namespace: it holds a list of rights"
    );
    assert_eq!(
        ok(
            &b,
            &kc,
            &[],
            &["auth", "can-i", "delete", "deployments", "--all-namespaces"]
        )
        .trim(),
        "yes"
    );
    let me = ok(&b, &kc, &[], &["auth", "whoami", "-o", "json"]);
    let me: Value = serde_json::from_str(&me).unwrap();
    assert_eq!(me["status"]["userInfo"]["username"], alice_did.as_str());
    ok(&b, &kc, &[], &["create", "namespace", "gitlab-runner"]);
    // The checks docs/gitlab.md has a runner's operator run, as it lists them.
    for check in GITLAB_CHECKS {
        let args: Vec<&str> = check.split_whitespace().skip(1).collect();
        assert_eq!(ok(&b, &kc, &[], &args).trim(), "yes", "{check}");
    }
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/gitlab.md")).unwrap();
    for check in GITLAB_CHECKS {
        assert!(doc.contains(check), "docs/gitlab.md lists `{check}`");
    }
    step(
        t,
        "kubectl through the front: no nodes, can-i * * no, a namespace created",
    );

    // A node, and the streams.
    let manifest = dir.path().join("web.yaml");
    std::fs::write(&manifest, WORKLOAD).unwrap();
    ok(&b, &kc, &[], &["apply", "-f", manifest.to_str().unwrap()]);
    ok(
        &b,
        &kc,
        &[],
        &[
            "wait",
            "-n",
            "gitlab-runner",
            "--for=condition=Ready",
            "pod/web",
            "--timeout=150s",
        ],
    );
    step(t, "a node rented and the pod Ready");

    let ws = [
        ("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "true"),
        ("KUBECTL_PORT_FORWARD_WEBSOCKETS", "true"),
    ];
    let spdy = [
        ("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false"),
        ("KUBECTL_PORT_FORWARD_WEBSOCKETS", "false"),
    ];
    for (protocol, env, port) in [("websocket", &ws, "18080"), ("SPDY/3.1", &spdy, "18081")] {
        let before = upgrades(&b, protocol);
        let out = ok(
            &b,
            &kc,
            env,
            &[
                "exec",
                "-n",
                "gitlab-runner",
                "web",
                "--",
                "cat",
                "/www/index.html",
            ],
        );
        assert_eq!(
            out.trim(),
            "served-through-the-front",
            "exec over {protocol}"
        );
        assert!(upgrades(&b, protocol) > before, "exec used {protocol}");

        // attach: the container's output arrives while it runs.
        let before = upgrades(&b, protocol);
        let mut attach = b.kubectl_as(&kc, env, &["attach", "-n", "gitlab-runner", "web"]);
        let mut child = attach
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().unwrap().unwrap();
        assert!(
            first.starts_with("tick "),
            "attach over {protocol}: {first}"
        );
        let _ = child.kill();
        let _ = child.wait();
        assert!(upgrades(&b, protocol) > before, "attach used {protocol}");

        // port-forward: an HTTP request to the pod through the tunnel.
        let before = upgrades(&b, protocol);
        let mut pf = b
            .kubectl_as(
                &kc,
                env,
                &[
                    "port-forward",
                    "-n",
                    "gitlab-runner",
                    "pod/web",
                    &format!("{port}:8080"),
                ],
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let body = wait_for(
            "a page through port-forward",
            Duration::from_secs(20),
            || {
                let o = world.internet.output(
                    "curl",
                    &[
                        "-sS",
                        "--max-time",
                        "3",
                        &format!("http://127.0.0.1:{port}/"),
                    ],
                )?;
                Ok(o.status
                    .success()
                    .then(|| String::from_utf8_lossy(&o.stdout).into_owned()))
            },
        )
        .unwrap();
        let _ = pf.kill();
        let _ = pf.wait();
        assert_eq!(
            body.trim(),
            "served-through-the-front",
            "port-forward over {protocol}"
        );
        assert!(
            upgrades(&b, protocol) > before,
            "port-forward used {protocol}"
        );
        step(t, &format!("exec, attach and port-forward over {protocol}"));
    }

    // logs -f streams: two lines arrive a tick apart, long before the stream ends.
    let mut logs = b
        .kubectl_as(
            &kc,
            &[],
            &["logs", "-f", "--tail=1", "-n", "gitlab-runner", "web"],
        )
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(logs.stdout.take().unwrap()).lines();
    let a = lines.next().unwrap().unwrap();
    let b_line = lines.next().unwrap().unwrap();
    assert!(a.starts_with("tick ") && b_line.starts_with("tick ") && a != b_line);
    let _ = logs.kill();
    let _ = logs.wait();
    step(t, "logs -f streamed");

    // Refusals, each with its reason.
    let taken = b
        .api(&mallory, &["create-cluster", "ci"])
        .unwrap_err()
        .to_string();
    assert!(taken.contains("is taken"), "{taken}");
    let theirs = b
        .api(
            &mallory,
            &[
                "kubeconfig",
                "ci",
                "--out",
                dir.path().join("m.kc").to_str().unwrap(),
            ],
        )
        .unwrap_err()
        .to_string();
    assert!(theirs.contains("you have no cluster \"ci\""), "{theirs}");
    assert!(!dir.path().join("m.kc").exists(), "nothing written");
    let listed = b.api(&mallory, &["list-clusters"]).unwrap();
    assert_eq!(
        listed["clusters"],
        serde_json::json!([]),
        "another DID's cluster is not listed"
    );

    // A certificate from another cluster's CA, presented at this cluster's mount.
    b.api(&mallory, &["create-cluster", "other"]).unwrap();
    let mkc = dir.path().join("mallory.kubeconfig");
    b.api(
        &mallory,
        &["kubeconfig", "other", "--out", mkc.to_str().unwrap()],
    )
    .unwrap();
    let forged = dir.path().join("forged.kubeconfig");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&mkc).unwrap()).unwrap();
    v["clusters"][0]["cluster"]["server"] = server.clone().into();
    std::fs::write(&forged, v.to_string()).unwrap();
    // The same answer as a path with no cluster mounted: a stranger's certificate learns
    // nothing of which clusters exist.
    let m = refused(&b, &forged, &["get", "ns"]);
    assert!(
        m.contains("no cluster it was issued for is mounted here"),
        "{m}"
    );
    {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD;
        let user = &v["users"][0]["user"];
        let (cert, key) = (dir.path().join("m.crt"), dir.path().join("m.key"));
        std::fs::write(
            &cert,
            b64.decode(user["client-certificate-data"].as_str().unwrap())
                .unwrap(),
        )
        .unwrap();
        std::fs::write(
            &key,
            b64.decode(user["client-key-data"].as_str().unwrap())
                .unwrap(),
        )
        .unwrap();
        let answer = |url: &str| {
            world
                .internet
                .exec(
                    "curl",
                    &[
                        "-s",
                        "-w",
                        " %{http_code}",
                        "--cacert",
                        b.front_ca().to_str().unwrap(),
                        "--cert",
                        cert.to_str().unwrap(),
                        "--key",
                        key.to_str().unwrap(),
                        url,
                    ],
                )
                .unwrap()
        };
        let here = answer(&format!("{server}/api"));
        let nowhere = answer(&format!(
            "{}/api",
            server.replace(":ci:", ":no-such-cluster:")
        ));
        assert!(here.ends_with(" 401"), "{here}");
        assert_eq!(
            here, nowhere,
            "an unmounted path answers as another cluster's does"
        );
    }
    b.api(&mallory, &["delete-cluster", "other"]).unwrap();

    // No certificate at all (kubectl would prompt for a password; curl asks plainly).
    let o = world
        .internet
        .output(
            "curl",
            &[
                "-sS",
                "-w",
                " %{http_code}",
                "--cacert",
                b.front_ca().to_str().unwrap(),
                &format!("{server}/api/v1/namespaces"),
            ],
        )
        .unwrap();
    let m = String::from_utf8_lossy(&o.stdout);
    assert!(m.ends_with(" 401"), "{m}");
    assert!(m.contains("a client certificate is required"), "{m}");
    step(
        t,
        "refused: another DID, another cluster's CA, no certificate",
    );

    // Revocation: the next request is refused within a second, and an open watch is cut.
    let mut watch = b
        .kubectl_as(&kc, &[], &["get", "ns", "-w", "--request-timeout=0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut wl = BufReader::new(watch.stdout.take().unwrap()).lines();
    assert!(
        wl.next().unwrap().unwrap().starts_with("NAME"),
        "the watch is open"
    );
    let revoked_at = Instant::now();
    let r = b.api(&alice, &["revoke", &serial]).unwrap();
    assert!(r["revokedAt"].is_string(), "{r}");
    let m = refused(&b, &kc, &["get", "ns"]);
    let refused_after = revoked_at.elapsed();
    assert!(m.contains(&format!("{serial} was revoked at")), "{m}");
    let cut = wait_for("the watch to be cut", Duration::from_secs(5), || {
        Ok(watch.try_wait()?.map(|_| revoked_at.elapsed()))
    })
    .unwrap();
    eprintln!(
        "revocation: from the revoke call, the next request refused after {} ms, the watch cut after {} ms",
        refused_after.as_millis(),
        cut.as_millis()
    );
    assert!(
        cut < Duration::from_secs(2),
        "the watch was cut {cut:?} after revocation"
    );
    let certs = b.api(&alice, &["certificates", "--cluster", "ci"]).unwrap();
    let listed: Vec<&Value> = certs["certificates"].as_array().unwrap().iter().collect();
    assert_eq!(listed.len(), 1);
    assert!(
        listed
            .iter()
            .any(|c| c["serial"] == serial.as_str() && c["revokedAt"].is_string())
    );
    step(t, "revoked: refused, and the open watch cut");

    // An expired certificate of this cluster's CA (signed here with a clock two minutes
    // behind: the API will not issue one shorter than 60 s, and waiting for one is a minute).
    let ca = socialweb_broker::access::certs::open_users_ca(&b.cluster_dir("ci")).unwrap();
    let old = socialweb_broker::access::certs::issue(
        &ca,
        &alice_did,
        socialweb_broker::access::certs::Lifetime::For(Duration::from_secs(60)),
        std::time::SystemTime::now() - Duration::from_secs(120),
    )
    .unwrap();
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&kc).unwrap()).unwrap();
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    v["users"][0]["user"]["client-certificate-data"] = b64.encode(&old.cert_pem).into();
    v["users"][0]["user"]["client-key-data"] = b64.encode(&old.key_pem).into();
    let expired = dir.path().join("expired.kubeconfig");
    std::fs::write(&expired, v.to_string()).unwrap();
    let m = refused(&b, &expired, &["get", "ns"]);
    assert!(m.contains("has expired"), "{m}");
    step(t, "refused: an expired certificate");
}

/// `curl` a gateway method with a bearer token, from the host namespace: (status, body).
fn xrpc(b: &Broker<'_>, method: &str, token: &str, body: Option<&str>) -> (u16, Value) {
    let url = format!("{}/xrpc/{method}", b.front_url());
    let auth = format!("Authorization: Bearer {token}");
    let ca = b.front_ca();
    let mut args = vec![
        "-sS",
        "-o",
        "-",
        "-w",
        "\n%{http_code}",
        "--cacert",
        ca.to_str().unwrap(),
        "-H",
        &auth,
    ];
    if let Some(body) = body {
        args.extend(["-H", "Content-Type: application/json", "--data", body]);
    }
    args.push(&url);
    let o = b.host.output("curl", &args).unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let (json, code) = out.rsplit_once('\n').unwrap();
    (
        code.trim().parse().unwrap(),
        serde_json::from_str(json).unwrap_or(Value::Null),
    )
}

#[test]
fn service_auth_tokens_are_checked_against_the_did_and_bad_requests_change_nothing() {
    use socialweb_broker::api::{GET_KUBECONFIG, LIST_CLUSTERS};
    use socialweb_broker::auth::token::{SigningKey, sign};
    use std::time::SystemTime;

    let world = world();
    // A did:web document on a user's own HTTPS server on the internet, from a CA the broker
    // is told to trust.
    let dir = TempDir::new("didweb").unwrap();
    let key = SigningKey::generate(atrium_crypto::Algorithm::Secp256k1);
    let did_web = format!("did:web:{}%3A8444", testbed::world::USERS_DOMAIN);
    let (web_ca, mut server) = did_web_server(&world, dir.path(), &did_web, &key);

    let b = Broker::start(
        &world,
        BrokerOptions {
            front: Front {
                did_web_roots: vec![web_ca.ca_cert()],
                ..Front::default()
            },
            ..Default::default()
        },
    )
    .unwrap();
    let aud = b
        .host
        .exec(
            "curl",
            &[
                "-sS",
                "--cacert",
                b.front_ca().to_str().unwrap(),
                &format!("{}/xrpc/computer.socialweb.describeServer", b.front_url()),
            ],
        )
        .unwrap();
    let aud: Value = serde_json::from_str(&aud).unwrap();
    let aud = aud["did"].as_str().unwrap().to_string();
    let now = SystemTime::now();

    // did:key and did:web both get in.
    let alice = SigningKey::generate(atrium_crypto::Algorithm::P256);
    let (code, v) = xrpc(
        &b,
        LIST_CLUSTERS,
        &sign(&alice, &alice.did(), &aud, LIST_CLUSTERS, 60, now),
        None,
    );
    assert_eq!((code, &v["clusters"]), (200, &serde_json::json!([])), "{v}");
    let (code, v) = xrpc(
        &b,
        LIST_CLUSTERS,
        &sign(&key, &did_web, &aud, LIST_CLUSTERS, 60, now),
        None,
    );
    assert_eq!(code, 200, "did:web: {v}\n{}", b.diagnostics());

    // Every bad token is refused with its reason.
    let other = SigningKey::generate(atrium_crypto::Algorithm::P256);
    let replayed = sign(&alice, &alice.did(), &aud, LIST_CLUSTERS, 60, now);
    assert_eq!(xrpc(&b, LIST_CLUSTERS, &replayed, None).0, 200);
    for (what, token, needle) in [
        (
            "expired",
            sign(
                &alice,
                &alice.did(),
                &aud,
                LIST_CLUSTERS,
                60,
                now - Duration::from_secs(120),
            ),
            "exp: the token expired",
        ),
        (
            "for another audience",
            sign(
                &alice,
                &alice.did(),
                "did:web:elsewhere",
                LIST_CLUSTERS,
                60,
                now,
            ),
            "aud: the token is for",
        ),
        (
            "for another method",
            sign(&alice, &alice.did(), &aud, GET_KUBECONFIG, 60, now),
            "lxm: the token is for method",
        ),
        (
            "signed by another key",
            sign(&other, &alice.did(), &aud, LIST_CLUSTERS, 60, now),
            "does not verify",
        ),
        (
            "did:web signed by another key",
            sign(&other, &did_web, &aud, LIST_CLUSTERS, 60, now),
            "does not verify",
        ),
        ("replayed", replayed.clone(), "used already"),
        ("not a JWT", "garbage".to_string(), "not a JWT"),
    ] {
        let (code, v) = xrpc(&b, LIST_CLUSTERS, &token, None);
        assert_eq!(code, 401, "{what}: {v}");
        assert!(
            v["message"].as_str().unwrap_or("").contains(needle),
            "{what}: {v}"
        );
    }

    // Lifetimes outside 60 s .. 24 h are refused, and nothing is issued or written.
    let kc = dir.path().join("kc");
    let alice_file = dir.path().join("alice.key");
    std::fs::write(&alice_file, alice.to_multibase()).unwrap();
    for (lifetime, needle) in [
        ("59s", "59 s is under the minimum"),
        ("86401s", "86401 s is over the maximum"),
    ] {
        let e = b
            .api(
                &alice_file,
                &[
                    "kubeconfig",
                    "x",
                    "--lifetime",
                    lifetime,
                    "--out",
                    kc.to_str().unwrap(),
                ],
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("lifetimeSeconds: ") && e.contains(needle), "{e}");
        assert!(!kc.exists(), "nothing written for {lifetime}");
    }
    let (code, v) = xrpc(
        &b,
        GET_KUBECONFIG,
        &sign(&alice, &alice.did(), &aud, GET_KUBECONFIG, 60, now),
        Some(r#"{"name": "x", "lifetimeSecond": 60}"#),
    );
    assert_eq!(code, 400);
    assert!(
        v["message"].as_str().unwrap().contains("lifetimeSecond"),
        "{v}"
    );
    let certs = b.api(&alice_file, &["certificates"]).unwrap();
    assert_eq!(
        certs["certificates"],
        serde_json::json!([]),
        "no certificate was issued"
    );
    let _ = server.kill();
    let _ = server.wait();
}
