//! The scale driver of one cluster: level-triggered. Pod and Node watches (kube reflectors)
//! and the hold timer only say "look again"; every pass observes the whole picture -- the
//! cluster's Pods, the store's provisions, now and then the provider's leases -- asks the
//! core (the decision, the reconcile), records what it decided when that changed, and acts
//! on the difference. A missed event costs latency, never correctness.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use kube::Api;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use socialweb_broker_core::provision::{plan_backoff, recent_failures};
use socialweb_broker_core::reconcile::Fix;
use socialweb_broker_core::{DecisionRow, Provision, from_millis, millis};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::cache::{self, Bounded};
use super::decision::{
    Action, DaemonView, Decision, Knobs, LeaseView, MISJUDGED_AFTER, Offers, PodView, Pool,
    Scheduling, decide, go_duration, held_past, next_release, releases, teardown_due,
};
use crate::provision::{ClusterCtx, Provisioner};
use crate::tenant;

/// How often the provider's view is compared with the store's.
const RECONCILE_EVERY: Duration = Duration::from_secs(15);
/// A change is acted on once no other came for this long ([`settle`]).
const SETTLE: Duration = Duration::from_millis(200);
/// ... or this long after it, whatever keeps coming.
const SETTLE_MAX: Duration = Duration::from_secs(1);
/// With nothing else to wake for, a pass runs this often (provisions move on their own).
const IDLE_PASS: Duration = Duration::from_secs(1);

/// Watches a resource (as `config` selects it), keeping each object as `slim` leaves it
/// and at most `bounded`'s cap of them, and nudges on every change.
fn watch_into<K>(
    api: Api<K>,
    config: watcher::Config,
    slim: fn(&mut K),
    mut bounded: Bounded,
    nudge: Arc<Notify>,
    stop: CancellationToken,
) -> reflector::Store<K>
where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (store, writer) = reflector::store();
    let events = watcher(api, config)
        .default_backoff()
        .modify(slim)
        .filter(move |e| std::future::ready(e.as_ref().map_or(true, |e| bounded.admit(e))));
    let stream = reflector(writer, events);
    tokio::spawn(async move {
        futures_util::pin_mut!(stream);
        loop {
            tokio::select! {
                ev = stream.next() => match ev {
                    None => return,
                    Some(Err(e)) => warn!("watch: {e}"),
                    // Mid-list the store still holds the old state; it swaps at InitDone.
                    Some(Ok(watcher::Event::Init | watcher::Event::InitApply(_))) => {}
                    Some(Ok(_)) => nudge.notify_one(),
                },
                _ = stop.cancelled() => return,
            }
        }
    });
    store
}

/// The key a recorded decision is compared by: a decision is recorded when it changed.
type DecisionKey = (&'static str, u32, u32, u32);

/// One cluster's driver and what it remembers between passes.
/// What the driver reads and counts with, beside the Provisioner it hands provisions to.
#[derive(Debug, Clone)]
pub struct Handles {
    pub store: crate::store::Store,
    pub metrics: crate::metrics::Metrics,
    /// `scale.schedulers`: the schedulers whose Pods rent nodes.
    pub schedulers: Arc<[String]>,
}

struct Driver {
    p: Arc<Provisioner>,
    h: Handles,
    c: ClusterCtx,
    knobs: Knobs,
    pods: reflector::Store<Pod>,
    nodes: reflector::Store<Node>,
    claims: reflector::Store<PersistentVolumeClaim>,
    daemonsets: reflector::Store<DaemonSet>,
    nudge: Arc<Notify>,
    /// The task moving each provision that is not where it will stay.
    tasks: HashMap<String, tokio::task::JoinHandle<()>>,
    recorded: Option<DecisionKey>,
    /// Pods already told (with an Event) that no node will be rented for them.
    told: HashSet<String>,
    last_reconcile: Option<Instant>,
    next_plan_at: tokio::time::Instant,
    /// When each leased node was first seen empty while others work (in memory: a restarted
    /// broker starts every clock over, which only keeps a node longer).
    empty_since: HashMap<String, SystemTime>,
    /// Provisions whose empty node is being released (not started twice).
    released: HashSet<String>,
    /// When each Unschedulable Pod was first seen placed by the plan on a registered node.
    on_registered_since: HashMap<String, SystemTime>,
    /// The Pods the scheduler kept refusing where the plan put them, and what they are told
    /// ([`Scheduling::Refused`]); forgotten once bound or gone.
    refused: HashMap<String, String>,
    /// The tenant's NodePool as last read, and when ([`Driver::pool`]).
    pool: Option<(Instant, Pool)>,
    /// The NodePool version last told it could not be read (told once).
    pool_told: Option<String>,
}

/// How long the tenant's NodePool is taken as read: a change takes effect within this.
const POOL_FOR: Duration = Duration::from_secs(5);

/// A cluster's Pods and Nodes, watched: what the driver decides from (and the tunnel's
/// egress routes by).
#[derive(Clone)]
pub struct Watches {
    pub pods: reflector::Store<Pod>,
    pub nodes: reflector::Store<Node>,
    /// Which claims exist: a Pod that mounts one that does not is refused every node, a new
    /// one too.
    pub claims: reflector::Store<PersistentVolumeClaim>,
    /// The DaemonSets: what a new node runs before any work, known at zero too.
    pub daemonsets: reflector::Store<DaemonSet>,
    nudge: Arc<Notify>,
}

impl std::fmt::Debug for Watches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Watches")
    }
}

