//! The broker's configuration: a TOML file, then environment variables over it, then
//! validation. Every error names the file key or the variable and the value that was wrong.
//! The scale variables keep the names operators know from the seeds
//! (`SOCIALWEB_CLUSTERPROVIDER_SCALE_*`).
//!
//! Each subsystem gets its own section (or a value built from the few it needs, in
//! `daemon`), never the whole [`Config`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
pub use socialweb_broker_core::scale::NodeSize;

pub mod check;
pub mod reference;

mod durations;

use durations::{HumanDuration, humantime_serde_compat};

/// A configuration problem, naming where it came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{source_name}: {problem}")]
pub struct ConfigError {
    /// `SOCIALWEB_CLUSTERPROVIDER_SCALE_HOLD`, or `scale.hold` in the file.
    pub source_name: String,
    pub problem: String,
}

fn err(source: &str, problem: impl Into<String>) -> ConfigError {
    ConfigError {
        source_name: source.to_string(),
        problem: problem.into(),
    }
}

/// Whether a node elsewhere can reach `a`: not unspecified, loopback, link-local (it needs
/// a zone) or multicast.
fn reachable_v6(a: Ipv6Addr) -> bool {
    !(a.is_unspecified() || a.is_loopback() || a.is_unicast_link_local() || a.is_multicast())
}

/// Everything the daemon is told.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where the store (SQLite by default), the clusters' PKI and data, and the provider's
    /// records live.
    pub state_dir: PathBuf,
    /// The address the broker's tunnel endpoint and relay listen on, and, unless
    /// `advertise_addr` says otherwise, where nodes reach them (and users the front, unless
    /// `front.public_url` says otherwise). Put on `lo` when no interface has it. Tenant
    /// control planes listen on loopback only.
    pub service_addr: Ipv4Addr,
    /// The address nodes and users are told to reach the broker at, when it is not
    /// `service_addr`: a public address on no interface of this host, forwarded to
    /// `service_addr` (a cloud's 1:1 NAT: an elastic or floating IP). Identities name it for
    /// the tunnel endpoint and the relay, the front's default URL and serving certificate
    /// carry it. Default: `service_addr`.
    pub advertise_addr: Option<Ipv4Addr>,
    /// The host's IPv6 address, where it has one: the tunnel endpoint listens on it beside
    /// `service_addr`, identities name it too (a node tries both families and keeps the path
    /// that answers), and the front's self-made certificate carries it. Put on `lo` when no
    /// interface has it. Default: none (IPv4 only). The relay stays on `service_addr`: it is
    /// one server at one URL.
    pub service_addr_v6: Option<Ipv6Addr>,
    /// The IPv6 address nodes are told, when it is not `service_addr_v6` (a prefix
    /// translated on the way in). Default: `service_addr_v6`.
    pub advertise_addr_v6: Option<Ipv6Addr>,
    /// The Kubernetes we ship: a directory with `kube` and `pause`.
    pub kube_dir: PathBuf,
    /// The owner-only control socket the `cluster` commands use.
    pub ctl_socket: PathBuf,
    /// The broker's own records: clusters, provisions, decisions, certificates, accounts.
    pub store: Store,
    /// The scale decision's knobs (docs/scale.md).
    pub scale: Scale,
    /// The node size rented when no provider says its shapes.
    #[schemars(with = "NodeSection")]
    pub node: NodeSize,
    /// Whom the broker rents nodes from (docs/market.md).
    pub market: Market,
    /// The embedded provider (when `[market]` names none) and, on a provider machine,
    /// `socialweb-broker provider`: how it makes nodes.
    pub local_provider: LocalProvider,
    /// The mesh relay: a public listener on `service_addr`.
    pub relay: Relay,
    /// The tunnel endpoint nodes reach their control plane through.
    pub tunnel: Tunnel,
    /// The Prometheus endpoint.
    pub metrics: Metrics,
    /// What every tenant cluster gets: its control plane's datastore and budget, ports, DNS.
    pub clusters: ClusterDefaults,
    /// The way in for users: the certificate front and the gateway API (docs/api.md).
    pub front: Front,
    /// Who may have clusters, and how much of the broker a user may take (docs/security.md).
    pub access: Access,
    /// Several broker hosts sharing one PostgreSQL store (docs/operations.md, "A fleet").
    // Left out of a written configuration while off: a previous release's broker reads
    // the files this one writes (the upgrade test), and knows no `[fleet]`.
    #[serde(skip_serializing_if = "Fleet::is_off")]
    pub fleet: Fleet,
}

/// `[fleet]`: this host is one of several sharing the store. Each awake cluster is run by
/// the one host holding its lease (a row of the store it renews); a host that sees the
/// lease of a cluster that is not hibernating expire takes the cluster over and starts its
/// control plane from PostgreSQL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Fleet {
    /// Run as one host of a fleet. Needs a PostgreSQL `store.url`, `store.key_file` (the same
    /// key on every host) and `clusters.datastore = "postgres"`: nothing a cluster needs
    /// may be on one host's disk.
    pub enabled: bool,
    /// How long a cluster's lease lasts unless renewed (at least 3 s). Its owner renews it
    /// every fifth of this and stops the control plane when three tenths of it are left
    /// unrenewed; another host takes the cluster over a fifth of it after the expiry. A
    /// lost host's clusters are started elsewhere about 1.2 times this after its last
    /// renewal, plus a control plane's start.
    #[serde(with = "humantime_serde_compat")]
    #[schemars(with = "HumanDuration")]
    pub lease_ttl: Duration,
    /// The most clusters this host runs awake at once. A host at it claims no other: a
    /// cluster created or woken here is then taken by another host of the fleet, and a lost
    /// host's clusters go to hosts below theirs. Hosts with fewer claims first (each claim of
    /// a cluster no request asked of this host waits a tenth of a second per cluster it runs).
    /// Unset: no limit.
    pub max_awake: Option<u32>,
    /// The port of this host's link, on `service_addr` (told to the other hosts at
    /// `advertise_addr`): where they carry the requests their fronts admit for the clusters
    /// this host runs. Mutual TLS under the fleet's own CA, kept in the store like the
    /// clusters' CAs; it admits the fleet's hosts and no one else.
    pub link_port: u16,
}

impl Fleet {
    /// Not a fleet, and nothing else set: what need not be written.
    pub fn is_off(&self) -> bool {
        *self == Fleet::default()
    }
}

impl Default for Fleet {
    fn default() -> Fleet {
        Fleet {
            enabled: false,
            lease_ttl: Duration::from_secs(10),
            max_awake: None,
            link_port: 6445,
        }
    }
}

/// `[node]`, as [`NodeSize`] (a pure crate's type) reads it: its schema, with what each key
/// means. The reference's test holds it to the keys `NodeSize` writes.
#[derive(Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
struct NodeSection {
    /// Virtual CPUs.
    vcpu: u32,
    /// Memory in MiB (at least 256).
    #[serde(rename = "memMiB")]
    mem_mib: u64,
    /// Disk in MiB (at least 1024).
    #[serde(rename = "diskMiB")]
    disk_mib: u64,
}

impl Default for NodeSection {
    fn default() -> NodeSection {
        let n = NodeSize::default();
        NodeSection {
            vcpu: n.vcpu,
            mem_mib: n.mem_mib,
            disk_mib: n.disk_mib,
        }
    }
}

/// What `socialweb-broker provider` reads on a provider machine: a part of the broker's
/// configuration, in the same format; the rest of a file is not read there
/// (`check-config --provider` names it).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ProviderFile {
    /// Where the provider machine keeps its key (`provider-tls/`, what `provider-pin`
    /// prints), its records and its machines' directories (`local-provider/`).
    pub state_dir: PathBuf,
    /// The Kubernetes we ship: a directory with `kube` and `pause`, which nodes run when
    /// `local_provider.image` is not set.
    pub kube_dir: PathBuf,
    /// The node size offered, at price 0, when `local_provider.shapes` is empty.
    #[schemars(with = "NodeSection")]
    pub node: NodeSize,
    /// The provider itself: where it listens, whom it serves, how it makes nodes.
    pub local_provider: LocalProvider,
    /// Where it serves `/metrics`, `/healthz` and `/readyz` (another port than the broker's
    /// when both run on one host).
    pub metrics: Metrics,
}

