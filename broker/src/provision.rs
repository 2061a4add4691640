//! Renting one node: the executor of the core's transition function
//! (`socialweb_broker_core::provision`). At each step it does the step's I/O (the join token,
//! the RFP, the acceptance, the lease, the Node), asks [`next`] what follows, and does that.
//! Each step, and every id the step will use, is written to the store before the step calls
//! the market, and every call is one the provider treats as the same request when repeated:
//! a broker that crashes anywhere picks each provision up at its recorded step and repeats
//! the call; it never guesses.
//!
//! This is also the one place that writes a provision's step ([`Provisioner::set`]: the
//! store, the log, the metrics, the relay's allow list, the tests' crash points) and the one
//! place that releases a lease at the provider ([`Provisioner::release_lease`]).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use socialweb_broker_core::provision::{Limits, Next, Seen, next};
use socialweb_broker_core::scale::{NodeSize, Rentable};
use socialweb_broker_core::{Provision, Step, millis};
use socialweb_market::{Accept, Bid, Lease, RfpRequest};
use socialweb_market::{NodeSpec, Topology};
use socialweb_wire::{BootstrapToken, CaTrust, MeshSecretKey, NodeIdentity};
use tracing::{info, warn};

use crate::market::{Market, MarketError};

mod reconcile;
use crate::metrics::Metrics;
use crate::store::{Fence, Store};
use crate::tenant;
pub use reconcile::Scope;

/// What a provision needs of its cluster.
#[derive(Clone)]
pub struct ClusterCtx {
    pub name: String,
    /// The apiserver as nodes reach it: node-local, through the tunnel
    /// (`https://169.254.20.11:<port>`).
    pub server_url: String,
    pub ca_pin: [u8; 32],
    pub client: kube::Client,
}

impl std::fmt::Debug for ClusterCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterCtx")
            .field("name", &self.name)
            .field("server_url", &self.server_url)
            .finish_non_exhaustive()
    }
}

/// The fleet's other hosts, as a node's identity names them (contract 1's `fleet` and
/// `fleet_relays`).
#[derive(Debug, Default)]
pub struct FleetHosts {
    pub tunnels: Vec<socialweb_wire::BrokerEndpoint>,
    pub relays: Vec<url::Url>,
}

/// What the provisioner is told (from the `[market]` and `[node]` sections, the relay's URL
/// and the clusters' resolvers).
#[derive(Debug, Clone)]
pub struct Settings {
    pub limits: Limits,
    pub node: NodeSize,
    /// The node image's fingerprint (the RFP's `image`).
    pub image: String,
    /// The relay nodes fall back to.
    pub relay_url: url::Url,
    /// The relay's CA (PEM), for nodes to trust it (the broker's self-made front CA).
    pub relay_ca: Option<String>,
    /// The broker's tunnel endpoint nodes reach their control plane through.
    pub tunnel: socialweb_wire::BrokerEndpoint,
    /// Where node-local DNS forwards (the identity's `upstream_resolvers`).
    pub upstream_resolvers: Vec<SocketAddr>,
    /// Pods at or below this priority do not keep a node from being released.
    pub expendable_cutoff: i32,
    /// The least isolation RFPs ask for (`market.isolation`).
    pub isolation: socialweb_market::Isolation,
}

/// A callback, for [`Provisioner::new`]'s `on_change`.
pub struct OnChange(pub Box<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for OnChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnChange")
    }
}

