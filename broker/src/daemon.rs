//! `socialweb-broker run`: the operator's one daemon, and its composition root. [`Daemon::start`]
//! builds each subsystem from its own section of the configuration -- the store, the market
//! (the embedded provider unless a market URL is configured), the metrics endpoint, the mesh
//! relay, the way in (certificate records, the front, the DID resolver), the provisioner, and
//! the services the front doors call -- wires them, and resumes every cluster. [`Daemon::shutdown`]
//! stops them in order. Nothing else happens here.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use socialweb_broker_core::provision::Limits;
use socialweb_broker_core::scale::Knobs;
use socialweb_provider::{Listen, Provider, ProviderConfig};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::access::records::Records;
use crate::access::service::{Access, FrontAddress};
use crate::api::Gateway;
use crate::auth::did::Resolver;
use crate::cluster::{ClusterSettings, Clusters};
use crate::config::Config;
use crate::fleet_host::FleetHost;
use crate::front::Front;
use crate::market::{Market, MarketClient, Transport};
use crate::metrics::{Metrics, check};
use crate::provision::{OnChange, Provisioner, Settings};
use crate::relay::gate::Gate;
use crate::relay::{self, Allow};
use crate::services::Services;
use crate::store::Store;
use crate::tunnel::{TunnelSettings, Tunnels};

/// The running daemon.
#[derive(Debug)]
pub struct Daemon {
    services: Services,
    store: Store,
    provider: Option<Provider>,
    stop: CancellationToken,
    /// A fleet host's lease watchdog ([`crate::watchdog`]), killed with the daemon.
    _watchdog: Option<tokio::process::Child>,
}

fn broker_id(state_dir: &std::path::Path) -> Result<String> {
    let path = state_dir.join("broker-id");
    if let Ok(id) = std::fs::read_to_string(&path) {
        return Ok(id.trim().to_string());
    }
    let id = uuid::Uuid::new_v4().to_string();
    socialweb_proc::owner_only::write_atomic(&path, format!("{id}\n").as_bytes())
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(id)
}

/// The embedded provider's configuration: the `[local_provider]` section, the node size it
/// offers (and nothing larger), and where it keeps its records.
pub fn provider_config(cfg: &Config) -> ProviderConfig {
    let lp = &cfg.local_provider;
    ProviderConfig {
        dir: cfg.state_dir.join("local-provider"),
        capacity: lp.capacity,
        shapes: if lp.shapes.is_empty() {
            vec![socialweb_market::Shape {
                spec: cfg.node.into(),
                price_micros_per_hour: 0,
            }]
        } else {
            lp.shapes.iter().map(|s| (*s).into()).collect()
        },
        subnet: lp.subnet,
        prefix: lp.prefix.clone(),
        agent: lp.agent.clone(),
        kube_dir: cfg.kube_dir.clone(),
        cni_bin_dir: lp.cni_bin_dir.clone(),
        seed_images: lp.seed_images.clone(),
        kubelet_config_patch: lp.kubelet_config_patch.clone(),
        image: lp.image.clone(),
        machine: match lp.machine {
            crate::config::MachineKind::Namespace => socialweb_provider::MachineKind::Namespace,
            crate::config::MachineKind::Vm => {
                socialweb_provider::MachineKind::Vm(socialweb_provider::VmSettings {
                    accel: lp.vm.accel,
                    boot_timeout: lp.vm.boot_timeout,
                    qemu: lp.vm.qemu.clone(),
                    qemu_img: lp.vm.qemu_img.clone(),
                    tcg_as_vm: lp.vm.tcg_as_vm,
                    egress_allow: lp.vm.egress_allow.clone(),
                    jail: lp.vm.jail,
                })
            }
        },
        name: "local".into(),
        topology: socialweb_market::Topology {
            region: lp.region.clone(),
            zone: lp.zone.clone(),
        },
    }
}

fn check_kube_dir(cfg: &Config) -> Result<()> {
    for f in ["kube", "pause"] {
        let p = cfg.kube_dir.join(f);
        if !p.is_file() {
            bail!(
                "kube_dir: {} is missing (the Kubernetes we ship: image-builder/kubernetes/build.sh prints where it is)",
                p.display()
            );
        }
    }
    // Checked at the start, not at the first create: the default datastore must be there.
    if cfg.clusters.datastore.uses_kine() && !cfg.clusters.kine_binary.is_file() {
        bail!(
            "clusters.kine_binary: {} is not a file, and clusters.datastore is {} (image-builder/kine/build.sh builds it; or set clusters.datastore = \"etcd\")",
            cfg.clusters.kine_binary.display(),
            cfg.clusters.datastore.as_str()
        );
    }
    Ok(())
}