impl Watches {
    /// Starts watching until `stop`.
    pub fn start(client: &kube::Client, stop: &CancellationToken) -> Watches {
        let nudge = Arc::new(Notify::new());
        Watches {
            pods: watch_into(
                Api::all(client.clone()),
                watcher::Config::default().fields(cache::LIVE_PODS),
                cache::slim_pod,
                Bounded::new("Pods", cache::MAX_PODS),
                nudge.clone(),
                stop.clone(),
            ),
            nodes: watch_into(
                Api::all(client.clone()),
                watcher::Config::default(),
                cache::slim_node,
                Bounded::new("Nodes", cache::MAX_NODES),
                nudge.clone(),
                stop.clone(),
            ),
            claims: watch_into(
                Api::all(client.clone()),
                watcher::Config::default(),
                cache::slim_claim,
                Bounded::new("PersistentVolumeClaims", cache::MAX_CLAIMS),
                nudge.clone(),
                stop.clone(),
            ),
            daemonsets: watch_into(
                Api::all(client.clone()),
                watcher::Config::default(),
                cache::slim_daemonset,
                Bounded::new("DaemonSets", cache::MAX_DAEMONSETS),
                nudge.clone(),
                stop.clone(),
            ),
            nudge,
        }
    }
}

/// Runs the loop until `stop`; returns when stopped.
pub async fn run(
    p: Arc<Provisioner>,
    h: Handles,
    c: ClusterCtx,
    knobs: Knobs,
    w: Watches,
    stop: CancellationToken,
) {
    let Watches {
        pods,
        nodes,
        claims,
        daemonsets,
        nudge,
    } = w;
    tokio::select! {
        _ = async {
            let _ = pods.wait_until_ready().await;
            let _ = nodes.wait_until_ready().await;
            let _ = claims.wait_until_ready().await;
            let _ = daemonsets.wait_until_ready().await;
        } => {}
        _ = stop.cancelled() => return,
    }
    info!(cluster = %c.name, "scale driver watching Pods and Nodes");
    let mut d = Driver {
        p,
        h,
        c,
        knobs,
        pods,
        nodes,
        claims,
        daemonsets,
        nudge,
        tasks: HashMap::new(),
        recorded: None,
        told: HashSet::new(),
        last_reconcile: None,
        next_plan_at: tokio::time::Instant::now(),
        empty_since: HashMap::new(),
        released: HashSet::new(),
        on_registered_since: HashMap::new(),
        refused: HashMap::new(),
        pool: None,
        pool_told: None,
    };
    loop {
        // A pass waits on the store, which may be out of reach: the period's end (a lost
        // lease, whose owner waits for this before it tries again) does not wait for it.
        // Stopping mid-pass is a crash, which the step machine is safe from.
        let wake = tokio::select! {
            w = d.pass() => w,
            _ = stop.cancelled() => break,
        };
        tokio::select! {
            _ = d.nudge.notified() => settle(&d.nudge).await,
            _ = tokio::time::sleep_until(wake) => {}
            _ = stop.cancelled() => break,
        }
    }
    for (_, h) in d.tasks {
        // The step machine is crash-safe: stopping it mid-step is a crash.
        h.abort();
    }
}

