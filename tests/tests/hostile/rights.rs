//! Issue 58: a tenant holds a list of rights, not cluster-admin minus a list. Each door the
//! review found -- PodSecurity lifted through a namespace's subresources, a tenant made a
//! node, the apiserver sent to the broker host's loopback by a webhook's URL, the broker's
//! own API group repointed -- is tried as the tenant (a DID in the owners' group, through
//! the front) and as what the tenant can make (a ServiceAccount of its own, talking to the
//! apiserver as an in-cluster client does), and refused with the reason. The role itself is
//! read from the live cluster and checked against what it serves and what docs/security.md
//! lists.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use socialweb_broker_core::rights::{CLUSTER_GRANTS, ROLE, Rule, WRITE, allows};
use testbed::broker::{Broker, BrokerOptions};
use testbed::tmp::TempDir;
use testbed::world::World;

use super::{kubectl_with, tenant_cluster};

/// A kubeconfig for `cluster`'s apiserver on loopback with a bearer token: what an
/// in-cluster client of the tenant's (a Pod's ServiceAccount) presents.
fn token_kubeconfig(b: &Broker<'_>, cluster: &str, token: &str, out: &Path) -> PathBuf {
    let admin = b
        .kubectl_json(cluster, &["config", "view", "--raw", "--minify"])
        .unwrap();
    let c = &admin["clusters"][0]["cluster"];
    let kc = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": c}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "sa"}}],
        "current-context": "c",
    });
    std::fs::write(out, kc.to_string()).unwrap();
    out.to_path_buf()
}

/// kubectl from the host with `kubeconfig` (not the admin's): (success, output).
fn kubectl_host(b: &Broker<'_>, kubeconfig: &Path, args: &[&str]) -> (bool, String) {
    let bins = testbed::k8s::binaries().unwrap();
    let o = b
        .host
        .command(&bins.kube().to_string_lossy())
        .arg("kubectl")
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(args)
        .output()
        .unwrap();
    (
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

/// The rules of the live ClusterRole, as the core reads rules.
fn live_rules(b: &Broker<'_>, cluster: &str) -> Vec<Rule> {
    let role = b
        .kubectl_json(cluster, &["get", "clusterrole", ROLE])
        .unwrap();
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|x| x.as_str().map(str::to_string))
            .collect()
    };
    role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| Rule {
            api_groups: strings(&r["apiGroups"]),
            resources: strings(&r["resources"]),
            verbs: strings(&r["verbs"]),
            non_resource_urls: strings(&r["nonResourceURLs"]),
        })
        .collect()
}

/// Every cluster-scoped resource and subresource the apiserver serves, by group, from its
/// discovery (each group's preferred version).
fn cluster_scoped(b: &Broker<'_>, cluster: &str) -> BTreeSet<(String, String)> {
    let mut paths = vec!["/api/v1".to_string()];
    let groups: Value =
        serde_json::from_str(&b.kubectl(cluster, &["get", "--raw", "/apis"]).unwrap()).unwrap();
    for g in groups["groups"].as_array().unwrap() {
        paths.push(format!(
            "/apis/{}",
            g["preferredVersion"]["groupVersion"].as_str().unwrap()
        ));
    }
    let mut out = BTreeSet::new();
    for p in paths {
        let list: Value =
            serde_json::from_str(&b.kubectl(cluster, &["get", "--raw", &p]).unwrap()).unwrap();
        let group = list["groupVersion"]
            .as_str()
            .unwrap()
            .rsplit_once('/')
            .map(|(g, _)| g.to_string())
            .unwrap_or_default();
        for r in list["resources"].as_array().unwrap() {
            if r["namespaced"] == json!(false) {
                out.insert((group.clone(), r["name"].as_str().unwrap().to_string()));
            }
        }
    }
    out
}