impl Default for ProviderFile {
    fn default() -> ProviderFile {
        let c = Config::default();
        ProviderFile {
            state_dir: c.state_dir,
            kube_dir: c.kube_dir,
            node: c.node,
            local_provider: c.local_provider,
            metrics: c.metrics,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Store {
    /// `sqlite://<path>` (default: `<state_dir>/broker.db`) or `postgres://...`.
    pub url: Option<String>,
    /// A file holding the key (64 hexadecimal characters, owner-only; `socialweb-broker
    /// store-key FILE` makes one) that seals each cluster's CA keys into the store: the
    /// store becomes their home and this host's disk keeps copies, so a host with an empty
    /// disk, the store and this key serves the same clusters, and the store alone cannot
    /// sign for them. Back it up apart from the store. Unset: CA keys live on this disk only.
    pub key_file: Option<PathBuf>,
}

/// The scale decision's knobs (docs/scale.md).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Scale {
    /// The most nodes a cluster has at once (a tenant's NodePool may set fewer); below 1 is
    /// refused, not clamped.
    pub max_nodes: u32,
    /// The most work Pods one node holds, whatever their requests (Pods without requests
    /// are bound by it alone).
    pub pods_per_node: u32,
    /// How long a cluster with nothing to run keeps its nodes, and an empty node stays,
    /// before they are released.
    #[serde(with = "humantime_serde_compat")]
    #[schemars(with = "HumanDuration")]
    pub hold: Duration,
    /// Pods at or below this priority are expendable: they neither rent nor keep a node.
    pub expendable_priority_cutoff: i32,
    /// The longest `consolidateAfter` a tenant's NodePool may set (longer is taken as this):
    /// how long an empty node of a tenant may hold a provider's slot.
    #[serde(with = "humantime_serde_compat")]
    #[schemars(with = "HumanDuration")]
    pub max_consolidate_after: Duration,
    /// The schedulers whose Pods rent nodes (`spec.schedulerName`): kube-scheduler's
    /// `default-scheduler`, and any other the operator runs that places Pods by the same
    /// filters. A Pod for a scheduler not listed is not the broker's to rent for
    /// (docs/scale.md).
    pub schedulers: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Market {
    /// One provider's base URL (a provider named `market`); `providers` names several.
    /// Neither: the embedded local provider.
    pub url: Option<String>,
    /// That provider's key, for an `https://` `url` (as `providers[].pin`).
    pub pin: Option<String>,
    /// The providers the broker rents from: every RFP goes to each, and the best bid wins.
    pub providers: Vec<ProviderRef>,
    /// How long to wait for bids on an RFP.
    #[serde(with = "humantime_serde_compat")]
    #[schemars(with = "HumanDuration")]
    pub bid_deadline: Duration,
    /// How long a lease may stay `booting` before it is given up.
    #[serde(with = "humantime_serde_compat")]
    #[schemars(with = "HumanDuration")]
    pub boot_timeout: Duration,
    /// Per-request timeout of the market client.
    #[serde(with = "humantime_serde_compat")]
    #[schemars(with = "HumanDuration")]
    pub request_timeout: Duration,
    /// The nodes this broker rents: `namespace` (network namespaces on the provider's
    /// host, for trusted tenants only: see `access.tenants_trusted`) or `vm`. RFPs ask for
    /// at least this; a provider with less does not bid.
    #[schemars(with = "String")]
    pub isolation: socialweb_market::Isolation,
    /// The node image RFPs name, so a provider boots exactly it: a node image directory
    /// (its `nodeimage.json`'s fingerprint is read at start) or a fingerprint
    /// (`sha256:<64 hex>`) or name (`socialweb-node-<16 hex>`). Default: the embedded
    /// provider's `local_provider.image`, else `local` (a provider's own binaries).
    pub image: Option<String>,
}

/// A provider of the market, as `[[market.providers]]` names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProviderRef {
    /// How the broker calls it (in its records and messages): 1-32 of a-z, 0-9, '-'.
    pub name: String,
    /// Its base URL: `https://...` (mutual TLS; plain `http://` only on loopback).
    pub url: String,
    /// The provider's key, as `socialweb-broker provider-pin` prints it on its machine
    /// (`sha256:<hex>`): required for `https://`; the broker talks to no other key there.
    #[serde(default)]
    pub pin: Option<String>,
    /// The region its nodes run in, in the operator's word (a label value): it stands for
    /// the region the provider's offer names, which is only checked against it (an offer
    /// that says otherwise is logged; this is kept). Unset: the offer's word.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// The zone its nodes run in, in the operator's word, as `region` (docs/scale.md,
    /// "Zones"). Unset: the offer's word.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct LocalProvider {
    /// Where `socialweb-broker provider` (on a provider machine) serves the market protocol,
    /// mutual TLS. The embedded provider serves the broker on an owner-only Unix socket in
    /// the state directory instead, and listens on no port.
    pub listen: SocketAddr,
    /// The brokers `socialweb-broker provider` serves: their keys, as `socialweb-broker
    /// market-pin` prints them on each broker's host. No other client gets past TLS.
    pub brokers: Vec<String>,
    /// How many nodes it may run at once.
    pub capacity: u32,
    /// The node sizes it rents and their prices (`[[local_provider.shapes]]`); none: the
    /// `[node]` size at price 0. The broker sizes each node it rents from the shapes its
    /// providers offer (docs/scale.md).
    pub shapes: Vec<LocalShape>,
    /// Node links are carved from this /16: node `i` gets `<a>.<b>.<i>.0/24`.
    pub subnet: Ipv4Addr,
    /// Prefix of the network namespaces, links and cgroups it creates.
    pub prefix: String,
    /// The node's software: `socialweb-agent`, the CNI plugins, the seed images.
    pub agent: PathBuf,
    /// The CNI plugins nodes use: `socialweb-cni`, `loopback` and `portmap`.
    pub cni_bin_dir: PathBuf,
    /// Extra image archives every node imports (the pause image is always there).
    pub seed_images: Vec<PathBuf>,
    /// Merged over each node's kubelet configuration.
    pub kubelet_config_patch: Option<serde_json::Value>,
    /// A node image directory (`socialweb-image-builder build --out`): nodes run from its
    /// root filesystem, as rented VMs do, instead of the host's `agent` and CNI plugins.
    pub image: Option<PathBuf>,
    /// What a node is: `namespace` (namespaces on this machine: trusted tenants only) or
    /// `vm` (a qemu guest booted from `image`, its own kernel).
    pub machine: MachineKind,
    /// How VMs run (`machine = "vm"`).
    pub vm: Vm,
    /// The region its offer names (a label value): its nodes carry it as
    /// `topology.kubernetes.io/region` (docs/scale.md, "Zones"). Unset: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// The zone its offer names (a label value): its nodes carry it as
    /// `topology.kubernetes.io/zone`, so that Pods spread over zones or kept in one can run
    /// on them (docs/scale.md, "Zones"). Unset: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
}

/// `[[local_provider.shapes]]`: a node size and its price.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LocalShape {
    /// Virtual CPUs.
    pub vcpu: u32,
    /// Memory in MiB.
    #[serde(rename = "memMiB")]
    pub mem_mib: u64,
    /// Disk in MiB.
    #[serde(rename = "diskMiB")]
    pub disk_mib: u64,
    /// Millionths of a currency unit per hour.
    #[serde(default)]
    pub price_micros_per_hour: u64,
}

impl From<LocalShape> for socialweb_market::Shape {
    fn from(s: LocalShape) -> socialweb_market::Shape {
        socialweb_market::Shape {
            spec: socialweb_market::NodeSpec {
                vcpu: s.vcpu,
                mem_mib: s.mem_mib,
                disk_mib: s.disk_mib,
            },
            price_micros_per_hour: s.price_micros_per_hour,
        }
    }
}

/// `local_provider.machine`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MachineKind {
    #[default]
    Namespace,
    Vm,
}

/// `[local_provider.vm]`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Vm {
    /// `auto` (KVM when a probe guest runs under it within 5 s, else TCG), `kvm` or `tcg`.
    #[schemars(with = "String")]
    pub accel: socialweb_provider::AccelChoice,
    /// A guest that has not reported ready by then fails its lease, with its console's last
    /// lines as the reason.
    #[serde(with = "humantime_serde_compat")]
    #[schemars(with = "HumanDuration")]
    pub boot_timeout: Duration,
    /// The emulator guests run in: a path, or a name looked up on `PATH`.
    pub qemu: PathBuf,
    /// What makes each guest's disk over the image's: a path, or a name on `PATH`.
    pub qemu_img: PathBuf,
    /// Whether guests under TCG (no KVM) bid as `vm` isolation. QEMU's security policy
    /// counts only hardware virtualization (KVM) as a boundary, so by default a TCG guest
    /// bids as `namespace`.
    pub tcg_as_vm: bool,
    /// Private IPv4 networks guests may reach besides the public internet (a registry or a
    /// proxy of the operator's, say). Loopback, RFC 1918, link-local (cloud metadata),
    /// CGNAT and multicast are refused otherwise (docs/security.md).
    #[schemars(with = "Vec<String>")]
    pub egress_allow: Vec<ipnet::Ipv4Net>,
    /// Whether each guest's qemu runs jailed: its own uid, network namespace, mount
    /// namespace (chrooted) and cgroup with the RFP's budget (docs/security.md). `false`
    /// only to measure what the jail costs (`bench/vm`): unjailed guests never bid as `vm`.
    pub jail: bool,
}

impl Default for Vm {
    fn default() -> Vm {
        Vm {
            accel: Default::default(),
            boot_timeout: Duration::from_secs(600),
            qemu: "qemu-system-x86_64".into(),
            qemu_img: "qemu-img".into(),
            tcg_as_vm: false,
            egress_allow: Vec::new(),
            jail: true,
        }
    }
}

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

