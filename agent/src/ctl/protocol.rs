//! Requests and responses on the control socket, one JSON document per line.

use serde::{Deserialize, Serialize};

/// What a client asks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    /// The bring-up steps, the children, readiness.
    Status,
    /// The mesh as a whole, with every peer.
    MeshStatus,
    /// Routes the mesh means and whether the kernel has them.
    MeshRoutes,
    /// A round trip to a peer's agent, by node name or by an address in its pod CIDR.
    MeshPing { target: String },
    /// Node-local DNS counters.
    DnsStats,
}

/// The answer: `{"ok": <data>}` or `{"error": "<message>"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Response {
    Ok(serde_json::Value),
    Error(String),
}

/// The answer to [`Request::MeshPing`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PingResult {
    pub node: String,
    pub rtt_ms: f64,
    pub path: String,
}

/// Requests larger than this are refused unread.
pub const MAX_REQUEST: usize = 64 * 1024;