/// The `group/resource` cells of docs/security.md's table of cluster-scoped kinds.
fn documented() -> BTreeSet<(String, String)> {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/security.md"))
            .unwrap();
    let (_, table) = doc
        .split_once("<!-- cluster-scoped kinds -->")
        .expect("docs/security.md has the table of cluster-scoped kinds");
    table
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| {
            // `resource.group` or `resource/subresource.group`; the core group has no dot.
            let cell = l.split('|').nth(1)?.trim().trim_matches('`');
            if cell.starts_with("kind") || cell.starts_with('-') {
                return None;
            }
            let (resource, group) = cell.split_once('.').unwrap_or((cell, ""));
            Some((group.to_string(), resource.to_string()))
        })
        .collect()
}

#[test]
fn a_tenant_holds_a_list_of_rights_and_every_cluster_scoped_write_is_named() {
    let world = World::new(0).unwrap();
    let dir = TempDir::new("rights").unwrap();
    let b = Broker::start(&world, BrokerOptions::default()).unwrap();
    let kc = tenant_cluster(&b, dir.path(), "t");
    let kubectl = |args: &[&str]| kubectl_with(&b, &kc, args, None);

    // The owners are bound to the role, and to nothing that is cluster-admin.
    let bindings = b
        .kubectl_json("t", &["get", "clusterrolebindings"])
        .unwrap();
    for crb in bindings["items"].as_array().unwrap() {
        let owners = crb["subjects"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["name"] == "socialweb.computer:cluster-owners");
        if owners {
            assert_eq!(crb["roleRef"]["name"], ROLE, "{crb}");
        }
    }
    let (_, can) = kubectl(&["auth", "can-i", "--list"]);
    assert!(
        !can.contains("*.*  "),
        "the tenant has a wildcard over everything: {can}"
    );

    // Every cluster-scoped write the live role allows is one the core lists, and every
    // cluster-scoped kind the apiserver serves has its row in docs/security.md.
    let rules = live_rules(&b, "t");
    let served = cluster_scoped(&b, "t");
    let granted: BTreeSet<(&str, &str)> = CLUSTER_GRANTS
        .iter()
        .map(|g| (g.group, g.resource))
        .collect();
    let tenant_groups = ["socialweb.computer", "metrics.k8s.io"];
    for (group, resource) in &served {
        for verb in WRITE.iter().skip(3) {
            if allows(&rules, group, resource, verb) {
                assert!(
                    granted.contains(&(group.as_str(), resource.as_str()))
                        || tenant_groups.contains(&group.as_str()),
                    "the role lets a tenant {verb} {group}/{resource}, which \
                     socialweb_broker_core::rights::CLUSTER_GRANTS does not list"
                );
            }
        }
    }
    let docs = documented();
    let missing: Vec<_> = served.difference(&docs).collect();
    assert!(
        missing.is_empty(),
        "cluster-scoped kinds the apiserver serves and docs/security.md does not list: {missing:?}"
    );
    for g in CLUSTER_GRANTS {
        assert!(
            docs.contains(&(g.group.to_string(), g.resource.to_string())),
            "{}/{} is granted and not in docs/security.md's table",
            g.group,
            g.resource
        );
    }

    // Attack 1: the PodSecurity label through a namespace's status and finalize.
    let privileged =
        r#"{"metadata":{"labels":{"pod-security.kubernetes.io/enforce":"privileged"}}}"#;
    let (ok, out) = kubectl(&[
        "patch",
        "namespace",
        "default",
        "--subresource=status",
        "--type=merge",
        "-p",
        privileged,
    ]);
    assert!(!ok && out.contains("forbidden"), "status: {out}");
    let ns = b
        .kubectl_json("t", &["get", "namespace", "default"])
        .unwrap();
    let mut labelled = ns.clone();
    labelled["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] = json!("privileged");
    let file = dir.path().join("ns.json");
    std::fs::write(&file, labelled.to_string()).unwrap();
    let (ok, out) = kubectl_with(
        &b,
        &kc,
        &[
            "replace",
            "--raw",
            "/api/v1/namespaces/default/finalize",
            "-f",
            "-",
        ],
        Some(&labelled.to_string()),
    );
    assert!(!ok && out.contains("forbidden"), "finalize: {out}");
    // Whoever may write the subresources (the broker's admin here) meets admission.
    for sub in ["status", "finalize"] {
        let e = b
            .kubectl(
                "t",
                &[
                    "replace",
                    "--raw",
                    &format!("/api/v1/namespaces/default/{sub}"),
                    "-f",
                    file.to_str().unwrap(),
                ],
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("socialweb-pod-security-labels"), "{sub}: {e}");
    }

    // Attack 2: the tenant as a node. Its ServiceAccount may impersonate (the tenant holds
    // that right and grants it), but not a bootstrap token, a node or the control plane.
    let sa_rbac = r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: mallory, namespace: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: impersonator}
rules:
- apiGroups: [""]
  resources: ["users", "groups"]
  verbs: ["impersonate"]
- apiGroups: ["certificates.k8s.io"]
  resources: ["certificatesigningrequests"]
  verbs: ["create", "get", "list"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: impersonator}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: impersonator}