impl Driver {
    /// One pass: observe, reconcile when due, keep provisions moving, decide, record, tell,
    /// act. Returns when to look again without a nudge.
    async fn pass(&mut self) -> tokio::time::Instant {
        let soon = tokio::time::Instant::now() + IDLE_PASS;
        self.tasks.retain(|_, h| !h.is_finished());
        // A release that ended (or was called off: a Pod landed) may be needed again later.
        self.released.retain(|id| self.tasks.contains_key(id));
        let Some(mut provisions) = self.provisions().await else {
            return soon;
        };
        if self
            .last_reconcile
            .is_none_or(|t| t.elapsed() > RECONCILE_EVERY)
        {
            self.reconcile(&provisions).await;
            self.last_reconcile = Some(Instant::now());
            provisions = self.provisions().await.unwrap_or(provisions);
        }
        self.keep_moving(&provisions);
        let pool = self.pool().await;
        let knobs = pool.knobs(&self.knobs);
        let d = self.decide(&provisions, &pool, &knobs).await;
        self.record(&d).await;
        self.tell_unfit(&d).await;
        if self.act(&d, &provisions).await {
            return tokio::time::Instant::now();
        }
        if d.action != Action::Teardown {
            self.release_empty(&d, &provisions, knobs.hold);
        }
        // Wake on the hold's end, or an empty node's, if it is near.
        let due = [
            teardown_due(&d, &knobs),
            next_release(&self.empty_since, knobs.hold),
        ];
        match due
            .into_iter()
            .flatten()
            .min()
            .and_then(|due| due.duration_since(SystemTime::now()).ok())
        {
            Some(left) => soon.min(tokio::time::Instant::now() + left + Duration::from_millis(50)),
            None => soon,
        }
    }

    async fn provisions(&self) -> Option<Vec<Provision>> {
        match self.h.store.provisions(Some(&self.c.name)).await {
            Ok(v) => Some(v),
            Err(e) => {
                warn!(cluster = %self.c.name, "reading provisions: {e:#}");
                None
            }
        }
    }

    /// Carries out the core's reconcile of the provider's view with the store's: the
    /// Provisioner releases the orphans; failing a provision and lifting a cordon are this
    /// driver's (it runs their tasks).
    async fn reconcile(&mut self, provisions: &[Provision]) {
        let (p, c) = (&self.p, &self.c);
        let scope = crate::provision::Scope::Cluster(&c.name);
        let Some(fixes) = p.reconcile(scope, Some(provisions)).await else {
            return;
        };
        for fix in fixes {
            match fix {
                Fix::Release { .. } => {}
                Fix::Fail { provision, why } => {
                    if let Some(h) = self.tasks.remove(&provision) {
                        h.abort();
                    }
                    let Some(mut x) = provisions.iter().find(|x| x.id == provision).cloned() else {
                        continue;
                    };
                    if let Err(e) = p.fail(c, &mut x, why).await {
                        warn!(cluster = %c.name, "reconcile: {e:#}");
                    }
                }
                // A broker that crashed between cordoning a node to release it and recording
                // the release left it cordoned; no release is under way, so lift it.
                Fix::Uncordon { provision, node } if !self.tasks.contains_key(&provision) => {
                    if let Err(e) = tenant::uncordon_ours(&c.client, &node).await {
                        warn!(cluster = %c.name, node = %node, "reconcile: {e:#}");
                    }
                }
                Fix::Uncordon { .. } => {}
            }
        }
    }

    /// Every provision that is not where it will stay gets its task.
    fn keep_moving(&mut self, provisions: &[Provision]) {
        for prov in provisions.iter().filter(|x| x.state.in_progress()) {
            if self.tasks.contains_key(&prov.id) {
                continue;
            }
            let (pp, cc, pv, n) = (
                self.p.clone(),
                self.c.clone(),
                prov.clone(),
                self.nudge.clone(),
            );
            let h = tokio::spawn(async move {
                let res = if pv.state == socialweb_broker_core::Step::Releasing {
                    pp.release(cc, pv, "releasing".into()).await
                } else {
                    pp.drive(cc, pv).await
                };
                if let Err(e) = res {
                    warn!("provision: {e:#}");
                }
                n.notify_one();
            });
            self.tasks.insert(prov.id.clone(), h);
        }
    }

