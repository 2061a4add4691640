//! The iroh endpoint: the node's mesh identity, our relay only (no public n0 services, no
//! address lookup, no port mapping), QUIC tuned for carrying IP packets as datagrams.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use iroh::endpoint::{
    AckFrequencyConfig, ControllerFactory, PortmapperConfig, QuicTransportConfig, VarInt, presets,
};
use iroh::tls::CaTlsConfig;
use iroh::{Endpoint, EndpointAddr, EndpointId, RelayMode, RelayUrl, SecretKey};
use noq_proto::congestion::{Bbr3Config, CubicConfig};
use socialweb_wire::mesh::ALPN;
use url::Url;

/// What the endpoint is built from.
#[derive(Debug, Clone)]
pub struct EndpointConfig {
    pub secret_key: [u8; 32],
    /// Every relay, never empty: the renting host's first, then the fleet's others
    /// (`NodeIdentity::relays`). The endpoint picks its home among all of them (the nearest
    /// that answers, another when that one is gone), and dials peers on each.
    pub relays: Vec<Url>,
    /// UDP address to bind for direct paths; a specific address (the endpoint offers peers
    /// exactly this one).
    pub bind: SocketAddr,
    /// The IPv6 address bound beside it, on a dual-stack machine.
    pub bind_v6: Option<SocketAddr>,
    /// The pod MTU: the smallest path MTU QUIC may assume is pinned to carry it.
    pub pod_mtu: u16,
    pub tuning: Tuning,
    /// The relay's TLS CA (DER), trusted beside the usual roots (the identity's
    /// `relay_ca_cert`: a broker's self-made CA).
    pub relay_ca: Option<Vec<u8>>,
}

/// Knobs of the QUIC connections between agents (`socialweb-agent run --help`); the defaults
/// are what `bench/mesh` measured best on a 2-core machine (docs/mesh.md has the figures).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Args)]
pub struct Tuning {
    /// Congestion control of mesh connections. Pod UDP is not congestion-controlled itself,
    /// so the mesh never turns it off (RFC 9298 §6). BBR measured 0.17-0.80x of Cubic's
    /// throughput here, with idle ping p99 up to 600 ms.
    #[arg(long = "mesh-congestion", value_enum, default_value_t = Congestion::Cubic)]
    pub congestion: Congestion,
    /// Ask the peer to acknowledge every N+1 ack-eliciting packets instead of every other one
    /// (QUIC's ACK frequency extension; both ends are our agents); 0 leaves QUIC's default.
    /// Fewer ACKs are fewer packets to build, encrypt, send and process: +16-18% on one stream.
    #[arg(long = "mesh-ack-threshold", default_value_t = 9)]
    pub ack_threshold: u32,
    /// Ciphers the mesh's TLS offers: `aes128` (AES-128-GCM only: 10 AES rounds a block
    /// instead of AES-256's 14) or `any` (rustls' defaults, AES-256-GCM first).
    #[arg(long = "mesh-cipher", value_enum, default_value_t = Cipher::Aes128)]
    pub cipher: Cipher,
    /// Datagrams received and not yet written to the TUN, per connection, in KiB. Beyond it
    /// the oldest are dropped, which is what tells the pods' TCP to slow down: a large buffer
    /// is queueing delay under load (4 MiB: loaded ping p50 13.9 ms against 10.4 at 512 KiB,
    /// for the same throughput).
    #[arg(long = "mesh-recv-buffer-kib", default_value_t = 512, value_parser = clap::value_parser!(u32).range(64..=65536))]
    pub recv_buffer_kib: u32,
    /// Datagrams handed to a connection and not yet sent, in KiB. Small on purpose: packets
    /// wait in the mesh's own queue (--mesh-queue), where their waiting time is managed, and
    /// only this much sits in QUIC's buffer, which is a plain FIFO.
    #[arg(long = "mesh-send-buffer-kib", default_value_t = 128, value_parser = clap::value_parser!(u32).range(16..=65536))]
    pub send_buffer_kib: u32,
    /// The queue discipline where packets wait for a peer's connection (out) and for the
    /// TUN (in): `fq-codel` (flows served fairly, a standing queue marked or dropped; RFC
    /// 8290) or `fifo` (one queue, dropped only when over --mesh-queue-kib).
    #[arg(long = "mesh-queue", value_enum, default_value_t = QueueKind::FqCodel)]
    pub queue: QueueKind,
    /// CoDel's target, the standing queue delay it allows: `auto` (5 % of the interval) or a
    /// duration (RFC 8289: 5ms).
    #[arg(long = "mesh-codel-target", default_value = "auto", value_parser = AutoOr::parse)]
    pub codel_target: AutoOr,
    /// CoDel's interval, about the worst round trip of the flows through a peer's queue:
    /// `auto` (eight times the path's round trip, 20ms to 100ms, followed as it changes) or a
    /// duration (RFC 8289: 100ms).
    #[arg(long = "mesh-codel-interval", default_value = "auto", value_parser = AutoOr::parse)]
    pub codel_interval: AutoOr,
    /// Drop instead of marking ECN-capable packets CE when CoDel signals congestion.
    #[arg(long = "mesh-no-ecn")]
    pub no_ecn: bool,
    /// Bytes each queue holds at most, in KiB (beyond it the fattest flow loses its oldest).
    #[arg(long = "mesh-queue-kib", default_value_t = 4096, value_parser = clap::value_parser!(u32).range(64..=1048576))]
    pub queue_kib: u32,
    /// Write each received packet to the TUN on its own, as before the mesh's write buffers
    /// had room for the TUN's GRO to coalesce a flow's packets (for comparing; slower).
    #[arg(long = "mesh-no-tun-gro")]
    pub no_tun_gro: bool,
    /// Threads the mesh's data path runs on (1: one thread, every hand-off a task switch).
    #[arg(long = "mesh-threads", default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=64))]
    pub threads: u8,
    /// SCHED_FIFO priority of the mesh's threads (1-99), ahead of every normally scheduled
    /// thread (the pods, the kubelet) as the kernel's network processing is; 0: the normal
    /// scheduler at --mesh-nice. Refused (no CAP_SYS_NICE, no RT budget in the cgroup): the
    /// normal scheduler, logged, and `mesh status` says so.
    #[arg(long = "mesh-realtime", default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=99))]
    pub realtime: u8,
    /// Nice value of the mesh's threads under the normal scheduler (-20 to 19; below 0 needs
    /// CAP_SYS_NICE, which the agent has as root).
    #[arg(long = "mesh-nice", default_value_t = 0, allow_hyphen_values = true, value_parser = clap::value_parser!(i8).range(-20..=19))]
    pub nice: i8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum QueueKind {
    FqCodel,
    Fifo,
}

impl Tuning {
    /// The queue discipline's settings for a pod MTU.
    pub fn queue(&self, mtu: u16) -> socialweb_mesh_core::fq::Settings {
        use socialweb_mesh_core::{codel, fq};
        let limit_bytes = self.queue_kib as usize * 1024;
        let mtu = usize::from(mtu);
        match self.queue {
            QueueKind::FqCodel => fq::Settings {
                // Until the path's round trip is known: RFC 8289's.
                codel: self.codel_for(None, mtu),
                quantum: mtu,
                flows: fq::Settings::default().flows,
                limit_bytes,
                ecn: !self.no_ecn,
            },
            // One bucket and a target no sojourn reaches: a FIFO that drops at its limit.
            QueueKind::Fifo => fq::Settings {
                codel: codel::Params {
                    target: Duration::MAX,
                    ..codel::Params::default()
                },
                quantum: mtu,
                flows: 1,
                limit_bytes,
                ecn: false,
            },
        }
    }

