//! The iroh endpoint: the node's mesh identity, our relay only (no public n0 services, no
//! address lookup, no port mapping), QUIC tuned for carrying IP packets as datagrams.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use iroh::endpoint::{PortmapperConfig, QuicTransportConfig, presets};
use iroh::{Endpoint, EndpointAddr, EndpointId, RelayMode, RelayUrl, SecretKey};
use socialweb_wire::mesh::ALPN;
use url::Url;

/// What the endpoint is built from.
#[derive(Debug, Clone)]
pub struct EndpointConfig {
    pub secret_key: [u8; 32],
    pub relay_url: Url,
    /// UDP address to bind for direct paths; a specific address (the endpoint offers peers
    /// exactly this one).
    pub bind: SocketAddr,
}

/// How long a silent connection lives: with keep-alives every second, a peer that stops
/// answering is declared gone within this, and its route withdrawn.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// The endpoint id (public key) of a secret key.
pub fn endpoint_id(secret: &[u8; 32]) -> EndpointId {
    SecretKey::from_bytes(secret).public()
}

/// Parses a 64-hex-digit endpoint id.
pub fn parse_endpoint_id(s: &str) -> Result<EndpointId> {
    s.parse()
        .with_context(|| format!("{s:?} is not an endpoint id"))
}

/// Binds the endpoint.
pub async fn bind(cfg: &EndpointConfig) -> Result<Endpoint> {
    let relay = RelayUrl::from(cfg.relay_url.clone());
    let transport = QuicTransportConfig::builder()
        .keep_alive_interval(Duration::from_secs(1))
        .max_idle_timeout(Some(
            IDLE_TIMEOUT
                .try_into()
                .expect("5 s is a valid idle timeout"),
        ))
        // Start with room for a 1280-byte IP packet in one datagram (QUIC needs ~40 bytes
        // around it); path MTU discovery grows it from there where the path allows.
        .initial_mtu(1400)
        .datagram_receive_buffer_size(Some(4 << 20))
        // Small on purpose: a full send buffer pushes back into the TUN, where the pods' TCP
        // sees the queue; 8 MiB here measured 32 ms of queueing delay under iperf3.
        .datagram_send_buffer_size(512 << 10)
        .build();
    Endpoint::builder(presets::Minimal)
        .secret_key(SecretKey::from_bytes(&cfg.secret_key))
        .alpns(vec![ALPN.to_vec()])
        .relay_mode(RelayMode::custom([relay]))
        .clear_address_lookup()
        .portmapper_config(PortmapperConfig::Disabled)
        .transport_config(transport)
        // One socket on one address: see routes::default_source_v4 for why not 0.0.0.0.
        .clear_ip_transports()
        .bind_addr(cfg.bind)
        .with_context(|| format!("mesh listen address {}", cfg.bind))?
        .bind()
        .await
        .context("binding the mesh endpoint")
}

/// Where to dial a peer: the relay always, its direct addresses when it has any.
pub fn dial_addr(id: EndpointId, relay: &Url, direct: &[SocketAddr]) -> EndpointAddr {
    let mut addr = EndpointAddr::new(id).with_relay_url(RelayUrl::from(relay.clone()));
    for d in direct {
        addr = addr.with_ip_addr(*d);
    }
    addr
}