/// Shared by every provision.
#[derive(Debug)]
pub struct Provisioner {
    settings: Settings,
    store: Store,
    market: Market,
    /// Tags every RFP and lease, so the broker finds its own leases at the provider.
    broker_id: String,
    metrics: Metrics,
    /// Called whenever the set of live provisions changes (the relay's allow list).
    on_change: OnChange,
    /// The providers' offers when last asked, and when ([`Provisioner::offers`]).
    shapes: tokio::sync::Mutex<Option<(Instant, Offers)>>,
    /// What nodes of each shape, where they were offered, really gave Pods: the least
    /// allocatable CPU and memory their Nodes reported ([`Provisioner::learn`]). In memory:
    /// a restarted broker learns again from its first node of each.
    learned: std::sync::Mutex<HashMap<(Topology, NodeSpec), (u64, u64)>>,
    /// What the plan counted each node not yet joined at, by provision id: what its Node is
    /// checked against when it registers ([`Provisioner::check_shape`]). In memory: after a
    /// restart a node is checked against what its shape is counted at then.
    counted: std::sync::Mutex<HashMap<String, (u64, u64)>>,
    /// The lease each cluster's provisions are written under on this fleet host, while it
    /// runs the cluster ([`Provisioner::fenced_by`]).
    fences: std::sync::Mutex<HashMap<String, Fence>>,
}

/// The providers' offers, by the broker's names for them.
type Offers = Vec<(String, socialweb_market::Offer)>;

/// How long the market's shapes are taken as known before they are asked for again.
const SHAPES_FOR: Duration = Duration::from_secs(30);

/// Crashes the broker here when the failpoint `broker::<step>` is set (the tests' SIGKILL
/// after each step).
fn crash_point(step: Step) {
    #[cfg(feature = "failpoints")]
    {
        let name = format!("broker::{}", step.as_str());
        fail::fail_point!(&name, |_| {
            tracing::error!("failpoint {name}: killing the broker (SIGKILL)");
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        });
    }
    let _ = step;
}

/// What was seen at a step, owned (the core's [`Seen`] borrows it).
enum Sight {
    TokenWritten,
    Bids {
        bids: Vec<Bid>,
        waited: Duration,
        quiet: Duration,
    },
    Lease(Option<Lease>),
    Node {
        ready: bool,
    },
    Released,
}

impl Sight {
    fn seen(&self) -> Seen<'_> {
        match self {
            Sight::TokenWritten => Seen::TokenWritten,
            Sight::Bids {
                bids,
                waited,
                quiet,
            } => Seen::Bids {
                bids,
                waited: *waited,
                quiet: *quiet,
            },
            Sight::Lease(l) => Seen::Lease(l.as_ref()),
            Sight::Node { ready } => Seen::Node { ready: *ready },
            Sight::Released => Seen::Released,
        }
    }
}

/// How the bids on an RFP came in, while the executor waits at `rfp_sent`.
struct BidWatch {
    since: Instant,
    seen: usize,
    last_new: Instant,
}

impl BidWatch {
    fn new() -> BidWatch {
        let now = Instant::now();
        BidWatch {
            since: now,
            seen: 0,
            last_new: now,
        }
    }
}

