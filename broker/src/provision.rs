//! Renting one node, step by step, crash-safe: each step's state, and every id the step will
//! use, is written to the store before the step calls the market, and every call is one the
//! provider treats as the same request when repeated. A broker that crashes anywhere and
//! starts again picks each provision up at its recorded step and repeats the call; it never
//! guesses.
//!
//! planned → rfp_sent → accepted → booting → running → joined, then releasing → released;
//! failed from any step, with the reason (a lease that may exist is released first).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use tracing::{info, warn};

use crate::config::Config;
use crate::market::client::{MarketClient, MarketError};
use crate::market::protocol::{Accept, LeaseState, NodeSpec, RfpRequest};
use crate::store::{Provision, Step, Store, millis};
use crate::tenant;

/// What a provision needs of its cluster.
#[derive(Clone)]
pub struct ClusterCtx {
    pub name: String,
    /// The apiserver nodes reach.
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

/// Shared by every provision.
#[derive(Debug)]
pub struct Provisioner {
    pub cfg: Config,
    pub store: Store,
    pub market: MarketClient,
    /// Tags every RFP and lease, so the broker finds its own leases at the provider.
    pub broker_id: String,
    pub metrics: crate::metrics::Metrics,
    /// The node image's fingerprint (the RFP's `image`).
    pub image: String,
    /// Called whenever the set of live provisions changes (the relay's allow list).
    pub on_change: OnChange,
}

/// A callback, for [`Provisioner::on_change`].
pub struct OnChange(pub Box<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for OnChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnChange")
    }
}

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

