//! Following the peer directory once the mesh is up. Each state of the directory becomes
//! events ([`events`], pure): the view for the mesh, and this node's pod CIDR when it changes.
//! The [`Follower`] hands them on: the view to the mesh, the pod CIDR to the tunnel and to
//! this node's pod network (bridge, CNI configuration, masquerade), which is retried on a
//! timer until it holds and redone when the CIDR changes. It says on a watch when the pod
//! network first holds, which the rest of the bring-up waits for.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use ipnet::IpNet;
use socialweb_mesh_core::directory::{self as peer_directory, NodeEntry, View};
use socialweb_wire::NodeIdentity;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{Ctx, retry};
use crate::backoff::Backoff;
use crate::mesh::{Mesh, egress};
use crate::node;
use crate::tunnel::Tunnel;

/// What one state of the directory means for this node.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// This node's pod CIDR, when it differs from the last one said.
    OwnPodCidr(IpNet),
    /// This node is not in the directory (yet): no pod CIDR.
    NotListed,
    /// The peers as the mesh should have them.
    Peers(View),
}

/// The events of one directory state, given the pod CIDR said last.
pub fn events(entries: &[NodeEntry], id: &NodeIdentity, said: Option<IpNet>) -> Vec<Event> {
    let range = socialweb_wire::mesh::node_range();
    let view = peer_directory::view(entries, &id.node, &id.cluster_cidr, &range);
    let own = view.own.as_ref().map(|o| o.pod_cidr);
    let mut events = Vec::with_capacity(2);
    match own {
        Some(cidr) if Some(cidr) != said => events.push(Event::OwnPodCidr(cidr)),
        Some(_) => {}
        None => events.push(Event::NotListed),
    }
    events.push(Event::Peers(view));
    events
}

/// Hands the directory's events to the mesh, the tunnel and this node's pod network.
#[derive(Debug)]
pub struct Follower {
    cx: Arc<Ctx>,
    mesh: Mesh,
    tunnel: Option<Tunnel>,
    /// The pod CIDR said last, and whether the pod network holds it.
    want: Option<IpNet>,
    holds: bool,
    backoff: Backoff,
    retry_at: Option<Instant>,
    up: watch::Sender<bool>,
}

impl Follower {
    /// A follower and the watch that turns `true` once the pod network first holds.
    pub fn new(
        cx: Arc<Ctx>,
        mesh: Mesh,
        tunnel: Option<Tunnel>,
    ) -> (Follower, watch::Receiver<bool>) {
        let (up, up_rx) = watch::channel(false);
        let follower = Follower {
            cx,
            mesh,
            tunnel,
            want: None,
            holds: false,
            backoff: retry(),
            retry_at: None,
            up,
        };
        (follower, up_rx)
    }

    /// Follows `directory` until `stop`; an error only when the directory's source ends.
    pub async fn run(
        mut self,
        mut directory: watch::Receiver<Vec<NodeEntry>>,
        stop: CancellationToken,
    ) -> Result<()> {
        let waiting = "waiting for this node's pod CIDR";
        self.cx.steps.running("pod-network", Some(waiting.into()));
        loop {
            let entries = directory.borrow_and_update().clone();
            for event in events(&entries, &self.cx.id, self.want) {
                self.hand_on(event).await;
            }
            if self.retry_at.is_some_and(|t| t <= Instant::now()) {
                self.pod_network();
            }
            let wake = self
                .retry_at
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                changed = directory.changed() => if changed.is_err() {
                    bail!("the peer directory source ended")
                },
                _ = tokio::time::sleep_until(wake) => {}
                _ = stop.cancelled() => return Ok(()),
            }
        }
    }

    async fn hand_on(&mut self, event: Event) {
        match event {
            Event::OwnPodCidr(cidr) => {
                self.want = Some(cidr);
                self.holds = false;
                if let Some(t) = &self.tunnel {
                    t.set_pod_cidr(cidr);
                }
                self.pod_network();
            }
            Event::NotListed => {
                warn!(node = %self.cx.id.node, "this node is not in the peer directory yet; no pod CIDR")
            }
            Event::Peers(view) => {
                if let Err(e) = self.mesh.apply(&view).await {
                    warn!("applying the peer directory to the mesh: {e:#}");
                }
            }
        }
    }

    /// One attempt at this node's pod network for the wanted CIDR.
    fn pod_network(&mut self) {
        let Some(cidr) = self.want.filter(|_| !self.holds) else {
            self.retry_at = None;
            return;
        };
        let steps = &self.cx.steps;
        steps.running("pod-network", None); // counts the attempt
        match own_network(&self.cx, &cidr) {
            Ok(detail) => {
                self.holds = true;
                self.retry_at = None;
                self.backoff.reset();
                steps.done("pod-network", Some(detail));
                let _ = self.up.send(true);
            }
            Err(e) => {
                let delay = self.backoff.next_delay();
                steps.failed("pod-network", format!("{e:#}"), delay);
                self.retry_at = Some(Instant::now() + delay);
            }
        }
    }
}

