//! Every node's cluster address, published in its cluster (contract 2): the broker assigned
//! each live node its `node_ip` when it planned it (`socialweb_broker_core::names`), and it
//! alone writes them into the ConfigMap [`NODE_ADDRESSES`], which nodes may read and not
//! write (`agent/deploy/rbac.yaml`). Peers route a node's address over the mesh from here
//! only: a node that edits its own Node object cannot make the others route someone else's
//! address to it.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Result;
use socialweb_broker_core::records::Provision;
use socialweb_wire::mesh::NODE_ADDRESSES;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::store::Store;

/// How often the store is read for changes: well under the time a planned node takes from
/// its first boot to a registered Node (its CSR, approved by the store's same records, comes
/// first), so its address is published before any peer sees it.
const EVERY: Duration = Duration::from_secs(2);

/// The address of every live node of the provisions, by node name.
pub fn addresses(provisions: &[Provision]) -> BTreeMap<String, String> {
    provisions
        .iter()
        .filter(|p| p.state.live())
        .filter_map(|p| Some((p.node.clone(), p.node_ip?.to_string())))
        .collect()
}

/// Writes `data` as the ConfigMap.
pub async fn publish(client: &kube::Client, data: &BTreeMap<String, String>) -> Result<()> {
    crate::tenant::apply_configmap(client, NODE_ADDRESSES, &serde_json::json!(data)).await
}

/// Keeps `cluster`'s published addresses equal to the store's live provisions until `stop`
/// (written once at the start of each awake period, then on every change).
pub async fn run(client: kube::Client, cluster: String, store: Store, stop: CancellationToken) {
    let mut written: Option<BTreeMap<String, String>> = None;
    loop {
        match store.provisions(Some(&cluster)).await {
            Err(e) => warn!(%cluster, "reading the provisions for the node addresses: {e:#}"),
            Ok(p) => {
                let now = addresses(&p);
                if written.as_ref() != Some(&now) {
                    match publish(&client, &now).await {
                        Ok(()) => {
                            info!(%cluster, nodes = now.len(), "node addresses published");
                            written = Some(now);
                        }
                        Err(e) => warn!(%cluster, "{e:#}"),
                    }
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(EVERY) => {}
            _ = stop.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_broker_assigns_from_the_range_the_agents_route() {
        assert_eq!(
            socialweb_broker_core::names::NODE_RANGE,
            socialweb_wire::mesh::NODE_RANGE
        );
    }
}