impl Provisioner {
    /// Plans a new node for `cluster`: names, ids, token and mesh key chosen and written
    /// before anything is asked of anyone.
    pub async fn plan(&self, cluster: &str) -> Result<Provision> {
        let node = self.store.next_node_name(cluster).await?;
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
            reason: None,
            attempts: 0,
            created_at: now,
            updated_at: now,
        };
        self.store.insert_provision(&p).await?;
        info!(cluster, node = %p.node, provision = %p.id, "planned");
        (self.on_change.0)();
        crash_point(Step::Planned);
        Ok(p)
    }

    async fn set(&self, p: &mut Provision, step: Step, reason: Option<String>) -> Result<()> {
        let from = p.state;
        p.state = step;
        if reason.is_some() {
            p.reason = reason;
        }
        p.updated_at = millis(SystemTime::now());
        self.store.update_provision(p).await?;
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

    fn identity(&self, c: &ClusterCtx, p: &Provision) -> Result<serde_json::Value> {
        let cfg = &self.cfg;
        let mut doc = serde_json::json!({
            "version": socialweb_wire::identity::VERSION,
            "cluster": c.name,
            "node": p.node,
            "server_url": c.server_url,
            "ca_cert_sha256": socialweb_wire::CaTrust::pin_text(&c.ca_pin),
            "join_token": format!("{}.{}", p.token_id, p.token_secret),
            "relay_url": format!("http://{}:{}", cfg.service_addr, cfg.relay.port),
            "mesh_secret_key": p.mesh_key,
            "cluster_cidr": crate::control_plane::CLUSTER_CIDR,
            "service_cidr": crate::control_plane::SERVICE_CIDR,
            "cluster_domain": "cluster.local",
            "labels": {"socialweb.computer/cluster": c.name},
        });
        if !cfg.clusters.upstream_resolvers.is_empty() {
            doc["upstream_resolvers"] = cfg.clusters.upstream_resolvers.clone().into();
        }
        // What the node will refuse, the broker refuses first.
        socialweb_wire::NodeIdentity::from_json(doc.to_string().as_bytes())
            .map_err(|e| anyhow!("the identity for {}: {e}", p.node))?;
        Ok(doc)
    }

    /// Runs a provision from its recorded step until it is joined, released or failed.
    /// Transient market errors are retried with backoff; the rest fail it with the reason.
    pub async fn drive(self: Arc<Self>, c: ClusterCtx, mut p: Provision) -> Result<()> {
        let mut delay = Duration::from_millis(500);
        loop {
            if p.state.ended() || p.state == Step::Joined {
                return Ok(());
            }
            match self.step(&c, &mut p).await {
                Ok(()) => delay = Duration::from_millis(500),
                Err(e) => {
                    let transient = e
                        .downcast_ref::<MarketError>()
                        .is_some_and(MarketError::transient)
                        || e.downcast_ref::<kube::Error>().is_some();
                    if transient {
                        warn!(cluster = %c.name, node = %p.node, step = p.state.as_str(), "{e:#}; retrying in {delay:?}");
                        p.reason = Some(format!("{e:#}"));
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(30));
                        continue;
                    }
                    self.fail(&c, &mut p, format!("{e:#}")).await?;
                }
            }
        }
    }

    /// Fails a provision: its lease, if one may exist, is released first.
    pub async fn fail(&self, c: &ClusterCtx, p: &mut Provision, reason: String) -> Result<()> {
        warn!(cluster = %c.name, node = %p.node, step = p.state.as_str(), "provision failed: {reason}");
        if matches!(
            p.state,
            Step::Accepted | Step::Booting | Step::Running | Step::Joined | Step::Releasing
        ) {
            self.market
                .release(&p.lease_id)
                .await
                .context("releasing the failed lease")?;
        }
        let _ = tenant::forget_node(&c.client, &p.node, &p.token_id).await;
        self.set(p, Step::Failed, Some(reason)).await
    }

    /// One step forward.
    async fn step(&self, c: &ClusterCtx, p: &mut Provision) -> Result<()> {
        let cfg = &self.cfg;
        match p.state {
            Step::Planned => {
                let secret = crate::control_plane::bootstrap_token_secret(
                    &socialweb_wire::BootstrapToken {
                        id: p.token_id.clone(),
                        secret: p.token_secret.clone(),
                    },
                    &format!("join {}", p.node),
                    Some(
                        &humantime::format_rfc3339_seconds(
                            SystemTime::now() + cfg.market.boot_timeout + Duration::from_secs(600),
                        )
                        .to_string(),
                    ),
                );
                tenant::put_token(&c.client, &secret).await?;
                self.set(p, Step::RfpSent, None).await?;
                self.send_rfp(p).await
            }
            Step::RfpSent => {
                // Repeated after a crash: the same id is the same RFP.
                self.send_rfp(p).await?;
                let bids = self
                    .market
                    .bids(
                        &p.rfp_id,
                        cfg.market.bid_deadline,
                        Duration::from_millis(300),
                    )
                    .await?;
                if bids.is_empty() {
                    bail!(
                        "no bid before the deadline ({})",
                        crate::scale::decision::go_duration(cfg.market.bid_deadline)
                    );
                }
                let identity = self.identity(c, p)?;
                let mut last = None;
                for bid in bids {
                    p.bid_id = Some(bid.id.clone());
                    p.provider = Some(bid.provider.clone());
                    self.set(p, Step::Accepted, None).await?;
                    match self
                        .market
                        .accept(
                            &bid.id,
                            &Accept {
                                lease_id: p.lease_id.clone(),
                                identity: identity.clone(),
                            },
                        )
                        .await
                    {
                        Ok(lease) => {
                            info!(cluster = %c.name, node = %p.node, lease = %lease.id, bid = %bid.id,
                                  price = bid.price_micros_per_hour, eta_ms = bid.eta_ms, "bid accepted");
                            return Ok(());
                        }
                        Err(e) if !e.transient() => {
                            warn!(cluster = %c.name, node = %p.node, "bid {} refused: {e}; next bid", bid.id);
                            last = Some(e);
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
                Err(anyhow!(
                    "every bid refused the acceptance; last: {}",
                    last.map(|e| e.to_string()).unwrap_or_default()
                ))
            }
            Step::Accepted => {
                // Repeated after a crash: the same lease id is the same acceptance.
                let lease = match self.market.lease(&p.lease_id).await? {
                    Some(l) => l,
                    None => {
                        let bid = p.bid_id.clone().context("accepted without a bid id")?;
                        let identity = self.identity(c, p)?;
                        self.market
                            .accept(
                                &bid,
                                &Accept {
                                    lease_id: p.lease_id.clone(),
                                    identity,
                                },
                            )
                            .await?
                    }
                };
                match lease.state {
                    LeaseState::Booting => self.set(p, Step::Booting, None).await,
                    LeaseState::Running => self.set(p, Step::Running, None).await,
                    s => bail!(
                        "lease {} is {} ({})",
                        lease.id,
                        s.as_str(),
                        lease.reason.unwrap_or_default()
                    ),
                }
            }
            Step::Booting => {
                let started = Instant::now();
                loop {
                    let lease = self.market.lease(&p.lease_id).await?.with_context(|| {
                        format!("the provider does not have lease {}", p.lease_id)
                    })?;
                    match lease.state {
                        LeaseState::Booting => {}
                        LeaseState::Running => return self.set(p, Step::Running, None).await,
                        s => bail!(
                            "lease {} {}: {}",
                            lease.id,
                            s.as_str(),
                            lease.reason.unwrap_or_default()
                        ),
                    }
                    if started.elapsed() > cfg.market.boot_timeout {
                        bail!(
                            "still booting after {}",
                            crate::scale::decision::go_duration(cfg.market.boot_timeout)
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
            Step::Running => {
                let nodes: Api<Node> = Api::all(c.client.clone());
                let started = Instant::now();
                loop {
                    if nodes
                        .get_opt(&p.node)
                        .await?
                        .is_some_and(|n| tenant::node_ready(&n))
                    {
                        return self.set(p, Step::Joined, None).await;
                    }
                    if started.elapsed() > cfg.market.boot_timeout {
                        bail!(
                            "the node did not join within {}",
                            crate::scale::decision::go_duration(cfg.market.boot_timeout)
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
            Step::Releasing => {
                // Again after a crash: nothing may land on a node on its way out.
                tenant::cordon(&c.client, &p.node).await?;
                self.market.release(&p.lease_id).await?;
                tenant::forget_node(&c.client, &p.node, &p.token_id).await?;
                self.set(p, Step::Released, None).await
            }
            Step::Joined | Step::Released | Step::Failed => Ok(()),
        }
    }

    async fn send_rfp(&self, p: &Provision) -> Result<()> {
        let n = &self.cfg.node;
        let mut tags = std::collections::BTreeMap::new();
        tags.insert("broker".into(), self.broker_id.clone());
        tags.insert("cluster".into(), p.cluster.clone());
        tags.insert("provision".into(), p.id.clone());
        self.market
            .post_rfp(&RfpRequest {
                id: p.rfp_id.clone(),
                spec: NodeSpec {
                    vcpu: n.vcpu,
                    mem_mib: n.mem_mib,
                    disk_mib: n.disk_mib,
                },
                image: self.image.clone(),
                tags,
                bid_deadline_ms: self.cfg.market.bid_deadline.as_millis() as u64,
            })
            .await?;
        Ok(())
    }

    /// Releases a node: written `releasing` first, then released at the provider.
    pub async fn release(
        self: Arc<Self>,
        c: ClusterCtx,
        mut p: Provision,
        why: String,
    ) -> Result<()> {
        if p.state.ended() {
            return Ok(());
        }
        if matches!(p.state, Step::Planned | Step::RfpSent) {
            // No lease can exist: the RFP was never accepted.
            let _ = tenant::forget_node(&c.client, &p.node, &p.token_id).await;
            return self.set(&mut p, Step::Released, Some(why)).await;
        }
        if p.state != Step::Releasing {
            // Cordon first, then look: a Pod the scheduler placed on the node since the
            // decision is seen here and calls the release off, and none is placed after.
            if tenant::cordon(&c.client, &p.node).await? {
                let work = tenant::work_on(
                    &c.client,
                    &p.node,
                    self.cfg.scale.expendable_priority_cutoff,
                )
                .await?;
                if let Some(pod) = work.first() {
                    tenant::uncordon_ours(&c.client, &p.node).await?;
                    info!(cluster = %p.cluster, node = %p.node, pod = %pod,
                          "release called off: a Pod was placed on the node");
                    return Ok(());
                }
            }
            self.set(&mut p, Step::Releasing, Some(why)).await?;
        }
        self.drive(c, p).await
    }
}
