//! How a tenant control plane is configured: the flags of each component of the Kubernetes we
//! ship (image-builder/kubernetes), the manifests applied once it is up, and bootstrap tokens
//! for joining nodes. This file is pure (values in, values out); the supervision is
//! [`runner`], the bring-up until Pods can be created [`up`].
//!
//! The configuration reproduces what k3s does with `--flannel-backend=none
//! --cluster-cidr=10.42.0.0/16` (docs/kubernetes.md): pod CIDRs allocated by the control plane,
//! no overlay, no bundled addons, and nodes joining with a token.

pub mod cgroup;
pub mod etcd_backup;
pub mod postgres;
pub mod rotate;
pub mod runner;
pub mod token;
pub mod up;

use std::ffi::OsString;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

pub use token::{bootstrap_token_secret, new_bootstrap_token};

/// The cluster CIDR pod CIDRs are allocated from (k3s's default).
pub const CLUSTER_CIDR: &str = "10.42.0.0/16";
/// The Service CIDR (k3s's default); its first address is `kubernetes.default`.
pub const SERVICE_CIDR: &str = "10.43.0.0/16";
/// The prefix length of each node's pod CIDR.
pub const NODE_CIDR_MASK: u8 = 24;
/// The group every bootstrap token of a socialweb cluster carries (see deploy/bootstrap.yaml).
pub const BOOTSTRAP_GROUP: &str = "system:bootstrappers:socialweb:nodes";
/// The service-account issuer (what in-cluster clients see in their tokens).
pub const SA_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// RBAC and the cluster-info reader every tenant cluster needs for nodes to join.
pub const BOOTSTRAP_MANIFEST: &str = include_str!("../../deploy/bootstrap.yaml");

/// What the node agent and kube-proxy read with the node's credentials (the agent's own
/// manifest, applied by whoever creates a cluster).
pub const AGENT_RBAC: &str = include_str!("../../../agent/deploy/rbac.yaml");

/// The admission policies every cluster on namespace nodes gets (docs/security.md), beside
/// [`pod_security_admission`].
pub const NODE_ISOLATION_MANIFEST: &str = include_str!("../../deploy/node-isolation.yaml");
/// The NodePool resource tenants set their nodes with (docs/scale.md).
pub const NODEPOOL_MANIFEST: &str = include_str!("../../deploy/nodepool.yaml");
/// The admission policy every broker cluster gets: aggregated APIs only for groups of its own.
pub const APISERVICES_MANIFEST: &str = include_str!("../../deploy/apiservices.yaml");
/// The admission policy every broker cluster gets: tenants' writes refused while the
/// datastore is at its quota (`crate::quota`).
pub const DATASTORE_QUOTA_MANIFEST: &str = include_str!("../../deploy/datastore-quota.yaml");

