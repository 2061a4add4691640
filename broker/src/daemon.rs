//! `socialweb-broker run`: the operator's one daemon. It opens the store, starts the market
//! (the embedded local provider unless a market URL is configured), the mesh relay, the
//! metrics endpoint and the control socket, then runs every cluster: its control plane and
//! its scale driver. Clusters are created and deleted through [`Daemon::create_cluster`] and
//! [`Daemon::delete_cluster`] (the `cluster` commands; the gateway API calls the same).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, bail};
use serde::Serialize;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::access::records::Records;
use crate::auth::did::Resolver;
use crate::config::Config;
use crate::control_plane::runner::{self, PORT_PURPOSES, Ports, Running, Spec};
use crate::front::{Front, Mount};
use crate::market::client::MarketClient;
use crate::market::local::{self, Provider, ProviderConfig};
use crate::market::protocol::NodeSpec;
use crate::metrics::Metrics;
use crate::provision::{ClusterCtx, OnChange, Provisioner};
use crate::relay::{self, Allow};
use crate::store::{Step, Store};

/// A cluster's life as the daemon sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ClusterState {
    Starting { detail: String },
    Ready,
    Deleting,
    Failed { error: String },
}

#[derive(Debug)]
struct Handle {
    state: watch::Receiver<ClusterState>,
    /// Stops the driver and the control plane (shutdown: nothing is released).
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

/// What `cluster list` and `cluster create` answer.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterInfo {
    pub name: String,
    #[serde(flatten)]
    pub state: ClusterState,
    /// The apiserver (reachable from this host and from the nodes).
    pub server: String,
    /// The admin kubeconfig (owner-only).
    pub kubeconfig: PathBuf,
    /// Live nodes (rented or being rented).
    pub nodes: usize,
    /// The DID it belongs to (`None`: the operator's).
    pub owner: Option<String>,
}

/// The running daemon.
#[derive(Debug)]
pub struct Daemon {
    cfg: Config,
    store: Store,
    provisioner: Arc<Provisioner>,
    clusters: Mutex<HashMap<String, Handle>>,
    stop: CancellationToken,
    provider: Option<Provider>,
    front: Arc<Front>,
    resolver: Resolver,
}

/// A cluster name: a DNS label short enough that `<name>-<n>` node names stay labels.
pub fn valid_cluster_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 40
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "cluster name {name:?}: 1-40 characters of a-z, 0-9 and '-', not starting or ending with '-'"
        ))
    }
}

/// One TLS crypto provider for the process (ring, as kube's); with more than one linked in,
/// rustls refuses to guess.
pub fn crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn broker_id(state_dir: &std::path::Path) -> Result<String> {
    let path = state_dir.join("broker-id");
    if let Ok(id) = std::fs::read_to_string(&path) {
        return Ok(id.trim().to_string());
    }
    let id = uuid::Uuid::new_v4().to_string();
    std::fs::write(&path, format!("{id}\n"))
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(id)
}