/// The tunnel endpoint nodes reach their control plane through (contract 9): a public UDP
/// listener (QUIC, admitting only the live nodes of each cluster).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Tunnel {
    /// UDP, on `service_addr`: QUIC, nodes' one way to their control plane and back.
    pub port: u16,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Metrics {
    /// Prometheus endpoint (`/metrics`); loopback by default.
    pub listen: SocketAddr,
}

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

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterDefaults {
    /// Resolvers node-local DNS forwards to (the identity's `upstream_resolvers`).
    pub upstream_resolvers: Vec<String>,
    /// First port of the range tenant control planes lease from.
    pub port_base: u16,
    /// How many ports the range has.
    pub port_count: u16,
    /// Whether the operator's own clusters (those no DID owns) get the node isolation policy
    /// on namespace nodes too, as every DID's cluster does (docs/security.md). The upstream
    /// conformance run turns it off: some of its tests run hostNetwork Pods.
    pub isolate_operators_clusters: bool,
    /// How long a cluster with no nodes, no lease, no request at the front and nothing
    /// inside it that will act by itself stays awake before its control plane stops
    /// (docs/hibernation.md); `0` never. A cluster's own (`cluster create
    /// --hibernate-after`, `cluster set`) overrides it.
    #[serde(with = "humantime_serde_compat")]
    #[schemars(with = "HumanDuration")]
    pub hibernate_after: Duration,
    /// What keeps a new cluster's objects: `etcd`, `kine` (SQLite through the etcd API, as
    /// k3s does, in the cluster's directory), or `postgres` (kine over a database of the
    /// cluster's own on `postgres_url`'s server, created with the cluster and dropped with
    /// it); `cluster create --datastore` chooses for one cluster.
    pub datastore: DatastoreKind,
    /// The PostgreSQL server `postgres` clusters' databases are made on
    /// (`postgres://user[:password]@host[:port]/database`; the role needs `CREATEDB`, and the
    /// database named is where it connects to create them). Default: `store.url` when the
    /// store is PostgreSQL.
    pub postgres_url: Option<String>,
    /// The `kine` binary (image-builder/kine/build.sh builds it).
    pub kine_binary: PathBuf,
    /// `GOGC` of every control-plane component: the garbage a Go heap may hold beyond its
    /// live objects, in percent. Lower is less memory for more collector CPU; Go's default
    /// is 100, ours 50 (docs/hibernation.md has the measurements behind it).
    pub gogc: u32,
    /// The memory each control plane (apiserver, datastore, controller-manager, scheduler
    /// together) may use, in MiB; past it the kernel reclaims and then kills within it.
    /// 0: no limit. An idle awake cluster uses about 400 MiB (docs/hibernation.md).
    pub memory_max_mib: u64,
    /// The processes and threads each control plane may have; 0: no limit.
    pub pids_max: u64,
    /// The CPUs each control plane may use (1.5: one and a half); 0: no limit.
    pub cpu_max: f64,
    /// How much each kine cluster's datastore may hold, in MiB, etcd's semantics: past it,
    /// writes are refused and reads and deletes still served (docs/security.md, "Budgets").
    /// etcd clusters keep etcd's own 2048. 0: no quota.
    pub datastore_quota_mib: u64,
    /// Networks (`203.0.113.0/24`, `0.0.0.0/0` for every public address) a cluster's
    /// apiserver may reach for the webhooks and conversion webhooks its tenant names by URL
    /// (docs/security.md, "The control plane's own egress"). A URL that names the cluster's
    /// own nodes, Pods or Services goes through the tunnel as a Service-backed webhook does;
    /// any other address must be public and listed. Loopback, private, link-local and other
    /// non-public addresses are never dialled, listed or not. Default: none.
    pub webhook_egress_allow: Vec<String>,
}

/// The smallest datastore quota: a new cluster's objects, their history until kine's first
/// compaction, and room to work.
pub const MIN_DATASTORE_QUOTA_MIB: u64 = 32;

impl ClusterDefaults {
    /// The control planes' budget (a cgroup each).
    pub fn budget(&self) -> crate::control_plane::cgroup::Budget {
        crate::control_plane::cgroup::Budget {
            memory_bytes: (self.memory_max_mib > 0).then_some(self.memory_max_mib << 20),
            pids: (self.pids_max > 0).then_some(self.pids_max),
            cpu_millis: (self.cpu_max > 0.0).then(|| (self.cpu_max * 1000.0).round() as u64),
        }
    }

    /// The datastore quota in bytes, if there is one.
    pub fn datastore_quota(&self) -> Option<u64> {
        (self.datastore_quota_mib > 0).then_some(self.datastore_quota_mib << 20)
    }

    /// `webhook_egress_allow`, read (`validate` has refused what does not read).
    pub fn webhook_egress_allow(&self) -> Vec<ipnet::IpNet> {
        self.webhook_egress_allow
            .iter()
            .filter_map(|n| n.parse().ok())
            .collect()
    }
}

/// `clusters.datastore`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DatastoreKind {
    Etcd,
    Kine,
    // kine over a database of the cluster's own on `clusters.postgres_url`'s server. (A
    // plain comment: a doc comment would make the schema's values a oneOf.)
    Postgres,
}

impl DatastoreKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DatastoreKind::Etcd => "etcd",
            DatastoreKind::Kine => "kine",
            DatastoreKind::Postgres => "postgres",
        }
    }

    /// A name as the store and `cluster create --datastore` have it.
    pub fn parse(s: &str) -> Result<DatastoreKind, String> {
        match s {
            "etcd" => Ok(DatastoreKind::Etcd),
            "kine" => Ok(DatastoreKind::Kine),
            "postgres" => Ok(DatastoreKind::Postgres),
            other => Err(format!("{other:?} is none of etcd, kine, postgres")),
        }
    }

    /// Whether kine runs it (and `clusters.kine_binary` must be there).
    pub fn uses_kine(self) -> bool {
        matches!(self, DatastoreKind::Kine | DatastoreKind::Postgres)
    }
}

impl Default for Config {
    fn default() -> Config {
        Config {
            state_dir: "/var/lib/socialweb-broker".into(),
            service_addr: Ipv4Addr::new(10, 255, 255, 1),
            advertise_addr: None,
            service_addr_v6: None,
            advertise_addr_v6: None,
            kube_dir: "/usr/lib/socialweb/kubernetes".into(),
            ctl_socket: "/run/socialweb-broker/broker.sock".into(),
            store: Store::default(),
            scale: Scale::default(),
            node: NodeSize::default(),
            market: Market::default(),
            local_provider: LocalProvider::default(),
            relay: Relay::default(),
            tunnel: Tunnel::default(),
            metrics: Metrics::default(),
            clusters: ClusterDefaults::default(),
            front: Front::default(),
            access: Access::default(),
            fleet: Fleet::default(),
        }
    }
}

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

impl Default for Scale {
    fn default() -> Scale {
        Scale {
            max_nodes: 10,
            pods_per_node: 8,
            hold: Duration::from_secs(120),
            expendable_priority_cutoff: -10,
            max_consolidate_after: Duration::from_secs(3600),
            schedulers: vec!["default-scheduler".into()],
        }
    }
}

impl Default for Market {
    fn default() -> Market {
        Market {
            url: None,
            pin: None,
            providers: Vec::new(),
            bid_deadline: Duration::from_secs(5),
            boot_timeout: Duration::from_secs(300),
            request_timeout: Duration::from_secs(10),
            isolation: socialweb_market::Isolation::Namespace,
            image: None,
        }
    }
}

impl Default for LocalProvider {
    fn default() -> LocalProvider {
        LocalProvider {
            listen: "127.0.0.1:7480".parse().expect("address"),
            capacity: 16,
            shapes: Vec::new(),
            subnet: Ipv4Addr::new(172, 30, 0, 0),
            prefix: "swn-".into(),
            agent: "/usr/local/bin/socialweb-agent".into(),
            cni_bin_dir: "/usr/lib/cni".into(),
            seed_images: Vec::new(),
            kubelet_config_patch: None,
            brokers: Vec::new(),
            image: None,
            machine: MachineKind::Namespace,
            vm: Vm::default(),
            region: None,
            zone: None,
        }
    }
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

impl Default for Tunnel {
    fn default() -> Tunnel {
        Tunnel { port: 7443 }
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            listen: "127.0.0.1:9464".parse().expect("address"),
        }
    }
}

impl Default for ClusterDefaults {
    fn default() -> ClusterDefaults {
        ClusterDefaults {
            upstream_resolvers: Vec::new(),
            port_base: 16443,
            port_count: 1000,
            isolate_operators_clusters: true,
            hibernate_after: Duration::from_secs(600),
            datastore: DatastoreKind::Kine,
            postgres_url: None,
            kine_binary: "/usr/lib/socialweb/kine/kine".into(),
            gogc: 50,
            memory_max_mib: 2048,
            pids_max: 8192,
            cpu_max: 2.0,
            datastore_quota_mib: 2048,
            webhook_egress_allow: Vec::new(),
        }
    }
}