/// How the apiserver reaches etcd: TLS, with a client certificate of etcd's own CA (not
/// the cluster CA, whose node certificates must not open the datastore).
#[derive(Debug, Clone)]
pub struct EtcdClient {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Where a control plane's credentials are (all PEM files).
#[derive(Debug, Clone)]
pub struct Credentials {
    /// The CAs whose certificates are accepted (`--client-ca-file`, `--root-ca-file`, the
    /// kubelets'): the cluster CA, and during a rotation's overlap the old one beside it.
    pub trust: PathBuf,
    /// The cluster CA: signs every component's certificate and the nodes' client
    /// certificates (the controller-manager's CSR signer uses it).
    pub ca_cert: PathBuf,
    pub ca_key: PathBuf,
    /// The apiserver's serving certificate.
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    /// The apiserver's client certificate for kubelets.
    pub kubelet_client_cert: PathBuf,
    pub kubelet_client_key: PathBuf,
    /// The service-account signing key and its public half.
    pub sa_key: PathBuf,
    pub sa_pub: PathBuf,
    /// Request-header authentication: the front's and the aggregator's.
    pub front_proxy: Option<FrontProxy>,
}

/// The request-header CA and the apiserver's own certificate of it.
#[derive(Debug, Clone)]
pub struct FrontProxy {
    /// The CA of the front's client certificate: a request presenting a certificate of this
    /// CA named [`FRONT_PROXY_NAME`] (or [`AGGREGATOR_NAME`]) is taken to be from the user and
    /// groups its `X-Remote-User`/`X-Remote-Group` headers name (docs/api.md). A CA of its
    /// own, not the cluster CA, so no other certificate can claim that.
    pub ca: PathBuf,
    /// The apiserver's client certificate of that CA, named [`AGGREGATOR_NAME`]: what its
    /// aggregator presents to an aggregated API server (an APIService's Pods), which checks
    /// it against the CA the apiserver publishes in kube-system's
    /// `extension-apiserver-authentication` ConfigMap before it believes the headers.
    pub aggregator_cert: PathBuf,
    pub aggregator_key: PathBuf,
}

/// The CommonName of the front's request-header client certificate.
pub const FRONT_PROXY_NAME: &str = "socialweb:front";
/// The CommonName of the aggregator's.
pub const AGGREGATOR_NAME: &str = "socialweb:aggregator";

/// Where the apiserver listens and where its datastore is.
#[derive(Debug, Clone)]
pub struct Apiserver {
    pub bind: IpAddr,
    pub port: u16,
    /// `http://127.0.0.1:2379` for the embedded etcd.
    pub etcd_url: String,
    /// The address the `kubernetes` Service's endpoint names, when it is not `bind`: for a
    /// broker's cluster, the node-local address every node serves the apiserver on.
    pub advertise: Option<IpAddr>,
    /// An EgressSelectorConfiguration file: the apiserver's `cluster` egress through the
    /// broker's tunnel (contract 9).
    pub egress_selector: Option<PathBuf>,
    /// The broker's hardening (docs/security.md); `None` for a plain control plane.
    pub hardening: Option<Hardening>,
}

/// What a broker's control plane adds to a plain one.
#[derive(Debug, Clone)]
pub struct Hardening {
    /// An AuthorizationConfiguration: the guard webhook, then Node and RBAC.
    pub authorization_config: PathBuf,
    /// Whether privileged containers are allowed at all (not on namespace nodes).
    pub allow_privileged: bool,
    /// An AdmissionConfiguration ([`pod_security_admission`]), for namespace nodes.
    pub admission_config: Option<PathBuf>,
    pub etcd: EtcdClient,
    /// Kubelets' serving certificates are verified against this CA (CIS 1.2.5).
    pub kubelet_ca: PathBuf,
}

/// The apiserver's AuthorizationConfiguration: the broker's guard first, asked only for the
/// requests [`socialweb_broker_core::guard::match_conditions`] select and denying them when
/// it cannot be asked; then the Node authorizer and RBAC, as `--authorization-mode=Node,RBAC`.
pub fn authorization_config(guard_kubeconfig: &Path) -> String {
    let config = serde_json::json!({
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AuthorizationConfiguration",
        "authorizers": [
            {"type": "Webhook", "name": "socialweb-guard", "webhook": {
                "timeout": "3s",
                "authorizedTTL": "10s",
                "unauthorizedTTL": "10s",
                "subjectAccessReviewVersion": "v1",
                "matchConditionSubjectAccessReviewVersion": "v1",
                "failurePolicy": "Deny",
                "connectionInfo": {"type": "KubeConfigFile", "kubeConfigFile": guard_kubeconfig},
                "matchConditions": socialweb_broker_core::guard::match_conditions()
                    .into_iter()
                    .map(|e| serde_json::json!({"expression": e}))
                    .collect::<Vec<_>>(),
            }},
            {"type": "Node", "name": "node"},
            {"type": "RBAC", "name": "rbac"},
        ],
    });
    serde_json::to_string_pretty(&config).expect("JSON")
}

/// The apiserver's AdmissionConfiguration on namespace nodes: the built-in PodSecurity
/// admission enforces the Pod Security Standards' `baseline` level in every namespace that
/// does not choose `restricted` (the `socialweb-pod-security-labels` policy allows no other
/// choice), at the latest version, with no exemptions. `baseline`, not `restricted`: CI jobs
/// run as root in their containers, which `restricted` refuses and a namespace node allows
/// (its containers' root is the host's only through what baseline already refuses).
pub fn pod_security_admission() -> String {
    let config = serde_json::json!({
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AdmissionConfiguration",
        "plugins": [{
            "name": "PodSecurity",
            "configuration": {
                "apiVersion": "pod-security.admission.config.k8s.io/v1",
                "kind": "PodSecurityConfiguration",
                "defaults": {"enforce": "baseline", "enforce-version": "latest"},
                "exemptions": {"usernames": [], "runtimeClasses": [], "namespaces": []},
            },
        }],
    });
    serde_json::to_string_pretty(&config).expect("JSON")
}

/// The kubeconfig the apiserver calls the guard with: its loopback HTTPS, its serving
/// certificate's CA. No credentials: the guard only ever refuses, so a caller gains nothing.
pub fn guard_kubeconfig(url: &str, ca: &Path) -> String {
    let kc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "guard", "cluster": {"server": url, "certificate-authority": ca}}],
        "users": [{"name": "apiserver", "user": {}}],
        "contexts": [{"name": "guard", "context": {"cluster": "guard", "user": "apiserver"}}],
        "current-context": "guard",
    });
    serde_json::to_string_pretty(&kc).expect("JSON")
}

