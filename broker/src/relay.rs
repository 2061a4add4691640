//! The relay the mesh falls back to when nodes cannot reach each other: an iroh relay server,
//! as a library function (the broker hosts it) and behind `socialweb-broker relay` (tests and
//! experiments). The relay never sees plaintext, since every packet it carries is inside a
//! QUIC connection encrypted end to end between the two nodes; but the handshake and the
//! endpoint ids are not, so the broker serves it over TLS (a public listener,
//! docs/operations.md), with QUIC address discovery beside it (a node learns the address its
//! NAT gives it, for direct paths). `--open` and plain HTTP are for experiments.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use anyhow::{Context, Result};
use iroh::EndpointId;
use iroh_relay::server::{Access, AccessControl, ClientRequest, RelayConfig, Server, ServerConfig};
use tracing::{info, warn};

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

/// Starts a relay serving plain HTTP on `bind`. Its URL for nodes is `http://<bind>`.
pub async fn serve(bind: SocketAddr, allow: Allow) -> Result<Server> {
    let mut relay = RelayConfig::new(bind);
    relay.access = Arc::new(allow);
    let mut config = ServerConfig::default();
    config.relay = Some(relay);
    let server = Server::spawn(config)
        .await
        .with_context(|| format!("starting the relay on {bind}"))?;
    info!(addr = ?server.http_addr(), "relay serving");
    Ok(server)
}

/// Starts a relay serving HTTPS on `bind` with `tls`, and QUIC address discovery on UDP
/// `quic` (when given). Its URL for nodes is `https://<bind>`. (The plain-HTTP side iroh-relay
/// always keeps, for captive-portal probes only, is put on loopback.)
pub async fn serve_tls(
    bind: SocketAddr,
    tls: rustls::ServerConfig,
    quic: Option<SocketAddr>,
    allow: Allow,
) -> Result<Server> {
    use iroh_relay::server::{CertConfig, QuicConfig, TlsConfig};
    let mut relay = RelayConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)));
    relay.tls = Some(TlsConfig::new(
        bind,
        CertConfig::Manual { server_config: tls },
    ));
    relay.access = Arc::new(allow);
    let mut config = ServerConfig::default();
    config.relay = Some(relay);
    config.quic = quic.map(QuicConfig::new);
    let server = Server::spawn(config)
        .await
        .with_context(|| format!("starting the relay on {bind}"))?;
    info!(https = ?server.https_addr(), quic = ?server.quic_addr(), "relay serving");
    Ok(server)
}