/// The variables read over the file, and what each sets.
pub const ENV: &[(&str, &str)] = &[
    (
        "SOCIALWEB_CLUSTERPROVIDER_SCALE_MAX_NODES",
        "scale.max_nodes",
    ),
    (
        "SOCIALWEB_CLUSTERPROVIDER_SCALE_PODS_PER_NODE",
        "scale.pods_per_node",
    ),
    ("SOCIALWEB_CLUSTERPROVIDER_SCALE_HOLD", "scale.hold"),
    (
        "SOCIALWEB_CLUSTERPROVIDER_SCALE_EXPENDABLE_PRIORITY_CUTOFF",
        "scale.expendable_priority_cutoff",
    ),
    ("SOCIALWEB_CLUSTERPROVIDER_NODE_VCPU", "node.vcpu"),
    ("SOCIALWEB_CLUSTERPROVIDER_NODE_MEM_MIB", "node.memMiB"),
    ("SOCIALWEB_CLUSTERPROVIDER_NODE_DISK_MIB", "node.diskMiB"),
    ("SOCIALWEB_BROKER_STATE_DIR", "state_dir"),
    ("SOCIALWEB_BROKER_STORE_URL", "store.url"),
    ("SOCIALWEB_BROKER_MARKET_URL", "market.url"),
    ("SOCIALWEB_BROKER_SERVICE_ADDR", "service_addr"),
    ("SOCIALWEB_BROKER_ADVERTISE_ADDR", "advertise_addr"),
    ("SOCIALWEB_BROKER_KUBE_DIR", "kube_dir"),
    (
        "SOCIALWEB_BROKER_HIBERNATE_AFTER",
        "clusters.hibernate_after",
    ),
    ("SOCIALWEB_BROKER_DATASTORE", "clusters.datastore"),
    ("SOCIALWEB_BROKER_KINE_BINARY", "clusters.kine_binary"),
];

/// Whether `market.image` is something an RFP can name.
fn image_ref_ok(i: &str) -> bool {
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    i == "local"
        || i.strip_prefix("sha256:").is_some_and(|h| hex(h, 64))
        || i.strip_prefix("socialweb-node-")
            .is_some_and(|h| hex(h, 16))
        || std::path::Path::new(i).join("nodeimage.json").is_file()
}

/// A cluster's idle time before it hibernates: `0` (never), or from a second to a year (a
/// shorter one would stop and start a control plane between a client's requests).
pub fn hibernate_after_ok(d: Duration) -> Result<(), String> {
    if d.is_zero() {
        return Ok(());
    }
    if d < Duration::from_secs(1) {
        return Err(format!(
            "{} is too short: give 0 (never) or at least 1s",
            humantime::format_duration(d)
        ));
    }
    if d > Duration::from_secs(365 * 86400) {
        return Err(format!(
            "{} is longer than a year: give 0 for never",
            humantime::format_duration(d)
        ));
    }
    Ok(())
}

fn parse_num<T: std::str::FromStr>(var: &str, v: &str) -> Result<T, ConfigError>
where
    T::Err: std::fmt::Display,
{
    v.trim()
        .parse()
        .map_err(|e| err(var, format!("{v:?} is not a number: {e}")))
}

fn parse_duration(var: &str, v: &str) -> Result<Duration, ConfigError> {
    humantime::parse_duration(v.trim()).map_err(|e| {
        err(
            var,
            format!("{v:?} is not a duration such as 2m or 90s: {e}"),
        )
    })
}