impl Daemon {
    /// Starts everything but the control socket.
    pub async fn start(cfg: Config) -> Result<Arc<Daemon>> {
        crypto_provider();
        std::fs::create_dir_all(&cfg.state_dir)
            .with_context(|| format!("creating the state directory {}", cfg.state_dir.display()))?;
        for f in ["kube", "pause"] {
            let p = cfg.kube_dir.join(f);
            if !p.is_file() {
                bail!(
                    "kube_dir: {} is missing (the Kubernetes we ship: image-builder/kubernetes/build.sh prints where it is)",
                    p.display()
                );
            }
        }
        let store = Store::open(&cfg.store_url()).await?;
        info!(backend = store.backend(), "store open");
        let id = broker_id(&cfg.state_dir)?;
        let stop = CancellationToken::new();
        local::network::ensure_service_addr(cfg.service_addr)
            .with_context(|| format!("putting the service address {} on lo", cfg.service_addr))?;

        // The market: the configured provider, or the embedded local one, over HTTP either way.
        let (market_url, provider) = match &cfg.market.url {
            Some(u) => (u.clone(), None),
            None => {
                let lp = &cfg.local_provider;
                let provider = Provider::start(provider_config(&cfg))?;
                let bound = local::serve(provider.clone(), lp.listen, stop.clone()).await?;
                (format!("http://{bound}"), Some(provider))
            }
        };
        let market = MarketClient::new(&market_url, cfg.market.request_timeout)
            .map_err(anyhow::Error::msg)?;
        info!(market = %market_url, broker = %id, "market");

        let metrics = Metrics::default();
        let metrics_addr = metrics.serve(cfg.metrics.listen, stop.clone()).await?;
        info!(%metrics_addr, "metrics at /metrics");

        // The relay admits the live nodes of every cluster, and no one else.
        let allow = Allow::only([]);
        let relay_addr = std::net::SocketAddr::new(IpAddr::V4(cfg.service_addr), cfg.relay.port);
        let relay = relay::serve(relay_addr, allow.clone()).await?;
        let refresh = {
            let (store, allow, gauge) = (
                store.clone(),
                allow.clone(),
                metrics.live_provisions.clone(),
            );
            move || {
                let (store, allow, gauge) = (store.clone(), allow.clone(), gauge.clone());
                tokio::spawn(async move {
                    if let Ok(all) = store.provisions(None).await {
                        let live: Vec<_> = all.iter().filter(|p| p.state.live()).collect();
                        gauge.set(live.len() as i64);
                        allow.set(
                            live.iter()
                                .filter_map(|p| p.endpoint.parse::<iroh::EndpointId>().ok()),
                        );
                    }
                });
            }
        };
        refresh();
        // The way in: the certificate records, the front's TLS, the DID resolver.
        let records = Arc::new(Records::new(store.certificates().await?));
        let front_url = cfg.front_url();
        let mut names: Vec<String> = url::Url::parse(&front_url)
            .ok()
            .and_then(|u| u.host_str().map(|h| h.trim_matches(['[', ']']).to_string()))
            .into_iter()
            .chain([
                cfg.service_addr.to_string(),
                "127.0.0.1".into(),
                "localhost".into(),
            ])
            .chain(cfg.front.names.iter().cloned())
            .collect();
        names.sort();
        names.dedup();
        let (chain, key, front_ca) = crate::front::tls::serving(
            cfg.front.tls_cert.as_deref(),
            cfg.front.tls_key.as_deref(),
            &cfg.state_dir.join("front"),
            &names,
        )?;
        let tls = crate::front::tls::server_config(chain, key)?;
        let front = Arc::new(Front::new(records, front_ca, front_url));
        let mut roots = Vec::new();
        for (i, p) in cfg.front.did_web_roots.iter().enumerate() {
            roots.push(
                std::fs::read(p).with_context(|| {
                    format!("front.did_web_roots[{i}]: reading {}", p.display())
                })?,
            );
        }
        let resolver = Resolver::new(&cfg.front.plc_directory, &roots)?;
        let image = std::env::var("SOCIALWEB_BROKER_IMAGE").unwrap_or_else(|_| "local".into());
        let provisioner = Arc::new(Provisioner {
            cfg: cfg.clone(),
            store: store.clone(),
            market,
            broker_id: id,
            metrics,
            image,
            on_change: OnChange(Box::new(refresh)),
        });
        let d = Arc::new(Daemon {
            cfg,
            store,
            provisioner,
            clusters: Mutex::new(HashMap::new()),
            stop,
            provider,
            front,
            resolver,
        });
        let listen = d.cfg.front.listen;
        crate::front::serve(
            listen,
            tls,
            d.front.clone(),
            crate::api::router(d.clone()),
            d.stop.clone(),
        )
        .await?;
        // Keep the relay alive as long as the daemon.
        let stop_relay = d.stop.clone();
        tokio::spawn(async move {
            stop_relay.cancelled().await;
            let _ = relay.shutdown().await;
        });
        d.sweep_deleted_clusters().await;
        for c in d.store.clusters().await? {
            match c.state.as_str() {
                "deleting" => {
                    let d2 = d.clone();
                    tokio::spawn(async move {
                        if let Err(e) = d2.finish_delete(&c.name).await {
                            error!(cluster = %c.name, "finishing the deletion: {e:#}");
                        }
                    });
                }
                _ => d.spawn_cluster(&c.name),
            }
        }
        Ok(d)
    }

