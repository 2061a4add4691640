//! Requests and responses on the control socket, one JSON document per line.

use serde::{Deserialize, Serialize};

use crate::dns::stats::DnsStats;
use crate::mesh::stats::{MeshStatus, RouteStatus};
use crate::status::AgentStatus;

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

/// The answer: `{"ok": <data>}` or `{"error": "<message>"}`. The agent sends a
/// `Response<Reply>`; a client reads the `Response<T>` of the one type its request is
/// answered with ([`Reply`] says which).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Response<T = Reply> {
    Ok(T),
    Error(String),
}

/// The data of a successful answer, one variant per request: on the wire only the data
/// (no tag), since the client knows the type its request gets.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Reply {
    /// To [`Request::Status`].
    Status(Box<AgentStatus>),
    /// To [`Request::MeshStatus`].
    MeshStatus(Box<MeshStatus>),
    /// To [`Request::MeshRoutes`].
    MeshRoutes(Vec<RouteStatus>),
    /// To [`Request::MeshPing`].
    MeshPing(PingResult),
    /// To [`Request::DnsStats`].
    DnsStats(Box<DnsStats>),
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