/// The EgressSelectorConfiguration of a broker's cluster: everything the apiserver opens
/// towards nodes and Pods (logs, exec, attach, port-forward, proxy, webhooks and aggregated
/// APIs named by Service) is HTTP CONNECT over `cluster`, and what it opens for the control
/// plane itself (webhooks and conversion webhooks named by URL, the guard) over
/// `controlplane`, both served by the broker, which checks every destination
/// (`socialweb_broker_core::egress`); only etcd stays direct.
pub fn egress_selector(cluster: &Path, controlplane: &Path) -> String {
    format!(
        "apiVersion: apiserver.k8s.io/v1beta1\n\
         kind: EgressSelectorConfiguration\n\
         egressSelections:\n\
         - name: cluster\n  \
           connection:\n    \
             proxyProtocol: HTTPConnect\n    \
             transport:\n      \
               uds:\n        \
                 udsName: {}\n\
         - name: controlplane\n  \
           connection:\n    \
             proxyProtocol: HTTPConnect\n    \
             transport:\n      \
               uds:\n        \
                 udsName: {}\n\
         - name: etcd\n  \
           connection:\n    \
             proxyProtocol: Direct\n",
        cluster.display(),
        controlplane.display()
    )
}

pub(crate) fn arg(k: &str, v: impl AsRef<std::ffi::OsStr>) -> OsString {
    let mut s = OsString::from(format!("--{k}="));
    s.push(v.as_ref());
    s
}

/// Names and addresses the apiserver's serving certificate must carry: its address, loopback,
/// the node-local address nodes reach it on, and every name in-cluster clients use for
/// `kubernetes.default` (with its ClusterIP).
pub fn serving_names(bind: IpAddr) -> Vec<String> {
    let mut names = vec![
        bind.to_string(),
        socialweb_wire::tunnel::NODE_LOCAL_API_ADDR.to_string(),
        socialweb_wire::tunnel::KUBERNETES_ENDPOINT_ADDR.to_string(),
        "127.0.0.1".into(),
        "10.43.0.1".into(),
        "localhost".into(),
        "kubernetes".into(),
        "kubernetes.default".into(),
        "kubernetes.default.svc".into(),
        "kubernetes.default.svc.cluster.local".into(),
    ];
    names.sort();
    names.dedup();
    names
}

/// The most mutating requests a cluster's apiserver serves at once (beyond system:masters,
/// which the limit exempts); more are answered 429 and clients retry. A tenant's budget of
/// writes in flight, and what keeps kine on PostgreSQL from starving its own connection pool
/// (`runner::KINE_MAX_OPEN` must stay well above it).
pub const MAX_MUTATING_INFLIGHT: u32 = 64;

