//! The apiserver's `cluster` egress (its EgressSelectorConfiguration: HTTPConnect over this
//! Unix socket, one per cluster, so that clusters whose pod CIDRs overlap never meet in one
//! routing table). Each connection is one CONNECT: read with a size limit and a timeout,
//! routed by the core's `egress::route` to the one node the address belongs to, carried as a
//! `connect` stream on that node's tunnel, and answered `200` once the node has dialled, or
//! `502 <reason>` naming the destination and why. Never a fallback to another way.

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector;
use socialweb_broker_core::egress::{MAX_HEAD, NodeRoute, parse_connect, refusal_head, route};
use socialweb_wire::tunnel::{Open, Reply};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::{Tunnels, read_line, splice};
use crate::store::Store;

/// How long the apiserver has to send its CONNECT, and a node to dial.
const WITHIN: Duration = Duration::from_secs(10);

/// One cluster's egress.
#[derive(Clone)]
pub struct Egress {
    pub cluster: String,
    pub tunnels: Tunnels,
    pub store: Store,
    /// The cluster's Nodes (their pod CIDRs and readiness), from the driver's watch.
    pub nodes: reflector::Store<Node>,
    pub service_cidr: IpNet,
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress")
            .field("cluster", &self.cluster)
            .finish_non_exhaustive()
    }
}

/// Serves `e` on `socket` (mode 0600: the apiserver runs as the broker's user) until `stop`.
pub fn serve(e: Egress, socket: &Path, stop: CancellationToken) -> Result<()> {
    let cluster = e.cluster.clone();
    super::serve_socket(socket, "apiserver egress", &cluster, stop, move |uds| {
        let e = e.clone();
        async move { e.one(uds).await }
    })
}

/// Reads the request head (up to the empty line), at most [`MAX_HEAD`] bytes.
pub(super) async fn read_head(uds: &mut UnixStream) -> Result<Vec<u8>, String> {
    let mut head = Vec::with_capacity(128);
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() >= MAX_HEAD {
            return Err(format!("the request head is longer than {MAX_HEAD} bytes"));
        }
        match uds.read(&mut byte).await {
            Ok(0) => return Err("the apiserver closed before its request".into()),
            Ok(_) => head.push(byte[0]),
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(head)
}

impl Egress {
    async fn one(&self, mut uds: UnixStream) {
        let head = match tokio::time::timeout(WITHIN, read_head(&mut uds)).await {
            Ok(Ok(h)) => h,
            Ok(Err(e)) => return self.refuse(&mut uds, &e).await,
            Err(_) => return self.refuse(&mut uds, "no CONNECT within 10 s").await,
        };
        let to = match parse_connect(&head) {
            Ok(to) => to,
            Err(e) => return self.refuse(&mut uds, &e).await,
        };
        let (send, recv) = match self.open(to).await {
            Ok(s) => s,
            Err(e) => return self.refuse(&mut uds, &e).await,
        };
        if uds
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await
            .is_err()
        {
            return;
        }
        debug!(cluster = %self.cluster, %to, "egress connected");
        splice(uds, send, recv).await;
    }

    async fn refuse(&self, uds: &mut UnixStream, why: &str) {
        warn!(cluster = %self.cluster, "apiserver egress refused: {why}");
        let _ = uds.write_all(refusal_head(why).as_bytes()).await;
        let _ = uds.shutdown().await;
    }

    /// The nodes as routing sees them: addresses from the broker's records, pod CIDRs and
    /// readiness from the cluster, connections from the tunnel.
    async fn routes(&self) -> Result<Vec<(NodeRoute, Option<iroh::EndpointId>)>, String> {
        let provisions = self
            .store
            .provisions(Some(&self.cluster))
            .await
            .map_err(|e| format!("{e:#}"))?;
        let nodes = self.nodes.state();
        Ok(provisions
            .into_iter()
            .filter(|p| p.state.live())
            .map(|p| {
                let n = nodes
                    .iter()
                    .find(|n| n.metadata.name.as_deref() == Some(&p.node));
                let id: Option<iroh::EndpointId> = p.endpoint.parse().ok();
                let route = NodeRoute {
                    node: p.node.clone(),
                    node_ip: p.node_ip,
                    pod_cidr: n.and_then(|n| n.spec.as_ref()?.pod_cidr.as_ref()?.parse().ok()),
                    connected: id.is_some_and(|id| self.tunnels.link(&id).is_some()),
                    ready: n.is_some_and(|n| crate::tenant::node_ready(n)),
                };
                (route, id)
            })
            .collect())
    }

    /// A `connect` stream to the node `to` belongs to, once the node has dialled it.
    pub(super) async fn open(
        &self,
        to: std::net::SocketAddr,
    ) -> Result<(iroh::endpoint::SendStream, iroh::endpoint::RecvStream), String> {
        let routes = self.routes().await?;
        let plain: Vec<NodeRoute> = routes.iter().map(|(r, _)| r.clone()).collect();
        let node = route(to.ip(), &plain, &self.service_cidr, &self.cluster)?;
        let link = routes
            .iter()
            .find(|(r, _)| r.node == node.node)
            .and_then(|(_, id)| id.as_ref())
            .and_then(|id| self.tunnels.link(id))
            .ok_or_else(|| format!("{to}: node {}'s tunnel went down", node.node))?;
        let dial = async {
            let (mut send, mut recv) = link
                .conn
                .open_bi()
                .await
                .map_err(|e| format!("{to}: node {}: {e}", node.node))?;
            send.write_all(Open::Connect(to).line().as_bytes())
                .await
                .map_err(|e| format!("{to}: node {}: {e}", node.node))?;
            let line = read_line(&mut recv)
                .await
                .map_err(|e| format!("{to}: node {}: {e:#}", node.node))?;
            match Reply::parse(&line) {
                Ok(Reply::Ok) => Ok((send, recv)),
                Ok(Reply::Refused(why)) => Err(format!("node {} refused: {why}", node.node)),
                Err(e) => Err(format!("{to}: node {}: {e}", node.node)),
            }
        };
        tokio::time::timeout(WITHIN, dial)
            .await
            .map_err(|_| format!("{to}: node {} did not answer within 10 s", node.node))?
    }
}
