//! `cluster rotate-ca`: new CAs for a cluster. The users CA is replaced at once (the front
//! admits the old one's certificates for the overlap: `access::users_trust`); the
//! cluster's own CAs are made again at its control plane's next start
//! (`control_plane::rotate`), which is now if it is awake.
//!
//! A cluster with nodes keeps its old cluster CA trusted beside the new one until every
//! node has moved to it (`control_plane::rotate`, [`Rotation::Overlap`]); [`retirement`]
//! watches the Nodes for it. Refused while an earlier rotation's nodes are still moving, and
//! with the other hosts of a fleet (`store.key_file`: the store keeps the CAs and wins over a
//! host's files).

use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use socialweb_broker_core::{ClusterPhase, millis};

use super::{Clusters, past};
use crate::access::certs::sha256_hex;
use crate::command::{ClusterState, RotatedCa, ServiceError};
use crate::control_plane::rotate::{self as cp, Rotation};

/// The longest overlap: a month is long enough to hand every user a new kubeconfig.
pub const MAX_OVERLAP: Duration = Duration::from_secs(30 * 24 * 3600);

impl Clusters {
    /// Rotates cluster `name`'s CAs; the old users CA's certificates are admitted for
    /// `overlap` more. An awake cluster's control plane starts again with its new CAs,
    /// waited for at most `wait`.
    pub async fn rotate_ca(
        &self,
        name: &str,
        overlap: Duration,
        wait: Duration,
    ) -> Result<RotatedCa, ServiceError> {
        if overlap > MAX_OVERLAP {
            return Err(ServiceError::Invalid(format!(
                "overlap: {} is over the maximum of 30 days",
                humantime::format_duration(overlap)
            )));
        }
        if self.settings.seal_key.is_some() {
            return Err(ServiceError::Conflict(
                "cluster rotate-ca does not run with store.key_file set yet: the store keeps \
                 the clusters' CAs for every host and would give the old ones back"
                    .into(),
            ));
        }
        let lock = self.lock(name).await;
        let c = self.record(name).await?;
        if c.state == ClusterPhase::Deleting {
            return Err(ServiceError::Conflict(format!(
                "name: cluster {name:?} is being deleted"
            )));
        }
        let dir = self.dir_of(&c);
        if cp::overlapping(&dir).is_some() || cp::asked(&dir) {
            return Err(ServiceError::Conflict(format!(
                "cluster {name}: an earlier rotation's nodes have not all moved to its new CA \
                 yet (each Node says it has with the {} annotation); rotate again once they have",
                socialweb_wire::ca::CLUSTER_CA_ANNOTATION
            )));
        }
        let nodes = self.nodes(name, &dir).await?;
        let how = if nodes.is_empty() {
            Rotation::AtOnce
        } else {
            Rotation::Overlap
        };
        let old = self
            .access
            .users_trust(&dir)
            .map_err(ServiceError::internal)?;
        let until = SystemTime::now() + overlap;
        let new = crate::access::users_trust::rotate(&dir, name, until)
            .map_err(ServiceError::internal)?;
        self.front.set_users_trust(name, new.clone());
        cp::ask(&dir, how).map_err(ServiceError::internal)?;
        tracing::info!(cluster = %name, until = %humantime::format_rfc3339_seconds(until),
                       "CAs rotated: the users CA now, the cluster's at its next start");
        drop(lock);
        let made = self.restarted_with_new_cas(name, &dir, wait).await;
        let cluster_cas = match (made, how) {
            (false, _) => "at_next_start",
            (true, Rotation::AtOnce) => "made",
            (true, Rotation::Overlap) => "overlap",
        };
        Ok(RotatedCa {
            cluster: name.to_string(),
            users_ca_sha256: sha256_hex(&new.current),
            previous_users_ca_sha256: sha256_hex(&old.current),
            previous_admitted_until: millis(until),
            cluster_cas: cluster_cas.into(),
            nodes,
            info: self.info(name).await?,
        })
    }

