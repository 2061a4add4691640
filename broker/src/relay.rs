//! The relay the mesh falls back to when nodes cannot reach each other: an iroh relay server,
//! as a library function (the broker hosts it) and behind `socialweb-broker relay` (tests and
//! experiments). The relay never sees plaintext, since every packet it carries is inside a
//! QUIC connection encrypted end to end between the two nodes; but the handshake and the
//! endpoint ids are not, so the broker serves it over TLS (a public listener,
//! docs/operations.md), with QUIC address discovery beside it (a node learns the address its
//! NAT gives it, for direct paths). `--open` and plain HTTP are for experiments. Either way
//! its TCP listener is the [`gate`]'s, which bounds every connection; the iroh server listens
//! on loopback behind it.

pub mod gate;

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, RwLock};

use anyhow::{Context, Result};
use iroh::EndpointId;
use iroh_relay::server::{Access, AccessControl, ClientRequest, RelayConfig, Server, ServerConfig};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use gate::Gate;

/// Who may use the relay: everyone, or only the listed endpoints (a cluster's nodes). The list
/// can change while the relay runs (nodes come and go).
#[derive(Debug, Clone, Default)]
pub struct Allow {
    only: Option<Arc<RwLock<HashSet<EndpointId>>>>,
}

impl Allow {
    pub fn everyone() -> Allow {
        Allow { only: None }
    }

    pub fn only(ids: impl IntoIterator<Item = EndpointId>) -> Allow {
        Allow {
            only: Some(Arc::new(RwLock::new(ids.into_iter().collect()))),
        }
    }

    /// Replaces the list (no-op when everyone is allowed).
    pub fn set(&self, ids: impl IntoIterator<Item = EndpointId>) {
        // (A client already connected stays until it reconnects: the list is iroh-relay's
        // admission check; the broker's tunnel drops released nodes itself.)
        if let Some(list) = &self.only {
            *list.write().expect("lock") = ids.into_iter().collect();
        }
    }

    fn admits(&self, id: &EndpointId) -> bool {
        self.only
            .as_ref()
            .is_none_or(|l| l.read().expect("lock").contains(id))
    }
}

impl AccessControl for Allow {
    async fn on_connect(&self, request: &ClientRequest) -> Access {
        let id = request.endpoint_id();
        if self.admits(&id) {
            info!(endpoint = %id.fmt_short(), "relay client admitted");
            Access::Allow
        } else {
            warn!(endpoint = %id, "relay client refused: not in the allow list");
            Access::Deny {
                reason: Some("not a node of this cluster".into()),
            }
        }
    }
}

/// A relay serving behind its [`gate`].
#[derive(Debug)]
pub struct Running {
    server: Server,
    addr: SocketAddr,
    stop: CancellationToken,
    gate: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Where clients reach it: the gate's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops the gate (its connections end) and the relay server.
    pub async fn shutdown(self) -> Result<()> {
        self.stop.cancel();
        let _ = self.gate.await;
        self.server.shutdown().await.context("stopping the relay")
    }
}

/// Where the iroh server listens: on loopback, behind the gate.
const BEHIND_THE_GATE: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);

/// Starts a relay serving plain HTTP on `bind`, through `gate`. Its URL for nodes is
/// `http://<bind>`.
pub async fn serve(bind: SocketAddr, allow: Allow, gate: Gate) -> Result<Running> {
    let mut relay = RelayConfig::new(BEHIND_THE_GATE);
    relay.access = Arc::new(allow);
    let mut config = ServerConfig::default();
    config.relay = Some(relay);
    let server = Server::spawn(config)
        .await
        .with_context(|| format!("starting the relay for {bind}"))?;
    let upstream = server
        .http_addr()
        .context("the relay server has no HTTP address")?;
    let running = behind(gate, bind, upstream, server).await?;
    info!(addr = %running.addr, "relay serving (HTTP)");
    Ok(running)
}

/// Starts a relay serving HTTPS on `bind` with `tls`, through `gate`, and QUIC address
/// discovery on UDP `quic` (when given; not gated: it answers each packet with its source
/// address and keeps no state). Its URL for nodes is `https://<bind>`. (The plain-HTTP side
/// iroh-relay always keeps, for captive-portal probes only, stays on loopback.)
pub async fn serve_tls(
    bind: SocketAddr,
    tls: rustls::ServerConfig,
    quic: Option<SocketAddr>,
    allow: Allow,
    gate: Gate,
) -> Result<Running> {
    use iroh_relay::server::{CertConfig, QuicConfig, TlsConfig};
    let mut relay = RelayConfig::new(BEHIND_THE_GATE);
    relay.tls = Some(TlsConfig::new(
        BEHIND_THE_GATE,
        CertConfig::Manual { server_config: tls },
    ));
    relay.access = Arc::new(allow);
    let mut config = ServerConfig::default();
    config.relay = Some(relay);
    config.quic = quic.map(QuicConfig::new);
    let server = Server::spawn(config)
        .await
        .with_context(|| format!("starting the relay for {bind}"))?;
    let upstream = server
        .https_addr()
        .context("the relay server has no HTTPS address")?;
    let quic = server.quic_addr();
    let running = behind(gate, bind, upstream, server).await?;
    info!(https = %running.addr, ?quic, "relay serving");
    Ok(running)
}

/// `server`, listening on `upstream`, behind `gate` on `bind`.
async fn behind(
    gate: Gate,
    bind: SocketAddr,
    upstream: SocketAddr,
    server: Server,
) -> Result<Running> {
    let stop = CancellationToken::new();
    let (addr, task) = gate.open(bind, upstream, stop.clone()).await?;
    Ok(Running {
        server,
        addr,
        stop,
        gate: task,
    })
}