/// kube-apiserver's flags.
pub fn apiserver_args(a: &Apiserver, c: &Credentials) -> Vec<OsString> {
    let mut args = vec![
        arg("etcd-servers", &a.etcd_url),
        arg("bind-address", a.bind.to_string()),
        arg("advertise-address", a.bind.to_string()),
        arg("secure-port", a.port.to_string()),
        arg("tls-cert-file", &c.serving_cert),
        arg("tls-private-key-file", &c.serving_key),
        arg("client-ca-file", &c.trust),
        arg("kubelet-client-certificate", &c.kubelet_client_cert),
        arg("kubelet-client-key", &c.kubelet_client_key),
        arg("service-account-key-file", &c.sa_pub),
        arg("service-account-signing-key-file", &c.sa_key),
        arg("service-account-issuer", SA_ISSUER),
        arg("service-cluster-ip-range", SERVICE_CIDR),
        arg("authorization-mode", "Node,RBAC"),
        arg("enable-admission-plugins", "NodeRestriction"),
        // Joining nodes authenticate with bootstrap tokens (Secrets in kube-system).
        arg("enable-bootstrap-token-auth", "true"),
        // Anonymous requests reach only what RBAC grants system:anonymous: health endpoints
        // and the cluster-info ConfigMap (deploy/bootstrap.yaml).
        arg("anonymous-auth", "true"),
        arg("allow-privileged", "true"),
        arg("profiling", "false"),
        arg("enable-priority-and-fairness", "false"),
        arg(
            "max-mutating-requests-inflight",
            MAX_MUTATING_INFLIGHT.to_string(),
        ),
        arg("kubelet-preferred-address-types", "InternalIP"),
        // An old revision lives one to two intervals; conformance waits 10 minutes for a
        // continue token's to go, missed by 7 s at the default 5 (docs/conformance.md).
        arg("etcd-compaction-interval", "4m"),
    ];
    if let Some(ip) = a.advertise {
        args.retain(|x| !x.to_string_lossy().starts_with("--advertise-address="));
        args.push(arg("advertise-address", ip.to_string()));
    }
    if let Some(f) = &a.egress_selector {
        args.extend([
            arg("egress-selector-config-file", f),
            // Webhooks and aggregated APIs dial a ready endpoint (a Pod IP the tunnel routes to
            // its node) instead of the ClusterIP, as k3s does with its egress selector.
            arg("enable-aggregator-routing", "true"),
        ]);
    }
    if let Some(h) = &a.hardening {
        args.retain(|x| {
            let x = x.to_string_lossy();
            !x.starts_with("--authorization-mode=") && !x.starts_with("--allow-privileged=")
        });
        args.extend([
            arg("authorization-config", &h.authorization_config),
            arg("allow-privileged", h.allow_privileged.to_string()),
            arg("etcd-cafile", &h.etcd.ca),
            arg("etcd-certfile", &h.etcd.cert),
            arg("etcd-keyfile", &h.etcd.key),
            arg("kubelet-certificate-authority", &h.kubelet_ca),
        ]);
        if let Some(f) = &h.admission_config {
            args.push(arg("admission-control-config-file", f));
        }
    }
    if let Some(f) = &c.front_proxy {
        args.extend([
            arg("requestheader-client-ca-file", &f.ca),
            arg(
                "requestheader-allowed-names",
                format!("{FRONT_PROXY_NAME},{AGGREGATOR_NAME}"),
            ),
            arg("proxy-client-cert-file", &f.aggregator_cert),
            arg("proxy-client-key-file", &f.aggregator_key),
            arg("requestheader-username-headers", "X-Remote-User"),
            arg("requestheader-group-headers", "X-Remote-Group"),
            arg("requestheader-extra-headers-prefix", "X-Remote-Extra-"),
        ]);
    }
    args
}

/// kube-controller-manager's flags, given its kubeconfig.
pub fn controller_manager_args(kubeconfig: &Path, c: &Credentials) -> Vec<OsString> {
    vec![
        arg("kubeconfig", kubeconfig),
        arg("authentication-kubeconfig", kubeconfig),
        arg("authorization-kubeconfig", kubeconfig),
        arg("bind-address", "127.0.0.1"),
        // Leader election, its lease in the cluster's own datastore: a second copy (an owner
        // frozen while the next one runs, a fleet's gray failure) waits instead of acting
        // beside this one -- no Job's Pod made twice, no pod CIDR given twice. The broker
        // releases the lease when it stops this one with grace (the controller-manager does
        // not), so a wake does not wait out the lease.
        arg("leader-elect", "true"),
        // The default controllers and the token cleaner (it deletes bootstrap tokens once
        // they expire), without the CSR approver: it would sign system:node:<any name> for
        // any bootstrap token. The broker approves nodes' requests (docs/security.md); a
        // plain control plane's operator approves them.
        arg("controllers", "*,tokencleaner,-csrapproving"),
        arg("cluster-signing-duration", "24h"),
        arg("allocate-node-cidrs", "true"),
        arg("cluster-cidr", CLUSTER_CIDR),
        arg("node-cidr-mask-size", NODE_CIDR_MASK.to_string()),
        arg("service-cluster-ip-range", SERVICE_CIDR),
        arg("cluster-signing-cert-file", &c.ca_cert),
        arg("cluster-signing-key-file", &c.ca_key),
        arg("root-ca-file", &c.trust),
        arg("service-account-private-key-file", &c.sa_key),
        arg("use-service-account-credentials", "true"),
        arg("profiling", "false"),
    ]
}

