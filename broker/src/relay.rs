//! The relay the mesh falls back to when nodes cannot reach each other: an iroh relay server,
//! as a library function (the broker hosts it) and behind `socialweb-agent relay` (tests and
//! the demo). Plain HTTP: the relay never sees plaintext, since every packet it carries is
//! inside a QUIC connection encrypted end to end between the two nodes; TLS in front of it is
//! the deployment's choice.

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