/// The market: the configured providers, or the embedded one (named `local`), over HTTP
/// either way.
async fn market(cfg: &Config, stop: &CancellationToken) -> Result<(Market, Option<Provider>)> {
    let timeout = cfg.market.request_timeout;
    if cfg.providers().is_empty() {
        // The embedded provider: an owner-only socket, no port.
        let provider = Provider::start(provider_config(cfg))?;
        let socket = embedded_socket(cfg);
        socialweb_provider::serve(provider.clone(), Listen::Unix(socket.clone()), stop.clone())
            .await?;
        let c = MarketClient::new("http://local-provider/", timeout, Transport::Unix(socket))
            .map_err(anyhow::Error::msg)?;
        return Ok((Market::new(vec![("local".into(), c)]), Some(provider)));
    }
    let me = market_identity(cfg)?;
    let mut clients = Vec::new();
    let mut topology = std::collections::HashMap::new();
    for p in cfg.providers() {
        let transport = match &p.pin {
            Some(pin) => Transport::Pinned(Box::new(socialweb_market_tls::client_config(
                &me,
                socialweb_market_tls::parse_pin(pin)?,
            )?)),
            None => Transport::Plain,
        };
        let c = MarketClient::new(&p.url, timeout, transport).map_err(anyhow::Error::msg)?;
        info!(provider = %p.name, url = %p.url, pin = p.pin.as_deref().unwrap_or("-"), "market provider");
        topology.insert(
            p.name.clone(),
            socialweb_market::Topology {
                region: p.region.clone(),
                zone: p.zone.clone(),
            },
        );
        clients.push((p.name, c));
    }
    Ok((Market::new(clients).with_topology(topology), None))
}

/// Where the embedded provider serves the broker.
pub fn embedded_socket(cfg: &Config) -> PathBuf {
    cfg.state_dir.join("run/provider.sock")
}

fn market_tls_dir(cfg: &Config) -> PathBuf {
    cfg.state_dir.join("market-tls")
}

fn provider_tls_dir(cfg: &Config) -> PathBuf {
    cfg.state_dir.join("provider-tls")
}

fn front_dir(cfg: &Config) -> PathBuf {
    cfg.state_dir.join("front")
}

fn clusters_dir(cfg: &Config) -> PathBuf {
    cfg.state_dir.join("clusters")
}

/// Where a broker (or a provider machine) run with a configuration keeps its files, as
/// `socialweb-broker paths --json` prints them: the daemon uses these same paths.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Paths {
    pub state_dir: PathBuf,
    /// The operator's control socket.
    pub ctl_socket: PathBuf,
    /// The store's URL.
    pub store: String,
    /// Under it, a directory per cluster (`cluster show --json` names each: `cluster.dir`).
    pub clusters: PathBuf,
    /// The front's self-made CA, which kubeconfigs carry; none when `front.tls_cert` is the
    /// operator's.
    pub front_ca: Option<PathBuf>,
    /// The broker's certificate and key towards providers (`market-pin` prints its pin).
    pub market_cert: PathBuf,
    pub market_key: PathBuf,
    /// A provider machine's certificate (`provider-pin` prints its pin).
    pub provider_cert: PathBuf,
    /// The embedded provider's owner-only socket (when no provider is configured).
    pub provider_socket: PathBuf,
    /// The local provider's records: every RFP, every lease and the machine that is its node.
    pub provider_records: PathBuf,
    /// The local provider's machines: `<this>/<lease id>` each (the agent's log and socket).
    pub provider_nodes: PathBuf,
}

/// The paths of a broker or provider machine configured by `cfg`.
pub fn paths(cfg: &Config) -> Paths {
    let (market_cert, market_key) = socialweb_market_tls::Identity::files(&market_tls_dir(cfg));
    let provider = provider_config(cfg);
    Paths {
        state_dir: cfg.state_dir.clone(),
        ctl_socket: cfg.ctl_socket.clone(),
        store: cfg.store_url(),
        clusters: clusters_dir(cfg),
        front_ca: cfg
            .front
            .tls_cert
            .is_none()
            .then(|| crate::front::tls::self_made_ca(&front_dir(cfg))),
        market_cert,
        market_key,
        provider_cert: socialweb_market_tls::Identity::files(&provider_tls_dir(cfg)).0,
        provider_socket: embedded_socket(cfg),
        provider_records: provider.records(),
        provider_nodes: provider.nodes_dir(),
    }
}