/// kube-scheduler's flags, given its kubeconfig.
pub fn scheduler_args(kubeconfig: &Path) -> Vec<OsString> {
    vec![
        arg("kubeconfig", kubeconfig),
        arg("authentication-kubeconfig", kubeconfig),
        arg("authorization-kubeconfig", kubeconfig),
        arg("bind-address", "127.0.0.1"),
        // As the controller-manager's: no two schedulers bind; it releases its lease itself
        // when stopped with grace.
        arg("leader-elect", "true"),
        arg("profiling", "false"),
    ]
}

/// The `cluster-info` ConfigMap in `kube-public`, as kubeadm publishes it: a kubeconfig with
/// the server and the CA and no credentials. A node with only a pin of the CA reads it
/// anonymously and checks the pin before it trusts the CA.
pub fn cluster_info(server: &str, ca_pem: &str) -> serde_json::Value {
    use base64::Engine;
    let kubeconfig = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "", "cluster": {
            "server": server,
            "certificate-authority-data": base64::engine::general_purpose::STANDARD.encode(ca_pem),
        }}],
        "contexts": [],
        "users": [],
    });
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cluster-info", "namespace": "kube-public",
                     "labels": {"app.kubernetes.io/managed-by": "socialweb"}},
        "data": {"kubeconfig": serde_json::to_string_pretty(&kubeconfig).expect("JSON")},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds() -> Credentials {
        let p = |s: &str| PathBuf::from(format!("/pki/{s}"));
        Credentials {
            trust: p("ca.crt"),
            ca_cert: p("ca.crt"),
            ca_key: p("ca.key"),
            serving_cert: p("apiserver.crt"),
            serving_key: p("apiserver.key"),
            kubelet_client_cert: p("kc.crt"),
            kubelet_client_key: p("kc.key"),
            sa_key: p("sa.key"),
            sa_pub: p("sa.pub"),
            front_proxy: Some(FrontProxy {
                ca: p("front-proxy/ca.crt"),
                aggregator_cert: p("front-proxy/aggregator.crt"),
                aggregator_key: p("front-proxy/aggregator.key"),
            }),
        }
    }

    fn has(args: &[OsString], flag: &str) -> bool {
        args.iter().any(|a| a.to_string_lossy() == flag)
    }

    #[test]
    fn the_apiserver_accepts_bootstrap_tokens_and_restricts_nodes() {
        let a = apiserver_args(
            &Apiserver {
                bind: "127.0.0.1".parse().unwrap(),
                port: 6443,
                etcd_url: "http://127.0.0.1:2379".into(),
                advertise: Some("100.100.20.11".parse().unwrap()),
                egress_selector: Some("/run/egress.yaml".into()),
                hardening: None,
            },
            &creds(),
        );
        assert!(has(&a, "--enable-bootstrap-token-auth=true"));
        assert!(has(&a, "--authorization-mode=Node,RBAC"));
        assert!(has(&a, "--enable-admission-plugins=NodeRestriction"));
        assert!(has(&a, "--service-account-key-file=/pki/sa.pub"));
        assert!(has(
            &a,
            "--requestheader-allowed-names=socialweb:front,socialweb:aggregator"
        ));
        assert!(has(
            &a,
            "--proxy-client-cert-file=/pki/front-proxy/aggregator.crt"
        ));
        assert!(has(
            &a,
            "--requestheader-client-ca-file=/pki/front-proxy/ca.crt"
        ));
        assert!(has(&a, "--advertise-address=100.100.20.11"));
        assert!(!has(&a, "--advertise-address=127.0.0.1"));
        assert!(has(&a, "--egress-selector-config-file=/run/egress.yaml"));
        assert!(has(&a, "--enable-aggregator-routing=true"));
    }

    #[test]
    fn a_brokers_apiserver_asks_the_guard_verifies_kubelets_and_etcd_and_refuses_privilege() {
        let p = |s: &str| PathBuf::from(format!("/pki/{s}"));
        let a = apiserver_args(
            &Apiserver {
                bind: "127.0.0.1".parse().unwrap(),
                port: 6443,
                etcd_url: "https://127.0.0.1:2379".into(),
                advertise: None,
                egress_selector: None,
                hardening: Some(Hardening {
                    authorization_config: p("authz.json"),
                    allow_privileged: false,
                    admission_config: Some(p("admission.json")),
                    etcd: EtcdClient {
                        ca: p("etcd/ca.crt"),
                        cert: p("etcd/apiserver.crt"),
                        key: p("etcd/apiserver.key"),
                    },
                    kubelet_ca: p("ca.crt"),
                }),
            },
            &creds(),
        );
        assert!(has(&a, "--authorization-config=/pki/authz.json"));
        assert!(has(
            &a,
            "--admission-control-config-file=/pki/admission.json"
        ));
        let psa: serde_json::Value = serde_json::from_str(&pod_security_admission()).unwrap();
        let c = &psa["plugins"][0]["configuration"];
        assert_eq!(psa["plugins"][0]["name"], "PodSecurity");
        assert_eq!(
            (&c["defaults"]["enforce"], &c["defaults"]["enforce-version"]),
            (&serde_json::json!("baseline"), &serde_json::json!("latest"))
        );
        assert_eq!(c["exemptions"]["namespaces"], serde_json::json!([]));
        assert!(
            !a.iter()
                .any(|x| x.to_string_lossy().starts_with("--authorization-mode="))
        );
        assert!(has(&a, "--allow-privileged=false"));
        assert!(!has(&a, "--allow-privileged=true"));
        assert!(has(&a, "--etcd-certfile=/pki/etcd/apiserver.crt"));
        assert!(has(&a, "--kubelet-certificate-authority=/pki/ca.crt"));
        let c: serde_json::Value =
            serde_json::from_str(&authorization_config(Path::new("/pki/guard.kubeconfig")))
                .unwrap();
        let names: Vec<&str> = c["authorizers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["socialweb-guard", "node", "rbac"]);
        assert_eq!(c["authorizers"][0]["webhook"]["failurePolicy"], "Deny");
        assert_eq!(
            c["authorizers"][0]["webhook"]["matchConditions"]
                .as_array()
                .unwrap()
                .len(),
            2
        );
    }

    #[test]
    fn the_cluster_and_control_plane_egresses_go_to_the_brokers_sockets() {
        let y = egress_selector(
            Path::new("/state/clusters/c/run/egress.sock"),
            Path::new("/state/clusters/c/run/controlplane-egress.sock"),
        );
        for (name, socket) in [
            ("cluster", "egress.sock"),
            ("controlplane", "controlplane-egress.sock"),
        ] {
            assert!(
                y.contains(&format!(
                    "name: {name}\n  connection:\n    proxyProtocol: HTTPConnect\n    \
                     transport:\n      uds:\n        udsName: /state/clusters/c/run/{socket}\n"
                )),
                "{y}"
            );
        }
        assert_eq!(y.matches("proxyProtocol: Direct").count(), 1, "{y}");
    }

    #[test]
    fn the_controller_manager_allocates_pod_cidrs_and_signs_node_certificates() {
        let a = controller_manager_args(Path::new("/kcm.kubeconfig"), &creds());
        assert!(has(&a, "--allocate-node-cidrs=true"));
        assert!(has(&a, "--cluster-cidr=10.42.0.0/16"));
        assert!(has(&a, "--cluster-signing-cert-file=/pki/ca.crt"));
        assert!(has(&a, "--controllers=*,tokencleaner,-csrapproving"));
        assert!(has(&a, "--cluster-signing-duration=24h"));
    }

    #[test]
    fn the_controllers_and_the_scheduler_act_only_as_elected_leaders() {
        let kcm = controller_manager_args(Path::new("/kcm.kubeconfig"), &creds());
        assert!(has(&kcm, "--leader-elect=true"));
        let sched = scheduler_args(Path::new("/scheduler.kubeconfig"));
        assert!(has(&sched, "--leader-elect=true"));
    }

    #[test]
    fn cluster_info_carries_the_ca_and_no_credentials() {
        let cm = cluster_info("https://10.0.0.1:6443", "-----BEGIN CERTIFICATE-----\n");
        let kc: serde_json::Value =
            serde_json::from_str(cm["data"]["kubeconfig"].as_str().unwrap()).unwrap();
        assert_eq!(
            kc["clusters"][0]["cluster"]["server"],
            "https://10.0.0.1:6443"
        );
        assert_eq!(kc["users"], serde_json::json!([]));
    }

    #[test]
    fn the_bootstrap_manifest_binds_the_token_group() {
        assert!(BOOTSTRAP_MANIFEST.contains(BOOTSTRAP_GROUP));
    }
}