/// Puts this node's pod CIDR on the bridge (dropping a previous one's gateway), writes the CNI
/// configuration and installs the masquerade (recording its removal). Idempotent.
fn own_network(cx: &Ctx, cidr: &IpNet) -> Result<String> {
    info!(pod_cidr = %cidr, "this node's pod CIDR");
    let mut done = vec![];
    if let Some(net) = cx.config.pod_network() {
        node::ensure_bridge(cidr, net.mtu)?;
        let path = node::write_conflist(cidr, &net)?;
        done.push(format!("{} on {}, {}", cidr, node::BRIDGE, path.display()));
    }
    if cx.config.pod_network.masquerade() {
        egress::install(cidr, &cx.id.cluster_cidr)?;
        let table = egress::TABLE;
        cx.installed
            .record(format!("the masquerade table {table}"), async {
                egress::remove()
            });
        done.push(format!("masquerade table {table}"));
    }
    Ok(done.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> NodeIdentity {
        let doc = serde_json::json!({
            "version": 3, "cluster": "c", "node": "a",
            "server_url": "https://172.31.255.1:6443",
            "ca_cert_sha256": format!("sha256:{}", "ab".repeat(32)),
            "join_token": "abcdef.0123456789abcdef",
            "relay_url": "http://172.31.255.1:3340", "mesh_secret_key": "11".repeat(32),
            "cluster_cidr": "10.42.0.0/16", "service_cidr": "10.43.0.0/16",
            "cluster_domain": "cluster.local",
        });
        NodeIdentity::from_json(doc.to_string().as_bytes()).expect("a valid identity")
    }

    fn entry(node: &str, cidr: &str) -> NodeEntry {
        serde_json::from_value(serde_json::json!({
            "node": node,
            "endpoint": crate::mesh::transport::endpoint_id(&[7; 32]).to_string(),
            "pod_cidr": cidr,
        }))
        .expect("an entry")
    }

    #[test]
    fn the_pod_cidr_is_said_once_and_again_when_it_changes() {
        let id = identity();
        let e = events(&[], &id, None);
        assert!(
            matches!(e[..], [Event::NotListed, Event::Peers(_)]),
            "{e:?}"
        );
        let listed = [entry("a", "10.42.1.0/24")];
        let cidr: IpNet = "10.42.1.0/24".parse().unwrap();
        let e = events(&listed, &id, None);
        assert_eq!(e[0], Event::OwnPodCidr(cidr));
        let e = events(&listed, &id, Some(cidr));
        assert!(matches!(e[..], [Event::Peers(_)]), "{e:?}");
        let moved = [entry("a", "10.42.2.0/24")];
        let e = events(&moved, &id, Some(cidr));
        assert_eq!(e[0], Event::OwnPodCidr("10.42.2.0/24".parse().unwrap()));
    }
}