fn unhex32(s: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    if s.len() != 64 {
        return None;
    }
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

impl Provisioner {
    pub fn new(
        settings: Settings,
        store: Store,
        market: Market,
        broker_id: String,
        metrics: Metrics,
        on_change: OnChange,
    ) -> Provisioner {
        Provisioner {
            settings,
            store,
            market,
            broker_id,
            metrics,
            on_change,
            shapes: tokio::sync::Mutex::new(None),
            learned: Default::default(),
            counted: Default::default(),
            fences: Default::default(),
        }
    }

    /// The lease cluster `cluster`'s provisions are written under from now on (`None`: no
    /// lease, outside a fleet or between its periods). Every write of one is conditional on
    /// it in the store, and a release at a provider asks the store first: a host frozen or
    /// cut off past its lease rents and releases nothing for a cluster another host runs.
    pub fn fenced_by(&self, cluster: &str, fence: Option<Fence>) {
        let mut fences = self.fences.lock().expect("the fences' lock");
        match fence {
            Some(f) => fences.insert(cluster.to_string(), f),
            None => fences.remove(cluster),
        };
    }

    fn fence_of(&self, cluster: &str) -> Option<Fence> {
        self.fences
            .lock()
            .expect("the fences' lock")
            .get(cluster)
            .cloned()
    }

    /// Refuses when this host writes cluster `cluster` under a lease that is no longer the
    /// cluster's: before a release at a provider, which the store cannot make conditional.
    async fn still_holds(&self, cluster: &str) -> Result<()> {
        let Some(f) = self.fence_of(cluster) else {
            return Ok(());
        };
        anyhow::ensure!(
            self.store.holds(cluster, &f).await?,
            "not released: cluster {cluster:?}'s lease is no longer this host's (fence {}): \
             another host runs it and its nodes",
            f.fence
        );
        Ok(())
    }

    /// The providers' offers at the isolation RFPs ask for, asked at most every
    /// [`SHAPES_FOR`] (one call per provider for every cluster).
    pub async fn offers(&self) -> Vec<(String, socialweb_market::Offer)> {
        let mut known = self.shapes.lock().await;
        if let Some((at, offers)) = known.as_ref()
            && at.elapsed() < SHAPES_FOR
        {
            return offers.clone();
        }
        let offers = self.market.offers(self.settings.isolation).await;
        *known = Some((Instant::now(), offers.clone()));
        offers
    }

    /// The shapes the market rents, where ([`socialweb_broker_core::offers::rentables`]),
    /// each counted at what its nodes gave when one has said; empty when no provider says
    /// (the decision then rents the `[node]` size).
    pub async fn shapes(&self) -> Vec<Rentable> {
        let mut shapes = socialweb_broker_core::offers::rentables(&self.offers().await);
        for r in &mut shapes {
            r.allocatable = self.learned(&r.topology, &r.shape.spec);
        }
        shapes
    }

    /// What nodes of `spec` in `topology` gave Pods, the least seen, if one has said.
    fn learned(&self, topology: &Topology, spec: &NodeSpec) -> Option<(u64, u64)> {
        let learned = self.learned.lock().expect("the learned shapes' lock");
        learned.get(&(topology.clone(), *spec)).copied()
    }

    /// Takes what a node of `spec` in `topology` gives Pods (its Node's allocatable CPU
    /// millis and memory bytes) as what such nodes give, when it is less than known.
    pub fn learn(&self, topology: &Topology, spec: &NodeSpec, allocatable: (u64, u64)) {
        let mut learned = self.learned.lock().expect("the learned shapes' lock");
        let e = learned
            .entry((topology.clone(), *spec))
            .or_insert(allocatable);
        if allocatable.0 < e.0 || allocatable.1 < e.1 {
            info!(shape = %spec.instance_type(), topology = %topology,
                  cpu_millis = allocatable.0, memory_mib = allocatable.1 >> 20,
                  "a node gives less than its shape was counted at: planning with what it gives");
        }
        *e = (e.0.min(allocatable.0), e.1.min(allocatable.1));
    }

    /// Plans a new node of `what`'s shape and topology for `cluster`: names, ids, token and
    /// mesh key chosen and written before anything is asked of anyone.
    pub async fn plan(&self, cluster: &str, what: &Rentable) -> Result<Provision> {
        let spec = what.shape.spec;
        let node = self.store.next_node_name(cluster).await?;
        let used: Vec<std::net::IpAddr> = self
            .store
            .provisions(Some(cluster))
            .await?
            .iter()
            .filter(|p| !p.state.ended())
            .filter_map(|p| p.node_ip)
            .collect();
        let node_ip = socialweb_broker_core::names::free_node_ip(&used)
            .context("every node address of the cluster is taken")?;
        let token = crate::control_plane::new_bootstrap_token();
        let secret: [u8; 32] = rand::random();
        let key: String = secret.iter().map(|b| format!("{b:02x}")).collect();
        let endpoint = iroh::SecretKey::from_bytes(&secret).public().to_string();
        let now = millis(SystemTime::now());
        let p = Provision {
            id: uuid::Uuid::new_v4().to_string(),
            cluster: cluster.to_string(),
            node,
            state: Step::Planned,
            rfp_id: uuid::Uuid::new_v4().to_string(),
            bid_id: None,
            lease_id: uuid::Uuid::new_v4().to_string(),
            provider: None,
            token_id: token.id,
            token_secret: token.secret,
            mesh_key: key,
            endpoint,
            node_ip: Some(node_ip.into()),
            spec: Some(spec),
            topology: what.topology.clone(),
            reason: None,
            attempts: 0,
            created_at: now,
            updated_at: now,
        };
        self.store
            .insert_provision(&p, self.fence_of(cluster).as_ref())
            .await?;
        self.counted
            .lock()
            .expect("the counted nodes' lock")
            .insert(p.id.clone(), what.counted_at());
        info!(cluster, node = %p.node, provision = %p.id, shape = %spec.instance_type(),
              topology = %p.topology, "planned");
        (self.on_change.0)();
        crash_point(Step::Planned);
        Ok(p)
    }

    /// Writes `p`'s new step (and reason): the store first, then the log, the metrics, the
    /// relay's allow list, and the tests' crash point.
    async fn set(&self, p: &mut Provision, step: Step, reason: Option<String>) -> Result<()> {
        let from = p.state;
        if matches!(step, Step::Joined | Step::Releasing) || step.ended() {
            self.counted
                .lock()
                .expect("the counted nodes' lock")
                .remove(&p.id);
        }
        p.state = step;
        if reason.is_some() {
            p.reason = reason;
        }
        p.updated_at = millis(SystemTime::now());
        self.store
            .update_provision(p, self.fence_of(&p.cluster).as_ref())
            .await?;
        info!(cluster = %p.cluster, node = %p.node, from = from.as_str(), to = step.as_str(),
              reason = p.reason.as_deref().unwrap_or(""), "provision step");
        self.metrics.step(step);
        if step == Step::Joined {
            let secs = (p.updated_at - p.created_at) as f64 / 1000.0;
            self.metrics.provisioned(secs);
        }
        if !step.live() || step == Step::Planned {
            (self.on_change.0)();
        }
        crash_point(step);
        Ok(())
    }

    /// Ends a provision (released or failed) whose lease, if it had one, is released already.
    pub async fn end(&self, p: &mut Provision, step: Step, reason: &str) -> Result<()> {
        debug_assert!(step.ended());
        self.set(p, step, Some(reason.to_string())).await
    }

    /// Releases a lease at `provider`; releasing a released or unknown lease is fine.
    pub async fn release_lease(
        &self,
        provider: &str,
        lease_id: &str,
        why: &str,
    ) -> Result<(), MarketError> {
        info!(lease = %lease_id, provider, "releasing the lease: {why}");
        self.market.release(provider, lease_id).await.map(|_| ())
    }

    /// Releases `p`'s lease, at the provider it was accepted from, while this host still
    /// holds the cluster's lease (a fleet's).
    pub async fn release_own(&self, p: &Provision, why: &str) -> Result<()> {
        let Some(provider) = p.provider.as_deref() else {
            // Accepted is written with the provider: a provision without one has no lease.
            return Ok(());
        };
        self.still_holds(&p.cluster).await?;
        Ok(self.release_lease(provider, &p.lease_id, why).await?)
    }

    /// The node's identity document (contract 1), from its provision and its cluster.
    fn identity(
        &self,
        c: &ClusterCtx,
        p: &Provision,
        fleet: FleetHosts,
    ) -> Result<serde_json::Value> {
        let s = &self.settings;
        let key = unhex32(&p.mesh_key).context("the provision's mesh key is not 64 hex digits")?;
        let id = NodeIdentity {
            cluster: c.name.clone(),
            node: p.node.clone(),
            server_url: c.server_url.parse().context("the cluster's server URL")?,
            ca: CaTrust::Sha256Pin(c.ca_pin),
            join_token: BootstrapToken {
                id: p.token_id.clone(),
                secret: p.token_secret.clone(),
            },
            broker: Some(s.tunnel.clone()),
            fleet: fleet.tunnels,
            node_ip: p.node_ip,
            relay_url: s.relay_url.clone(),
            fleet_relays: fleet.relays,
            relay_ca: s.relay_ca.clone(),
            mesh_secret_key: MeshSecretKey(key),
            cluster_cidr: crate::control_plane::CLUSTER_CIDR.parse()?,
            service_cidr: crate::control_plane::SERVICE_CIDR.parse()?,
            cluster_domain: "cluster.local".into(),
            upstream_resolvers: s.upstream_resolvers.clone(),
            labels: self.node_labels(c, p),
        };
        Ok(id.to_json())
    }

    /// The labels a node's kubelet registers it with: its cluster, and its shape, region and
    /// zone as the scale decision's placement planned them (docs/scale.md), and the provider
    /// it was rented from (when the name is a label value).
    fn node_labels(&self, c: &ClusterCtx, p: &Provision) -> BTreeMap<String, String> {
        use socialweb_broker_core::placement::{INSTANCE_TYPE, PROVIDER};
        let mut l = socialweb_broker_core::scale::node_labels(
            &BTreeMap::from([("socialweb.computer/cluster".to_string(), c.name.clone())]),
            &self.spec_of(p),
            &p.topology,
            &p.node,
        );
        // The kubelet sets its hostname label itself.
        l.remove(socialweb_broker_core::placement::HOSTNAME);
        debug_assert!(l.contains_key(INSTANCE_TYPE));
        if let Some(provider) = p
            .provider
            .as_ref()
            .filter(|n| socialweb_market::valid_label_value(n))
        {
            l.insert(PROVIDER.into(), provider.clone());
        }
        l
    }

    /// Runs a provision from its recorded step until it is joined, released or failed.
    /// Transient market and cluster errors are retried with backoff; the rest fail it with
    /// the reason.
    pub async fn drive(self: Arc<Self>, c: ClusterCtx, mut p: Provision) -> Result<()> {
        let mut delay = Duration::from_millis(500);
        while p.state.in_progress() {
            match self.step(&c, &mut p).await {
                Ok(()) => delay = Duration::from_millis(500),
                Err(e) => {
                    let transient = e
                        .downcast_ref::<MarketError>()
                        .is_some_and(MarketError::transient)
                        || e.downcast_ref::<kube::Error>().is_some();
                    if !transient {
                        self.fail(&c, &mut p, format!("{e:#}")).await?;
                        continue;
                    }
                    warn!(cluster = %c.name, node = %p.node, step = p.state.as_str(), "{e:#}; retrying in {delay:?}");
                    p.reason = Some(format!("{e:#}"));
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(30));
                }
            }
        }
        Ok(())
    }

    /// Fails a provision: its lease, if one may exist, is released first.
    pub async fn fail(&self, c: &ClusterCtx, p: &mut Provision, reason: String) -> Result<()> {
        warn!(cluster = %c.name, node = %p.node, step = p.state.as_str(), "provision failed: {reason}");
        if p.state.may_hold_lease() {
            self.release_own(p, &reason)
                .await
                .context("releasing the failed lease")?;
        }
        let _ = tenant::forget_node(&c.client, &p.node, &p.token_id).await;
        self.end(p, Step::Failed, &reason).await
    }

    /// One step: its way in, then looking and following [`next`] until the step is left.
    async fn step(&self, c: &ClusterCtx, p: &mut Provision) -> Result<()> {
        let entered = Instant::now();
        self.enter(c, p).await?;
        let mut bids = BidWatch::new();
        loop {
            let sight = self.look(c, p, &mut bids).await?;
            match next(p, sight.seen(), entered.elapsed(), &self.settings.limits) {
                Next::Advance(step) => {
                    self.set(p, step, None).await?;
                    if step == Step::Joined {
                        // A crash before this leaves the token to its expiry (the
                        // controller-manager's token cleaner deletes it then).
                        tenant::delete_token(&c.client, &p.token_id).await?;
                    }
                    return Ok(());
                }
                Next::PollAfter(d) => tokio::time::sleep(d).await,
                Next::Accept(bids) => return self.accept_bids(c, p, bids).await,
                Next::Reaccept => {
                    let bid = p.bid_id.clone().context("accepted without a bid id")?;
                    self.accept(c, p, &bid).await?;
                }
                Next::Fail(why) => return self.fail(c, p, why).await,
            }
        }
    }

    /// What a step does once on its way in (again after a crash: each is idempotent).
    async fn enter(&self, c: &ClusterCtx, p: &Provision) -> Result<()> {
        match p.state {
            Step::Planned => {
                let expiry = SystemTime::now()
                    + self.settings.limits.boot_timeout
                    + Duration::from_secs(600);
                let secret = crate::control_plane::bootstrap_token_secret(
                    &BootstrapToken {
                        id: p.token_id.clone(),
                        secret: p.token_secret.clone(),
                    },
                    &format!("join {}", p.node),
                    Some(&humantime::format_rfc3339_seconds(expiry).to_string()),
                );
                tenant::put_token(&c.client, &secret).await
            }
            // The same id is the same RFP.
            Step::RfpSent => self.send_rfp(p).await,
            Step::Releasing => {
                // Nothing may land on a node on its way out.
                tenant::cordon(&c.client, &p.node).await?;
                self.release_own(p, "releasing").await?;
                tenant::forget_node(&c.client, &p.node, &p.token_id).await
            }
            _ => Ok(()),
        }
    }

    /// What there is to see at `p`'s step.
    async fn look(&self, c: &ClusterCtx, p: &Provision, w: &mut BidWatch) -> Result<Sight> {
        Ok(match p.state {
            Step::Planned => Sight::TokenWritten,
            Step::RfpSent => {
                let bids = self.market.bids(&p.rfp_id).await?;
                if bids.len() != w.seen {
                    w.seen = bids.len();
                    w.last_new = Instant::now();
                }
                Sight::Bids {
                    bids,
                    waited: w.since.elapsed(),
                    quiet: w.last_new.elapsed(),
                }
            }
            Step::Accepted | Step::Booting => {
                let provider = p
                    .provider
                    .as_deref()
                    .context("accepted without a provider")?;
                if p.state == Step::Booting {
                    self.checked_node(c, p).await?;
                }
                Sight::Lease(self.market.lease(provider, &p.lease_id).await?)
            }
            Step::Running => {
                let node = self.checked_node(c, p).await?;
                Sight::Node {
                    ready: node.is_some_and(|n| tenant::node_joined(&n)),
                }
            }
            Step::Releasing => Sight::Released,
            Step::Joined | Step::Released | Step::Failed => {
                return Err(anyhow!("nothing to look at in step {}", p.state.as_str()));
            }
        })
    }

    /// Fails a node whose Node, once registered, has less than the plan counted on (a
    /// provider's word is not taken beyond its name): the error names the provider, and
    /// what the node gives is learned, so the next plan counts its shape at it. A node the
    /// scheduler has already given work keeps it (released, its Pods would be deleted with
    /// its Node): it is only told of, and learned from.
    async fn check_shape(&self, c: &ClusterCtx, p: &Provision, n: &Node) -> Result<()> {
        let Some(why) = self.short_of(p, n) else {
            return Ok(());
        };
        let work = tenant::work_on(&c.client, &p.node, self.settings.expendable_cutoff).await?;
        if let Some(pod) = work.first() {
            warn!(cluster = %c.name, node = %p.node, pod = %pod,
                  "{why}; kept, since the scheduler has given it work");
            return Ok(());
        }
        bail!("{why}")
    }

    /// Learns what node `n` of provision `p` gives, and says why it is short of what the
    /// plan counted its shape at, if it is.
    fn short_of(&self, p: &Provision, n: &Node) -> Option<String> {
        let capacity = tenant::node_resources(n, tenant::Resources::Capacity)?;
        let allocatable = tenant::node_resources(n, tenant::Resources::Allocatable)?;
        let spec = self.spec_of(p);
        let counted = self
            .counted
            .lock()
            .expect("the counted nodes' lock")
            .get(&p.id)
            .copied();
        let r = Rentable {
            shape: socialweb_market::Shape {
                spec,
                price_micros_per_hour: 0,
            },
            topology: p.topology.clone(),
            allocatable: counted.or_else(|| self.learned(&p.topology, &spec)),
        };
        let short = socialweb_broker_core::offers::short(&r, capacity);
        self.learn(&p.topology, &spec, allocatable);
        short.map(|why| {
            format!(
                "provider {} rented a node short of its shape: {why}",
                p.provider.as_deref().unwrap_or("(unknown)")
            )
        })
    }

    /// The Node of provision `p`, if it has registered, checked against its shape: a short
    /// one is failed (the provision's lease released) whatever its step -- it may register,
    /// and be found idle, before its provider calls it running.
    async fn checked_node(&self, c: &ClusterCtx, p: &Provision) -> Result<Option<Node>> {
        let node = Api::<Node>::all(c.client.clone()).get_opt(&p.node).await?;
        if let Some(n) = &node {
            self.check_shape(c, p, n).await?;
        }
        Ok(node)
    }

    /// Why a node about to be released unjoined is short of its shape, if its Node has
    /// registered and is: released idle before its provider called it running, it would
    /// otherwise teach the plan nothing, and the next plan would rent the same shape.
    async fn short_before_release(&self, c: &ClusterCtx, p: &Provision) -> Option<String> {
        if p.state == Step::Joined {
            return None;
        }
        let n = Api::<Node>::all(c.client.clone())
            .get_opt(&p.node)
            .await
            .ok()??;
        self.short_of(p, &n)
    }

    /// Accepts `bids` best first: `accepted` (with the bid) is written before each call; a
    /// bid the provider refuses for good gives way to the next.
    async fn accept_bids(&self, c: &ClusterCtx, p: &mut Provision, bids: Vec<Bid>) -> Result<()> {
        let mut last = None;
        for bid in bids {
            p.bid_id = Some(bid.id.clone());
            p.provider = Some(bid.provider.clone());
            self.set(p, Step::Accepted, None).await?;
            match self.accept(c, p, &bid.id).await {
                Ok(lease) => {
                    info!(cluster = %c.name, node = %p.node, lease = %lease.id, bid = %bid.id,
                          price = bid.price_micros_per_hour, eta_ms = bid.eta_ms,
                          machine = bid.machine.as_deref().unwrap_or("unsaid"), "bid accepted");
                    return Ok(());
                }
                Err(e) if !e.transient() => {
                    warn!(cluster = %c.name, node = %p.node, "bid {} refused: {e}; next bid", bid.id);
                    last = Some(e);
                }
                Err(e) => return Err(e.into()),
            }
        }
        let why = format!(
            "every bid refused the acceptance; last: {}",
            last.map(|e| e.to_string()).unwrap_or_default()
        );
        self.fail(c, p, why).await
    }

    /// Accepts `bid` for `p` at `p.provider` (idempotent by the lease id).
    async fn accept(&self, c: &ClusterCtx, p: &Provision, bid: &str) -> Result<Lease, MarketError> {
        let provider = p.provider.clone().unwrap_or_default();
        let identity =
            self.identity(c, p, self.fleet_hosts().await)
                .map_err(|e| MarketError::Refused {
                    call: format!("POST /bids/{bid}/accept"),
                    status: 400,
                    code: "bad_request".into(),
                    message: format!("the identity for {}: {e:#}", p.node),
                })?;
        let a = Accept {
            lease_id: p.lease_id.clone(),
            identity,
        };
        self.market.accept(&provider, bid, &a).await
    }

    /// The other fleet hosts' tunnel endpoints and relays (none outside a fleet): a node
    /// tries their tunnels when this host does not take it (it may run the node's cluster no
    /// more), and keeps its mesh on their relays when this host's is gone.
    async fn fleet_hosts(&self) -> FleetHosts {
        let recorded = match self.store.fleet_tunnels().await {
            Ok(r) => r,
            Err(e) => {
                warn!("reading the fleet's tunnel endpoints: {e:#}");
                return FleetHosts::default();
            }
        };
        let mut hosts = FleetHosts::default();
        for t in &recorded {
            let Ok(serde_json::Value::Object(mut v)) = serde_json::from_str(t) else {
                continue;
            };
            // Recorded beside the endpoint (`FleetHost::join`); not a field of one.
            let relay = v.remove("relay_url");
            let Ok(b) = socialweb_wire::BrokerEndpoint::from_json(&v.into()) else {
                continue;
            };
            if b.endpoint == self.settings.tunnel.endpoint {
                continue;
            }
            let relay = relay
                .as_ref()
                .and_then(|r| r.as_str()?.parse::<url::Url>().ok());
            hosts
                .relays
                .extend(relay.filter(|r| *r != self.settings.relay_url));
            hosts.tunnels.push(b);
        }
        hosts
    }

    /// The shape `p` is rented as (the `[node]` size for one planned before shapes).
    pub fn spec_of(&self, p: &Provision) -> socialweb_market::NodeSpec {
        p.spec.unwrap_or_else(|| self.settings.node.into())
    }

    async fn send_rfp(&self, p: &Provision) -> Result<()> {
        let tags = BTreeMap::from([
            ("broker".to_string(), self.broker_id.clone()),
            ("cluster".to_string(), p.cluster.clone()),
            ("provision".to_string(), p.id.clone()),
        ]);
        // A node planned in a region or zone is asked of the providers there alone.
        let only = socialweb_broker_core::offers::providers_in(&self.offers().await, &p.topology);
        if only.as_ref().is_some_and(Vec::is_empty) {
            bail!(
                "no provider offers {} now (the node was planned there)",
                p.topology
            );
        }
        self.market
            .post_rfp_to(
                &RfpRequest {
                    id: p.rfp_id.clone(),
                    spec: self.spec_of(p),
                    image: self.settings.image.clone(),
                    tags,
                    bid_deadline_ms: self.settings.limits.bid_deadline.as_millis() as u64,
                    isolation: self.settings.isolation,
                },
                only.as_deref(),
            )
            .await?;
        Ok(())
    }

    /// Releases a node: written `releasing` first, then released at the provider. Called
    /// off when a Pod was placed on the node since the decision.
    pub async fn release(
        self: Arc<Self>,
        c: ClusterCtx,
        mut p: Provision,
        why: String,
    ) -> Result<()> {
        if p.state.ended() {
            return Ok(());
        }
        if !p.state.may_hold_lease() {
            // No lease can exist: the RFP was never accepted.
            let _ = tenant::forget_node(&c.client, &p.node, &p.token_id).await;
            return self.end(&mut p, Step::Released, &why).await;
        }
        if p.state != Step::Releasing {
            // Cordon first, then look: a Pod the scheduler placed on the node since the
            // decision is seen here and calls the release off, and none is placed after.
            if tenant::cordon(&c.client, &p.node).await? {
                let work =
                    tenant::work_on(&c.client, &p.node, self.settings.expendable_cutoff).await?;
                if let Some(pod) = work.first() {
                    tenant::uncordon_ours(&c.client, &p.node).await?;
                    info!(cluster = %p.cluster, node = %p.node, pod = %pod,
                          "release called off: a Pod was placed on the node");
                    return Ok(());
                }
            }
            if let Some(short) = self.short_before_release(&c, &p).await {
                return self.fail(&c, &mut p, short).await;
            }
            self.set(&mut p, Step::Releasing, Some(why)).await?;
        }
        self.drive(c, p).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mesh_keys_read_back_from_their_hex() {
        let key = [0xabu8; 32];
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(unhex32(&hex), Some(key));
        assert_eq!(unhex32("ab"), None);
        assert_eq!(unhex32(&"zz".repeat(32)), None);
    }
}
