//! The files the join writes for containerd, the kubelet and kube-proxy. Pure: each takes the
//! identity and the machine's settings and returns text, so every line is unit-tested and the
//! same on a rented guest as in the tests.
//!
//! Kubernetes reads its configuration files as YAML, of which JSON is a subset; they are
//! written as JSON from `serde_json` values, so no value can break the syntax.

use std::net::Ipv4Addr;
use std::path::Path;

use serde_json::{Value, json};
use socialweb_wire::NodeIdentity;

use super::Machine;

/// containerd's configuration (version 2, containerd 1.6/1.7).
pub fn containerd_toml(m: &Machine) -> String {
    // TOML basic strings take the same escapes as JSON strings.
    let q = |p: &Path| serde_json::to_string(&p.to_string_lossy()).expect("JSON string");
    format!(
        r#"# Written by socialweb-agent at every start; edits are overwritten.
version = 2
root = {root}
state = {state}
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = {socket}

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = {pause}
  disable_apparmor = true
  enable_selinux = false
  # Where root lacks CAP_SYS_RESOURCE (containers, some sandboxes) a sandbox's oom_score_adj
  # of -998 cannot be set and every pod would fail in runc init; keeping scores at or above
  # containerd's own costs nothing on a node that has the capability.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        # cgroupfs, as the kubelet is told: works on cgroup v1 and v2, with or without systemd.
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = {cni_bin}
    conf_dir = {cni_conf}
    max_conf_num = 1
"#,
        root = q(&m.containerd_root),
        state = q(&m.containerd_state),
        socket = q(&m.containerd_socket()),
        pause = serde_json::to_string(&m.sandbox_image).expect("JSON string"),
        cni_bin = q(&m.cni_bin_dir),
        cni_conf = q(&m.cni_conf_dir),
    )
}

/// The kubelet's configuration file (`--config`). `patch`, from the agent's
/// `--kubelet-config-patch`, is merged over it (RFC 7386 merge patch), so an operator can set
/// any field without a new agent.
pub fn kubelet_config(
    id: &NodeIdentity,
    m: &Machine,
    node_ip: Ipv4Addr,
    patch: Option<&Value>,
) -> Value {
    let mut c = json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        // Requests to the kubelet's API (exec, logs, port-forward) come from the apiserver
        // with a certificate of the cluster CA, and are authorized by asking the apiserver:
        // another node's certificate is refused.
        "authentication": {
            "anonymous": {"enabled": false},
            "webhook": {"enabled": true},
            "x509": {"clientCAFile": m.ca_file().to_string_lossy()},
        },
        "authorization": {"mode": "Webhook"},
        "address": node_ip.to_string(),
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": m.cgroup_root,
        "cgroupsPerQOS": true,
        // Kubernetes 1.35 refuses cgroup v1 by default; rented guests and this project's test
        // machines may have it.
        "failCgroupV1": false,
        "failSwapOn": false,
        "clusterDNS": [socialweb_wire::mesh::NODE_LOCAL_DNS_ADDR.to_string()],
        "clusterDomain": id.cluster_domain,
        "resolvConf": m.resolv_conf().to_string_lossy(),
        "rotateCertificates": true,
        // The serving certificate from the cluster CA, by CSR (the broker approves it for the
        // node's own name and address only), so that the apiserver can verify the kubelet.
        "serverTLSBootstrap": true,
        "serializeImagePulls": false,
        "staticPodPath": "",
        // A container that names no seccomp profile gets the runtime's default (which
        // refuses the syscalls containers have no business with: kexec, bpf, keyctl, ...),
        // not `Unconfined`. PodSecurity `baseline` refuses asking for `Unconfined`.
        "seccompDefault": true,
    });
    if let Some(p) = patch {
        merge(&mut c, p);
    }
    c
}

/// RFC 7386 JSON merge patch: objects merge, `null` deletes, anything else replaces.
pub fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().expect("object");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// The kubelet's command line, after the program name.
pub fn kubelet_args(id: &NodeIdentity, m: &Machine, node_ip: Ipv4Addr) -> Vec<String> {
    let mut labels: Vec<String> = id.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    labels.push(format!(
        "{}=true",
        socialweb_wire::mesh::NODE_LOCAL_DNS_LABEL
    ));
    vec![
        format!("--config={}", m.kubelet_config_file().display()),
        format!(
            "--bootstrap-kubeconfig={}",
            m.bootstrap_kubeconfig().display()
        ),
        format!("--kubeconfig={}", m.kubelet_kubeconfig().display()),
        format!("--cert-dir={}", m.kubelet_cert_dir().display()),
        format!(
            "--container-runtime-endpoint=unix://{}",
            m.containerd_socket().display()
        ),
        format!("--hostname-override={}", id.node),
        format!("--node-ip={node_ip}"),
        format!("--node-labels={}", labels.join(",")),
        format!("--root-dir={}", m.kubelet_dir.display()),
        "--v=1".into(),
    ]
}

/// A kubeconfig that authenticates with the bootstrap token: the kubelet uses it once, to ask
/// for its client certificate. Holds a secret: written mode 0600.
pub fn bootstrap_kubeconfig(id: &NodeIdentity, ca_pem: &str) -> Value {
    use base64::Engine;
    json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": id.cluster, "cluster": {
            "server": id.server_url.as_str().trim_end_matches('/'),
            "certificate-authority-data": base64::engine::general_purpose::STANDARD.encode(ca_pem),
        }}],
        "users": [{"name": "bootstrap", "user": {"token": id.join_token.expose()}}],
        "contexts": [{"name": "bootstrap", "context": {"cluster": id.cluster, "user": "bootstrap"}}],
        "current-context": "bootstrap",
    })
}

