//! The peer directory from the cluster itself (contract 2): watches of every Node (its
//! `spec.podCIDR`, allocated by the control plane, and the annotations each agent writes on
//! its own Node) and of the ConfigMap in which the broker publishes every node's address and
//! mesh endpoint id ([`NODE_ADDRESSES`]), with `kube` reflectors. What they make of the
//! directory, and whom it trusts for what, is [`super::nodes`].

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, Config};
use socialweb_wire::mesh::{ADDRS_ANNOTATION, ENDPOINT_ANNOTATION, NODE_ADDRESSES, PublishedNodes};
use tokio::sync::watch;
use tracing::{info, warn};

use socialweb_mesh_core::directory::NodeEntry;

use super::nodes::{self, Me, Trust};

/// A client from a kubeconfig file (the node's, written by the join).
pub async fn client(kubeconfig: &Path) -> Result<Client> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading kubeconfig {}", kubeconfig.display()))?;
    let config = Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .with_context(|| format!("kubeconfig {}", kubeconfig.display()))?;
    Client::try_from(config).context("building the Kubernetes client")
}

/// Writes this node's endpoint id and direct addresses on its Node object (a merge patch of
/// annotations, which the node's own credentials may do). Peers in a broker's cluster read
/// only the addresses; the endpoint id is for clusters without a broker, agents of v0.1.0
/// and people.
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

/// Watches Nodes and the broker's published nodes and publishes the directory on every
/// change, endpoint ids taken as `trust` says. The first value is published once both
/// initial lists have been read.
pub fn watch(client: Client, me: Me, trust: Trust) -> watch::Receiver<Vec<NodeEntry>> {
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
                    // A cluster that does not let nodes read the ConfigMap goes on without
                    // it (now, not at the next Node event) rather than waiting: without a
                    // broker it still routes pods; in a broker's cluster no peer has an
                    // endpoint id then, and the directory holds this node alone.
                    addresses_listed = true;
                }
                Ok(false) => continue,
                Ok(true) if is_nodes => nodes_listed = true,
                Ok(true) => addresses_listed = true,
            }
            if !(nodes_listed && addresses_listed) {
                continue;
            }
            // Rebuild from the stores each time (deletions included).
            let data = published.state().first().and_then(|cm| cm.data.clone());
            let from_broker = PublishedNodes::from_data(data.iter().flatten());
            let listed = nodes.state();
            let entries = nodes::entries(listed.iter().map(|n| &**n), &me, &from_broker, trust);
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
