//! The peer directory from the cluster itself (contract 2): watches of every Node (its
//! `spec.podCIDR`, allocated by the control plane, and the annotations each agent writes on
//! its own Node) and of the ConfigMap in which the broker publishes every node's address and
//! mesh endpoint id ([`NODE_ADDRESSES`]), with `kube` reflectors. What they make of the
//! directory, and whom it trusts for what, is [`super::nodes`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
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

/// A client from a kubeconfig file, read once.
pub async fn client_once(kubeconfig: &Path) -> Result<Client> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading kubeconfig {}", kubeconfig.display()))?;
    let config = Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .with_context(|| format!("kubeconfig {}", kubeconfig.display()))?;
    Client::try_from(config).context("building the Kubernetes client")
}

/// The node's client, from its kubeconfig (the kubelet's, written by the join), following
/// it: when the file or the client certificate it names changes (a CA rotation gives the
/// node a new CA bundle and a new certificate, `join::rotation`), the next request goes
/// through a client made from them. Requests under way finish on the client they started
/// with; a watch moves over at its next request.
pub async fn client(kubeconfig: &Path) -> Result<Client> {
    let made = Made::now(kubeconfig);
    let first = client_once(kubeconfig).await?;
    let svc = Following {
        path: kubeconfig.to_path_buf(),
        current: Arc::new(tokio::sync::Mutex::new((made, first))),
    };
    Ok(Client::new(svc, "default"))
}

/// See [`client`].
#[derive(Clone)]
struct Following {
    path: PathBuf,
    current: Arc<tokio::sync::Mutex<(Made, Client)>>,
}

/// What a client was made from: the kubeconfig's modification time, the client certificate
/// it names (read from it once per change, not at every request) and that file's (through
/// its `-current` symlink).
#[derive(PartialEq)]
struct Made {
    kubeconfig: Option<std::time::SystemTime>,
    cert: Option<PathBuf>,
    cert_modified: Option<std::time::SystemTime>,
}

fn modified(p: &Path) -> Option<std::time::SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

impl Made {
    fn now(kubeconfig: &Path) -> Made {
        let cert = kube::config::Kubeconfig::read_from(kubeconfig)
            .ok()
            .and_then(|kc| kc.auth_infos.into_iter().next())
            .and_then(|a| a.auth_info)
            .and_then(|a| a.client_certificate)
            .map(PathBuf::from);
        Made {
            kubeconfig: modified(kubeconfig),
            cert_modified: cert.as_deref().and_then(modified),
            cert,
        }
    }

    /// Whether the files changed since: two `stat`s.
    fn changed(&self, kubeconfig: &Path) -> bool {
        modified(kubeconfig) != self.kubeconfig
            || self.cert.as_deref().and_then(modified) != self.cert_modified
    }
}

impl Following {
    /// The client for the files as they are now.
    async fn now(&self) -> Client {
        let mut cur = self.current.lock().await;
        if cur.0.changed(&self.path) {
            let made = Made::now(&self.path);
            match client_once(&self.path).await {
                Ok(c) => {
                    info!(kubeconfig = %self.path.display(), "the node's kubeconfig or certificate changed; using them from now on");
                    *cur = (made, c);
                }
                // Half written: the next request tries again.
                Err(e) => warn!("{e:#}; keeping the client made before"),
            }
        }
        cur.1.clone()
    }
}

impl tower::Service<http::Request<kube::client::Body>> for Following {
    type Response = http::Response<kube::client::Body>;
    type Error = kube::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { this.now().await.send(req).await })
    }
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