impl Config {
    /// Reads the file (none: the defaults), applies `env` over it and validates.
    pub fn load(
        file: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let mut c = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| err(&path.display().to_string(), e.to_string()))?;
                toml::from_str(&text).map_err(|e| {
                    err(
                        &path.display().to_string(),
                        e.to_string().trim().replace('\n', " "),
                    )
                })?
            }
            None => Config::default(),
        };
        for (var, _) in ENV {
            let Some(v) = env(var) else { continue };
            match *var {
                "SOCIALWEB_CLUSTERPROVIDER_SCALE_MAX_NODES" => {
                    c.scale.max_nodes = parse_num(var, &v).and_then(|n: i64| {
                        u32::try_from(n).map_err(|_| {
                            err(
                                var,
                                format!("{n} must be at least 1; it is refused, not clamped"),
                            )
                        })
                    })?
                }
                "SOCIALWEB_CLUSTERPROVIDER_SCALE_PODS_PER_NODE" => {
                    c.scale.pods_per_node = parse_num::<i64>(var, &v).and_then(|n| {
                        u32::try_from(n).map_err(|_| err(var, format!("{n} must be at least 1")))
                    })?
                }
                "SOCIALWEB_CLUSTERPROVIDER_SCALE_HOLD" => c.scale.hold = parse_duration(var, &v)?,
                "SOCIALWEB_CLUSTERPROVIDER_SCALE_EXPENDABLE_PRIORITY_CUTOFF" => {
                    c.scale.expendable_priority_cutoff = parse_num(var, &v)?
                }
                "SOCIALWEB_CLUSTERPROVIDER_NODE_VCPU" => c.node.vcpu = parse_num(var, &v)?,
                "SOCIALWEB_CLUSTERPROVIDER_NODE_MEM_MIB" => c.node.mem_mib = parse_num(var, &v)?,
                "SOCIALWEB_CLUSTERPROVIDER_NODE_DISK_MIB" => c.node.disk_mib = parse_num(var, &v)?,
                "SOCIALWEB_BROKER_STATE_DIR" => c.state_dir = v.into(),
                "SOCIALWEB_BROKER_STORE_URL" => c.store.url = Some(v).filter(|s| !s.is_empty()),
                "SOCIALWEB_BROKER_MARKET_URL" => c.market.url = Some(v).filter(|s| !s.is_empty()),
                "SOCIALWEB_BROKER_SERVICE_ADDR" => {
                    c.service_addr = v
                        .trim()
                        .parse()
                        .map_err(|e| err(var, format!("{v:?}: {e}")))?
                }
                "SOCIALWEB_BROKER_ADVERTISE_ADDR" => {
                    c.advertise_addr = Some(v.trim())
                        .filter(|s| !s.is_empty())
                        .map(|s| s.parse().map_err(|e| err(var, format!("{v:?}: {e}"))))
                        .transpose()?
                }
                "SOCIALWEB_BROKER_KUBE_DIR" => c.kube_dir = v.into(),
                "SOCIALWEB_BROKER_HIBERNATE_AFTER" => {
                    c.clusters.hibernate_after = parse_duration(var, &v)?
                }
                "SOCIALWEB_BROKER_DATASTORE" => {
                    c.clusters.datastore =
                        DatastoreKind::parse(v.trim()).map_err(|e| err(var, e))?
                }
                "SOCIALWEB_BROKER_KINE_BINARY" => c.clusters.kine_binary = v.into(),
                _ => {}
            }
        }
        c.validate(&env)?;
        Ok(c)
    }

    /// Where a setting came from, for errors: the variable if it was set, else the file key.
    fn origin(key: &str, env: &impl Fn(&str) -> Option<String>) -> String {
        ENV.iter()
            .find(|(var, k)| *k == key && env(var).is_some())
            .map(|(var, _)| var.to_string())
            .unwrap_or_else(|| key.to_string())
    }

    fn validate(&self, env: &impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        let o = |k: &str| Self::origin(k, env);
        self.validate_names()?;
        self.validate_sizes(&o)?;
        self.validate_addresses(&o)?;
        self.validate_clusters(&o)?;
        self.validate_front()?;
        self.validate_relay()?;
        self.validate_access()
    }

    /// How the broker reaches each provider: mutual TLS with a pinned key, or plain HTTP on
    /// loopback only; and the keys a provider machine serves (docs/market.md).
    fn validate_market_transport(&self) -> Result<(), ConfigError> {
        let key = |i: usize, f: &str| match &self.market.url {
            Some(_) => format!("market.{f}"),
            None => format!("market.providers[{i}].{f}"),
        };
        for (i, p) in self.providers().iter().enumerate() {
            let Ok(u) = url::Url::parse(&p.url) else {
                continue;
            };
            match (u.scheme(), &p.pin) {
                ("https", None) => {
                    return Err(err(
                        &key(i, "pin"),
                        format!(
                            "{} is https: give its key (`socialweb-broker provider-pin` on that machine prints it)",
                            p.url
                        ),
                    ));
                }
                ("https", Some(pin)) => {
                    socialweb_market_tls::parse_pin(pin)
                        .map_err(|e| err(&key(i, "pin"), e.to_string()))?;
                }
                _ => {
                    let loopback = match u.host() {
                        Some(url::Host::Ipv4(a)) => a.is_loopback(),
                        Some(url::Host::Ipv6(a)) => a.is_loopback(),
                        Some(url::Host::Domain(d)) => d == "localhost",
                        None => false,
                    };
                    if !loopback {
                        return Err(err(
                            &key(i, "url"),
                            format!(
                                "{} is plain HTTP off this host: use https:// with the provider's pin",
                                p.url
                            ),
                        ));
                    }
                }
            }
        }
        for (i, pin) in self.local_provider.brokers.iter().enumerate() {
            socialweb_market_tls::parse_pin(pin)
                .map_err(|e| err(&format!("local_provider.brokers[{i}]"), e.to_string()))?;
        }
        self.validate_machines()
    }

    /// A VM provider boots a node image, and what only a machine of namespaces can be given
    /// (the host's seed archives, a kubelet patch on the agent's command line) is refused by
    /// name rather than ignored.
    fn validate_machines(&self) -> Result<(), ConfigError> {
        if let Some(i) = &self.market.image
            && !image_ref_ok(i)
        {
            return Err(err(
                "market.image",
                format!(
                    "{i:?} is neither a directory with nodeimage.json, a fingerprint (sha256:<64 hex>), a name (socialweb-node-<16 hex>) nor \"local\""
                ),
            ));
        }
        let lp = &self.local_provider;
        if lp.machine != MachineKind::Vm {
            return Ok(());
        }
        if lp.image.is_none() {
            return Err(err(
                "local_provider.image",
                "required with machine = \"vm\": the node image directory its guests boot",
            ));
        }
        if !lp.seed_images.is_empty() {
            return Err(err(
                "local_provider.seed_images",
                "not taken with machine = \"vm\": a guest imports the node image's seed disk (put the archives in the image config's `images`)",
            ));
        }
        if lp.kubelet_config_patch.is_some() {
            return Err(err(
                "local_provider.kubelet_config_patch",
                "not taken with machine = \"vm\": a guest's agent runs as the node image's unit starts it",
            ));
        }
        if lp.vm.boot_timeout < Duration::from_secs(10) {
            return Err(err(
                "local_provider.vm.boot_timeout",
                "must be at least 10s (a guest boots its kernel, systemd and the agent)",
            ));
        }
        Ok(())
    }

    /// Who may have clusters, and the limits: none zero, every allowed DID a DID.
    fn validate_access(&self) -> Result<(), ConfigError> {
        let a = &self.access;
        for (key, n) in [
            ("access.max_clusters_per_did", a.max_clusters_per_did),
            ("access.max_clusters", a.max_clusters),
            (
                "access.requests_per_minute_per_source",
                a.requests_per_minute_per_source,
            ),
            (
                "access.requests_per_minute_per_did",
                a.requests_per_minute_per_did,
            ),
            (
                "access.creates_per_hour_per_did",
                a.creates_per_hour_per_did,
            ),
        ] {
            if n == 0 {
                return Err(err(key, "must be at least 1"));
            }
        }
        if let Some(d) = a.allowed_dids.iter().find(|d| {
            !(d.starts_with("did:key:") || d.starts_with("did:web:") || d.starts_with("did:plc:"))
        }) {
            return Err(err(
                "access.allowed_dids",
                format!("{d:?} is not a did:key, did:web or did:plc"),
            ));
        }
        Ok(())
    }

    /// The scale knobs and the node size.
    /// The names the configuration gives: the schedulers the broker rents for, and the
    /// local provider's region and zone (label values).
    fn validate_names(&self) -> Result<(), ConfigError> {
        if self.scale.schedulers.is_empty() {
            return Err(err(
                "scale.schedulers",
                "lists no scheduler: no Pod would ever rent a node (the default is \
                 [\"default-scheduler\"])",
            ));
        }
        if let Some(bad) = self
            .scale
            .schedulers
            .iter()
            .find(|n| n.is_empty() || n.len() > 253 || !n.bytes().all(|b| b.is_ascii_graphic()))
        {
            return Err(err(
                "scale.schedulers",
                format!("{bad:?} is not a scheduler name (1-253 printable characters)"),
            ));
        }
        for (field, v) in [
            ("local_provider.region", &self.local_provider.region),
            ("local_provider.zone", &self.local_provider.zone),
        ] {
            if let Some(v) = v
                && !socialweb_market::valid_label_value(v)
            {
                return Err(err(
                    field,
                    format!(
                        "{v:?} is not a label value (1-63 of A-Z a-z 0-9 - _ ., alphanumeric \
                         at both ends)"
                    ),
                ));
            }
        }
        Ok(())
    }

    fn validate_sizes(&self, o: &impl Fn(&str) -> String) -> Result<(), ConfigError> {
        if self.scale.max_nodes < 1 {
            return Err(err(
                &o("scale.max_nodes"),
                "0 must be at least 1; it is refused, not clamped",
            ));
        }
        if self.scale.pods_per_node < 1 {
            return Err(err(&o("scale.pods_per_node"), "0 must be at least 1"));
        }
        hibernate_after_ok(self.clusters.hibernate_after)
            .map_err(|e| err(&o("clusters.hibernate_after"), e))?;
        if self.scale.max_consolidate_after < Duration::from_secs(1) {
            return Err(err("scale.max_consolidate_after", "must be at least 1s"));
        }
        if self.scale.hold.is_zero() {
            return Err(err(&o("scale.hold"), "must be longer than 0s"));
        }
        if self.node.vcpu < 1 {
            return Err(err(&o("node.vcpu"), "must be at least 1"));
        }
        if self.node.mem_mib < 256 {
            return Err(err(
                &o("node.memMiB"),
                format!(
                    "{} MiB is too small for a node (at least 256)",
                    self.node.mem_mib
                ),
            ));
        }
        for (i, s) in self.local_provider.shapes.iter().enumerate() {
            let at = format!("local_provider.shapes[{i}]");
            // The spec's check names the field after the shape: `...shapes[1].vcpu`.
            socialweb_market::Shape::from(*s)
                .spec
                .validate(&at)
                .map_err(|e| match e.split_once(": ") {
                    Some((field, problem)) => err(field, problem),
                    None => err(&at, e),
                })?;
        }
        if self.node.disk_mib < 1024 {
            return Err(err(
                &o("node.diskMiB"),
                format!(
                    "{} MiB is too small for a node (at least 1024)",
                    self.node.disk_mib
                ),
            ));
        }
        Ok(())
    }

    /// The store's and market's URLs, the service address, the resolvers, the port range.
    fn validate_addresses(&self, o: &impl Fn(&str) -> String) -> Result<(), ConfigError> {
        if let Some(url) = &self.store.url
            && !(url.starts_with("sqlite:")
                || url.starts_with("postgres://")
                || url.starts_with("postgresql://"))
        {
            return Err(err(
                &o("store.url"),
                format!("{url:?} is neither sqlite:<path> nor postgres://..."),
            ));
        }
        if self.market.url.is_some() && !self.market.providers.is_empty() {
            return Err(err(
                &o("market.url"),
                "give market.url (one provider) or market.providers (several), not both",
            ));
        }
        for (key, url) in self.market.url.iter().map(|u| (o("market.url"), u)).chain(
            self.market
                .providers
                .iter()
                .enumerate()
                .map(|(i, p)| (format!("market.providers[{i}].url"), &p.url)),
        ) {
            if url::Url::parse(url)
                .map(|u| !matches!(u.scheme(), "http" | "https"))
                .unwrap_or(true)
            {
                return Err(err(&key, format!("{url:?} is not an http(s) URL")));
            }
        }
        self.validate_market_transport()?;
        let mut names = std::collections::BTreeSet::new();
        for (i, p) in self.market.providers.iter().enumerate() {
            let ok = !p.name.is_empty()
                && p.name.len() <= 32
                && p.name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
            if !ok {
                return Err(err(
                    &format!("market.providers[{i}].name"),
                    format!("{:?} is not 1-32 of a-z, 0-9, '-'", p.name),
                ));
            }
            if !names.insert(p.name.as_str()) {
                return Err(err(
                    &format!("market.providers[{i}].name"),
                    format!("{:?} is named twice", p.name),
                ));
            }
            for (field, v) in [("region", &p.region), ("zone", &p.zone)] {
                if let Some(v) = v
                    && !socialweb_market::valid_label_value(v)
                {
                    return Err(err(
                        &format!("market.providers[{i}].{field}"),
                        format!("{v:?} is not a label value (1-63 of A-Z a-z 0-9 - _ .)"),
                    ));
                }
            }
        }
        self.validate_service_addrs(o)
    }

    /// The addresses nodes are told the broker is at, both families.
    fn validate_service_addrs(&self, o: &impl Fn(&str) -> String) -> Result<(), ConfigError> {
        if IpAddr::V4(self.service_addr).is_unspecified() {
            return Err(err(
                &o("service_addr"),
                "must be a specific address nodes can reach",
            ));
        }
        if let Some(a) = self.advertise_addr
            && (a.is_unspecified() || a.is_loopback())
        {
            return Err(err(
                &o("advertise_addr"),
                format!("{a} is not an address nodes can reach"),
            ));
        }
        for (key, a) in [
            ("service_addr_v6", self.service_addr_v6),
            ("advertise_addr_v6", self.advertise_addr_v6),
        ] {
            if let Some(a) = a
                && !reachable_v6(a)
            {
                return Err(err(
                    &o(key),
                    format!(
                        "{a} is not an address nodes can reach (unspecified, loopback, \
                         link-local or multicast)"
                    ),
                ));
            }
        }
        if self.advertise_addr_v6.is_some() && self.service_addr_v6.is_none() {
            return Err(err(
                &o("advertise_addr_v6"),
                "is set without service_addr_v6, the address it is forwarded to",
            ));
        }
        Ok(())
    }

    /// The `[clusters]` section: resolvers, the datastore, GOGC, the port range.
    fn validate_clusters(&self, o: &impl Fn(&str) -> String) -> Result<(), ConfigError> {
        for (i, n) in self.clusters.webhook_egress_allow.iter().enumerate() {
            if n.parse::<ipnet::IpNet>().is_err() {
                return Err(err(
                    &format!("clusters.webhook_egress_allow[{i}]"),
                    format!("{n:?} is not a network (203.0.113.0/24, 2001:db8::/32, 0.0.0.0/0)"),
                ));
            }
        }
        for (i, r) in self.clusters.upstream_resolvers.iter().enumerate() {
            if socialweb_wire::identity::parse_resolver(r).is_none() {
                return Err(err(
                    &format!("clusters.upstream_resolvers[{i}]"),
                    format!("{r:?} is not an IP or IP:port"),
                ));
            }
        }
        if !(10..=1000).contains(&self.clusters.gogc) {
            return Err(err(
                &o("clusters.gogc"),
                format!(
                    "{} is not from 10 to 1000 (Go's default is 100)",
                    self.clusters.gogc
                ),
            ));
        }
        if !(self.clusters.cpu_max.is_finite() && self.clusters.cpu_max >= 0.0)
            || (self.clusters.cpu_max > 0.0 && self.clusters.cpu_max < 0.01)
        {
            return Err(err(
                &o("clusters.cpu_max"),
                format!(
                    "{} is not 0 (no limit) or at least 0.01 CPUs",
                    self.clusters.cpu_max
                ),
            ));
        }
        if self.clusters.memory_max_mib > 0 && self.clusters.memory_max_mib < 256 {
            return Err(err(
                &o("clusters.memory_max_mib"),
                format!(
                    "{} MiB is too little for a control plane (an idle one uses about 400); 0 is no limit",
                    self.clusters.memory_max_mib
                ),
            ));
        }
        if self.clusters.datastore_quota_mib > 0
            && self.clusters.datastore_quota_mib < MIN_DATASTORE_QUOTA_MIB
        {
            return Err(err(
                &o("clusters.datastore_quota_mib"),
                format!(
                    "{} MiB is less than a new cluster's own objects take (at least \
                     {MIN_DATASTORE_QUOTA_MIB}); 0 is no quota",
                    self.clusters.datastore_quota_mib
                ),
            ));
        }
        if u32::from(self.clusters.port_base) + u32::from(self.clusters.port_count) > 65535 {
            return Err(err("clusters.port_count", "the port range runs past 65535"));
        }
        if let Some(u) = &self.clusters.postgres_url
            && !url::Url::parse(u).is_ok_and(|u| matches!(u.scheme(), "postgres" | "postgresql"))
        {
            return Err(err(
                &o("clusters.postgres_url"),
                "is not a postgres://user@host/database URL",
            ));
        }
        if self.clusters.datastore == DatastoreKind::Postgres
            && self.clusters_postgres_url().is_none()
        {
            return Err(err(
                &o("clusters.datastore"),
                "is postgres, and neither clusters.postgres_url nor a PostgreSQL store.url says which server",
            ));
        }
        self.validate_fleet(o)
    }

    /// A fleet keeps nothing a cluster needs on one host's disk.
    fn validate_fleet(&self, o: &impl Fn(&str) -> String) -> Result<(), ConfigError> {
        if !self.fleet.enabled {
            return Ok(());
        }
        if self.fleet.lease_ttl < Duration::from_secs(3) {
            return Err(err(&o("fleet.lease_ttl"), "must be at least 3s"));
        }
        if self.fleet.link_port == 0 {
            return Err(err(
                &o("fleet.link_port"),
                "must be a port: the other hosts reach this one's clusters through it",
            ));
        }
        if !self
            .store
            .url
            .as_deref()
            .is_some_and(|u| u.starts_with("postgres"))
        {
            return Err(err(
                &o("fleet.enabled"),
                "needs a PostgreSQL store.url: the hosts of a fleet share their store",
            ));
        }
        if self.store.key_file.is_none() {
            return Err(err(
                &o("fleet.enabled"),
                "needs store.key_file: the clusters' CAs must be in the store for another host to serve them",
            ));
        }
        if self.clusters.datastore != DatastoreKind::Postgres {
            return Err(err(
                &o("fleet.enabled"),
                "needs clusters.datastore = \"postgres\": a cluster's objects must be where every host reaches them",
            ));
        }
        Ok(())
    }

    /// The front's URL, DID and certificate.
    fn validate_front(&self) -> Result<(), ConfigError> {
        if let Some(u) = &self.front.public_url
            && url::Url::parse(u)
                .map(|u| u.scheme() != "https" || u.host_str().is_none())
                .unwrap_or(true)
        {
            return Err(err(
                "front.public_url",
                format!("{u:?} is not an https:// URL with a host"),
            ));
        }
        if let Some(d) = &self.front.service_did
            && !d.starts_with("did:")
        {
            return Err(err("front.service_did", format!("{d:?} is not a DID")));
        }
        if self.front.tls_cert.is_some() != self.front.tls_key.is_some() {
            return Err(err(
                "front.tls_cert",
                "give front.tls_cert and front.tls_key together, or neither",
            ));
        }
        self.validate_front_limits()
    }

    /// The front's bounds: none may be zero (a zero would refuse everything or time out at once).
    fn validate_front_limits(&self) -> Result<(), ConfigError> {
        let f = &self.front;
        for (key, zero) in [
            ("front.max_connections", f.max_connections == 0),
            (
                "front.max_connections_per_source",
                f.max_connections_per_source == 0,
            ),
            ("front.handshake_timeout", f.handshake_timeout.is_zero()),
            ("front.header_read_timeout", f.header_read_timeout.is_zero()),
            ("front.idle_timeout", f.idle_timeout.is_zero()),
            ("front.body_read_timeout", f.body_read_timeout.is_zero()),
            (
                "front.max_streams_per_certificate",
                f.max_streams_per_certificate == 0,
            ),
        ] {
            if zero {
                return Err(err(key, "must be more than zero"));
            }
        }
        if f.max_connections_per_source > f.max_connections {
            return Err(err(
                "front.max_connections_per_source",
                format!(
                    "{} is more than front.max_connections ({})",
                    f.max_connections_per_source, f.max_connections
                ),
            ));
        }
        Ok(())
    }

    /// The relay's gate: no bound may be zero, and one address may not have more than all.
    fn validate_relay(&self) -> Result<(), ConfigError> {
        let r = &self.relay;
        for (key, zero) in [
            ("relay.max_connections", r.max_connections == 0),
            (
                "relay.max_connections_per_source",
                r.max_connections_per_source == 0,
            ),
            ("relay.handshake_timeout", r.handshake_timeout.is_zero()),
            ("relay.idle_timeout", r.idle_timeout.is_zero()),
        ] {
            if zero {
                return Err(err(key, "must be more than zero"));
            }
        }
        if r.max_connections_per_source > r.max_connections {
            return Err(err(
                "relay.max_connections_per_source",
                format!(
                    "{} is more than relay.max_connections ({})",
                    r.max_connections_per_source, r.max_connections
                ),
            ));
        }
        Ok(())
    }

    /// Where the front binds: `front.listen`, except that all IPv4 addresses become all
    /// addresses of both families when the host has `service_addr_v6`.
    pub fn front_bind(&self) -> SocketAddr {
        match self.front.listen {
            SocketAddr::V4(a) if a.ip().is_unspecified() && self.service_addr_v6.is_some() => {
                SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), a.port())
            }
            a => a,
        }
    }

    /// The server `postgres` clusters' databases are made on: `clusters.postgres_url`, else
    /// the store's URL when the store is PostgreSQL.
    pub fn clusters_postgres_url(&self) -> Option<String> {
        self.clusters.postgres_url.clone().or_else(|| {
            self.store
                .url
                .clone()
                .filter(|u| u.starts_with("postgres://") || u.starts_with("postgresql://"))
        })
    }

    /// Where this host's fleet link listens (`fleet.link_port` on `service_addr`).
    pub fn link_bind(&self) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(self.service_addr), self.fleet.link_port)
    }

    /// The URL other hosts of the fleet reach this host's link at.
    pub fn link_url(&self) -> String {
        format!(
            "https://{}:{}",
            self.advertised_addr(),
            self.fleet.link_port
        )
    }

    /// The URL kubeconfigs name the front by.
    pub fn front_url(&self) -> String {
        self.front.public_url.clone().unwrap_or_else(|| {
            format!(
                "https://{}:{}",
                self.advertised_addr(),
                self.front.listen.port()
            )
        })
    }

    /// Where nodes and users are told the broker is: `advertise_addr`, else `service_addr`.
    pub fn advertised_addr(&self) -> Ipv4Addr {
        self.advertise_addr.unwrap_or(self.service_addr)
    }

    /// The IPv6 address nodes are told, if the host has one: `advertise_addr_v6`, else
    /// `service_addr_v6`.
    pub fn advertised_addr_v6(&self) -> Option<Ipv6Addr> {
        self.advertise_addr_v6.or(self.service_addr_v6)
    }

    /// The DID service-auth tokens must be addressed to.
    pub fn service_did(&self) -> String {
        self.front.service_did.clone().unwrap_or_else(|| {
            let host = url::Url::parse(&self.front_url())
                .ok()
                .and_then(|u| {
                    u.host_str().map(|h| match u.port() {
                        Some(p) => format!("{h}%3A{p}"),
                        None => h.to_string(),
                    })
                })
                .unwrap_or_default();
            format!("did:web:{host}")
        })
    }

    /// The providers to rent from: `market.providers`, or `market.url` as one named `market`;
    /// empty: the embedded local provider.
    pub fn providers(&self) -> Vec<ProviderRef> {
        match &self.market.url {
            Some(url) => vec![ProviderRef {
                name: "market".into(),
                url: url.clone(),
                pin: self.market.pin.clone(),
                region: None,
                zone: None,
            }],
            None => self.market.providers.clone(),
        }
    }

    /// The store's URL: the configured one, or SQLite in the state directory.
    pub fn store_url(&self) -> String {
        self.store.url.clone().unwrap_or_else(|| {
            format!(
                "sqlite://{}?mode=rwc",
                self.state_dir.join("broker.db").display()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn load(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::load(None, |k| m.get(k).cloned())
    }

    /// What the harness (and `check-config`) write, read back, is the same configuration.
    #[test]
    fn a_configuration_written_out_reads_back_the_same() {
        let mut c = Config::default();
        c.store.url = Some("postgres://u@db/broker".into());
        c.scale.hold = Duration::from_millis(2500);
        c.market.providers.push(ProviderRef {
            name: "east".into(),
            url: "https://198.51.100.11:7480".into(),
            pin: Some("sha256:00".into()),
            region: None,
            zone: None,
        });
        c.market.isolation = socialweb_market::Isolation::Vm;
        c.local_provider.shapes.push(LocalShape {
            vcpu: 2,
            mem_mib: 4096,
            disk_mib: 20480,
            price_micros_per_hour: 20000,
        });
        c.local_provider.kubelet_config_patch =
            Some(serde_json::json!({"evictionHard": {"memory.available": "1Mi"}, "n": 100}));
        c.local_provider.machine = MachineKind::Vm;
        c.local_provider.vm.jail = false;
        c.local_provider.vm.egress_allow = vec!["10.1.0.0/16".parse().unwrap()];
        c.front.did_web_nameservers = vec!["192.0.2.53:53".parse().unwrap()];
        c.access.registration = Registration::Open;
        c.clusters.cpu_max = 1.5;
        let text = toml::to_string_pretty(&c).unwrap();
        let back: Config = toml::from_str(&text).unwrap();
        assert_eq!(toml::to_string_pretty(&back).unwrap(), text);
        assert_eq!(back.scale.hold, Duration::from_millis(2500));
        assert_eq!(
            back.local_provider.kubelet_config_patch,
            c.local_provider.kubelet_config_patch
        );
    }

    /// Every key a configuration writes, dotted (`market.providers.pin` for each
    /// `[[market.providers]]`), down to the keys of `reference` (whose values may be tables).
    fn written_keys(v: &toml::Value, at: &str, reference: &[String], out: &mut Vec<String>) {
        match v {
            toml::Value::Table(t) if !reference.iter().any(|k| k == at) => {
                for (k, v) in t {
                    let key = if at.is_empty() {
                        k.clone()
                    } else {
                        format!("{at}.{k}")
                    };
                    written_keys(v, &key, reference, out);
                }
            }
            toml::Value::Array(a) if a.first().is_some_and(toml::Value::is_table) => {
                out.push(at.to_string());
                for (k, v) in a[0].as_table().into_iter().flatten() {
                    written_keys(v, &format!("{at}.{k}"), reference, out);
                }
            }
            _ => out.push(at.to_string()),
        }
    }

    /// A configuration with every optional key set and every array given an element.
    fn everything() -> Config {
        let mut c = Config::default();
        c.store.url = Some("sqlite://x".into());
        c.market.url = Some("https://m".into());
        c.market.pin = Some("sha256:00".into());
        c.market.image = Some("local".into());
        c.market.providers.push(ProviderRef {
            name: "east".into(),
            url: "https://198.51.100.11:7480".into(),
            pin: Some("sha256:00".into()),
            region: None,
            zone: None,
        });
        c.local_provider.shapes.push(LocalShape {
            vcpu: 2,
            mem_mib: 4096,
            disk_mib: 20480,
            price_micros_per_hour: 1,
        });
        c.local_provider.kubelet_config_patch = Some(serde_json::json!({"maxPods": 30}));
        c.local_provider.image = Some("/srv/image".into());
        c.front.public_url = Some("https://b".into());
        c.front.service_did = Some("did:web:b".into());
        c.front.tls_cert = Some("/c".into());
        c.front.tls_key = Some("/k".into());
        c
    }

    /// The reference names every key the configuration has, and no other: a key added to a
    /// type, or to `NodeSize` and not to its schema's mirror, fails here.
    #[test]
    fn the_reference_has_every_key_and_no_other() {
        let r = reference::Reference::new();
        let keys = r.broker_keys();
        let mut written = Vec::new();
        let v = toml::Value::try_from(everything()).unwrap();
        written_keys(&v, "", &keys, &mut written);
        for k in &written {
            assert!(keys.contains(k), "{k} is not in the reference");
        }
        // What `everything` leaves unset is an optional key, unset by default.
        for t in &r.broker {
            for k in &t.keys {
                assert!(
                    written.contains(&k.key) || k.default.is_null(),
                    "{} is in the reference, not in the configuration",
                    k.key
                );
            }
        }
        let provider: Vec<String> = r
            .provider
            .iter()
            .flat_map(|t| t.keys.iter().map(|k| k.key.clone()))
            .collect();
        for k in &provider {
            assert!(
                keys.contains(k),
                "{k} is a provider's key, not the broker's"
            );
        }
        assert!(provider.contains(&"local_provider.brokers".to_string()));
        assert!(!provider.iter().any(|k| k.starts_with("front")));
    }

    /// The defaults are what `check-config` prints for an empty file (issue 39: the page
    /// said etcd and 100), with their variables, types and meanings.
    #[test]
    fn the_reference_says_the_defaults_check_config_prints() {
        let r = reference::Reference::new();
        let key = |name: &str| {
            r.broker
                .iter()
                .flat_map(|t| &t.keys)
                .find(|k| k.key == name)
                .unwrap_or_else(|| panic!("{name}"))
                .clone()
        };
        let printed = toml::to_string_pretty(&Config::default()).unwrap();
        assert!(printed.contains("datastore = \"kine\"") && printed.contains("gogc = 50"));
        assert_eq!(
            key("clusters.datastore").default_toml.as_deref(),
            Some("\"kine\"")
        );
        assert_eq!(
            key("clusters.datastore").values,
            ["etcd", "kine", "postgres"]
        );
        assert_eq!(key("clusters.gogc").default_toml.as_deref(), Some("50"));
        assert_eq!(key("scale.hold").default_toml.as_deref(), Some("\"2m\""));
        assert!(
            key("scale.hold").ty.starts_with("duration"),
            "{:?}",
            key("scale.hold")
        );
        assert_eq!(key("node.memMiB").default_toml.as_deref(), Some("4096"));
        assert_eq!(key("clusters.cpu_max").default_toml.as_deref(), Some("2.0"));
        assert_eq!(key("front.tls_cert").default_toml, None);
        assert!(key("market.providers.name").required);
        assert!(!key("market.providers.pin").required);
        assert_eq!(
            key("state_dir").variable.as_deref(),
            Some("SOCIALWEB_BROKER_STATE_DIR")
        );
        assert!(key("kube_dir").meaning.contains("`kube` and `pause`"));
        let md = r.markdown();
        assert!(
            md.contains("| `gogc` | integer (0 or more) | `50` |"),
            "{md}"
        );
        assert!(md.contains("### `[[market.providers]]`"), "{md}");
        for t in r.broker.iter().chain(&r.provider) {
            for k in &t.keys {
                assert!(!k.meaning.is_empty(), "{} has no doc comment", k.key);
            }
        }
    }

    #[test]
    fn check_config_names_missing_files_by_key_and_a_providers_missing_brokers() {
        let dir = std::env::temp_dir().join(format!("sw-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut c = Config {
            kube_dir: dir.clone(),
            ..Config::default()
        };
        c.clusters.kine_binary = dir.join("kine");
        c.local_provider.agent = dir.join("agent");
        c.local_provider.cni_bin_dir = dir.join("cni");
        c.front.tls_cert = Some(dir.join("front.crt"));
        c.front.tls_key = Some(dir.join("front.key"));
        let found = check::run(&c, None, check::Role::Broker);
        let errors = |found: &[check::Finding]| -> Vec<String> {
            found
                .iter()
                .filter(|f| f.level == check::Level::Error)
                .map(|f| f.key.clone())
                .collect()
        };
        let e = errors(&found);
        for key in [
            "kube_dir",
            "clusters.kine_binary",
            "front.tls_cert",
            "front.tls_key",
            "local_provider.agent",
            "local_provider.cni_bin_dir",
        ] {
            assert!(e.iter().any(|k| k == key), "{key}: {found:?}");
        }
        assert!(
            found.iter().all(|f| !f.key.contains("brokers")),
            "{found:?}"
        );
        c.clusters.datastore = DatastoreKind::Etcd;
        let found = check::run(&c, None, check::Role::Broker);
        assert!(!errors(&found).contains(&"clusters.kine_binary".to_string()));
        let file = dir.join("provider.toml");
        std::fs::write(&file, "state_dir = \"/x\"\n[front]\nnames = []\n[scale]\n").unwrap();
        let found = check::run(&c, Some(&file), check::Role::Provider);
        let e = errors(&found);
        assert!(
            e.contains(&"local_provider.brokers".to_string()),
            "{found:?}"
        );
        assert!(e.contains(&"kube_dir".to_string()), "{found:?}");
        let shown: Vec<String> = found.iter().map(ToString::to_string).collect();
        assert!(
            shown.contains(&"warning: front: `socialweb-broker provider` does not read it; a provider machine reads only kube_dir, local_provider, metrics, node and state_dir (docs/config.md)".to_string()),
            "{shown:?}"
        );
        assert_eq!(
            check::not_read_by_a_provider(&std::fs::read_to_string(&file).unwrap()),
            ["front", "scale"]
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn the_seeds_defaults() {
        let c = load(&[]).unwrap();
        assert_eq!(c.scale.max_nodes, 10);
        assert_eq!(c.scale.pods_per_node, 8);
        assert_eq!(c.scale.hold, Duration::from_secs(120));
        assert_eq!(c.scale.expendable_priority_cutoff, -10);
        assert_eq!(c.clusters.hibernate_after, Duration::from_secs(600));
    }

    #[test]
    fn shapes_are_checked_and_errors_name_the_field() {
        let ok = "[local_provider]\nshapes = [{ vcpu = 1, memMiB = 2048, diskMiB = 20480 }, \
                  { vcpu = 2, memMiB = 4096, diskMiB = 20480, price_micros_per_hour = 20000 }]\n";
        let c = toml::from_str::<Config>(ok).unwrap();
        assert!(c.validate(&|_| None).is_ok());
        assert_eq!(c.local_provider.shapes[1].price_micros_per_hour, 20000);
        let bad = ok.replace("vcpu = 2", "vcpu = 0");
        let e = toml::from_str::<Config>(&bad)
            .unwrap()
            .validate(&|_| None)
            .unwrap_err();
        assert_eq!(e.source_name, "local_provider.shapes[1].vcpu", "{e}");
        assert!(e.problem.contains("0 is not 1-1024"), "{e}");
        let unknown = ok.replace("diskMiB = 20480 }", "diskMiB = 20480, gpu = 1 }");
        let e = toml::from_str::<Config>(&unknown).unwrap_err().to_string();
        assert!(e.contains("gpu"), "{e}");
    }

    #[test]
    fn schedulers_and_zones_are_checked_and_errors_name_the_key() {
        let check = |toml: &str| toml::from_str::<Config>(toml).unwrap().validate(&|_| None);
        assert!(check("[scale]\nschedulers = [\"default-scheduler\", \"gitlab\"]\n").is_ok());
        let e = check("[scale]\nschedulers = []\n").unwrap_err();
        assert_eq!(e.source_name, "scale.schedulers", "{e}");
        assert!(check("[local_provider]\nregion = \"eu\"\nzone = \"eu-1a\"\n").is_ok());
        let e = check("[local_provider]\nzone = \"eu 1a\"\n").unwrap_err();
        assert_eq!(e.source_name, "local_provider.zone", "{e}");
        assert!(e.problem.contains("not a label value"), "{e}");
        let provider = "[[market.providers]]\nname = \"p1\"\nurl = \"http://127.0.0.1:7480\"\n";
        assert!(check(&format!("{provider}zone = \"eu-1b\"\n")).is_ok());
        let e = check(&format!("{provider}region = \"-eu\"\n")).unwrap_err();
        assert_eq!(e.source_name, "market.providers[0].region", "{e}");
    }

    #[test]
    fn hibernate_after_is_zero_or_a_sane_time_and_errors_name_the_key() {
        let var = "SOCIALWEB_BROKER_HIBERNATE_AFTER";
        assert_eq!(
            load(&[(var, "0")]).unwrap().clusters.hibernate_after,
            Duration::ZERO
        );
        assert_eq!(
            load(&[(var, "30m")]).unwrap().clusters.hibernate_after,
            Duration::from_secs(1800)
        );
        for (v, needle) in [
            ("200ms", "too short"),
            ("400days", "longer than a year"),
            ("later", "not a duration"),
        ] {
            let e = load(&[(var, v)]).unwrap_err();
            assert_eq!(e.source_name, var, "{e}");
            assert!(e.problem.contains(needle), "{v}: {e}");
        }
        let e = toml::from_str::<Config>("[clusters]\nhibernate_after = \"5s\"\n")
            .map(|c| c.validate(&|_| None));
        assert!(matches!(e, Ok(Ok(()))), "{e:?}");
        let e = toml::from_str::<Config>("[clusters]\nhibernate_after = \"10ms\"\n")
            .unwrap()
            .validate(&|_| None)
            .unwrap_err();
        assert_eq!(e.source_name, "clusters.hibernate_after", "{e}");
    }

    #[test]
    fn variables_override_and_bad_ones_are_named() {
        let c = load(&[
            ("SOCIALWEB_CLUSTERPROVIDER_SCALE_MAX_NODES", "5"),
            ("SOCIALWEB_CLUSTERPROVIDER_SCALE_PODS_PER_NODE", "1"),
            ("SOCIALWEB_CLUSTERPROVIDER_SCALE_HOLD", "1m"),
        ])
        .unwrap();
        assert_eq!((c.scale.max_nodes, c.scale.pods_per_node), (5, 1));
        assert_eq!(c.scale.hold, Duration::from_secs(60));
        for (var, value, needle) in [
            (
                "SOCIALWEB_CLUSTERPROVIDER_SCALE_MAX_NODES",
                "0",
                "refused, not clamped",
            ),
            (
                "SOCIALWEB_CLUSTERPROVIDER_SCALE_MAX_NODES",
                "-3",
                "refused, not clamped",
            ),
            (
                "SOCIALWEB_CLUSTERPROVIDER_SCALE_MAX_NODES",
                "many",
                "not a number",
            ),
            (
                "SOCIALWEB_CLUSTERPROVIDER_SCALE_PODS_PER_NODE",
                "0",
                "at least 1",
            ),
            (
                "SOCIALWEB_CLUSTERPROVIDER_SCALE_HOLD",
                "soon",
                "not a duration",
            ),
            (
                "SOCIALWEB_CLUSTERPROVIDER_SCALE_HOLD",
                "0s",
                "longer than 0s",
            ),
            ("SOCIALWEB_CLUSTERPROVIDER_NODE_MEM_MIB", "16", "too small"),
            ("SOCIALWEB_BROKER_STORE_URL", "mysql://x", "neither"),
        ] {
            let e = load(&[(var, value)]).unwrap_err();
            assert_eq!(e.source_name, var, "{e}");
            assert!(e.problem.contains(needle), "{e}");
        }
    }

    #[test]
    fn the_file_is_strict_and_errors_name_it() {
        let dir = std::env::temp_dir().join(format!("sw-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("broker.toml");
        std::fs::write(
            &f,
            "[scale]\nmax_nodes = 3\nhold = \"30s\"\n[node]\nvcpu = 4\nmemMiB = 8192\n",
        )
        .unwrap();
        let c = Config::load(Some(&f), |_| None).unwrap();
        assert_eq!(
            (c.scale.max_nodes, c.node.vcpu, c.node.mem_mib),
            (3, 4, 8192)
        );
        std::fs::write(&f, "[scale]\nmax_nodse = 3\n").unwrap();
        let e = Config::load(Some(&f), |_| None).unwrap_err();
        assert!(e.problem.contains("max_nodse"), "{e}");
        std::fs::write(&f, "[scale]\nmax_nodes = 0\n").unwrap();
        assert_eq!(
            Config::load(Some(&f), |_| None).unwrap_err().source_name,
            "scale.max_nodes"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

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

    #[test]
    fn ipv6_addresses_must_be_reachable_and_make_the_front_listen_on_both_families() {
        let dir = std::env::temp_dir().join(format!("sw-cfg6-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("broker.toml");
        let load = |text: &str| {
            std::fs::write(&f, text).unwrap();
            Config::load(Some(&f), |_| None)
        };
        let c = load("service_addr_v6 = \"2001:db8::1\"\n").unwrap();
        assert_eq!(c.advertised_addr_v6(), Some("2001:db8::1".parse().unwrap()));
        assert_eq!(c.front_bind(), "[::]:8443".parse().unwrap());
        let c = load("service_addr_v6 = \"2001:db8::1\"\n[front]\nlisten = \"192.0.2.1:443\"\n");
        assert_eq!(c.unwrap().front_bind(), "192.0.2.1:443".parse().unwrap());
        assert_eq!(
            Config::default().front_bind(),
            "0.0.0.0:8443".parse().unwrap()
        );
        for bad in ["::", "::1", "fe80::1", "ff02::1"] {
            let e = load(&format!("service_addr_v6 = \"{bad}\"\n")).unwrap_err();
            assert_eq!(e.source_name, "service_addr_v6", "{bad}: {e}");
            assert!(e.problem.contains(bad), "{e}");
        }
        let e = load("advertise_addr_v6 = \"2001:db8::9\"\n").unwrap_err();
        assert_eq!(e.source_name, "advertise_addr_v6", "{e}");
        let c = load("service_addr_v6 = \"fd00::1\"\nadvertise_addr_v6 = \"2001:db8::9\"\n");
        assert_eq!(
            c.unwrap().advertised_addr_v6(),
            Some("2001:db8::9".parse().unwrap())
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
