//! What the broker assigned each live node, published in its cluster (contract 2): its
//! cluster address (`node_ip`, chosen when it planned the node:
//! `socialweb_broker_core::names`) and its mesh endpoint id (the public half of the mesh key
//! it generated then). The broker alone writes them into the ConfigMap [`NODE_ADDRESSES`],
//! which nodes may read and not write (`agent/deploy/rbac.yaml`). Peers take a node's
//! address and endpoint id from here only: a node that edits its own Node object cannot make
//! the others route someone else's address to it, nor take someone else's place in their
//! directories.

use std::time::Duration;

use anyhow::Result;
use socialweb_broker_core::records::Provision;
use socialweb_wire::mesh::{NODE_ADDRESSES, PublishedNodes, is_endpoint_id};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::store::Store;

/// How often the store is read for changes: well under the time a planned node takes from
/// its first boot to a registered Node (its CSR, approved by the store's same records, comes
/// first), so its address and endpoint id are published before any peer sees it.
const EVERY: Duration = Duration::from_secs(2);

/// The address and endpoint id of every live node of the provisions, by node name.
pub fn published(provisions: &[Provision]) -> PublishedNodes {
    let live = || provisions.iter().filter(|p| p.state.live());
    PublishedNodes {
        addresses: live()
            .filter_map(|p| Some((p.node.clone(), p.node_ip?)))
            .collect(),
        endpoints: live()
            .filter(|p| is_endpoint_id(&p.endpoint))
            .map(|p| (p.node.clone(), p.endpoint.to_ascii_lowercase()))
            .collect(),
    }
}

/// Writes `nodes` as the ConfigMap.
pub async fn publish(client: &kube::Client, nodes: &PublishedNodes) -> Result<()> {
    let data = serde_json::json!(nodes.to_data());
    crate::tenant::apply_configmap(client, NODE_ADDRESSES, &data).await
}

/// Keeps what `cluster`'s nodes read equal to the store's live provisions until `stop`
/// (written once at the start of each awake period, then on every change).
pub async fn run(client: kube::Client, cluster: String, store: Store, stop: CancellationToken) {
    let mut written: Option<PublishedNodes> = None;
    loop {
        match store.provisions(Some(&cluster)).await {
            Err(e) => warn!(%cluster, "reading the provisions to publish: {e:#}"),
            Ok(p) => {
                let now = published(&p);
                if written.as_ref() != Some(&now) {
                    match publish(&client, &now).await {
                        Ok(()) => {
                            let nodes = now.endpoints.len();
                            info!(%cluster, nodes, "node addresses and endpoint ids published");
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
    use socialweb_broker_core::records::Step;

    use super::*;

    fn provision(n: u8, state: Step, endpoint: &str) -> Provision {
        Provision {
            id: format!("p{n}"),
            cluster: "c".into(),
            node: format!("c-{n}"),
            state,
            rfp_id: "r".into(),
            bid_id: None,
            lease_id: format!("l{n}"),
            provider: None,
            token_id: "abcdef".into(),
            token_secret: String::new(),
            mesh_key: String::new(),
            endpoint: endpoint.into(),
            node_ip: Some(format!("10.41.0.{n}").parse().unwrap()),
            spec: None,
            topology: Default::default(),
            reason: None,
            attempts: 0,
            created_at: 0,
            updated_at: 0,
        }
    }

    #[test]
    fn the_broker_assigns_from_the_range_the_agents_route() {
        assert_eq!(
            socialweb_broker_core::names::NODE_RANGE,
            socialweb_wire::mesh::NODE_RANGE
        );
    }

    #[test]
    fn every_live_node_is_published_with_its_address_and_endpoint_id() {
        let id = |c: char| c.to_string().repeat(64);
        let p = published(&[
            provision(1, Step::Joined, &id('a')),
            provision(2, Step::Planned, &id('B')),
            provision(3, Step::Released, &id('c')),
            provision(4, Step::Running, ""),
        ]);
        let nodes = |ns: &[u8]| ns.iter().map(|n| format!("c-{n}")).collect::<Vec<_>>();
        assert_eq!(
            p.addresses.keys().cloned().collect::<Vec<_>>(),
            nodes(&[1, 2, 4])
        );
        assert_eq!(
            p.endpoints,
            [("c-1".to_string(), id('a')), ("c-2".to_string(), id('b'))].into(),
            "live ones with an id, lowercase as agents compare it"
        );
        // What an agent reads back is what the broker meant.
        assert_eq!(PublishedNodes::from_data(&p.to_data()), p);
    }
}