/// The broker's key towards providers (`<state_dir>/market-tls`), made on first use; its pin
/// is what providers list (`socialweb-broker market-pin`).
pub fn market_identity(cfg: &Config) -> Result<socialweb_market_tls::Identity> {
    socialweb_proc::owner_only::dir(&cfg.state_dir)?;
    Ok(socialweb_market_tls::Identity::load_or_create(
        &market_tls_dir(cfg),
        &[],
    )?)
}

/// A provider machine's key (`<state_dir>/provider-tls`), made on first use for the address
/// it listens on; its pin is what brokers name (`socialweb-broker provider-pin`).
pub fn provider_identity(cfg: &Config) -> Result<socialweb_market_tls::Identity> {
    socialweb_proc::owner_only::dir(&cfg.state_dir)?;
    Ok(socialweb_market_tls::Identity::load_or_create(
        &provider_tls_dir(cfg),
        &[cfg.local_provider.listen.ip().to_string()],
    )?)
}

/// The front's TLS material: the serving chain and key (the operator's, or from the broker's
/// own front CA), and that CA when it is the broker's (kubeconfigs and identities carry it).
struct FrontTls {
    /// Shared by the front and the relay; reloaded when the operator's files change.
    serving: Arc<crate::front::cert::ServingCert>,
    ca_pem: Option<String>,
}

impl FrontTls {
    fn load(cfg: &Config) -> Result<FrontTls> {
        let (serving, ca_pem) = crate::front::tls::serving(
            cfg.front.tls_cert.as_deref(),
            cfg.front.tls_key.as_deref(),
            &front_dir(cfg),
            &front_names(cfg),
            cfg.certificates.lifetimes(),
        )?;
        Ok(FrontTls { serving, ca_pem })
    }

    /// The front's own certificate (not the operator's) issued again while the broker runs.
    fn keep_renewed(&self, cfg: &Config, metrics: &Metrics, stop: &CancellationToken) {
        if self.ca_pem.is_some() {
            crate::front::tls::keep_own_renewed(
                front_dir(cfg),
                front_names(cfg),
                cfg.certificates.lifetimes(),
                metrics.certificates.clone(),
                stop.clone(),
            );
        }
    }

    fn ca_der(&self) -> Result<Option<Vec<u8>>> {
        self.ca_pem
            .as_deref()
            .map(|pem| {
                Ok(socialweb_wire::ca::certificates(pem.as_bytes())
                    .map_err(anyhow::Error::msg)?
                    .remove(0)
                    .der)
            })
            .transpose()
    }
}

/// The relay (HTTPS with the front's certificate, QUIC address discovery beside it),
/// admitting the live nodes of every cluster and the broker's tunnel endpoint, and no one
/// else; returns its URL for nodes (at the advertised address), its URL on this host (for
/// the broker's own endpoint, which may not reach the advertised address from inside: a
/// 1:1 NAT seldom hairpins) and its allow list.
async fn relay(
    cfg: &Config,
    tls: &FrontTls,
    metrics: &Metrics,
    stop: &CancellationToken,
) -> Result<(url::Url, url::Url, Allow)> {
    let allow = Allow::only([]);
    let addr = SocketAddr::new(IpAddr::V4(cfg.service_addr), cfg.relay.port);
    let quic = (cfg.relay.quic_port != 0)
        .then(|| SocketAddr::new(IpAddr::V4(cfg.service_addr), cfg.relay.quic_port));
    let server_config = crate::front::tls::relay_config(tls.serving.clone())?;
    let gate = Gate::new(
        relay_limits(&cfg.relay),
        Arc::new(GateMetrics(metrics.relay_gate.clone())),
    );
    let server = relay::serve_tls(addr, server_config, quic, allow.clone(), gate).await?;
    let stop = stop.clone();
    tokio::spawn(async move {
        stop.cancelled().await;
        let _ = server.shutdown().await;
    });
    let advertised = SocketAddr::new(IpAddr::V4(cfg.advertised_addr()), cfg.relay.port);
    let url = |a: SocketAddr| -> Result<url::Url> {
        format!("https://{a}").parse().context("the relay's URL")
    };
    Ok((url(advertised)?, url(addr)?, allow))
}

/// The relay gate's bounds, from `[relay]`.
pub fn relay_limits(r: &crate::config::Relay) -> relay::gate::Limits {
    relay::gate::Limits {
        max_connections: r.max_connections,
        max_per_source: r.max_connections_per_source,
        handshake_timeout: r.handshake_timeout,
        idle_timeout: r.idle_timeout,
    }
}

/// The relay's gate counted in the broker's metrics (the relay, an edge, knows no metrics).
struct GateMetrics(crate::metrics::RelayGate);

impl relay::gate::Observe for GateMetrics {
    fn held(&self, admitted: bool) {
        self.0.held(admitted);
    }

