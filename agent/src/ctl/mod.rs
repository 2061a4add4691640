//! The agent's control socket: a Unix socket only root (or the agent's own user) may use,
//! carrying one JSON request and one JSON response per connection. `socialweb-agent mesh ...`
//! and `socialweb-agent dns stats` are its clients.

pub mod client;
pub mod handler;
pub mod protocol;
pub mod server;

/// Where the agent listens unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/socialweb/agent.sock";