    /// Leases the provider holds for this broker's clusters that no longer exist (deleted
    /// while the broker was down, or a crash mid-delete) are released.
    async fn sweep_deleted_clusters(&self) {
        let p = &self.provisioner;
        let Ok(leases) = p.market.leases("broker", &p.broker_id).await else {
            warn!(
                "could not list the provider's leases at start; the clusters' own reconcile will"
            );
            return;
        };
        let names: Vec<String> = self
            .store
            .clusters()
            .await
            .unwrap_or_default()
            .into_iter()
            .map(|c| c.name)
            .collect();
        for l in leases.iter().filter(|l| l.state.live()) {
            if l.tags.get("cluster").is_none_or(|c| !names.contains(c)) {
                warn!(lease = %l.id, "a lease of a cluster that no longer exists; releasing it");
                p.metrics.orphan();
                let _ = p.market.release(&l.id).await;
            }
        }
    }

    fn spec(&self, name: &str, ports: Ports) -> Spec {
        Spec {
            cluster: name.to_string(),
            dir: self.cfg.state_dir.join("clusters").join(name),
            kube: self.cfg.kube_dir.join("kube"),
            bind: self.cfg.service_addr,
            ports,
        }
    }

    async fn ports(&self, name: &str) -> Result<Ports> {
        let svc = IpAddr::V4(self.cfg.service_addr);
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let leased = self
            .store
            .lease_ports(
                name,
                &PORT_PURPOSES,
                self.cfg.clusters.port_base,
                self.cfg.clusters.port_count,
                |p| crate::process::port_free(svc, p) && crate::process::port_free(lo, p),
            )
            .await?;
        Ports::from_leased(&leased)
    }

    fn spawn_cluster(self: &Arc<Self>, name: &str) {
        let (tx, rx) = watch::channel(ClusterState::Starting {
            detail: "starting".into(),
        });
        let stop = self.stop.child_token();
        let d = self.clone();
        let n = name.to_string();
        let s = stop.clone();
        let task = tokio::spawn(async move {
            if let Err(e) = d.run_cluster(&n, &tx, s).await {
                error!(cluster = %n, "{e:#}");
                let _ = tx.send(ClusterState::Failed {
                    error: format!("{e:#}"),
                });
            }
        });
        self.clusters.lock().expect("lock").insert(
            name.to_string(),
            Handle {
                state: rx,
                stop,
                task,
            },
        );
    }