    fn refused(&self, why: relay::gate::Refusal) {
        self.0.refused(why.as_str());
    }

    fn cut(&self, why: relay::gate::Cut) {
        self.0.cut(why.as_str());
    }
}

/// The callback that keeps the relay's allow list, the tunnel's links and the
/// provisions' gauges in line with the store whenever a provision changes.
fn on_change(store: &Store, metrics: &Metrics, allow: Allow, tunnels: Tunnels) -> OnChange {
    let (store, metrics) = (store.clone(), metrics.clone());
    let refresh = move || {
        let (store, allow, metrics, tunnels) = (
            store.clone(),
            allow.clone(),
            metrics.clone(),
            tunnels.clone(),
        );
        tokio::spawn(async move {
            if let Ok(all) = store.provisions(None).await {
                let gauge = &metrics.live_provisions;
                metrics.provisions(
                    &all.iter()
                        .filter(|p| p.state.live())
                        .cloned()
                        .collect::<Vec<_>>(),
                );
                let live: Vec<iroh::EndpointId> = all
                    .iter()
                    .filter(|p| p.state.live())
                    .filter_map(|p| p.endpoint.parse().ok())
                    .collect();
                gauge.set(live.len() as i64);
                allow.set(live.iter().copied().chain([tunnels.id()]));
                tunnels.retain(&live);
            }
        });
    };
    refresh();
    OnChange(Box::new(refresh))
}

/// The market, its calls counted by provider and call (and failures by kind).
fn observed(market: Market, metrics: &Metrics) -> Market {
    let m = metrics.clone();
    market.observed(move |provider, call, failed| m.market_call(provider, call, failed))
}

/// The checks of `/healthz` and `/readyz` known at start (docs/operations.md): the store
/// answers a query, the embedded provider's loop turns and it takes leases, and every cluster
/// was resumed (`resumed`). The front's is added once it listens ([`front_check`]).
fn health_checks(
    metrics: &Metrics,
    store: &Store,
    provider: Option<&Provider>,
    resumed: Arc<AtomicBool>,
) {
    let h = &metrics.health;
    let s = store.clone();
    h.ready(
        "store",
        check(move || {
            let s = s.clone();
            async move {
                let t = std::time::Instant::now();
                match s.ping().await {
                    Ok(()) => Ok(format!(
                        "{} answered in {} ms",
                        s.backend(),
                        t.elapsed().as_millis()
                    )),
                    Err(e) => Err(format!("{e:#}")),
                }
            }
        }),
    );
    if let Some(p) = provider {
        let (a, r) = (p.clone(), p.clone());
        h.live(
            "local-provider-loop",
            check(move || std::future::ready(a.alive())),
        );
        h.ready(
            "local-provider",
            check(move || std::future::ready(r.ready())),
        );
    }
    h.ready(
        "clusters",
        check(move || {
            std::future::ready(if resumed.load(Ordering::Relaxed) {
                Ok("every cluster resumed".to_string())
            } else {
                Err("resuming the clusters (their control planes start, their leases are reconciled)".to_string())
            })
        }),
    );
}

/// `/readyz`'s front check: the front's port accepts a TCP connection.
fn front_check(metrics: &Metrics, bound: SocketAddr) {
    let mut at = bound;
    if at.ip().is_unspecified() {
        at.set_ip(if at.is_ipv4() {
            IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)
        } else {
            IpAddr::V6(std::net::Ipv6Addr::LOCALHOST)
        });
    }
    metrics.health.ready(
        "front",
        check(move || async move {
            match tokio::net::TcpStream::connect(at).await {
                Ok(_) => Ok(format!("accepting connections on {bound}")),
                Err(e) => Err(format!("{at}: {e}")),
            }
        }),
    );
}

