//! `[metrics]`: where the Prometheus endpoint listens.

use std::net::SocketAddr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Metrics {
    /// Prometheus endpoint (`/metrics`); loopback by default.
    pub listen: SocketAddr,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            listen: "127.0.0.1:9464".parse().expect("address"),
        }
    }
}