subjects: [{kind: ServiceAccount, name: mallory, namespace: default}]
"#;
    let (ok, out) = kubectl_with(&b, &kc, &["apply", "-f", "-"], Some(sa_rbac));
    assert!(ok, "the tenant grants what it holds: {out}");
    // ... and not what it does not hold: RBAC's escalation check.
    let (ok, out) = kubectl(&[
        "create",
        "clusterrolebinding",
        "mine-admin",
        "--clusterrole=cluster-admin",
        "--serviceaccount=default:mallory",
    ]);
    assert!(!ok && out.contains("forbidden"), "{out}");
    let (ok, token) = kubectl(&["create", "token", "mallory"]);
    assert!(ok, "{token}");
    let sa = token_kubeconfig(&b, "t", token.trim(), &dir.path().join("sa.kubeconfig"));
    let (ok, out) = kubectl_host(&b, &sa, &["--as=alice", "get", "pods"]);
    assert!(
        !ok && out.contains(r#"User "alice" cannot list"#),
        "impersonating one of its own users is the tenant's to do: {out}"
    );
    for who in [
        vec![
            "--as=system:bootstrap:abcdef",
            "--as-group=system:bootstrappers:socialweb:nodes",
        ],
        vec!["--as=x", "--as-group=system:bootstrappers"],
        vec!["--as=system:node:t-1", "--as-group=system:nodes"],
        vec!["--as=x", "--as-group=system:nodes"],
        vec!["--as=x", "--as-group=system:masters"],
        vec!["--as=system:kube-controller-manager"],
        vec!["--as=system:serviceaccount:kube-system:clusterrole-aggregation-controller"],
    ] {
        let mut args = who.clone();
        args.extend(["get", "csr"]);
        let (ok, out) = kubectl_host(&b, &sa, &args);
        assert!(!ok && out.contains("impersonate"), "{who:?}: {out}");
    }
    // The control plane's namespace: no token of its own made, none of its controllers'.
    for args in [
        vec![
            "-n",
            "kube-system",
            "create",
            "secret",
            "generic",
            "bootstrap-token-abcdef",
            "--type=bootstrap.kubernetes.io/token",
            "--from-literal=token-id=abcdef",
            "--from-literal=token-secret=0123456789abcdef",
            "--from-literal=usage-bootstrap-authentication=true",
        ],
        vec![
            "-n",
            "kube-system",
            "delete",
            "secret",
            "bootstrap-token-abcdef",
        ],
        vec![
            "-n",
            "kube-system",
            "create",
            "token",
            "clusterrole-aggregation-controller",
        ],
        vec!["-n", "kube-system", "create", "configmap", "socialweb-x"],
        vec![
            "-n",
            "kube-system",
            "run",
            "as-a-controller",
            "--image=socialweb.local/busybox:1",
            "--overrides",
            r#"{"spec":{"serviceAccountName":"generic-garbage-collector"}}"#,
        ],
        vec!["label", "namespace", "kube-system", "x=y"],
    ] {
        let (ok, out) = kubectl(&args);
        assert!(
            !ok && out.contains("the control plane's namespaces"),
            "{args:?}: {out}"
        );
    }
    // Reads there are the tenant's.
    let (ok, out) = kubectl(&["-n", "kube-system", "get", "configmaps"]);
    assert!(ok, "{out}");

    // Attack 3: a webhook by URL at the broker host's loopback and other addresses.
    for (url, needle) in [
        ("https://127.0.0.1:9464/", "an address of the broker's host"),
        (
            "https://localhost:16443/",
            "an address of the broker's host",
        ),
        ("https://10.0.2.2:443/", "not public"),
        ("https://198.51.100.77:443/", "webhook_egress_allow"),
    ] {
        let hook = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "probe"},
            "webhooks": [{
                "name": "probe.example.com",
                "clientConfig": {"url": url},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                           "resources": ["configmaps"]}],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "default"}},
                "failurePolicy": "Fail", "sideEffects": "None", "timeoutSeconds": 5,
                "admissionReviewVersions": ["v1"],
            }],
        });
        let (ok, out) = kubectl_with(&b, &kc, &["apply", "-f", "-"], Some(&hook.to_string()));
        assert!(ok, "{out}");
        let (ok, out) = kubectl(&["create", "configmap", "probed"]);
        assert!(!ok && out.contains(needle), "{url}: {out}");
    }
    let (ok, out) = kubectl(&["delete", "validatingwebhookconfiguration", "probe"]);
    assert!(ok, "{out}");

    // The broker's own group is not the tenant's to serve, and the host's logs not its to read.
    let (ok, out) = kubectl(&[
        "patch",
        "apiservice",
        "v1alpha1.socialweb.computer",
        "--dry-run=server",
        "--type=merge",
        "-p",
        r#"{"spec":{"service":{"namespace":"default","name":"mine"},"insecureSkipTLSVerify":true}}"#,
    ]);
    assert!(
        !ok && out.contains("APIServices of Kubernetes' own groups"),
        "{out}"
    );
    let (ok, out) = kubectl(&["get", "--raw", "/logs/"]);
    assert!(!ok && out.contains("forbidden"), "/logs/: {out}");

    // What a tenant does is still its own: namespaces, workloads, its own kinds (once the
    // broker has added their group to the role), roles within its rights, admin of a namespace.
    let crd = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