/// The front's serving certificate names: the host of its public URL, the service addresses
/// (both families), loopback, and the configured extra names.
fn front_names(cfg: &Config) -> Vec<String> {
    let mut names: Vec<String> = url::Url::parse(&cfg.front_url())
        .ok()
        .and_then(|u| u.host_str().map(|h| h.trim_matches(['[', ']']).to_string()))
        .into_iter()
        .chain([
            cfg.service_addr.to_string(),
            cfg.advertised_addr().to_string(),
            "127.0.0.1".into(),
            "localhost".into(),
        ])
        .chain(cfg.service_addr_v6.iter().map(|a| a.to_string()))
        .chain(cfg.advertised_addr_v6().map(|a| a.to_string()))
        .chain(cfg.front.names.iter().cloned())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The gateway API: the services users call, under the access section's rate limits.
fn gateway(
    cfg: &Config,
    store: &Store,
    services: Services,
    metrics: crate::metrics::Metrics,
) -> Result<Arc<Gateway>> {
    Ok(Arc::new(Gateway {
        services,
        service_did: cfg.service_did(),
        public_url: cfg.front_url(),
        resolver: resolver(cfg)?,
        store: store.clone(),
        rates: crate::api::limits::Rates::new(crate::api::limits::RateSettings {
            per_source_per_minute: cfg.access.requests_per_minute_per_source,
            per_did_per_minute: cfg.access.requests_per_minute_per_did,
            creates_per_did_per_hour: cfg.access.creates_per_hour_per_did,
        }),
        metrics,
    }))
}

fn resolver(cfg: &Config) -> Result<Resolver> {
    let mut roots = Vec::new();
    for (i, p) in cfg.front.did_web_roots.iter().enumerate() {
        roots.push(
            std::fs::read(p)
                .with_context(|| format!("front.did_web_roots[{i}]: reading {}", p.display()))?,
        );
    }
    Resolver::new(
        &cfg.front.plc_directory,
        &roots,
        &cfg.front.did_web_nameservers,
    )
}

/// What RFPs name the node image by: `market.image` (a directory's fingerprint, read from
/// its `nodeimage.json`, or a fingerprint or name as given), else the embedded provider's
/// image, else `local` (a provider's own binaries).
fn rfp_image(cfg: &Config) -> Result<String> {
    let dir = match (&cfg.market.image, &cfg.local_provider.image) {
        (Some(i), _) if !std::path::Path::new(i).join("nodeimage.json").is_file() => {
            return Ok(i.clone());
        }
        (Some(i), _) => std::path::PathBuf::from(i),
        (None, Some(dir)) => dir.clone(),
        (None, None) => return Ok("local".into()),
    };
    let file = dir.join("nodeimage.json");
    let v: serde_json::Value = serde_json::from_slice(
        &std::fs::read(&file)
            .with_context(|| format!("market.image: reading {}", file.display()))?,
    )
    .with_context(|| format!("market.image: parsing {}", file.display()))?;
    v["fingerprint"]
        .as_str()
        .map(str::to_string)
        .with_context(|| format!("market.image: {} has no fingerprint", file.display()))
}

/// The provisioner's settings: the `[market]` and `[node]` sections, the relay and the
/// tunnel endpoint, the clusters' resolvers, the node image.
fn provision_settings(
    cfg: &Config,
    relay_url: url::Url,
    relay_ca: Option<String>,
    tunnels: &Tunnels,
) -> Result<Settings> {
    Ok(Settings {
        limits: Limits::new(cfg.market.bid_deadline, cfg.market.boot_timeout),
        node: cfg.node,
        image: rfp_image(cfg)?,
        relay_url,
        relay_ca,
        tunnel: broker_endpoint(cfg, tunnels),
        upstream_resolvers: cfg
            .clusters
            .upstream_resolvers
            .iter()
            .filter_map(|r| socialweb_wire::identity::parse_resolver(r))
            .collect(),
        expendable_cutoff: cfg.scale.expendable_priority_cutoff,
        isolation: cfg.market.isolation,
    })
}

/// The host ready for the daemon: its state directory owner-only, the Kubernetes we ship
/// there, the service addresses on `lo`.
fn host_ready(cfg: &Config) -> Result<()> {
    socialweb_proc::owner_only::dir(&cfg.state_dir).with_context(|| {
        format!(
            "creating the state directory {} (owner-only)",
            cfg.state_dir.display()
        )
    })?;
    check_kube_dir(cfg)?;
    crate::host::ensure_service_addr(cfg.service_addr)
        .with_context(|| format!("putting the service address {} on lo", cfg.service_addr))?;
    if let Some(v6) = cfg.service_addr_v6 {
        crate::host::ensure_service_addr_v6(v6)
            .with_context(|| format!("putting service_addr_v6 {v6} on lo"))?;
    }
    Ok(())
}

/// The id the leases this broker rents are tagged with: its own `id`, or in a fleet the
/// fleet's, once the fleet's key towards providers is shared (any host of a fleet
/// reconciles and releases the leases another rented).
async fn renter(cfg: &Config, id: &str, fleet: Option<&FleetHost>) -> Result<String> {
    let Some(f) = fleet else {
        return Ok(id.to_string());
    };
    let (cert, key) = socialweb_market_tls::Identity::files(&market_tls_dir(cfg));
    f.share_market_key(
        &cert,
        &key,
        || market_identity(cfg).map(|_| ()),
        || market_identity(cfg),
    )
    .await
}

/// The nodes' way to their control planes: the tunnel endpoint on the service addresses,
/// with the local relay beside it.
async fn tunnels(
    cfg: &Config,
    tls: &FrontTls,
    relay_url: url::Url,
    store: &Store,
    stop: &CancellationToken,
) -> Result<Tunnels> {
    Tunnels::start(
        &TunnelSettings {
            bind: SocketAddr::new(IpAddr::V4(cfg.service_addr), cfg.tunnel.port),
            bind_v6: cfg
                .service_addr_v6
                .map(|a| SocketAddr::new(IpAddr::V6(a), cfg.tunnel.port)),
            relay_url,
            relay_ca: tls.ca_der()?,
            key_file: cfg.state_dir.join("tunnel.key"),
        },
        store.clone(),
        stop.clone(),
    )
    .await
}

/// This host's tunnel endpoint, as nodes' identities name it.
fn broker_endpoint(cfg: &Config, tunnels: &Tunnels) -> socialweb_wire::BrokerEndpoint {
    socialweb_wire::BrokerEndpoint {
        endpoint: *tunnels.id().as_bytes(),
        addrs: std::iter::once(IpAddr::V4(cfg.advertised_addr()))
            .chain(cfg.advertised_addr_v6().map(IpAddr::V6))
            .map(|a| SocketAddr::new(a, cfg.tunnel.port))
            .collect(),
    }
}

/// What the way in is built from: the daemon's parts made before it.
struct Parts<'a> {
    store: &'a Store,
    id: &'a str,
    metrics: &'a Metrics,
    provisioner: Arc<Provisioner>,
    tunnels: Tunnels,
    tls: FrontTls,
    relay_url: url::Url,
    fleet: Option<FleetHost>,
}

