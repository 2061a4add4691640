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
    /// Where node-local DNS listens; `None`: no DNS.
    pub dns_listen: Option<SocketAddr>,
    /// UDP serving threads for DNS.
    pub dns_threads: usize,
}

/// Reads and validates the identity document.
pub fn read_identity(path: &std::path::Path) -> Result<NodeIdentity> {
    let bytes = std::fs::read(path)
        .with_context(|| format!("reading the identity document {}", path.display()))?;
    NodeIdentity::from_json(&bytes).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

struct Handler {
    mesh: Mesh,
    dns: Option<Arc<crate::dns::Dns>>,
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
                Request::DnsStats => match &self.dns {
                    Some(dns) => serde_json::to_value(dns.stats())?,
                    None => {
                        bail!("node-local DNS is not running in this agent (started with --no-dns)")
                    }
                },
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
    let client = match &opts.kubeconfig {
        Some(k) => Some(crate::directory::kube::client(k).await?),
        None => None,
    };
    let mut directory = match (&opts.peers, &client) {
        (Some(peers), _) => static_file::watch(peers.clone(), Duration::from_millis(500))?,
        (None, Some(client)) => {
            let endpoint = mesh.endpoint_id().to_string();
            tokio::spawn(annotate_own(
                client.clone(),
                id.node.clone(),
                endpoint.clone(),
                mesh.bound_addrs(),
            ));
            crate::directory::kube::watch(client.clone(), id.node.clone(), endpoint)
        }
        (None, None) => bail!(
            "no peer directory: give --kubeconfig FILE (Kubernetes Nodes) or --peers FILE (static)"
        ),
    };
    let dns = match opts.dns_listen {
        Some(addr) => Some(start_dns(&id, addr, opts.dns_threads, client.clone()).await?),
        None => None,
    };
    let _ctl = crate::ctl::server::serve(
        &opts.ctl_socket,
        Arc::new(Handler {
            mesh: mesh.clone(),
            dns: dns.as_ref().map(|(d, _)| d.clone()),
        }),
    )?;
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
    if let (Some(addr), Some((_, placement))) = (opts.dns_listen, &dns)
        && let (std::net::IpAddr::V4(ip), Ok(h)) = (addr.ip(), mesh::routes::handle().await)
        && let Err(e) = crate::dns::bind::remove(&h, ip, placement).await
    {
        warn!("removing the DNS address: {e:#}");
    }
    if opts.masquerade
        && let Err(e) = egress::remove()
    {
        warn!("removing the masquerade table: {e:#}");
    }
    Ok(())
}

/// Upstream resolvers: the identity's, else the node's resolv.conf (minus our own address).
fn upstreams(id: &NodeIdentity, listen: SocketAddr) -> Vec<SocketAddr> {
    if !id.upstream_resolvers.is_empty() {
        return id.upstream_resolvers.clone();
    }
    std::fs::read_to_string("/etc/resolv.conf")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|a| socialweb_wire::identity::parse_resolver(a.trim()))
        .filter(|a| a.ip() != listen.ip())
        .collect()
}

/// Starts node-local DNS: its address (a dummy interface, or lo), the server, and with a
/// client the cluster zone's watch and this node's label.
async fn start_dns(
    id: &NodeIdentity,
    addr: SocketAddr,
    threads: usize,
    client: Option<kube::Client>,
) -> Result<(Arc<crate::dns::Dns>, crate::dns::bind::Placement)> {
    let placement = match addr.ip() {
        std::net::IpAddr::V4(ip) if !ip.is_unspecified() && !ip.is_loopback() => {
            crate::dns::bind::ensure(&mesh::routes::handle().await?, ip).await?
        }
        _ => crate::dns::bind::Placement::Loopback,
    };
    let ups = upstreams(id, addr);
    if ups.is_empty() {
        warn!(
            "no upstream resolvers (identity and /etc/resolv.conf have none): only cluster names will resolve"
        );
    }
    let dns = Arc::new(crate::dns::Dns::new(
        &id.cluster_domain,
        vec![id.cluster_cidr, id.service_cidr],
        ups.clone(),
    ));
    crate::dns::server::serve(dns.clone(), addr, threads).await?;
    info!(%addr, zone = %id.cluster_domain, upstreams = ?ups, "node-local DNS up");
    if let Some(client) = client {
        crate::dns::kube::watch(
            client.clone(),
            id.node.clone(),
            id.cluster_domain.clone(),
            dns.clone(),
        );
        tokio::spawn(label_own(client, id.node.clone()));
    }
    Ok((dns, placement))
}

/// Labels this node `socialweb.computer/node-local-dns=true` (contract 5), retrying until the
/// Node exists.
async fn label_own(client: kube::Client, me: String) {
    use kube::api::{Api, Patch, PatchParams};
    let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(client);
    let patch = serde_json::json!({"metadata": {"labels": {socialweb_wire::mesh::NODE_LOCAL_DNS_LABEL: "true"}}});
    let mut delay = Duration::from_millis(500);
    loop {
        match api
            .patch(&me, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return,
            Err(e) => warn!("labelling Node {me}: {e}; retrying in {delay:?}"),
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(10));
    }
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
