//! `socialweb-agent run`: the agent's life on a node. Reads the identity (refusing a bad one),
//! follows the peer directory, keeps this node's bridge, CNI configuration and egress
//! masquerade in line with its pod CIDR, runs the mesh, serves the control socket, and on
//! SIGTERM or Ctrl-C removes what it installed.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use ipnet::IpNet;
use socialweb_wire::NodeIdentity;
use tokio::signal::unix::{SignalKind, signal};
use tracing::{error, info, warn};

use crate::ctl::protocol::{PingResult, Request, Response};
use crate::directory::static_file;
use crate::mesh::{self, Mesh, MeshConfig, egress};
use crate::node::{self, PodNetwork};

/// What `run` is told on its command line.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub identity: PathBuf,
    pub peers: Option<PathBuf>,
    /// Kubeconfig for the Kubernetes directory source (used when `peers` is `None`).
    pub kubeconfig: Option<PathBuf>,
    pub ctl_socket: PathBuf,
    pub mesh_listen: SocketAddr,
    pub tun: String,
    pub mtu: u16,
    pub masquerade: bool,
    /// `None`: leave the bridge and the CNI configuration alone.
    pub pod_network: Option<PodNetwork>,
}

/// Reads and validates the identity document.
pub fn read_identity(path: &std::path::Path) -> Result<NodeIdentity> {
    let bytes = std::fs::read(path)
        .with_context(|| format!("reading the identity document {}", path.display()))?;
    NodeIdentity::from_json(&bytes).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

struct Handler {
    mesh: Mesh,
}

impl crate::ctl::server::Handler for Handler {
    async fn handle(&self, req: Request) -> Response {
        let result: Result<serde_json::Value> = async {
            Ok(match req {
                Request::MeshStatus => serde_json::to_value(self.mesh.status())?,
                Request::MeshRoutes => serde_json::to_value(self.mesh.routes().await?)?,
                Request::MeshPing { target } => {
                    let (node, rtt, path) = self.mesh.ping(&target).await?;
                    serde_json::to_value(PingResult {
                        node,
                        rtt_ms: rtt.as_secs_f64() * 1e3,
                        path,
                    })?
                }
                Request::DnsStats => bail!("node-local DNS is not running in this agent"),
            })
        }
        .await;
        match result {
            Ok(v) => Response::Ok(v),
            Err(e) => Response::Error(format!("{e:#}")),
        }
    }
}

pub async fn run(opts: RunOptions) -> Result<()> {
    let id = read_identity(&opts.identity)?;
    info!(node = %id.node, cluster = %id.cluster, "identity read");
    let mesh = Mesh::start(MeshConfig {
        node: id.node.clone(),
        endpoint: mesh::transport::EndpointConfig {
            secret_key: id.mesh_secret_key.0,
            relay_url: id.relay_url.clone(),
            bind: opts.mesh_listen,
        },
        tun_name: opts.tun.clone(),
        mtu: opts.mtu,
    })
    .await?;
    let mut directory = match (&opts.peers, &opts.kubeconfig) {
        (Some(peers), _) => static_file::watch(peers.clone(), Duration::from_millis(500))?,
        (None, Some(kubeconfig)) => {
            let client = crate::directory::kube::client(kubeconfig).await?;
            let endpoint = mesh.endpoint_id().to_string();
            tokio::spawn(annotate_own(
                client.clone(),
                id.node.clone(),
                endpoint.clone(),
                mesh.bound_addrs(),
            ));
            crate::directory::kube::watch(client, id.node.clone(), endpoint)
        }
        (None, None) => bail!(
            "no peer directory: give --kubeconfig FILE (Kubernetes Nodes) or --peers FILE (static)"
        ),
    };
    let _ctl =
        crate::ctl::server::serve(&opts.ctl_socket, Arc::new(Handler { mesh: mesh.clone() }))?;
    info!(socket = %opts.ctl_socket.display(), "control socket ready");

    let mut term = signal(SignalKind::terminate())?;
    let mut own: Option<IpNet> = None;
    loop {
        let entries = directory.borrow_and_update().clone();
        let view = mesh::directory::view(&entries, &id.node, &id.cluster_cidr);
        let cidr = view.own.as_ref().map(|o| o.pod_cidr);
        if cidr != own {
            if let Some(cidr) = cidr {
                match own_network(&cidr, &id, &opts) {
                    Ok(()) => own = Some(cidr),
                    Err(e) => error!("setting up this node's pod network: {e:#}"),
                }
            } else {
                warn!(node = %id.node, "this node is not in the peer directory yet; no pod CIDR");
            }
        }
        mesh.apply(&view).await?;
        tokio::select! {
            changed = directory.changed() => if changed.is_err() { break },
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
        }
    }
    info!("shutting down");
    mesh.shutdown().await;
    if opts.masquerade
        && let Err(e) = egress::remove()
    {
        warn!("removing the masquerade table: {e:#}");
    }
    Ok(())
}

/// Publishes this node's endpoint on its Node, retrying until the Node exists (the kubelet
/// may register it after the agent starts).
async fn annotate_own(client: kube::Client, me: String, endpoint: String, addrs: Vec<SocketAddr>) {
    let mut delay = Duration::from_millis(500);
    loop {
        match crate::directory::kube::annotate_own(&client, &me, &endpoint, &addrs).await {
            Ok(()) => {
                info!(node = %me, "mesh endpoint published on the Node");
                return;
            }
            Err(e) => warn!("{e:#}; retrying in {delay:?}"),
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(10));
    }
}

fn own_network(cidr: &IpNet, id: &NodeIdentity, opts: &RunOptions) -> Result<()> {
    info!(pod_cidr = %cidr, "this node's pod CIDR");
    if let Some(net) = &opts.pod_network {
        node::ensure_bridge(cidr, net.mtu)?;
        let path = node::write_conflist(cidr, net)?;
        info!(path = %path.display(), "CNI configuration written");
    }
    if opts.masquerade {
        egress::install(cidr, &id.cluster_cidr)?;
        info!(table = egress::TABLE, "egress masquerade installed");
    }
    Ok(())
}