    /// CoDel's settings for a path of round trip `rtt` (unknown: RFC 8289's): what was given,
    /// the rest from the round trip. `None` for a FIFO, whose settings never change.
    pub fn codel_for(
        &self,
        rtt: Option<Duration>,
        mtu: usize,
    ) -> socialweb_mesh_core::codel::Params {
        use socialweb_mesh_core::codel::Params;
        let auto = rtt.map_or(
            Params {
                mtu,
                ..Params::default()
            },
            |rtt| Params::for_rtt(rtt, mtu),
        );
        Params {
            target: self.codel_target.or(auto.target),
            interval: self.codel_interval.or(auto.interval),
            mtu,
        }
    }

    /// Whether CoDel's settings follow the path (some of them `auto`, and a queue that has
    /// CoDel at all).
    pub fn codel_follows_path(&self) -> bool {
        self.queue == QueueKind::FqCodel
            && (self.codel_target == AutoOr::Auto || self.codel_interval == AutoOr::Auto)
    }

    /// The connection's datagram send buffer, in bytes.
    pub fn send_buffer_bytes(&self) -> usize {
        self.send_buffer_kib as usize * 1024
    }
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            congestion: Congestion::Cubic,
            ack_threshold: 9,
            cipher: Cipher::Aes128,
            recv_buffer_kib: 512,
            send_buffer_kib: 128,
            queue: QueueKind::FqCodel,
            codel_target: AutoOr::Auto,
            codel_interval: AutoOr::Auto,
            no_ecn: false,
            queue_kib: 4096,
            no_tun_gro: false,
            threads: 1,
            realtime: 1,
            nice: 0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Congestion {
    Cubic,
    Bbr,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Cipher {
    Aes128,
    Any,
}

/// Bytes a QUIC short-header packet adds around one DATAGRAM frame in the worst case (header
/// with a 20-byte connection id and a 4-byte packet number, frame type and length, AEAD tag),
/// rounded up.
pub const DATAGRAM_OVERHEAD: u16 = 48;

/// The smallest UDP payload QUIC's black-hole detection may fall back to: enough for a pod
/// packet of `pod_mtu`, but never above the 1400 bytes every connection starts with (a path
/// that carries less is a path the mesh cannot serve at that pod MTU; lower `--mtu` there).
pub fn min_udp_payload(pod_mtu: u16) -> u16 {
    pod_mtu
        .saturating_add(DATAGRAM_OVERHEAD)
        .clamp(1200, INITIAL_MTU)
}

/// The UDP payload size connections start with.
const INITIAL_MTU: u16 = 1400;

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
    let relays = cfg.relays.iter().cloned().map(RelayUrl::from);
    let congestion: Arc<dyn ControllerFactory + Send + Sync> = match cfg.tuning.congestion {
        Congestion::Cubic => Arc::new(CubicConfig::default()),
        Congestion::Bbr => Arc::new(Bbr3Config::default()),
    };
    let mut transport = QuicTransportConfig::builder()
        .keep_alive_interval(Duration::from_secs(1))
        .max_idle_timeout(Some(
            IDLE_TIMEOUT
                .try_into()
                .expect("5 s is a valid idle timeout"),
        ))
        // Start with room for a 1280-byte IP packet in one datagram (QUIC needs ~40 bytes
        // around it); path MTU discovery grows it from there where the path allows.
        .initial_mtu(INITIAL_MTU)
        // Black-hole detection takes a burst of lost packets larger than this for a smaller
        // path and falls back to it; at QUIC's default (1200) one burst of congestion loss
        // would leave a 1280-byte pod packet "too big" until the next probe, minutes later.
        .min_mtu(min_udp_payload(cfg.pod_mtu))
        .congestion_controller_factory(congestion)
        .datagram_receive_buffer_size(Some(cfg.tuning.recv_buffer_kib as usize * 1024))
        // Small on purpose: packets wait in the mesh's own queue, where CoDel sees them.
        .datagram_send_buffer_size(cfg.tuning.send_buffer_bytes());
    if cfg.tuning.ack_threshold > 0 {
        let mut acks = AckFrequencyConfig::default();
        acks.ack_eliciting_threshold(VarInt::from_u32(cfg.tuning.ack_threshold));
        transport = transport.ack_frequency_config(Some(acks));
    }
    let mut builder = Endpoint::builder(presets::Minimal);
    if let Some(ca) = &cfg.relay_ca {
        let root = rustls::pki_types::CertificateDer::from(ca.clone());
        builder = builder.ca_tls_config(CaTlsConfig::embedded().with_extra_roots([root]));
    }
    if cfg.tuning.cipher == Cipher::Aes128 {
        builder = builder.crypto_provider(Arc::new(aes128_only()));
    }
    builder = builder
        .secret_key(SecretKey::from_bytes(&cfg.secret_key))
        // The mesh's ALPN is the only one it accepts; it dials the broker's tunnel with
        // socialweb_wire::tunnel::ALPN (crate::tunnel).
        .alpns(vec![ALPN.to_vec()])
        .relay_mode(RelayMode::custom(relays))
        .clear_address_lookup()
        .portmapper_config(PortmapperConfig::Disabled)
        .transport_config(transport.build())
        // One socket on one address: see routes::default_source_v4 for why not 0.0.0.0.
        .clear_ip_transports()
        .bind_addr(cfg.bind)
        .with_context(|| format!("mesh listen address {}", cfg.bind))?;
    if let Some(v6) = cfg.bind_v6 {
        builder = builder
            .bind_addr(v6)
            .with_context(|| format!("mesh listen address {v6}"))?;
    }
    builder
        .bind()
        .await
        .with_context(|| format!("binding the mesh endpoint to {} (--mesh-listen)", cfg.bind))
}

/// A setting that is `auto` (derived) or a duration (`5ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoOr {
    Auto,
    Fixed(Duration),
}

impl AutoOr {
    fn parse(s: &str) -> Result<AutoOr, String> {
        if s == "auto" {
            return Ok(AutoOr::Auto);
        }
        humantime::parse_duration(s)
            .map(AutoOr::Fixed)
            .map_err(|e| format!("{e} (a duration such as 5ms, or auto)"))
    }