    /// The core's decision on the picture now; intent is recorded so the hold survives a
    /// restart.
    async fn decide(&mut self, provisions: &[Provision], pool: &Pool, knobs: &Knobs) -> Decision {
        let last_intent = self
            .h
            .store
            .cluster(&self.c.name)
            .await
            .ok()
            .flatten()
            .map(|x| from_millis(x.last_intent_at))
            .unwrap_or_else(SystemTime::now);
        let mut views: Vec<_> = self
            .pods
            .state()
            .iter()
            .map(|x| tenant::pod_view(x, &self.h.schedulers))
            .collect();
        self.take_refusals(&mut views);
        self.check_claims(&mut views);
        let leases: Vec<LeaseView> = provisions
            .iter()
            .map(|x| LeaseView {
                node: x.node.clone(),
                live: x.state.live(),
                spec: self.p.spec_of(x),
                allocatable: self.allocatable(&x.node),
                topology: x.topology.clone(),
                pod_capacity: self.pod_capacity(&x.node),
            })
            .collect();
        // What each registered node gives is what its shape gives, there (a node not yet
        // joined is checked against what the plan counted it at: `Provisioner::check_shape`).
        for l in &leases {
            if let Some(a) = l.allocatable {
                self.p.learn(&l.topology, &l.spec, a);
            }
        }
        let shapes = self.p.shapes().await;
        let labels = node_labels(&self.c.name);
        let daemonsets = self.daemonsets();
        let offers = Offers {
            shapes: &shapes,
            labels: &labels,
            daemonsets: &daemonsets,
        };
        let now = SystemTime::now();
        let t = Instant::now();
        let d = decide(&views, &leases, &offers, pool, knobs, now, last_intent);
        self.h.metrics.decided(t.elapsed().as_secs_f64());
        self.note_refusals(&d, &views, now);
        if d.intent > 0
            && let Err(e) = self.h.store.set_last_intent(&self.c.name, now).await
        {
            warn!(cluster = %self.c.name, "recording intent: {e:#}");
        }
        d
    }

    /// Marks the Pods the scheduler kept refusing as [`Scheduling::Refused`], and forgets
    /// those it has bound since or that are gone.
    fn take_refusals(&mut self, views: &mut [PodView]) {
        if self.refused.is_empty() {
            return;
        }
        let mut still = HashSet::new();
        for v in views.iter_mut() {
            let key = v.key();
            if let Some(why) = self.refused.get(&key)
                && matches!(v.scheduling, Scheduling::Unschedulable(_))
            {
                v.scheduling = Scheduling::Refused(why.clone());
                still.insert(key);
            }
        }
        self.refused.retain(|k, _| still.contains(k));
    }

    /// Marks each Unschedulable Pod that mounts a claim that does not exist as
    /// [`Scheduling::MissingClaim`]: the scheduler refuses it every node until the claim is
    /// made, so no new node helps.
    fn check_claims(&self, views: &mut [PodView]) {
        for v in views.iter_mut() {
            if !matches!(v.scheduling, Scheduling::Unschedulable(_)) {
                continue;
            }
            let missing = v.claims.iter().find(|name| {
                self.claims
                    .get(&reflector::ObjectRef::new(name).within(&v.namespace))
                    .is_none()
            });
            if let Some(name) = missing {
                v.scheduling = Scheduling::MissingClaim(name.clone());
            }
        }
    }

    /// Starts the clock of each Unschedulable Pod the plan put on a registered node; past
    /// [`MISJUDGED_AFTER`] the plan takes the scheduler's word ([`Driver::take_refusals`]
    /// from the next pass on).
    fn note_refusals(&mut self, d: &Decision, views: &[PodView], now: SystemTime) {
        let due = held_past(
            &d.on_registered,
            &mut self.on_registered_since,
            now,
            MISJUDGED_AFTER,
        );
        for (pod, after) in due {
            let said = views.iter().find_map(|v| match &v.scheduling {
                Scheduling::Unschedulable(m) if v.key() == pod => Some(m.clone()),
                _ => None,
            });
            let why = format!(
                "kube-scheduler has refused it for {} on a node where the plan found room, \
                 so the plan takes its word: {}",
                go_duration(after),
                said.unwrap_or_default()
            );
            info!(cluster = %self.c.name, pod = %pod, "{why}");
            self.on_registered_since.remove(&pod);
            self.refused.insert(pod, why);
        }
    }

