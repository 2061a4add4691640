//! `[relay]`: the mesh relay, a public listener on `service_addr`, and the bounds of its gate.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::durations::{HumanDuration, humantime_serde_compat};
use super::{ConfigError, err};

/// The mesh relay: a public listener (docs/operations.md), HTTPS with the front's certificate,
/// admitting the live nodes of every cluster and the broker's own tunnel endpoint.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Relay {
    /// TCP: the relay itself (HTTPS, a WebSocket per client).
    pub port: u16,
    /// UDP: QUIC address discovery (a node learns its public address, for direct paths
    /// through NAT); 0: none.
    pub quic_port: u16,
    /// TCP connections to the relay open at once, in all: beyond it a new one is closed at
    /// once. Each takes three file descriptors (the relay's gate carries it to the relay on
    /// loopback); kept under 10% of the open-file limit.
    pub max_connections: usize,
    /// TCP connections to the relay open at once from one address (an IPv6 /64): beyond it
    /// a new one is closed at once. A node keeps one.
    pub max_connections_per_source: usize,
    /// A connection's first bytes (its TLS handshake) must arrive within this.
    #[serde(with = "humantime_serde_compat")]
    #[schemars(with = "HumanDuration")]
    pub handshake_timeout: Duration,
    /// A connection whose client has sent nothing for this long is closed. The relay pings
    /// its clients every 15-20 s and each answers, so only stalled handshakes and dead
    /// peers reach it; under 30 s it would cut clients that work.
    #[serde(with = "humantime_serde_compat")]
    #[schemars(with = "HumanDuration")]
    pub idle_timeout: Duration,
}

impl Default for Relay {
    fn default() -> Relay {
        Relay {
            port: 3340,
            quic_port: 7842,
            max_connections: 4096,
            max_connections_per_source: 64,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
        }
    }
}

impl Relay {
    /// The relay's gate: no bound may be zero, and one address may not have more than all.
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        for (key, zero) in [
            ("relay.max_connections", self.max_connections == 0),
            (
                "relay.max_connections_per_source",
                self.max_connections_per_source == 0,
            ),
            ("relay.handshake_timeout", self.handshake_timeout.is_zero()),
            ("relay.idle_timeout", self.idle_timeout.is_zero()),
        ] {
            if zero {
                return Err(err(key, "must be more than zero"));
            }
        }
        if self.max_connections_per_source > self.max_connections {
            return Err(err(
                "relay.max_connections_per_source",
                format!(
                    "{} is more than relay.max_connections ({})",
                    self.max_connections_per_source, self.max_connections
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::Config;

    #[test]
    fn the_relays_bounds_are_more_than_zero_and_one_address_has_no_more_than_all() {
        let dir = std::env::temp_dir().join(format!("sw-cfgrelay-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("broker.toml");
        let load = |text: &str| {
            std::fs::write(&f, text).unwrap();
            Config::load(Some(&f), |_| None)
        };
        let c = load("[relay]\nmax_connections = 200\nidle_timeout = \"3s\"\n").unwrap();
        assert_eq!(c.relay.max_connections, 200);
        assert_eq!(c.relay.idle_timeout, Duration::from_secs(3));
        for (text, key) in [
            ("max_connections = 0", "relay.max_connections"),
            (
                "max_connections_per_source = 0",
                "relay.max_connections_per_source",
            ),
            ("handshake_timeout = \"0s\"", "relay.handshake_timeout"),
            ("idle_timeout = \"0s\"", "relay.idle_timeout"),
            (
                "max_connections = 8\nmax_connections_per_source = 9",
                "relay.max_connections_per_source",
            ),
        ] {
            let e = load(&format!("[relay]\n{text}\n")).unwrap_err();
            assert_eq!(e.source_name, key, "{text}: {e}");
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}