/// Which kube-proxy backend runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    Nftables,
    Iptables,
}

impl ProxyMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ProxyMode::Nftables => "nftables",
            ProxyMode::Iptables => "iptables",
        }
    }
}

/// kube-proxy's configuration file. It uses the kubelet's credentials (the node's own
/// certificate; agent/deploy/rbac.yaml grants system:nodes what kube-proxy needs).
pub fn kube_proxy_config(id: &NodeIdentity, m: &Machine, mode: ProxyMode) -> Value {
    json!({
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": mode.as_str(),
        "clusterCIDR": id.cluster_cidr.to_string(),
        "hostnameOverride": id.node,
        "clientConnection": {"kubeconfig": m.kubelet_kubeconfig().to_string_lossy()},
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        // Zero means "leave the kernel's value": conntrack limits are the host's business,
        // and inside a network namespace they are read-only.
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "nodePortAddresses": ["primary"],
    })
}

/// The resolv.conf the kubelet hands to pods with `dnsPolicy: Default` and uses for the
/// search path of the others: the identity's upstream resolvers (node-local DNS forwards to
/// the same), so a host resolver such as systemd-resolved's 127.0.0.53 never reaches a pod.
pub fn resolv_conf(upstreams: &[std::net::SocketAddr]) -> String {
    let mut out = String::from("# Written by socialweb-agent: the node's upstream resolvers.\n");
    for u in upstreams.iter().filter(|u| u.port() == 53).take(3) {
        out.push_str(&format!("nameserver {}\n", u.ip()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> NodeIdentity {
        NodeIdentity::from_json(
            json!({
                "version": 3, "cluster": "demo", "node": "node-1",
                "server_url": "https://172.31.255.1:6443",
                "ca_cert_sha256": format!("sha256:{}", "ab".repeat(32)),
                "join_token": "abcdef.0123456789abcdef",
                "relay_url": "http://172.31.255.1:3340", "mesh_secret_key": "11".repeat(32),
                "cluster_cidr": "10.42.0.0/16", "service_cidr": "10.43.0.0/16",
                "cluster_domain": "cluster.local", "upstream_resolvers": ["172.31.255.1", "10.0.0.1:5353"],
                "labels": {"socialweb.computer/pool": "ci"},
            })
            .to_string()
            .as_bytes(),
        )
        .unwrap()
    }

    #[test]
    fn the_kubelet_joins_with_the_bootstrap_kubeconfig_and_our_dns() {
        let m = Machine::default();
        let ip = Ipv4Addr::new(172, 31, 1, 2);
        let args = kubelet_args(&id(), &m, ip);
        assert!(args.contains(&"--hostname-override=node-1".to_string()));
        assert!(args.contains(&"--node-ip=172.31.1.2".to_string()));
        assert!(
            args.iter()
                .any(|a| a.starts_with("--bootstrap-kubeconfig="))
        );
        let labels = args
            .iter()
            .find(|a| a.starts_with("--node-labels="))
            .unwrap();
        assert!(labels.contains("socialweb.computer/pool=ci"));
        assert!(labels.contains("socialweb.computer/node-local-dns=true"));
        let c = kubelet_config(&id(), &m, ip, None);
        assert_eq!(c["clusterDNS"], json!(["169.254.20.10"]));
        assert_eq!(c["authorization"]["mode"], "Webhook");
        assert_eq!(c["failCgroupV1"], false);
        assert_eq!(c["seccompDefault"], true);
    }

    #[test]
    fn a_config_patch_sets_deletes_and_merges() {
        let m = Machine::default();
        let patch = json!({"evictionHard": {"memory.available": "1Mi"}, "staticPodPath": null, "authentication": {"webhook": {"cacheTTL": "1m"}}});
        let c = kubelet_config(&id(), &m, Ipv4Addr::LOCALHOST, Some(&patch));
        assert_eq!(c["evictionHard"]["memory.available"], "1Mi");
        assert!(c.get("staticPodPath").is_none());
        assert_eq!(c["authentication"]["webhook"]["enabled"], true);
        assert_eq!(c["authentication"]["webhook"]["cacheTTL"], "1m");
    }

    #[test]
    fn the_bootstrap_kubeconfig_carries_the_token_and_the_ca() {
        let kc = bootstrap_kubeconfig(&id(), "PEM");
        assert_eq!(kc["users"][0]["user"]["token"], "abcdef.0123456789abcdef");
        assert_eq!(
            kc["clusters"][0]["cluster"]["server"],
            "https://172.31.255.1:6443"
        );
        assert_eq!(
            kc["clusters"][0]["cluster"]["certificate-authority-data"],
            "UEVN"
        );
    }

    #[test]
    fn kube_proxy_knows_the_cluster_cidr_and_leaves_conntrack_alone() {
        let c = kube_proxy_config(&id(), &Machine::default(), ProxyMode::Nftables);
        assert_eq!(c["mode"], "nftables");
        assert_eq!(c["clusterCIDR"], "10.42.0.0/16");
        assert_eq!(c["conntrack"]["maxPerCore"], 0);
    }

    #[test]
    fn containerd_runs_our_cni_and_our_sandbox_image() {
        let t = containerd_toml(&Machine::default());
        assert!(t.contains(r#"conf_dir = "/etc/cni/net.d""#), "{t}");
        assert!(t.contains("restrict_oom_score_adj = true"));
        assert!(t.contains(r#"address = "/run/containerd/containerd.sock""#));
    }

    #[test]
    fn resolv_conf_lists_port_53_upstreams_only() {
        let r = resolv_conf(&id().upstream_resolvers);
        assert!(r.contains("nameserver 172.31.255.1\n"));
        assert!(!r.contains("10.0.0.1"));
    }
}
