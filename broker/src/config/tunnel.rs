//! `[tunnel]`: the tunnel endpoint nodes reach their control plane through (docs/tunnel.md).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The tunnel endpoint nodes reach their control plane through (contract 9): a public UDP
/// listener (QUIC, admitting only the live nodes of each cluster).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Tunnel {
    /// UDP, on `service_addr`: QUIC, nodes' one way to their control plane and back.
    pub port: u16,
}

impl Default for Tunnel {
    fn default() -> Tunnel {
        Tunnel { port: 7443 }
    }
}