    /// Starts cluster `name`'s control plane again if it is ready, and waits at most `wait`
    /// for the start to end: whether it carried out the rotation asked for in `dir`.
    async fn restarted_with_new_cas(
        &self,
        name: &str,
        dir: &std::path::Path,
        wait: Duration,
    ) -> bool {
        let handle = {
            let running = self.running.lock().expect("lock");
            running.get(name).map(|h| (h.life.clone(), h.state.clone()))
        };
        let Some((life, mut rx)) = handle else {
            return false;
        };
        if !matches!(*rx.borrow(), ClusterState::Ready) {
            return false;
        }
        life.ask_restart();
        // Out of ready (the restart began), then to where the start ends.
        past(&mut rx, wait, |s| matches!(s, ClusterState::Ready)).await;
        past(&mut rx, wait, |s| {
            matches!(s, ClusterState::Starting { .. })
        })
        .await;
        !cp::asked(dir)
    }

    /// Cluster `name`'s nodes and those on their way: the broker's provisions, and, if its
    /// apiserver serves, any Node (one joined by hand has no provision).
    async fn nodes(&self, name: &str, dir: &std::path::Path) -> Result<Vec<String>, ServiceError> {
        let provisions = self
            .store
            .provisions(Some(name))
            .await
            .map_err(ServiceError::internal)?;
        let mut nodes: Vec<String> = provisions
            .iter()
            .filter(|p| !p.state.ended())
            .map(|p| p.node.clone())
            .collect();
        if self.front.serves(name) {
            let listed = async {
                let client = crate::tenant::client(&dir.join("pki/admin.kubeconfig")).await?;
                let list = Api::<Node>::all(client)
                    .list(&ListParams::default())
                    .await?;
                anyhow::Ok(list.items)
            };
            let items = tokio::time::timeout(Duration::from_secs(15), listed)
                .await
                .map_err(|_| anyhow::anyhow!("listing its nodes took over 15 s"))
                .and_then(|r| r)
                .map_err(|e| {
                    ServiceError::Unavailable(format!(
                        "cluster {name}: its nodes could not be listed, so its CAs were not \
                         rotated: {e:#}"
                    ))
                })?;
            for n in items {
                let n = n.metadata.name.unwrap_or_default();
                if !nodes.contains(&n) {
                    nodes.push(n);
                }
            }
        }
        Ok(nodes)
    }
}

/// While nodes move after a rotation: resolves once every Node of the cluster says it trusts
/// and holds the new cluster CA's certificates (the agent's annotation), having asked for the
/// old CA's retirement at the next start. Never resolves outside a rotation.
pub(super) async fn retirement(dir: &std::path::Path, client: &kube::Client) {
    let pin = cp::overlapping(dir)
        .and_then(|_| std::fs::read(dir.join("pki/ca.crt")).ok())
        .and_then(|pem| socialweb_wire::ca::pin(&pem).ok());
    let Some(pin) = pin else {
        return std::future::pending().await;
    };
    let pin = socialweb_wire::CaTrust::pin_text(&pin);
    let mut said = None;
    loop {
        match moving(client, &pin).await {
            Ok(waiting) if waiting.is_empty() => match cp::retire(dir) {
                Ok(()) => {
                    tracing::info!(dir = %dir.display(), "every node has moved to the new cluster CA; retiring the old one");
                    return;
                }
                Err(e) => tracing::warn!("asking for the old cluster CA's retirement: {e:#}"),
            },
            Ok(waiting) if said.as_ref() != Some(&waiting) => {
                tracing::info!(nodes = ?waiting, "nodes still to move to the new cluster CA");
                said = Some(waiting);
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("listing the nodes a rotation waits for: {e:#}"),
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// The Nodes that do not say they have moved to the CA pinned `pin`.
async fn moving(client: &kube::Client, pin: &str) -> anyhow::Result<Vec<String>> {
    let list = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter(|n| {
            n.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(socialweb_wire::ca::CLUSTER_CA_ANNOTATION))
                .is_none_or(|p| p != pin)
        })
        .map(|n| n.metadata.name.unwrap_or_default())
        .collect())
}