    async fn run_cluster(
        &self,
        name: &str,
        state: &watch::Sender<ClusterState>,
        stop: CancellationToken,
    ) -> Result<()> {
        let owner = self.store.cluster(name).await?.and_then(|c| c.owner);
        let users_ca = self.users_ca(name)?;
        let ca_der = socialweb_wire::ca::certificates(users_ca.ca_pem().as_bytes())
            .map_err(anyhow::Error::msg)?
            .remove(0)
            .der;
        let mut mount = Mount {
            cluster: name.to_string(),
            account_hash: owner.as_deref().map(crate::access::names::account_hash),
            users_ca: ca_der,
            upstream: None,
        };
        self.front.mount(mount.clone());
        let ports = self.ports(name).await?;
        let spec = self.spec(name, ports);
        let kube = spec.kube.clone();
        let mut cp = Running::start(spec)?;
        let _ = state.send(ClusterState::Starting {
            detail: "control plane starting".into(),
        });
        tokio::select! {
            r = cp.ready(Duration::from_secs(180)) => r?,
            _ = stop.cancelled() => { cp.stop().await; return Ok(()); }
        }
        let files = cp.files.clone();
        // What nodes need to join, and what the agent and kube-proxy read (docs/join.md).
        let manifests = [
            crate::control_plane::BOOTSTRAP_MANIFEST.to_string(),
            crate::control_plane::cluster_info(&files.url, &files.ca_pem).to_string(),
            crate::control_plane::AGENT_RBAC.to_string(),
            crate::access::ACCESS_MANIFEST.to_string(),
        ];
        for m in &manifests {
            let mut delay = Duration::from_millis(500);
            loop {
                match runner::apply(&kube, &files.admin_kubeconfig, m).await {
                    Ok(()) => break,
                    Err(e) if !stop.is_cancelled() => {
                        warn!(cluster = %name, "applying the join configuration: {e:#}; retrying");
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(10));
                    }
                    Err(_) => {
                        cp.stop().await;
                        return Ok(());
                    }
                }
            }
        }
        let client = crate::tenant::client(&files.admin_kubeconfig).await?;
        // Ready for users means Pods can be created: the controller-manager has made the
        // default ServiceAccount (else the first `kubectl apply` is refused).
        let sas: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> =
            kube::Api::namespaced(client.clone(), "default");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while !matches!(sas.get_opt("default").await, Ok(Some(_)))
            && tokio::time::Instant::now() < deadline
        {
            let _ = state.send(ClusterState::Starting {
                detail: "waiting for the default ServiceAccount".into(),
            });
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                _ = stop.cancelled() => { cp.stop().await; return Ok(()); }
            }
        }
        let ctx = ClusterCtx {
            name: name.to_string(),
            server_url: files.url.clone(),
            ca_pin: socialweb_wire::ca::pin(files.ca_pem.as_bytes()).map_err(anyhow::Error::msg)?,
            client,
        };
        // The front reaches the apiserver with a certificate only request-header
        // authentication accepts (its own CA, not the cluster's).
        mount.upstream = Some(crate::front::proxy::Upstream::new(
            &files.url,
            files.ca_pem.as_bytes(),
            &std::fs::read(&files.front.cert)?,
            &std::fs::read(&files.front.key)?,
        )?);
        self.front.mount(mount);
        let _ = state.send(ClusterState::Ready);
        info!(cluster = %name, url = %files.url, kubeconfig = %files.admin_kubeconfig.display(), "cluster ready");
        crate::scale::driver::run(self.provisioner.clone(), ctx, Arc::new(Notify::new()), stop)
            .await;
        cp.stop().await;
        Ok(())
    }

    /// Creates a cluster: its record, its ports, its control plane. Returns once it is
    /// ready or `wait` passes.
    pub async fn create_cluster(
        self: &Arc<Self>,
        name: &str,
        owner: Option<&str>,
        wait: Duration,
    ) -> Result<ClusterInfo> {
        valid_cluster_name(name).map_err(anyhow::Error::msg)?;
        self.store
            .create_cluster(name, owner, SystemTime::now())
            .await?;
        self.users_ca(name)?;
        info!(cluster = %name, "cluster created");
        self.spawn_cluster(name);
        let mut rx = self
            .clusters
            .lock()
            .expect("lock")
            .get(name)
            .map(|h| h.state.clone())
            .context("just spawned")?;
        let _ = tokio::time::timeout(
            wait,
            rx.wait_for(|s| !matches!(s, ClusterState::Starting { .. })),
        )
        .await;
        self.info(name).await
    }

    /// Deletes a cluster: its scale driver stops, every lease is released, its control
    /// plane stops, its files and records go.
    pub async fn delete_cluster(&self, name: &str) -> Result<()> {
        if self.store.cluster(name).await?.is_none() {
            bail!("no cluster {name:?}");
        }
        self.store.set_cluster_state(name, "deleting").await?;
        self.front.unmount(name);
        let handle = self.clusters.lock().expect("lock").remove(name);
        if let Some(h) = handle {
            h.stop.cancel();
            let _ = h.task.await;
        }
        self.finish_delete(name).await
    }

    async fn finish_delete(&self, name: &str) -> Result<()> {
        let p = &self.provisioner;
        for mut prov in self.store.provisions(Some(name)).await? {
            if prov.state.ended() {
                continue;
            }
            if !matches!(prov.state, Step::Planned | Step::RfpSent) {
                p.market.release(&prov.lease_id).await.with_context(|| {
                    format!("releasing lease {} of {}", prov.lease_id, prov.node)
                })?;
            }
            prov.state = Step::Released;
            prov.reason = Some("cluster deleted".into());
            prov.updated_at = crate::store::millis(SystemTime::now());
            self.store.update_provision(&prov).await?;
        }
        (p.on_change.0)();
        let dir = self.cfg.state_dir.join("clusters").join(name);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
        }
        self.store.delete_cluster(name).await?;
        info!(cluster = %name, "cluster deleted");
        Ok(())
    }

    pub async fn info(&self, name: &str) -> Result<ClusterInfo> {
        let c = self
            .store
            .cluster(name)
            .await?
            .with_context(|| format!("no cluster {name:?}"))?;
        let state = if c.state == "deleting" {
            ClusterState::Deleting
        } else {
            self.clusters
                .lock()
                .expect("lock")
                .get(name)
                .map(|h| h.state.borrow().clone())
                .unwrap_or(ClusterState::Starting {
                    detail: "not running".into(),
                })
        };
        let ports = self.store.ports(name).await?;
        let api = ports
            .iter()
            .find(|(p, _)| p == "api")
            .map(|(_, p)| *p)
            .unwrap_or(0);
        let nodes = self
            .store
            .provisions(Some(name))
            .await?
            .iter()
            .filter(|p| p.state.live())
            .count();
        Ok(ClusterInfo {
            name: name.to_string(),
            state,
            server: format!("https://{}:{api}", self.cfg.service_addr),
            kubeconfig: self
                .cfg
                .state_dir
                .join("clusters")
                .join(name)
                .join("pki/admin.kubeconfig"),
            nodes,
            owner: c.owner,
        })
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn front(&self) -> &Front {
        &self.front
    }

    pub fn resolver(&self) -> &Resolver {
        &self.resolver
    }

    /// A cluster's users CA (made on first use).
    pub fn users_ca(&self, name: &str) -> Result<crate::control_plane::pki::Pki> {
        crate::access::certs::users_ca(&self.cfg.state_dir.join("clusters").join(name), name)
    }

    pub async fn list(&self) -> Result<Vec<ClusterInfo>> {
        let mut out = Vec::new();
        for c in self.store.clusters().await? {
            out.push(self.info(&c.name).await?);
        }
        Ok(out)
    }

    /// A cluster's decisions and provisions.
    pub async fn show(&self, name: &str) -> Result<serde_json::Value> {
        let info = self.info(name).await?;
        Ok(serde_json::json!({
            "cluster": info,
            "decisions": self.store.decisions(name).await?,
            "provisions": self.store.provisions(Some(name)).await?,
        }))
    }

    /// The provider's own view (the embedded local provider's leases, or the market's for
    /// this broker).
    pub async fn leases(&self) -> Result<serde_json::Value> {
        let p = &self.provisioner;
        Ok(serde_json::to_value(
            p.market.leases("broker", &p.broker_id).await?,
        )?)
    }

    /// Stops every cluster's driver and control plane; nodes keep running and their leases
    /// stay (the next start picks them up).
    pub async fn shutdown(&self) {
        let handles: Vec<Handle> = self
            .clusters
            .lock()
            .expect("lock")
            .drain()
            .map(|(_, h)| h)
            .collect();
        for h in &handles {
            h.stop.cancel();
        }
        for h in handles {
            let _ = h.task.await;
        }
        if let Some(p) = &self.provider {
            p.stop();
        }
        self.stop.cancel();
        self.store.close().await;
        info!("broker stopped");
    }
}