"#;
    let (ok, out) = kubectl_with(&b, &kc, &["apply", "-f", "-"], Some(crd));
    assert!(ok, "{out}");
    let widget =
        "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w, namespace: default}\n";
    let t0 = std::time::Instant::now();
    loop {
        let (ok, out) = kubectl_with(&b, &kc, &["apply", "-f", "-"], Some(widget));
        if ok {
            eprintln!(
                "a Widget created {:.1}s after its CRD",
                t0.elapsed().as_secs_f64()
            );
            break;
        }
        assert!(t0.elapsed().as_secs() < 20, "{out}");
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    for args in [
        vec!["create", "namespace", "ci"],
        vec![
            "-n",
            "ci",
            "create",
            "deployment",
            "web",
            "--image=socialweb.local/busybox:1",
        ],
        vec![
            "-n",
            "ci",
            "create",
            "rolebinding",
            "ci-admin",
            "--clusterrole=admin",
            "--serviceaccount=ci:default",
        ],
        vec![
            "-n",
            "ci",
            "create",
            "rolebinding",
            "ci-edit",
            "--clusterrole=edit",
            "--serviceaccount=ci:default",
        ],
        vec![
            "create",
            "clusterrolebinding",
            "ci-view",
            "--clusterrole=view",
            "--serviceaccount=ci:default",
        ],
        vec!["create", "priorityclass", "ci-low", "--value=-10"],
        vec!["label", "namespace", "ci", "team=ci"],
    ] {
        let (ok, out) = kubectl(&args);
        assert!(ok, "{args:?}: {out}");
    }
    for (what, yes) in [
        ("create pods", true),
        ("create customresourcedefinitions", true),
        ("create nodes", false),
        ("update namespaces --subresource=status", false),
        ("update namespaces --subresource=finalize", false),
        ("delete nodes", false),
    ] {
        let mut args = vec!["auth", "can-i"];
        args.extend(what.split(' '));
        let (_, out) = kubectl(&args);
        assert_eq!(out.trim().starts_with("yes"), yes, "can-i {what}: {out}");
    }
}
