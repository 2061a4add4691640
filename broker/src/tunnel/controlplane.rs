//! The apiserver's `controlplane` egress (its EgressSelectorConfiguration: HTTPConnect over
//! this Unix socket, one per cluster): what the apiserver dials for the control plane itself
//! -- its authorization webhook (the broker's guard), and the admission and conversion
//! webhooks a tenant names by URL. A tenant's URL used to be dialled directly from the
//! broker's host: its apiserver opened TLS to other clusters' apiservers and told open from
//! closed ports of the host. Now each CONNECT goes where the core's
//! `egress::control_plane_route` says: the cluster's own guard; an address of the cluster
//! (over the tunnel, as the `cluster` egress carries it); or a public network of the
//! operator's `clusters.webhook_egress_allow`, dialled from here. A name is resolved here and
//! only the addresses that pass are dialled (a name that resolves to loopback reaches
//! nothing). Anything else is answered `502 <reason>`, which the apiserver quotes in the
//! webhook's error.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Result;
use ipnet::IpNet;
use socialweb_broker_core::egress::{
    ControlPlaneRoute, Facts, Target, control_plane_route, parse_connect_target, refusal_head,
};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, UnixStream};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::egress::{Egress, read_head};

/// How long the apiserver has to send its CONNECT, a name to resolve, a dial to answer.
const WITHIN: Duration = Duration::from_secs(10);

/// One cluster's `controlplane` egress.
#[derive(Debug, Clone)]
pub struct ControlPlaneEgress {
    pub cluster: String,
    /// The cluster's guard: the one address of the broker's host its apiserver reaches.
    pub guard: SocketAddr,
    /// The cluster's networks: nodes', Pods', Services'.
    pub networks: Vec<IpNet>,
    /// `clusters.webhook_egress_allow`.
    pub allow: Vec<IpNet>,
    /// The cluster's `cluster` egress, once the awake period has its Nodes watched: the
    /// apiserver asks the guard from its first request, before that. Until then an address
    /// of the cluster is refused (its nodes are not known yet).
    pub to_cluster: Arc<OnceLock<Egress>>,
}

/// Serves `e` on `socket` (mode 0600) until `stop`.
pub fn serve(e: ControlPlaneEgress, socket: &Path, stop: CancellationToken) -> Result<()> {
    let cluster = e.cluster.clone();
    super::serve_socket(
        socket,
        "apiserver control-plane egress",
        &cluster,
        stop,
        move |uds| {
            let e = e.clone();
            async move { e.one(uds).await }
        },
    )
}

/// The addresses of this host's interfaces (what a webhook's URL may not name).
fn this_host(ip: IpAddr) -> bool {
    ip.is_loopback()
        || ip.is_unspecified()
        || nix::ifaddrs::getifaddrs().is_ok_and(|mut all| {
            all.any(|i| {
                i.address.as_ref().is_some_and(|a| {
                    a.as_sockaddr_in().map(|s| IpAddr::V4(s.ip())) == Some(ip)
                        || a.as_sockaddr_in6().map(|s| IpAddr::V6(s.ip())) == Some(ip)
                })
            })
        })
}

impl ControlPlaneEgress {
    async fn one(&self, mut uds: UnixStream) {
        let head = match tokio::time::timeout(WITHIN, read_head(&mut uds)).await {
            Ok(Ok(h)) => h,
            Ok(Err(e)) => return self.refuse(&mut uds, &e).await,
            Err(_) => return self.refuse(&mut uds, "no CONNECT within 10 s").await,
        };
        let addrs = match parse_connect_target(&head) {
            Ok(Target::Addr(a)) => vec![a],
            Ok(Target::Name(host, port)) => {
                match tokio::time::timeout(WITHIN, tokio::net::lookup_host((host.as_str(), port)))
                    .await
                {
                    Ok(Ok(a)) => a.collect(),
                    Ok(Err(e)) => {
                        return self.refuse(&mut uds, &format!("{host}: {e}")).await;
                    }
                    Err(_) => {
                        return self
                            .refuse(&mut uds, &format!("{host}: not resolved within 10 s"))
                            .await;
                    }
                }
            }
            Err(e) => return self.refuse(&mut uds, &e).await,
        };
        // The first address that may be reached; else the first one's reason.
        let mut why = format!("{addrs:?}: no address");
        for (i, to) in addrs.iter().copied().enumerate() {
            let facts = Facts {
                public: crate::auth::public_dns::is_public(to.ip()),
                this_host: this_host(to.ip()),
            };
            match control_plane_route(to, self.guard, &self.networks, facts, &self.allow) {
                Ok(route) => return self.carry(uds, to, route).await,
                Err(e) if i == 0 => why = e,
                Err(_) => {}
            }
        }
        self.refuse(&mut uds, &why).await
    }

    /// Connects `uds` to `to` the way `route` says, answering 200 once connected.
    async fn carry(&self, mut uds: UnixStream, to: SocketAddr, route: ControlPlaneRoute) {
        if route == ControlPlaneRoute::Cluster {
            let Some(cluster) = self.to_cluster.get() else {
                return self
                    .refuse(
                        &mut uds,
                        &format!("{to}: the cluster's nodes are not known yet"),
                    )
                    .await;
            };
            let (send, recv) = match cluster.open(to).await {
                Ok(s) => s,
                Err(e) => return self.refuse(&mut uds, &e).await,
            };
            if connected(&mut uds).await {
                super::splice(uds, send, recv).await;
            }
            return;
        }
        let mut tcp = match tokio::time::timeout(WITHIN, TcpStream::connect(to)).await {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => return self.refuse(&mut uds, &format!("{to}: {e}")).await,
            Err(_) => {
                return self
                    .refuse(&mut uds, &format!("{to}: no answer within 10 s"))
                    .await;
            }
        };
        if !connected(&mut uds).await {
            return;
        }
        debug!(cluster = %self.cluster, %to, ?route, "control-plane egress connected");
        if let Err(e) = tokio::io::copy_bidirectional(&mut uds, &mut tcp).await {
            debug!(cluster = %self.cluster, %to, "control-plane egress: {e}");
        }
    }

    async fn refuse(&self, uds: &mut UnixStream, why: &str) {
        warn!(cluster = %self.cluster, "apiserver control-plane egress refused: {why}");
        let _ = uds.write_all(refusal_head(why).as_bytes()).await;
        let _ = uds.shutdown().await;
    }
}

/// Tells the apiserver its CONNECT is through; `false` when it has gone.
async fn connected(uds: &mut UnixStream) -> bool {
    uds.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await
        .is_ok()
}