fn provider_config(cfg: &Config) -> ProviderConfig {
    let lp = &cfg.local_provider;
    ProviderConfig {
        dir: cfg.state_dir.join("local-provider"),
        capacity: lp.capacity,
        // It offers nodes of the configured size, and nothing larger.
        max_spec: NodeSpec {
            vcpu: cfg.node.vcpu,
            mem_mib: cfg.node.mem_mib,
            disk_mib: cfg.node.disk_mib,
        },
        subnet: lp.subnet,
        prefix: lp.prefix.clone(),
        agent: lp.agent.clone(),
        kube_dir: cfg.kube_dir.clone(),
        cni_bin_dir: lp.cni_bin_dir.clone(),
        seed_images: lp.seed_images.clone(),
        kubelet_config_patch: lp.kubelet_config_patch.clone(),
        image: lp.image.clone(),
        name: "local".into(),
        price_micros_per_hour: 0,
    }
}

/// The standalone local provider (`socialweb-broker provider`): the same provider the daemon
/// embeds, as its own process.
pub async fn run_provider(cfg: Config, stop: CancellationToken) -> Result<()> {
    crypto_provider();
    let provider = Provider::start(provider_config(&cfg))?;
    let bound = local::serve(provider.clone(), cfg.local_provider.listen, stop.clone()).await?;
    info!(%bound, "local provider running");
    stop.cancelled().await;
    provider.stop();
    Ok(())
}