    /// The fixed duration, or `auto`'s.
    pub fn or(self, auto: Duration) -> Duration {
        match self {
            AutoOr::Auto => auto,
            AutoOr::Fixed(d) => d,
        }
    }
}

/// rustls' ring provider offering AES-128-GCM only: mesh connections are between our own
/// agents, and AES-128 costs 10 AES rounds a block where AES-256 costs 14. TLS 1.2's
/// AES-128-GCM suites stay for the relay's HTTPS, should it use TLS 1.2.
fn aes128_only() -> rustls::crypto::CryptoProvider {
    use rustls::crypto::ring::{cipher_suite, default_provider};
    rustls::crypto::CryptoProvider {
        cipher_suites: vec![
            cipher_suite::TLS13_AES_128_GCM_SHA256,
            cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
            cipher_suite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        ],
        ..default_provider()
    }
}

/// Where to dial a peer: on every relay always (the peer is at home on one of them, which
/// one may change when a host is lost, and iroh keeps a path through each), and its direct
/// addresses when it has any.
pub fn dial_addr(id: EndpointId, relays: &[Url], direct: &[SocketAddr]) -> EndpointAddr {
    let mut addr = EndpointAddr::new(id);
    for r in relays {
        addr = addr.with_relay_url(RelayUrl::from(r.clone()));
    }
    for d in direct {
        addr = addr.with_ip_addr(*d);
    }
    addr
}
