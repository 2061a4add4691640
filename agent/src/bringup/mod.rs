//! The bring-up: the node's steps in order, each retried on a timer until it holds
//! (`docs/join.md`). Each step is a function of its own that takes the handles the steps
//! before it returned, records what it installs in [`Installed`], and publishes what the
//! control socket may show; [`bring_up`] is the list.
//!
//! sysctls → node-local DNS → the mesh → the tunnel to the broker → containerd → seed images
//! → trust in the control plane → the kubelet (TLS bootstrap) → the Node registered with a pod
//! CIDR (and marked `NetworkUnavailable`) → the bridge and the CNI configuration → the mesh
//! annotation → a live path to every peer (the Node schedulable) → kube-proxy. From the
//! Node's registration on, the node follows the CAs the cluster publishes ([`ca`]).
//!
//! With a static directory (`--peers`, nodes without Kubernetes) only the first three and the
//! pod network run.

pub mod ca;
pub mod follow;
pub mod join;
pub mod network;
pub mod node;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use socialweb_wire::NodeIdentity;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::config::AgentConfig;
use crate::ctl::handler::Published;
use crate::directory::static_file;
use crate::installed::Installed;
use crate::status::Steps;
use crate::supervise::Supervisor;

/// The bring-up steps of a node that joins a cluster, in order.
pub const JOIN_STEPS: &[&str] = &[
    "sysctls",
    "dns",
    "mesh",
    "tunnel",
    "containerd",
    "images",
    "trust",
    "kubelet",
    "node",
    "pod-network",
    "mesh-annotation",
    "mesh-paths",
    "kube-proxy",
];
/// The steps of a node with a static directory.
pub const STATIC_STEPS: &[&str] = &["sysctls", "dns", "mesh", "pod-network"];

/// What every step may use: who this node is, its configuration, and the agent's shared
/// books (steps, children, what is installed, what the control socket shows).
#[derive(Debug)]
pub struct Ctx {
    pub id: NodeIdentity,
    pub config: AgentConfig,
    pub steps: Arc<Steps>,
    pub children: Arc<Supervisor>,
    pub installed: Installed,
    pub published: Arc<Published>,
}

/// The delays between a failing step's attempts.
pub fn retry() -> Backoff {
    Backoff::new(Duration::from_millis(500), Duration::from_secs(15))
}

/// Every step in order, then follows the directory until `stop`. Returns only on an error no
/// retry can fix.
pub async fn bring_up(cx: Arc<Ctx>, stop: CancellationToken) -> Result<()> {
    network::sysctls(&cx).await;
    let dns = network::dns(&cx).await;
    let mesh = network::mesh(&cx).await;
    if let Some(peers) = &cx.config.peers {
        let directory = static_file::watch(peers.clone(), Duration::from_millis(500))?;
        let (follower, _) = follow::Follower::new(cx.clone(), mesh, None);
        return follower.run(directory, stop).await;
    }
    let tunnel = network::tunnel(&cx, &mesh).await;
    join::containerd(&cx).await;
    join::images(&cx).await;
    join::trust(&cx).await;
    let node_ip = join::kubelet(&cx).await;
    let client = node::registered(&cx).await;
    tokio::spawn(ca::follow(cx.clone(), client.clone(), stop.clone()));
    node::watch_own(&cx, &client, dns);
    let directory = node::directory(&cx, &client, &mesh);
    let (follower, mut net_up) = follow::Follower::new(cx.clone(), mesh.clone(), tunnel);
    tokio::spawn(follower.run(directory, stop.clone()));
    // The rest waits for the pod network, as the order says.
    if net_up.wait_for(|up| *up).await.is_err() {
        bail!("the directory follower ended");
    }
    node::annotate(&cx, &client, &mesh).await;
    node::paths_to_every_peer(&cx, &mesh, &client).await;
    node::kube_proxy(&cx, node_ip).await;
    stop.cancelled().await;
    Ok(())
}
