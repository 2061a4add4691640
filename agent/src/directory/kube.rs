//! The peer directory from the cluster itself (contract 2): every Node's `spec.podCIDR`,
//! allocated by the control plane, plus the annotations each agent writes on its own Node
//! with its mesh endpoint id and direct addresses. Watched with a `kube` reflector; the broker
//! is not in this loop.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, Config};
use socialweb_wire::mesh::{ADDRS_ANNOTATION, ENDPOINT_ANNOTATION, NODE_IP_ANNOTATION};
use tokio::sync::watch;
use tracing::{info, warn};

use socialweb_mesh_core::directory::NodeEntry;

/// A client from a kubeconfig file (the node's, written by the join).
pub async fn client(kubeconfig: &Path) -> Result<Client> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading kubeconfig {}", kubeconfig.display()))?;
    let config = Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .with_context(|| format!("kubeconfig {}", kubeconfig.display()))?;
    Client::try_from(config).context("building the Kubernetes client")
}

/// The directory entry a Node stands for, if it has a pod CIDR and an endpoint annotation.
/// `own_endpoint` fills in this node's endpoint before its annotation is written.
pub fn entry_of(node: &Node, me: &str, own_endpoint: &str) -> Option<NodeEntry> {
    let name = node.metadata.name.clone()?;
    let pod_cidr = node.spec.as_ref()?.pod_cidr.as_ref()?.parse().ok()?;
    let annotations = node.metadata.annotations.clone().unwrap_or_default();
    let endpoint = match annotations.get(ENDPOINT_ANNOTATION) {
        Some(e) => e.clone(),
        None if name == me => own_endpoint.to_string(),
        None => return None,
    };
    let addrs = annotations
        .get(ADDRS_ANNOTATION)
        .map(|s| {
            s.split(',')
                .filter_map(|a| a.trim().parse::<SocketAddr>().ok())
                .collect()
        })
        .unwrap_or_default();
    // The node's cluster address, when its agent routes it over the mesh.
    let node_ip = annotations
        .get(NODE_IP_ANNOTATION)
        .and_then(|a| a.trim().parse().ok());
    Some(NodeEntry {
        node: name,
        endpoint,
        pod_cidr,
        addrs,
        node_ip,
    })
}

/// Writes this node's endpoint id, direct addresses and mesh-routed node address on its
/// Node object (a merge patch of annotations, which the node's own credentials may do).
pub async fn annotate_own(
    client: &Client,
    me: &str,
    endpoint: &str,
    addrs: &[SocketAddr],
    node_ip: Option<std::net::IpAddr>,
) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let addrs: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
    let patch = serde_json::json!({"metadata": {"annotations": {
        ENDPOINT_ANNOTATION: endpoint,
        ADDRS_ANNOTATION: addrs.join(","),
        NODE_IP_ANNOTATION: node_ip.map(|ip| ip.to_string()),
    }}});
    api.patch(me, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("annotating Node {me}"))?;
    Ok(())
}

/// Watches Nodes and publishes the directory on every change. The first value is published
/// once the initial list has been read.
pub fn watch(client: Client, me: String, own_endpoint: String) -> watch::Receiver<Vec<NodeEntry>> {
    let (tx, rx) = watch::channel(Vec::new());
    tokio::spawn(async move {
        let api: Api<Node> = Api::all(client);
        let (store, writer) = reflector::store();
        let stream = reflector(
            writer,
            watcher(api, watcher::Config::default()).default_backoff(),
        );
        futures_util::pin_mut!(stream);
        let mut last: Option<Vec<NodeEntry>> = None;
        while let Some(event) = stream.next().await {
            match event {
                Err(e) => {
                    warn!("watching Nodes: {e}");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
                // While a (re)list is under way the store still holds the previous state; it
                // swaps in the new one at InitDone.
                Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => continue,
                Ok(_) => {}
            }
            // Rebuild from the store each time (deletions included).
            let mut entries: BTreeMap<String, NodeEntry> = BTreeMap::new();
            for node in store.state() {
                if let Some(e) = entry_of(&node, &me, &own_endpoint) {
                    entries.insert(e.node.clone(), e);
                }
            }
            let entries: Vec<NodeEntry> = entries.into_values().collect();
            if last.as_ref() != Some(&entries) {
                info!(nodes = entries.len(), "peer directory from Nodes changed");
                last = Some(entries.clone());
                if tx.send(entries).is_err() {
                    return;
                }
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, cidr: Option<&str>, endpoint: Option<&str>, addrs: Option<&str>) -> Node {
        let mut annotations = BTreeMap::new();
        annotations.insert(NODE_IP_ANNOTATION.to_string(), "10.41.0.2".to_string());
        if let Some(e) = endpoint {
            annotations.insert(ENDPOINT_ANNOTATION.to_string(), e.to_string());
        }
        if let Some(a) = addrs {
            annotations.insert(ADDRS_ANNOTATION.to_string(), a.to_string());
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"podCIDR": cidr},
        }))
        .unwrap()
    }

    #[test]
    fn nodes_become_entries_once_they_have_a_cidr_and_an_endpoint() {
        let ep = "a".repeat(64);
        let e = entry_of(
            &node(
                "n2",
                Some("10.42.2.0/24"),
                Some(&ep),
                Some("172.31.2.2:7443, bad"),
            ),
            "n1",
            "x",
        )
        .unwrap();
        assert_eq!(e.pod_cidr.to_string(), "10.42.2.0/24");
        assert_eq!(e.addrs, vec!["172.31.2.2:7443".parse().unwrap()]);
        assert_eq!(e.node_ip, Some("10.41.0.2".parse().unwrap()));
        assert!(
            entry_of(&node("n2", None, Some(&ep), None), "n1", "x").is_none(),
            "no CIDR yet"
        );
        assert!(
            entry_of(&node("n2", Some("10.42.2.0/24"), None, None), "n1", "x").is_none(),
            "no agent yet"
        );
        let own = entry_of(&node("n1", Some("10.42.1.0/24"), None, None), "n1", "mine").unwrap();
        assert_eq!(own.endpoint, "mine", "this node before it annotated itself");
    }
}
