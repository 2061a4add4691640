//! `[access]`: who may have clusters, and how much of the broker a user may take
//! (docs/security.md).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ConfigError, err};

/// Who may have a cluster, and how much of the broker a user may take (docs/security.md).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Access {
    /// Who may create clusters through the gateway API besides `allowed_dids`: `closed`
    /// (no one else; the default), `invite` (a DID that redeemed an invite of
    /// `socialweb-broker invite create`), or `open` (any DID).
    pub registration: Registration,
    /// DIDs that may always create clusters.
    pub allowed_dids: Vec<String>,
    /// Namespace nodes share their provider host's kernel and root (docs/security.md): the
    /// gateway API serves users only when the operator says they are trusted.
    pub tenants_trusted: bool,
    /// How many clusters one DID may have.
    pub max_clusters_per_did: u32,
    /// How many clusters all users together may have.
    pub max_clusters: u32,
    /// Gateway API requests one address may make a minute (before authentication).
    pub requests_per_minute_per_source: u32,
    /// Gateway API requests one DID may make a minute.
    pub requests_per_minute_per_did: u32,
    /// createCluster calls one DID may make an hour.
    pub creates_per_hour_per_did: u32,
}

/// How DIDs are admitted to have clusters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Registration {
    Closed,
    Invite,
    Open,
}

impl Registration {
    pub fn as_str(self) -> &'static str {
        match self {
            Registration::Closed => "closed",
            Registration::Invite => "invite",
            Registration::Open => "open",
        }
    }
}

impl Default for Access {
    fn default() -> Access {
        Access {
            registration: Registration::Closed,
            allowed_dids: Vec::new(),
            tenants_trusted: false,
            max_clusters_per_did: 5,
            max_clusters: 50,
            requests_per_minute_per_source: 300,
            requests_per_minute_per_did: 120,
            creates_per_hour_per_did: 20,
        }
    }
}

impl Access {
    /// Who may have clusters, and the limits: none zero, every allowed DID a DID.
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        for (key, n) in [
            ("access.max_clusters_per_did", self.max_clusters_per_did),
            ("access.max_clusters", self.max_clusters),
            (
                "access.requests_per_minute_per_source",
                self.requests_per_minute_per_source,
            ),
            (
                "access.requests_per_minute_per_did",
                self.requests_per_minute_per_did,
            ),
            (
                "access.creates_per_hour_per_did",
                self.creates_per_hour_per_did,
            ),
        ] {
            if n == 0 {
                return Err(err(key, "must be at least 1"));
            }
        }
        if let Some(d) = self.allowed_dids.iter().find(|d| {
            !(d.starts_with("did:key:") || d.starts_with("did:web:") || d.starts_with("did:plc:"))
        }) {
            return Err(err(
                "access.allowed_dids",
                format!("{d:?} is not a did:key, did:web or did:plc"),
            ));
        }
        Ok(())
    }
}