/// What `backup`, `restore` and the scheduled backups read: where the daemon keeps its
/// files ([`paths`]), and what of it is not state.
pub fn backup_layout(cfg: &Config) -> crate::backup::Layout {
    let p = paths(cfg);
    crate::backup::Layout {
        skip: vec![
            p.provider_nodes.clone(),
            p.provider_socket.clone(),
            p.ctl_socket.clone(),
        ],
        state_dir: p.state_dir,
        store: p.store,
        clusters: p.clusters,
        kube: cfg.kube_dir.join("kube"),
    }
}

/// The disk guard of the state directory (`[disk]`), sampling it for the metrics until
/// `stop`.
fn disk_guard(
    cfg: &Config,
    metrics: &crate::metrics::Metrics,
    stop: &CancellationToken,
) -> Arc<crate::disk::DiskGuard> {
    let disk = Arc::new(crate::disk::DiskGuard::new(
        cfg.state_dir.clone(),
        cfg.disk.floor(),
        metrics.disk.clone(),
    ));
    tokio::spawn(disk.clone().watch(stop.clone()));
    disk
}

/// The front listener's bounds, from `[front]`.
fn front_limits(cfg: &Config) -> crate::front::listener::Limits {
    let f = &cfg.front;
    crate::front::listener::Limits {
        max_connections: f.max_connections,
        max_per_source: f.max_connections_per_source,
        handshake_timeout: f.handshake_timeout,
        header_read_timeout: f.header_read_timeout,
        idle_timeout: f.idle_timeout,
        h2_keepalive: Duration::from_secs(30),
        body: crate::front::body::Pace {
            timeout: f.body_read_timeout,
            min_bytes_per_sec: f.min_body_bytes_per_sec,
        },
    }
}

fn cluster_settings(
    cfg: &Config,
    host: &str,
    disk: Arc<crate::disk::DiskGuard>,
    metrics: &Metrics,
) -> Result<ClusterSettings> {
    Ok(ClusterSettings {
        host: host.to_string(),
        disk,
        metrics: metrics.clone(),
        schedulers: cfg.scale.schedulers.clone().into(),
        certificates: cfg.certificates.lifetimes(),
        dir: clusters_dir(cfg),
        kube: cfg.kube_dir.join("kube"),
        port_base: cfg.clusters.port_base,
        port_count: cfg.clusters.port_count,
        max_per_did: cfg.access.max_clusters_per_did,
        max_total: cfg.access.max_clusters,
        namespace_nodes: cfg.market.isolation == socialweb_market::Isolation::Namespace,
        isolate_operators_clusters: cfg.clusters.isolate_operators_clusters,
        hibernate_after: cfg.clusters.hibernate_after,
        datastore: cfg.clusters.datastore,
        kine_binary: cfg.clusters.kine_binary.clone(),
        postgres: cfg
            .clusters_postgres_url()
            .map(|u| crate::control_plane::postgres::Server::new(&u))
            .transpose()?,
        seal_key: cfg.store.seal_key()?,
        fleet: cfg
            .fleet
            .enabled
            .then(|| socialweb_broker_core::ownership::Timing::new(cfg.fleet.lease_ttl)),
        drain_marker: cfg.state_dir.join("drained"),
        max_awake: cfg.fleet.max_awake,
        gogc: cfg.clusters.gogc,
        budget: cfg.clusters.budget(),
        cgroup_parent: cfg.clusters.cgroup_parent.parent(),
        datastore_quota: cfg.clusters.datastore_quota(),
        webhook_egress_allow: cfg.clusters.webhook_egress_allow(),
        knobs: Knobs {
            max_nodes: cfg.scale.max_nodes,
            pods_per_node: cfg.scale.pods_per_node,
            hold: cfg.scale.hold,
            expendable_priority_cutoff: cfg.scale.expendable_priority_cutoff,
            node: cfg.node,
            max_hold: cfg.scale.max_consolidate_after,
        },
    })
}