    /// The tenant's NodePool `default` (read at most every [`POOL_FOR`]); none, or one the
    /// broker cannot read, is the operator's settings alone (the latter told once with a
    /// Warning Event on it).
    async fn pool(&mut self) -> Pool {
        if let Some((at, pool)) = &self.pool
            && at.elapsed() < POOL_FOR
        {
            return pool.clone();
        }
        let ar = kube::discovery::ApiResource {
            group: "socialweb.computer".into(),
            version: "v1alpha1".into(),
            api_version: "socialweb.computer/v1alpha1".into(),
            kind: "NodePool".into(),
            plural: "nodepools".into(),
        };
        let api: Api<kube::api::DynamicObject> = Api::all_with(self.c.client.clone(), &ar);
        let pool = match api.get_opt("default").await {
            Ok(Some(o)) => {
                let spec = o.data.get("spec").cloned().unwrap_or_default();
                match tenant::node_pool(&spec) {
                    Ok(pool) => pool,
                    Err(e) => {
                        self.tell_pool(&o, &e).await;
                        Pool::default()
                    }
                }
            }
            Ok(None) => Pool::default(),
            Err(e) => {
                warn!(cluster = %self.c.name, "reading the NodePool: {e}");
                Pool::default()
            }
        };
        self.pool = Some((Instant::now(), pool.clone()));
        pool
    }

    /// Tells the tenant its NodePool could not be read, once for each version of it.
    async fn tell_pool(&mut self, o: &kube::api::DynamicObject, why: &str) {
        let version = o.metadata.resource_version.clone().unwrap_or_default();
        if self.pool_told.as_deref() == Some(version.as_str()) {
            return;
        }
        warn!(cluster = %self.c.name, "the NodePool: {why}; the operator's settings stand");
        let uid = o.metadata.uid.as_deref();
        if let Err(e) = tenant::warn_node_pool(&self.c.client, uid, why).await {
            warn!(cluster = %self.c.name, "{e:#}");
        }
        self.pool_told = Some(version);
    }

    /// What node `name`'s Node says it can give Pods (CPU millis, memory bytes), once it has
    /// registered and said.
    fn allocatable(&self, name: &str) -> Option<(u64, u64)> {
        let node = self
            .nodes
            .get(&kube::runtime::reflector::ObjectRef::new(name))?;
        tenant::node_resources(&node, tenant::Resources::Allocatable)
    }

    /// The DaemonSets as the decision reads them: each one's Pod template, viewed as a Pod
    /// of its namespace.
    fn daemonsets(&self) -> Vec<DaemonView> {
        self.daemonsets
            .state()
            .iter()
            .filter_map(|d| {
                let template = d.spec.as_ref()?.template.spec.clone()?;
                let pod = Pod {
                    metadata: kube::api::ObjectMeta {
                        namespace: d.metadata.namespace.clone(),
                        ..Default::default()
                    },
                    spec: Some(template),
                    status: None,
                };
                let v = tenant::pod_view(&pod, &[]);
                Some(DaemonView {
                    cpu_millis: v.cpu_millis,
                    memory_bytes: v.memory_bytes,
                    node: v.node,
                })
            })
            .collect()
    }

    /// How many Pods node `name`'s Node says it takes (`status.allocatable.pods`).
    fn pod_capacity(&self, name: &str) -> Option<u32> {
        let node = self
            .nodes
            .get(&kube::runtime::reflector::ObjectRef::new(name))?;
        let a = node.status.as_ref()?.allocatable.as_ref()?;
        a.get("pods")?.0.parse().ok()
    }

    /// Records the decision when it differs from the last one recorded.
    async fn record(&mut self, d: &Decision) {
        let key = (d.action.as_str(), d.target, d.nodes, d.intent);
        if self.recorded == Some(key) {
            return;
        }
        let c = &self.c;
        let row = DecisionRow {
            cluster: c.name.clone(),
            at: millis(SystemTime::now()),
            action: d.action.as_str().into(),
            target: i64::from(d.target),
            nodes: i64::from(d.nodes),
            intent: i64::from(d.intent),
            reason: d.reason.clone(),
        };
        info!(cluster = %c.name, action = d.action.as_str(), target = d.target, nodes = d.nodes,
              intent = d.intent, "{} nodes={}", d.reason, d.target);
        if let Err(e) = self.h.store.record_decision(&row).await {
            warn!(cluster = %c.name, "recording the decision: {e:#}");
        }
        self.h.metrics.decision(d.action.as_str());
        self.recorded = Some(key);
    }

    /// Tells each Pod no node on offer can hold, once, with a Warning Event.
    async fn tell_unfit(&mut self, d: &Decision) {
        for (pod, why) in &d.unfit {
            if !self.told.insert(pod.clone()) {
                continue;
            }
            let Some((ns, name)) = pod.split_once('/') else {
                continue;
            };
            let uid = self
                .pods
                .state()
                .iter()
                .find(|x| {
                    x.metadata.namespace.as_deref() == Some(ns)
                        && x.metadata.name.as_deref() == Some(name)
                })
                .and_then(|x| x.metadata.uid.clone());
            info!(cluster = %self.c.name, pod = %pod, "no node on offer can hold it: {why}");
            if let Err(e) = tenant::warn_pod(&self.c.client, ns, name, uid.as_deref(), why).await {
                warn!(cluster = %self.c.name, "{e:#}");
            }
        }
    }

