//! `[front]`: the way in for users, one TLS listener for the certificate front and the
//! gateway API (docs/api.md), and the bounds that keep one client from taking it all.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::durations::{HumanDuration, humantime_serde_compat};
use super::{ConfigError, err};

/// The way in for users (docs/api.md): one TLS listener for the certificate front
/// (`/clusters/...`) and the gateway API (`/xrpc/...`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Front {
    /// Where it listens. It is the only way in from outside, so all addresses by default;
    /// every request is authenticated (a client certificate, or a service-auth token). With
    /// `service_addr_v6` set, `0.0.0.0` means all addresses of both families (`[::]`).
    pub listen: SocketAddr,
    /// The URL users reach it at; kubeconfigs carry `<public_url>/clusters/<mount path>`.
    /// Default: `https://<service_addr>:<listen port>`.
    pub public_url: Option<String>,
    /// This broker's DID: the `aud` every service-auth token must name. Default:
    /// `did:web:<host of public_url>`.
    pub service_did: Option<String>,
    /// The serving certificate chain and key (PEM), looked at every 10 s and served anew
    /// from the next handshake when either file changes (a renewal needs no restart). Without
    /// them the broker makes a CA of its own (`<state_dir>/front/ca.crt`) and puts it in
    /// every kubeconfig.
    pub tls_cert: Option<PathBuf>,
    /// The serving certificate's private key (PEM), given with `tls_cert`.
    pub tls_key: Option<PathBuf>,
    /// Names and addresses the self-made serving certificate carries, besides the host of
    /// `public_url`, `service_addr`, 127.0.0.1 and localhost.
    pub names: Vec<String>,
    /// Where `did:plc` documents are read.
    pub plc_directory: String,
    /// PEM CA certificates trusted for fetching `did:web` documents, besides the system's.
    pub did_web_roots: Vec<PathBuf>,
    /// Nameservers (`ip:port`) did:web hosts are looked up at; empty: the system's resolver.
    /// Either way only public addresses are fetched from (docs/security.md).
    pub did_web_nameservers: Vec<SocketAddr>,
    /// Connections open at once, in all (kept under 80% of the open-file limit).
    pub max_connections: usize,
    /// Connections open at once from one address.
    pub max_connections_per_source: usize,
    /// The TLS handshake must be done within this.
    #[serde(with = "humantime_serde_compat")]
    #[schemars(with = "HumanDuration")]
    pub handshake_timeout: Duration,
    /// Each request's headers must be in within this (HTTP/1.1: also the longest wait for
    /// the next request on a kept-alive connection).
    #[serde(with = "humantime_serde_compat")]
    #[schemars(with = "HumanDuration")]
    pub header_read_timeout: Duration,
    /// A connection with no request in flight for this long is closed.
    #[serde(with = "humantime_serde_compat")]
    #[schemars(with = "HumanDuration")]
    pub idle_timeout: Duration,
    /// How long a request body may keep the front waiting, besides what it earns at
    /// `min_body_bytes_per_sec`; past it the request ends (docs/security.md).
    #[serde(with = "humantime_serde_compat")]
    #[schemars(with = "HumanDuration")]
    pub body_read_timeout: Duration,
    /// Each this many bytes of a request body buy one more second of waiting (0: none do;
    /// a body has `body_read_timeout` of waiting in all).
    pub min_body_bytes_per_sec: u64,
    /// The watches, followed logs and upgraded streams (exec, attach, port-forward) one client
    /// certificate may hold open at once; one more is answered 429 (docs/security.md).
    pub max_streams_per_certificate: usize,
}

/// `front.max_streams_per_certificate`'s default: a CI runner's jobs' attach, exec and log
/// streams and a controller's informers, with room.
pub const DEFAULT_MAX_STREAMS_PER_CERTIFICATE: usize = 256;

impl Default for Front {
    fn default() -> Front {
        Front {
            listen: "0.0.0.0:8443".parse().expect("address"),
            public_url: None,
            service_did: None,
            tls_cert: None,
            tls_key: None,
            names: Vec::new(),
            plc_directory: "https://plc.directory".into(),
            did_web_roots: Vec::new(),
            did_web_nameservers: Vec::new(),
            max_connections: 10_000,
            max_connections_per_source: 64,
            handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(90),
            body_read_timeout: Duration::from_secs(10),
            min_body_bytes_per_sec: 1024,
            max_streams_per_certificate: DEFAULT_MAX_STREAMS_PER_CERTIFICATE,
        }
    }
}

impl Front {
    /// The front's URL, DID and certificate.
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        if let Some(u) = &self.public_url
            && url::Url::parse(u)
                .map(|u| u.scheme() != "https" || u.host_str().is_none())
                .unwrap_or(true)
        {
            return Err(err(
                "front.public_url",
                format!("{u:?} is not an https:// URL with a host"),
            ));
        }
        if let Some(d) = &self.service_did
            && !d.starts_with("did:")
        {
            return Err(err("front.service_did", format!("{d:?} is not a DID")));
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(err(
                "front.tls_cert",
                "give front.tls_cert and front.tls_key together, or neither",
            ));
        }
        self.check_limits()
    }

    /// The front's bounds: none may be zero (a zero would refuse everything or time out at once).
    fn check_limits(&self) -> Result<(), ConfigError> {
        for (key, zero) in [
            ("front.max_connections", self.max_connections == 0),
            (
                "front.max_connections_per_source",
                self.max_connections_per_source == 0,
            ),
            ("front.handshake_timeout", self.handshake_timeout.is_zero()),
            (
                "front.header_read_timeout",
                self.header_read_timeout.is_zero(),
            ),
            ("front.idle_timeout", self.idle_timeout.is_zero()),
            ("front.body_read_timeout", self.body_read_timeout.is_zero()),
            (
                "front.max_streams_per_certificate",
                self.max_streams_per_certificate == 0,
            ),
        ] {
            if zero {
                return Err(err(key, "must be more than zero"));
            }
        }
        if self.max_connections_per_source > self.max_connections {
            return Err(err(
                "front.max_connections_per_source",
                format!(
                    "{} is more than front.max_connections ({})",
                    self.max_connections_per_source, self.max_connections
                ),
            ));
        }
        Ok(())
    }
}