impl Daemon {
    /// Starts everything but the control socket.
    pub async fn start(cfg: Config) -> Result<Arc<Daemon>> {
        crate::crypto_provider();
        host_ready(&cfg)?;
        let store = Store::open(&cfg.store_url()).await?;
        info!(backend = store.backend(), "store open");
        let id = broker_id(&cfg.state_dir)?;
        let fleet = FleetHost::of(&cfg, &store)?;
        // Before any control plane runs under a lease: it watches their deadlines.
        let watchdog = fleet
            .is_some()
            .then(|| crate::watchdog::spawn(&clusters_dir(&cfg)))
            .transpose()?;
        let stop = CancellationToken::new();
        let renter = renter(&cfg, &id, fleet.as_ref()).await?;
        let (market, provider) = market(&cfg, &stop).await?;
        let metrics = Metrics::default();
        let metrics_addr = metrics.serve(cfg.metrics.listen, stop.clone()).await?;
        info!(%metrics_addr, broker = %id, "metrics at /metrics, /healthz, /readyz");
        let resumed = Arc::new(AtomicBool::new(false));
        health_checks(&metrics, &store, provider.as_ref(), resumed.clone());
        if let Some(f) = &fleet {
            f.share_front_ca(&front_dir(&cfg)).await?;
        }
        let tls = FrontTls::load(&cfg)?;
        let (relay_url, local_relay_url, allow) = relay(&cfg, &tls, &metrics, &stop).await?;
        let tunnels = tunnels(&cfg, &tls, local_relay_url, &store, &stop).await?;
        if let Some(f) = &fleet {
            f.follow_relay_clients(allow.clone(), tunnels.id(), &stop);
        }
        let provisioner = Arc::new(Provisioner::new(
            provision_settings(&cfg, relay_url.clone(), tls.ca_pem.clone(), &tunnels)?,
            store.clone(),
            observed(market, &metrics),
            renter,
            metrics.clone(),
            on_change(&store, &metrics, allow, tunnels.clone()),
        ));
        let services = Self::way_in(
            &cfg,
            Parts {
                store: &store,
                id: &id,
                metrics: &metrics,
                provisioner: provisioner.clone(),
                tunnels,
                tls,
                relay_url,
                fleet,
            },
            &stop,
        )
        .await?;
        sweep(&provisioner).await;
        services.clusters.resume().await?;
        resumed.store(true, Ordering::Relaxed);
        crate::backup_schedule::spawn(backup_layout(&cfg), &cfg.backup, &metrics, &stop);
        Ok(Arc::new(Daemon {
            services,
            store,
            provider,
            stop,
            _watchdog: watchdog,
        }))
    }

