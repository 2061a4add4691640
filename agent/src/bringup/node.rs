//! The steps that need the Node: registered with its pod CIDR, the watches through the
//! kubelet's credentials, the mesh annotation, a live path to every peer, kube-proxy.

use std::net::Ipv4Addr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use socialweb_mesh_core::directory::NodeEntry;
use socialweb_wire::NodeIdentity;
use tokio::sync::watch;
use tracing::{info, warn};

use super::join::CHILD_GRACE;
use super::{Ctx, retry};
use crate::dns::Dns;
use crate::join::config as files;
use crate::join::{proxy_mode, write_json};
use crate::mesh::Mesh;
use crate::supervise::ChildSpec;

const WAITING_FOR_CERT: &str = "waiting for the kubelet's client certificate (CSR approval)";

/// Waits for the kubelet's client certificate and the Node with its pod CIDR; returns a
/// client with the node's credentials.
pub async fn registered(cx: &Ctx) -> kube::Client {
    let mut backoff = retry();
    cx.steps.running("node", Some(WAITING_FOR_CERT.into()));
    loop {
        match registration(cx).await {
            Ok(Some(c)) => return c,
            Ok(None) => tokio::time::sleep(Duration::from_millis(200)).await,
            Err(e) => {
                let delay = backoff.next_delay();
                cx.steps.failed("node", format!("{e:#}"), delay);
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// One look at the registration: `None` (and the step's detail says what it waits for) until
/// the Node has a pod CIDR.
async fn registration(cx: &Ctx) -> Result<Option<kube::Client>> {
    let (m, me) = (&cx.config.machine, &cx.id.node);
    if !m.kubelet_kubeconfig().exists() {
        cx.steps.detail("node", WAITING_FOR_CERT.into());
        return Ok(None);
    }
    let client = crate::directory::kube::client(&m.kubelet_kubeconfig()).await?;
    let api: Api<Node> = Api::all(client.clone());
    let node = api
        .get_opt(me)
        .await
        .with_context(|| format!("reading Node {me}"))?;
    let Some(node) = node else {
        let detail = format!("waiting for the kubelet to register Node {me}");
        cx.steps.detail("node", detail);
        return Ok(None);
    };
    let Some(cidr) = node.spec.and_then(|sp| sp.pod_cidr) else {
        let detail = "waiting for the control plane to allocate a pod CIDR";
        cx.steps.detail("node", detail.into());
        return Ok(None);
    };
    // Unschedulable until the mesh reaches every peer (mesh-paths).
    set_network_available(&client, me, false).await?;
    let detail = format!("Node {me} registered, pod CIDR {cidr}");
    cx.steps.done("node", Some(detail));
    Ok(Some(client))
}

/// Starts what follows the cluster through the node's credentials: the cluster zone for
/// node-local DNS, and this Node's labels.
pub fn watch_own(cx: &Ctx, client: &kube::Client, dns: Option<std::sync::Arc<Dns>>) {
    let id = &cx.id;
    if let Some(dns) = dns {
        let (node, domain) = (id.node.clone(), id.cluster_domain.clone());
        crate::dns::kube::watch(client.clone(), node, domain, dns);
    }
    tokio::spawn(label_own(client.clone(), id.clone()));
}

/// The peer directory from the cluster's Nodes and what the broker publishes, peers'
/// endpoint ids from the broker alone in a broker's cluster.
pub fn directory(cx: &Ctx, client: &kube::Client, mesh: &Mesh) -> watch::Receiver<Vec<NodeEntry>> {
    use crate::directory::nodes::{Me, Trust};
    let me = Me {
        node: cx.id.node.clone(),
        endpoint: mesh.endpoint_id().to_string(),
        node_ip: cx.id.node_ip,
    };
    crate::directory::kube::watch(client.clone(), me, Trust::of(cx.id.node_ip))
}

/// This node's endpoint and addresses on its Node, for its peers' directories.
pub async fn annotate(cx: &Ctx, client: &kube::Client, mesh: &Mesh) {
    let endpoint = mesh.endpoint_id().to_string();
    cx.steps
        .until_done("mesh-annotation", retry(), || async {
            let addrs = mesh.bound_addrs();
            crate::directory::kube::annotate_own(client, &cx.id.node, &endpoint, &addrs).await?;
            Ok(((), Some(format!("endpoint {endpoint}"))))
        })
        .await;
}

/// Keeps the Node unschedulable (`NetworkUnavailable`) until the mesh has a live connection
/// to every peer in the directory, so that a Pod placed on it reaches every other node's Pods
/// from its first packet (the convention CNIs follow; the node lifecycle controller taints
/// and untaints the Node from the condition), and until the kubelet has its serving
/// certificate (the broker approves it; until then the apiserver, which verifies kubelets,
/// could not exec, attach or read logs on this node -- GitLab Runner's
/// FF_WAIT_FOR_POD_TO_BE_REACHABLE is the symptom elsewhere).
pub async fn paths_to_every_peer(cx: &Ctx, mesh: &Mesh, client: &kube::Client) {
    let serving = cx
        .config
        .machine
        .kubelet_cert_dir()
        .join("kubelet-server-current.pem");
    cx.steps
        .until_done("mesh-paths", retry(), || async {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            loop {
                let late = tokio::time::Instant::now() > deadline;
                if !serving.exists() {
                    let waiting =
                        "waiting for the kubelet's serving certificate (the broker approves it)";
                    cx.steps.detail("mesh-paths", waiting.into());
                    if late {
                        let missing = serving.display();
                        bail!("no kubelet serving certificate after 60 s: {missing} is missing");
                    }
                } else {
                    let st = mesh.status();
                    let waiting: Vec<&str> = st
                        .peers
                        .iter()
                        .filter(|p| !p.connected)
                        .map(|p| p.node.as_str())
                        .collect();
                    if waiting.is_empty() {
                        set_network_available(client, &cx.id.node, true).await?;
                        let n = st.peers.len();
                        return Ok(((), Some(format!("connected to all {n} peers; schedulable"))));
                    }
                    let waiting = waiting.join(", ");
                    cx.steps
                        .detail("mesh-paths", format!("waiting for {waiting}"));
                    if late {
                        bail!("no connection to {waiting} after 60 s");
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
}

/// kube-proxy, in the mode `--proxy-mode` resolves to; its rules go with it at shutdown.
pub async fn kube_proxy(cx: &Ctx, node_ip: Ipv4Addr) {
    let m = &cx.config.machine;
    let mode = proxy_mode::resolve(cx.config.kubelet.proxy_mode).await;
    cx.steps
        .until_done("kube-proxy", retry(), || async {
            let config = files::kube_proxy_config(&cx.id, m, mode);
            write_json(&m.kube_proxy_config_file(), &config, 0o644)?;
            let flag = format!("--config={}", m.kube_proxy_config_file().display());
            let spec = ChildSpec {
                name: "kube-proxy".into(),
                program: m.kube_proxy.clone(),
                args: vec![flag.into()],
                log: m.log("kube-proxy"),
            };
            cx.children.start(spec).await?;
            let (children, program) = (cx.children.clone(), m.kube_proxy.clone());
            cx.installed
                .record("child kube-proxy and its rules", async move {
                    children.stop("kube-proxy", CHILD_GRACE).await;
                    kube_proxy_cleanup(&program).await
                });
            Ok((
                (),
                Some(format!("{} mode, node IP {node_ip}", mode.as_str())),
            ))
        })
        .await;
}

/// kube-proxy's own rules: its `--cleanup` removes them for every mode.
async fn kube_proxy_cleanup(program: &std::path::Path) -> Result<()> {
    let out = tokio::process::Command::new(program)
        .arg("--cleanup")
        .output()
        .await
        .context("kube-proxy --cleanup")?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        bail!(
            "kube-proxy --cleanup: {}",
            stderr.lines().last().unwrap_or("")
        );
    }
    info!("kube-proxy rules removed");
    Ok(())
}

/// Sets this Node's `NetworkUnavailable` condition (a node may patch its own status).
async fn set_network_available(client: &kube::Client, node: &str, up: bool) -> Result<()> {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let (status, reason, message) = if up {
        (
            "False",
            "SocialwebMeshUp",
            "the mesh has a live path to every peer",
        )
    } else {
        (
            "True",
            "SocialwebMeshConnecting",
            "the mesh is connecting to its peers",
        )
    };
    let patch = serde_json::json!({"status": {"conditions": [{
        "type": "NetworkUnavailable", "status": status, "reason": reason, "message": message,
        "lastTransitionTime": now, "lastHeartbeatTime": now,
    }]}});
    Api::<Node>::all(client.clone())
        .patch_status(node, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .with_context(|| format!("setting NetworkUnavailable={status} on Node {node}"))?;
    Ok(())
}

/// Labels this node `socialweb.computer/node-local-dns=true` (contract 5) and with the
/// identity's labels, retrying until it holds. The kubelet sets them when it registers the
/// Node; this covers a Node that existed before.
async fn label_own(client: kube::Client, id: NodeIdentity) {
    let api: Api<Node> = Api::all(client);
    let me = id.node;
    let mut labels = id.labels;
    let dns_label = socialweb_wire::mesh::NODE_LOCAL_DNS_LABEL;
    labels.insert(dns_label.into(), "true".into());
    let patch = serde_json::json!({"metadata": {"labels": labels}});
    let mut backoff =
        crate::backoff::Backoff::new(Duration::from_millis(500), Duration::from_secs(10));
    loop {
        let params = PatchParams::default();
        match api.patch(&me, &params, &Patch::Merge(&patch)).await {
            Ok(_) => return,
            Err(e) => {
                let delay = backoff.next_delay();
                warn!("labelling Node {me}: {e}; retrying in {delay:?}");
                tokio::time::sleep(delay).await;
            }
        }
    }
}
