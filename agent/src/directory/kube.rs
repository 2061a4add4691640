//! The peer directory from the cluster itself (contract 2): every Node's `spec.podCIDR`,
//! allocated by the control plane, plus the annotations each agent writes on its own Node
//! with its mesh endpoint id and direct addresses, and every node's cluster address from the
//! ConfigMap the broker writes ([`NODE_ADDRESSES`]). Watched with `kube` reflectors.
//!
//! What a node writes about itself (its annotations) only decides how to reach it: a wrong
//! endpoint or address reaches nothing. What peers route to it (its pod CIDR, its address)
//! comes from the control plane and the broker, which nodes cannot write.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, Config};
use socialweb_wire::mesh::{ADDRS_ANNOTATION, ENDPOINT_ANNOTATION, NODE_ADDRESSES};
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

/// Every node's cluster address, by node name, from the broker's ConfigMap. An entry that
/// is not an address is left out (and said once per change, by the caller's log).
pub fn addresses_of(cm: &ConfigMap) -> BTreeMap<String, IpAddr> {
    cm.data
        .iter()
        .flatten()
        .filter_map(|(node, ip)| Some((node.clone(), ip.trim().parse().ok()?)))
        .collect()
}

/// The directory entry a Node stands for, if it has a pod CIDR and an endpoint annotation.
/// `own_endpoint` fills in this node's endpoint before its annotation is written; its node
/// address is `addresses`' entry for its name (the caller puts this node's own there).
pub fn entry_of(
    node: &Node,
    me: &str,
    own_endpoint: &str,
    addresses: &BTreeMap<String, IpAddr>,
) -> Option<NodeEntry> {
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
    Some(NodeEntry {
        node_ip: addresses.get(&name).copied(),
        node: name,
        endpoint,
        pod_cidr,
        addrs,
    })
}

/// Writes this node's endpoint id and direct addresses on its Node object (a merge patch of
/// annotations, which the node's own credentials may do).
pub async fn annotate_own(
    client: &Client,
    me: &str,
    endpoint: &str,
    addrs: &[SocketAddr],
) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let addrs: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
    let patch = serde_json::json!({"metadata": {"annotations": {
        ENDPOINT_ANNOTATION: endpoint,
        ADDRS_ANNOTATION: addrs.join(","),
    }}});
    api.patch(me, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("annotating Node {me}"))?;
    Ok(())
}

/// What changed on one of the two watches: `true` once a (re)list is complete or an object
/// changed, `false` while a relist is under way (the store then still holds the previous
/// state; it swaps in the new one at InitDone).
fn settled<K>(e: &watcher::Event<K>) -> bool {
    !matches!(e, watcher::Event::Init | watcher::Event::InitApply(_))
}

/// Watches Nodes and the node addresses and publishes the directory on every change. The
/// first value is published once both initial lists have been read. `own_node_ip` is this
/// node's address as its identity gives it (the same the broker publishes).
pub fn watch(
    client: Client,
    me: String,
    own_endpoint: String,
    own_node_ip: Option<IpAddr>,
) -> watch::Receiver<Vec<NodeEntry>> {
    let (tx, rx) = watch::channel(Vec::new());
    tokio::spawn(async move {
        let (nodes, nodes_writer) = reflector::store();
        let node_events = reflector(
            nodes_writer,
            watcher(Api::<Node>::all(client.clone()), watcher::Config::default()).default_backoff(),
        )
        .map(|e| e.map(|e| settled(&e)).map_err(|e| ("Nodes", e)));
        let (published, published_writer) = reflector::store();
        let (namespace, name) = NODE_ADDRESSES;
        let address_events = reflector(
            published_writer,
            watcher(
                Api::<ConfigMap>::namespaced(client, namespace),
                watcher::Config::default().fields(&format!("metadata.name={name}")),
            )
            .default_backoff(),
        )
        .map(|e| e.map(|e| settled(&e)).map_err(|e| ("node addresses", e)));
        let events = futures_util::stream::select(
            node_events.map(|e| (true, e)),
            address_events.map(|e| (false, e)),
        );
        futures_util::pin_mut!(events);
        let (mut nodes_listed, mut addresses_listed) = (false, false);
        let mut last: Option<Vec<NodeEntry>> = None;
        while let Some((is_nodes, event)) = events.next().await {
            match event {
                Err((what, e)) => {
                    warn!("watching {what}: {e}");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    if is_nodes || addresses_listed {
                        continue;
                    }
                    // A cluster that does not let nodes read the addresses still routes
                    // pods: the directory goes on without them (now, not at the next Node
                    // event) rather than waiting.
                    addresses_listed = true;
                }
                Ok(false) => continue,
                Ok(true) if is_nodes => nodes_listed = true,
                Ok(true) => addresses_listed = true,
            }
            if !(nodes_listed && addresses_listed) {
                continue;
            }
            let mut addresses = published
                .state()
                .first()
                .map(|cm| addresses_of(cm))
                .unwrap_or_default();
            match own_node_ip {
                Some(ip) => addresses.insert(me.clone(), ip),
                None => addresses.remove(&me),
            };
            // Rebuild from the stores each time (deletions included).
            let mut entries: BTreeMap<String, NodeEntry> = BTreeMap::new();
            for node in nodes.state() {
                if let Some(e) = entry_of(&node, &me, &own_endpoint, &addresses) {
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
        // What a node may write about itself does not decide its address.
        annotations.insert(
            "socialweb.computer/mesh-node-ip".to_string(),
            "203.0.113.1".to_string(),
        );
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
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": NODE_ADDRESSES.1, "namespace": NODE_ADDRESSES.0},
            "data": {"n2": "10.41.0.2", "n3": "not an address"},
        }))
        .unwrap();
        let addresses = addresses_of(&cm);
        assert_eq!(addresses.len(), 1, "{addresses:?}");
        let e = entry_of(
            &node(
                "n2",
                Some("10.42.2.0/24"),
                Some(&ep),
                Some("172.31.2.2:7443, bad"),
            ),
            "n1",
            "x",
            &addresses,
        )
        .unwrap();
        assert_eq!(e.pod_cidr.to_string(), "10.42.2.0/24");
        assert_eq!(e.addrs, vec!["172.31.2.2:7443".parse().unwrap()]);
        assert_eq!(
            e.node_ip,
            Some("10.41.0.2".parse().unwrap()),
            "the broker's address, not the node's annotation"
        );
        let n3 = node("n3", Some("10.42.3.0/24"), Some(&ep), None);
        assert_eq!(entry_of(&n3, "n1", "x", &addresses).unwrap().node_ip, None);
        assert!(
            entry_of(&node("n2", None, Some(&ep), None), "n1", "x", &addresses).is_none(),
            "no CIDR yet"
        );
        assert!(
            entry_of(
                &node("n2", Some("10.42.2.0/24"), None, None),
                "n1",
                "x",
                &addresses
            )
            .is_none(),
            "no agent yet"
        );
        let own = entry_of(
            &node("n1", Some("10.42.1.0/24"), None, None),
            "n1",
            "mine",
            &addresses,
        )
        .unwrap();
        assert_eq!(own.endpoint, "mine", "this node before it annotated itself");
    }
}