    /// The way in: the certificate records, the front's TLS, the access and cluster services,
    /// the gateway API on the front.
    async fn way_in(cfg: &Config, parts: Parts<'_>, stop: &CancellationToken) -> Result<Services> {
        let Parts {
            store,
            id,
            metrics,
            provisioner,
            tunnels,
            tls,
            relay_url,
            fleet,
        } = parts;
        let records = Arc::new(Records::new(store.certificates().await?));
        tls.serving.watch(stop.clone());
        tls.keep_renewed(cfg, metrics, stop);
        let server_tls = crate::front::tls::server_config(tls.serving.clone())?;
        let disk = disk_guard(cfg, metrics, stop);
        let front = Arc::new(
            Front::new(records.clone(), cfg.front_url(), metrics.clone())
                .with_max_streams_per_certificate(cfg.front.max_streams_per_certificate)
                .with_disk_guard(disk.clone()),
        );
        let access = Arc::new(Access::new(
            store.clone(),
            records.clone(),
            FrontAddress {
                public_url: cfg.front_url(),
                ca_pem: tls.ca_pem,
            },
        ));
        let fleet_tunnels = tunnels.clone();
        let endpoint = broker_endpoint(cfg, &tunnels);
        let clusters = Arc::new(Clusters::new(
            cluster_settings(cfg, id, disk, metrics)?,
            store.clone(),
            provisioner.clone(),
            front.clone(),
            access.clone(),
            tunnels,
            stop.clone(),
        ));
        let policy = Arc::new(crate::access::registration::Policy {
            registration: cfg.access.registration,
            allowed: cfg.access.allowed_dids.iter().cloned().collect(),
            tenants_trusted: cfg.access.tenants_trusted,
            isolation: cfg.market.isolation,
            store: store.clone(),
        });
        if let Err(e) = policy.serving() {
            warn!("the gateway API refuses users: {e}");
        }
        let services = Services::new(clusters, access, policy, provisioner);
        let gateway = gateway(cfg, store, services.clone(), metrics.clone())?;
        spawn_sweeps(gateway.clone(), stop.clone());
        let api = crate::api::router(gateway);
        let bound = crate::front::serve(
            cfg.front_bind(),
            server_tls,
            front_limits(cfg),
            front.clone(),
            api,
            stop.clone(),
        )
        .await?;
        front_check(metrics, bound);
        let joining = crate::fleet_host::Joining {
            id,
            front: &front,
            records,
            tunnels: fleet_tunnels,
            tunnel: &endpoint,
            relay: &relay_url,
            limits: front_limits(cfg),
        };
        if let Some(f) = &fleet {
            f.join(joining, stop).await?;
        }
        Ok(services)
    }

    /// What the front doors call (the control socket is served with these).
    pub fn services(&self) -> Services {
        self.services.clone()
    }

    /// Stops every cluster's driver and control plane; nodes keep running and their leases
    /// stay (the next start picks them up).
    pub async fn shutdown(&self) {
        self.services.clusters.shutdown().await;
        if let Some(p) = &self.provider {
            p.stop();
        }
        self.stop.cancel();
        self.store.close().await;
        info!("broker stopped");
    }
}

/// Every minute: spent nonces of expired tokens, records of certificates expired a day ago
/// (the front refuses them by their expiry anyway), idle rate-limit keys.
fn spawn_sweeps(g: Arc<Gateway>, stop: CancellationToken) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(60));
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.cancelled() => return,
            }
            let now = socialweb_broker_core::millis(std::time::SystemTime::now());
            match g.store.sweep(now, now - 24 * 3600 * 1000).await {
                Ok((n, c)) if n + c > 0 => {
                    tracing::debug!(nonces = n, certificates = c, "swept");
                    if c > 0 {
                        g.services.access.purge_expired(now - 24 * 3600 * 1000);
                    }
                }
                Ok(_) => {}
                Err(e) => warn!("sweeping nonces and expired certificates: {e:#}"),
            }
            g.rates.sweep();
        }
    });
}

/// At start, before any cluster runs: the core's reconcile over every lease this broker has
/// at the provider, releasing the orphans. Each cluster's driver reconciles the rest.
async fn sweep(p: &Provisioner) {
    if p.reconcile(crate::provision::Scope::Broker, None)
        .await
        .is_none()
    {
        warn!("could not list the providers' leases at start; the clusters' own reconcile will");
    }
}

/// The standalone local provider (`socialweb-broker provider`): the same provider the daemon
/// embeds, as its own process.
pub async fn run_provider(cfg: Config, stop: CancellationToken) -> Result<()> {
    crate::crypto_provider();
    if cfg.local_provider.brokers.is_empty() {
        bail!(
            "local_provider.brokers: list the keys of the brokers this provider serves \
             (`socialweb-broker market-pin` on each broker's host prints its key); a provider \
             serves no one else"
        );
    }
    let me = provider_identity(&cfg)?;
    let brokers = cfg
        .local_provider
        .brokers
        .iter()
        .map(|p| socialweb_market_tls::parse_pin(p))
        .collect::<Result<Vec<_>, _>>()?;
    let tls = Arc::new(socialweb_market_tls::server_config(&me, brokers)?);
    let provider = Provider::start(provider_config(&cfg))?;
    let listen = Listen::Tls {
        addr: cfg.local_provider.listen,
        tls,
    };
    let bound = socialweb_provider::serve(provider.clone(), listen, stop.clone()).await?;
    info!(%bound, pin = %me.pin_text(), "local provider running");
    // Plain HTTP, for monitoring only: /healthz, /readyz, /metrics (docs/operations.md).
    socialweb_provider::serve(
        provider.clone(),
        Listen::Health(cfg.metrics.listen),
        stop.clone(),
    )
    .await?;
    stop.cancelled().await;
    provider.stop();
    Ok(())
}