    /// Acts on the decision; `true` when it planned nodes (look again at once).
    async fn act(&mut self, d: &Decision, provisions: &[Provision]) -> bool {
        match d.action {
            Action::Provision { count } => {
                // Back off while provisions keep failing: the market may be refusing us.
                let failures = recent_failures(provisions);
                if failures > 0 && tokio::time::Instant::now() < self.next_plan_at {
                    return false;
                }
                debug_assert_eq!(d.shapes.len(), count as usize);
                for what in &d.shapes {
                    if let Err(e) = self.p.plan(&self.c.name, what).await {
                        warn!(cluster = %self.c.name, "planning a node: {e:#}");
                    }
                }
                self.next_plan_at = tokio::time::Instant::now() + plan_backoff(failures);
                true
            }
            Action::Teardown => {
                for prov in provisions.iter().filter(|x| x.state.live()) {
                    self.spawn_release(prov, d.reason.clone());
                }
                false
            }
            Action::Hold => false,
        }
    }
}

impl Driver {
    /// Releases `prov`'s node on a task of its own (the one moving it, if any, stopped: the
    /// step machine is crash-safe, so stopping it mid-step is a crash).
    fn spawn_release(&mut self, prov: &Provision, why: String) {
        if let Some(h) = self.tasks.remove(&prov.id) {
            h.abort();
        }
        let (pp, cc, pv, n) = (
            self.p.clone(),
            self.c.clone(),
            prov.clone(),
            self.nudge.clone(),
        );
        let h = tokio::spawn(async move {
            if let Err(e) = pp.release(cc, pv, why).await {
                warn!("release: {e:#}");
            }
            n.notify_one();
        });
        self.tasks.insert(prov.id.clone(), h);
    }

    /// Releases the nodes empty for longer than the hold while others work (the release
    /// cordons the node and calls itself off if a Pod landed there).
    fn release_empty(&mut self, d: &Decision, provisions: &[Provision], hold: Duration) {
        for (node, idle) in releases(&d.empty, &mut self.empty_since, SystemTime::now(), hold) {
            let Some(prov) = provisions
                .iter()
                .find(|x| x.node == node && x.state.live() && !self.released.contains(&x.id))
            else {
                continue;
            };
            let why = format!(
                "Release: node {node} empty for {}, past the {} hold, while {} pods work on {} \
                 other nodes",
                go_duration(idle),
                go_duration(hold),
                d.intent,
                d.nodes.saturating_sub(d.empty.len() as u32)
            );
            info!(cluster = %self.c.name, node = %node, "{why}");
            self.h.metrics.decision("Release");
            self.spawn_release(prov, why);
            self.released.insert(prov.id.clone());
        }
    }
}

/// The labels every node of `cluster` carries besides its hostname and shape, as the
/// placement matches Pods' node selectors against them: the kubelet's own, the cluster's
/// (the identity's) and the agent's node-local DNS mark.
fn node_labels(cluster: &str) -> BTreeMap<String, String> {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    BTreeMap::from([
        ("kubernetes.io/os".to_string(), "linux".to_string()),
        ("kubernetes.io/arch".to_string(), arch.to_string()),
        (
            "socialweb.computer/cluster".to_string(),
            cluster.to_string(),
        ),
        (
            "socialweb.computer/node-local-dns".to_string(),
            "true".to_string(),
        ),
    ])
}

/// Waits out a burst of changes, so that one decision sees all of it: `kubectl apply` of
/// five job Pods arrives as five events, and deciding on the first would rent one node, then
/// another, in five RFP rounds instead of one. Quiet for [`SETTLE`] ends the wait, and so does
/// [`SETTLE_MAX`], so a steady trickle of changes cannot starve the loop.
async fn settle(nudge: &Notify) {
    let give_up = tokio::time::Instant::now() + SETTLE_MAX;
    loop {
        let quiet = tokio::time::Instant::now() + SETTLE;
        tokio::select! {
            _ = nudge.notified() => {
                if tokio::time::Instant::now() >= give_up {
                    return;
                }
            }
            _ = tokio::time::sleep_until(quiet.min(give_up)) => return,
        }
    }
}
