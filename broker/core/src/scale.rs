//! The scale decision (contract 7), a pure function: Pods, leases, the configuration and the
//! time in; the node target, what to do and why out. No I/O, no clock of its own: tested as a
//! table, and cheap enough to run on every change (microseconds for 10,000 Pods).
//!
//! - Intent = Pods Pending, Running or Unknown, except the cluster's own addons (kube-system,
//!   DaemonSet and static Pods, which follow nodes rather than ask for them), Pods at or below
//!   the expendable priority cutoff (GitLab's pause Pods run at -10), Pods the scheduler will
//!   not look at (scheduling gates) or that are not ours to schedule (another
//!   `schedulerName`), and Pending Pods no node size on offer can hold (reported, to get an
//!   Event).
//! - The scheduler's verdict first ([`Scheduling`]): of the Pods not bound, only those
//!   kube-scheduler has marked `Unschedulable` wait for a node; a Pod it has not looked at
//!   yet, or has nominated to a node by preemption, is intent that rents nothing. A Pod the
//!   scheduler keeps refusing on the node the plan gave it is [`Scheduling::Refused`]: told,
//!   and no longer intent, so that node empties and goes.
//! - The Pods that wait are placed as the scheduler would ([`crate::placement`]): on the
//!   leased nodes beside the Pods bound to them (expendable ones left out: the scheduler
//!   preempts them), then on as few new nodes as first-fit-decreasing finds (requests as the
//!   scheduler sums them ([`crate::requests`]), `pods_per_node` slots, `nodeSelector` and node
//!   affinity against the labels our nodes carry, required anti-affinity on the hostname,
//!   the DaemonSets' overhead), at most up to `max_nodes`, each of the cheapest shape on
//!   offer that holds its Pods ([`Offers`]: the providers' shapes, else the `[node]` size).
//! - Provision the new nodes, each with its shape; with zero intent for longer than the hold,
//!   Teardown to zero.
//! - A leased node with no work while others work is empty; empty for the hold, it is
//!   released (Karpenter's `consolidateAfter` with `WhenEmpty`). A node with work stays:
//!   nothing running is ever moved.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime};

use crate::placement::{
    self, AntiAffinity, Capacity, Existing, HOSTNAME, HostPort, INSTANCE_TYPE, NodeKind,
    NodeRequirements, Place, Placeable, Plan, REGION, Requirement, Spread, Usage, ZONE,
};
use socialweb_market::{NodeSpec, Shape, Topology};

use serde::{Deserialize, Serialize};

/// The node size the broker rents: the RFP's spec, and what the decision checks a Pod's
/// requests against. The configuration's `[node]` section (hence the names and defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NodeSize {
    pub vcpu: u32,
    #[serde(rename = "memMiB")]
    pub mem_mib: u64,
    #[serde(rename = "diskMiB")]
    pub disk_mib: u64,
}

impl Default for NodeSize {
    fn default() -> NodeSize {
        NodeSize {
            vcpu: 2,
            mem_mib: 4096,
            disk_mib: 20480,
        }
    }
}

impl From<NodeSize> for socialweb_market::NodeSpec {
    fn from(n: NodeSize) -> socialweb_market::NodeSpec {
        socialweb_market::NodeSpec {
            vcpu: n.vcpu,
            mem_mib: n.mem_mib,
            disk_mib: n.disk_mib,
        }
    }
}

/// A Pod's phase, as the API reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Pending,
    Running,
    Unknown,
    Succeeded,
    Failed,
}

/// What the decision needs of a Pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    pub namespace: String,
    pub name: String,
    pub phase: Phase,
    /// `spec.priority` (0 when unset).
    pub priority: i32,
    /// Scheduled onto a node already.
    pub node_name: Option<String>,
    /// Owned by a DaemonSet, or a static (mirror) Pod.
    pub follows_nodes: bool,
    /// Its CPU and memory requests as the scheduler counts them ([`crate::requests`]).
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    /// Its requests of extended resources (`nvidia.com/gpu`), which no node we rent has.
    pub extended: Vec<(String, u64)>,
    /// What the scheduler has said of it (read while it is not bound).
    pub scheduling: Scheduling,
    /// The PersistentVolumeClaims its volumes name (`persistentVolumeClaim.claimName`).
    pub claims: Vec<String>,
    pub labels: BTreeMap<String, String>,
    /// Its required pod anti-affinity terms.
    pub anti_affinity: Vec<AntiAffinity>,
    /// Its required pod affinity terms.
    pub affinity: Vec<AntiAffinity>,
    /// Its topology spread constraints that do not schedule past the skew.
    pub spread: Vec<Spread>,
    /// Its `nodeSelector` and required node affinity.
    pub node: NodeRequirements,
    /// The host ports its containers bind.
    pub host_ports: Vec<HostPort>,
}

/// What kube-scheduler has said of a Pod that is not bound, or why it will not say: the
/// scheduler owns the fact of whether a Pod fits the nodes there are, so a Pod rents a node
/// only once the scheduler has refused it every node the cluster has (Karpenter and
/// cluster-autoscaler both act on this verdict alone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scheduling {
    /// Not said yet (the scheduler looks at a new Pod within milliseconds), or bound.
    Unseen,
    /// `PodScheduled=False`, reason `Unschedulable`: no node the cluster has can take it
    /// now; the scheduler's message (what each node lacked).
    Unschedulable(String),
    /// Held by `schedulingGates` (Kueue gates every Pod until it admits it): the scheduler
    /// does not look at it until they are gone, so neither does the plan.
    Gated,
    /// For another scheduler (`spec.schedulerName`): not ours to place.
    OtherScheduler(String),
    /// Nominated to a node by preemption (`status.nominatedNodeName`): the scheduler binds
    /// it there once its victims are gone, so it needs no new node.
    Nominated(String),
    /// Unschedulable, and mounts a PersistentVolumeClaim that does not exist (named): the
    /// scheduler refuses it every node, a new one too, until the claim is made.
    MissingClaim(String),
    /// Unschedulable still, [`MISJUDGED_AFTER`] after the plan put it on a node that had
    /// registered: the scheduler refuses what the plan thought fits (a rule the plan does
    /// not model). It rents nothing and keeps no node; it is told why, in the scheduler's
    /// words.
    Refused(String),
}

/// How long a Pod may stay Unschedulable on a registered node the plan gave it before the
/// plan takes the scheduler's word over its own ([`Scheduling::Refused`]): the scheduler
/// retries a Pod at once when a node is added or becomes Ready, and at most 10 s after a
/// failure otherwise (its backoff), so a minute is several of its tries.
pub const MISJUDGED_AFTER: Duration = Duration::from_secs(60);

impl PodView {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    fn placeable(&self, takes_slot: bool) -> Placeable<'_> {
        Placeable {
            namespace: &self.namespace,
            labels: &self.labels,
            cpu_millis: self.cpu_millis,
            memory_bytes: self.memory_bytes,
            takes_slot,
            anti_affinity: &self.anti_affinity,
            affinity: &self.affinity,
            spread: &self.spread,
            node: &self.node,
            host_ports: &self.host_ports,
        }
    }
}

/// A lease the broker holds for the cluster (booting or running: a node paid for).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseView {
    pub node: String,
    pub live: bool,
    /// The shape it was rented as.
    pub spec: NodeSpec,
    /// What its Node says it can give Pods (`status.allocatable` CPU and memory), once
    /// registered: what the scheduler counts, so the placement counts it too.
    pub allocatable: Option<(u64, u64)>,
    /// Where it was rented: its Node's region and zone labels.
    pub topology: Topology,
    /// How many Pods its Node says it takes (`status.allocatable.pods`, the kubelet's
    /// `maxPods`), once registered: every Pod counts, a DaemonSet's too.
    pub pod_capacity: Option<u32>,
}

/// A shape on offer where it is offered: the cheapest price any provider in `topology`
/// rents it at. A node rented as it goes to a provider of that topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rentable {
    pub shape: Shape,
    pub topology: Topology,
    /// What nodes of this shape there really gave Pods (their Nodes' allocatable CPU and
    /// memory, the least seen), once one has said: the plan counts a new node at it. None:
    /// at the shape less [`MEMORY_RESERVE_PERCENT`] of its memory.
    pub allocatable: Option<(u64, u64)>,
}

impl Rentable {
    /// A shape offered with no region or zone, as its offer says.
    pub fn anywhere(shape: Shape) -> Rentable {
        Rentable {
            shape,
            topology: Topology::default(),
            allocatable: None,
        }
    }

    /// What the plan counts a new node of it at: CPU millis and memory bytes.
    pub fn counted_at(&self) -> (u64, u64) {
        self.allocatable.unwrap_or_else(|| {
            let c = capacity(&self.shape.spec, 0);
            (c.cpu_millis, c.memory_bytes)
        })
    }
}

/// What the market rents: the shapes the providers offer (none known: the `[node]` size
/// at price 0) and the labels every node of the cluster carries besides its hostname, its
/// shape's [`INSTANCE_TYPE`] and its topology's [`REGION`] and [`ZONE`].
#[derive(Debug, Clone, Copy)]
pub struct Offers<'a> {
    pub shapes: &'a [Rentable],
    pub labels: &'a BTreeMap<String, String>,
    /// The cluster's DaemonSets, as their Pod templates ask: what a new node runs before
    /// any work (read from their specs, so known at zero too).
    pub daemonsets: &'a [DaemonView],
}

/// A DaemonSet as the decision reads it: what each of its Pods asks (as the scheduler sums
/// a Pod's requests) and the nodes it runs on (its template's node selector and affinity;
/// our nodes carry no taint, so tolerations do not matter).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DaemonView {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub node: NodeRequirements,
}

/// What the DaemonSets take of a new node of any of `offers`' kinds: the most, over the
/// kinds, of the sum of those whose node requirements the kind's labels match.
fn daemonset_overhead(daemonsets: &[DaemonView], offers: &[NodeKind<'_>]) -> Usage {
    offers
        .iter()
        .map(|k| {
            daemonsets.iter().filter(|d| d.node.matches(k.labels)).fold(
                Usage::default(),
                |mut u, d| {
                    u.cpu_millis += d.cpu_millis;
                    u.memory_bytes += d.memory_bytes;
                    u
                },
            )
        })
        .fold(Usage::default(), |a, b| Usage {
            cpu_millis: a.cpu_millis.max(b.cpu_millis),
            memory_bytes: a.memory_bytes.max(b.memory_bytes),
            slots: 0,
        })
}

/// The labels a node of `spec` in `topology` named `hostname` carries, given the cluster's
/// own.
pub fn node_labels(
    base: &BTreeMap<String, String>,
    spec: &NodeSpec,
    topology: &Topology,
    hostname: &str,
) -> BTreeMap<String, String> {
    let mut l = base.clone();
    l.insert(HOSTNAME.into(), hostname.into());
    l.insert(INSTANCE_TYPE.into(), spec.instance_type());
    if let Some(r) = &topology.region {
        l.insert(REGION.into(), r.clone());
    }
    if let Some(z) = &topology.zone {
        l.insert(ZONE.into(), z.clone());
    }
    l
}

/// The hostname a node to rent stands in with: not a valid label value, so no Pod's
/// selector names it, though `Exists` sees it as every node has one.
const NEW_NODE: &str = "(new node)";

/// The share of a shape's memory a new node is planned without: a guest's kernel and the
/// kubelet's eviction threshold take some before Pods (Karpenter's VM memory overhead is
/// 7.5 %). A node that exists is counted at its Node's own allocatable instead.
pub const MEMORY_RESERVE_PERCENT: u64 = 10;

/// What a node of `spec` is planned to give Pods before its Node says.
fn capacity(spec: &NodeSpec, slots: u32) -> Capacity {
    let mem = spec.mem_mib << 20;
    Capacity {
        cpu_millis: u64::from(spec.vcpu) * 1000,
        memory_bytes: mem - mem * MEMORY_RESERVE_PERCENT / 100,
        slots,
    }
}

/// The decision's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Knobs {
    pub max_nodes: u32,
    pub pods_per_node: u32,
    pub hold: Duration,
    pub expendable_priority_cutoff: i32,
    pub node: NodeSize,
    /// The longest hold a tenant's NodePool may ask (`consolidateAfter`).
    pub max_hold: Duration,
}

/// The tenant's NodePool `default` (group `socialweb.computer`, docs/scale.md), as the
/// decision reads it: which shapes it may rent, how much in all, and how long an empty node
/// stays. Nothing set: the operator's knobs alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pool {
    /// On the labels a node of a shape would carry: a shape that misses one is not rented.
    pub requirements: Vec<Requirement>,
    pub max_nodes: Option<u32>,
    /// The most CPU and memory all the cluster's nodes may have, by their shapes.
    pub max_cpu_millis: Option<u64>,
    pub max_memory_bytes: Option<u64>,
    /// How long a node stays empty, and a cluster with no work keeps its nodes.
    pub consolidate_after: Option<Duration>,
}

impl Pool {
    /// The cluster's knobs: the operator's, with the pool's node limit (at most the
    /// operator's `max_nodes`) and `consolidateAfter` as the hold (1 s to `max_hold`).
    pub fn knobs(&self, k: &Knobs) -> Knobs {
        Knobs {
            max_nodes: self.max_nodes.map_or(k.max_nodes, |n| n.min(k.max_nodes)),
            hold: self.consolidate_after.map_or(k.hold, |h| {
                h.clamp(
                    Duration::from_secs(1),
                    k.max_hold.max(Duration::from_secs(1)),
                )
            }),
            ..*k
        }
    }

    /// Whether the pool may rent a node that carries `labels`.
    pub fn allows(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    fn has_limits(&self) -> bool {
        self.max_cpu_millis.is_some() || self.max_memory_bytes.is_some()
    }
}

/// What to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Rent this many more nodes (their shapes: [`Decision::shapes`]).
    Provision { count: u32 },
    /// Release every node.
    Teardown,
    /// Nothing to do now.
    Hold,
}

impl Action {
    pub fn as_str(&self) -> &'static str {
        match self {
            Action::Provision { .. } => "Provision",
            Action::Teardown => "Teardown",
            Action::Hold => "Hold",
        }
    }
}

/// The outcome, with its reason in the seeds' words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub action: Action,
    /// The node count the cluster should have.
    pub target: u32,
    /// Live leases now.
    pub nodes: u32,
    /// Pods counted as intent.
    pub intent: u32,
    /// Pending Pods no node on offer can hold, and why (to be told with an Event).
    pub unfit: Vec<(String, String)>,
    /// When intent was last non-zero (to be stored: a restarted broker keeps the hold).
    pub last_intent_at: SystemTime,
    pub reason: String,
    /// The shape of each node to rent, and where (as many as a Provision's count).
    pub shapes: Vec<Rentable>,
    /// Leased nodes with no work bound and none the placement sends them, while the cluster
    /// has work elsewhere: released once empty for the hold ([`releases`]). Empty when
    /// intent is zero (then the whole cluster follows the hold).
    pub empty: Vec<String>,
    /// Unschedulable Pods (`namespace/name`) the placement put on a leased node whose Node
    /// has registered: the scheduler has seen that node and still refuses them, so past
    /// [`MISJUDGED_AFTER`] ([`held_past`]) they are [`Scheduling::Refused`].
    pub on_registered: Vec<String>,
}

/// The topology key of one of `p`'s spread constraints or affinity terms that no node on
/// offer carries: the scheduler lets no node without it take the Pod, so no rent can help.
fn missing_key<'p>(p: &'p PodView, offers: &[NodeKind<'_>]) -> Option<&'p str> {
    p.spread
        .iter()
        .map(|s| s.topology_key.as_str())
        .chain(p.affinity.iter().map(|t| t.topology_key.as_str()))
        .find(|&key| key != HOSTNAME && !offers.iter().any(|k| k.labels.contains_key(key)))
}

/// Why a Pending Pod cannot be placed on any node on offer (after the DaemonSets' overhead).
fn unfit(p: &PodView, offers: &[NodeKind<'_>], shapes: &[Rentable], overhead: Usage) -> String {
    if let Scheduling::Refused(why) = &p.scheduling {
        return why.clone();
    }
    if !p.extended.is_empty() {
        let asks: Vec<String> = p
            .extended
            .iter()
            .map(|(r, n)| format!("{r}: {n}"))
            .collect();
        return format!(
            "requests {}, which no node on offer has (they have CPU, memory and Pod slots)",
            asks.join(", ")
        );
    }
    if shapes.is_empty() {
        return "the NodePool default's requirements match no shape on offer".into();
    }
    if let Some(key) = missing_key(p, offers) {
        return format!(
            "its topology spread or pod affinity on {key} needs nodes that carry that label, \
             and no node on offer does (a provider's offer names its region and zone)"
        );
    }
    let on_offer: Vec<String> = shapes
        .iter()
        .map(|s| s.shape.spec.instance_type())
        .collect();
    let fits_requests = offers.iter().any(|k| {
        overhead.cpu_millis + p.cpu_millis <= k.capacity.cpu_millis
            && overhead.memory_bytes + p.memory_bytes <= k.capacity.memory_bytes
    });
    let daemonsets = if overhead.cpu_millis + overhead.memory_bytes > 0 {
        format!(
            " beside the DaemonSets' {}m CPU and {} MiB",
            overhead.cpu_millis,
            overhead.memory_bytes.div_ceil(1 << 20)
        )
    } else {
        String::new()
    };
    if fits_requests {
        format!(
            "its nodeSelector or required node affinity matches no node on offer (shapes: {}; \
             node labels: {INSTANCE_TYPE}, {HOSTNAME} and the cluster's own)",
            on_offer.join(", ")
        )
    } else {
        format!(
            "requests {}m CPU and {} MiB of memory, more than any node on offer holds{daemonsets} \
             (shapes: {})",
            p.cpu_millis,
            p.memory_bytes.div_ceil(1 << 20),
            on_offer.join(", ")
        )
    }
}

/// Go's duration text, to a tenth of a second (`1m0.9s`, `2m0s`, `12.3s`, `450ms`): what the
/// seeds' readings look like.
pub fn go_duration(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        return format!("{}ms", d.as_millis());
    }
    let tenths = (d.as_millis() + 50) / 100;
    let (h, rest) = (tenths / 36_000, tenths % 36_000);
    let (m, s_tenths) = (rest / 600, rest % 600);
    let s = if s_tenths % 10 == 0 {
        format!("{}", s_tenths / 10)
    } else {
        format!("{}.{}", s_tenths / 10, s_tenths % 10)
    };
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, m) => format!("{m}m{s}s"),
        (h, m) => format!("{h}h{m}m{s}s"),
    }
}

/// Whether a Pod is work that needs a node: not finished, not the system's own (kube-system,
/// or a DaemonSet's, which follows nodes rather than needing one), and above the expendable
/// priority cutoff.
pub fn is_work(p: &PodView, expendable_priority_cutoff: i32) -> bool {
    matches!(p.phase, Phase::Pending | Phase::Running | Phase::Unknown)
        && p.namespace != "kube-system"
        && !p.follows_nodes
        && p.priority > expendable_priority_cutoff
}

/// The picture the placement works on: the live leases' nodes and the Pods bound to each,
/// the shapes on offer, the overhead a new node pays, those that wait, and what the
/// decision counts.
struct Picture<'a> {
    existing: Vec<Existing<'a>>,
    offers: Vec<NodeKind<'a>>,
    overhead: Usage,
    waiting: Vec<Placeable<'a>>,
    /// The Pods behind `waiting`, in its order.
    waiting_pods: Vec<&'a PodView>,
    /// The live nodes a Pod is nominated to (by preemption): not empty.
    nominated: Vec<bool>,
    intent: u32,
    unfit: Vec<(String, String)>,
}

/// The labels of the live nodes and of each shape on offer, owned for [`picture`] to borrow.
struct Labels {
    live: Vec<BTreeMap<String, String>>,
    shapes: Vec<BTreeMap<String, String>>,
}

fn labels(live: &[&LeaseView], shapes: &[Rentable], base: &BTreeMap<String, String>) -> Labels {
    Labels {
        live: live
            .iter()
            .map(|l| node_labels(base, &l.spec, &l.topology, &l.node))
            .collect(),
        shapes: shapes
            .iter()
            .map(|s| node_labels(base, &s.shape.spec, &s.topology, NEW_NODE))
            .collect(),
    }
}

/// The live nodes as the placement sees them, with no Pod yet: a node counts what its Node
/// reports as allocatable, else its shape as planned.
fn existing<'a>(live: &[&LeaseView], labels: &'a Labels, slots: u32) -> Vec<Existing<'a>> {
    live.iter()
        .zip(&labels.live)
        .map(|(l, labels)| Existing {
            kind: NodeKind {
                capacity: match l.allocatable {
                    Some((cpu_millis, memory_bytes)) => Capacity {
                        cpu_millis,
                        memory_bytes,
                        slots,
                    },
                    None => capacity(&l.spec, slots),
                },
                labels,
                price: 0,
                group: 0,
            },
            pods: Vec::new(),
        })
        .collect()
}

impl<'a> Picture<'a> {
    /// Counts a Pending Pod no node has by what the scheduler said of it; `true` when it
    /// waits for a node (the scheduler has refused it every node there is).
    fn unbound(&mut self, p: &'a PodView, index: &HashMap<&str, usize>) -> bool {
        match &p.scheduling {
            Scheduling::Unschedulable(_) => return true,
            Scheduling::Refused(_) => {
                let why = unfit(p, &[], &[], Usage::default());
                self.unfit.push((p.key(), why));
            }
            // Work that will run without a new node: it keeps the hold from ending.
            Scheduling::Unseen => self.intent += 1,
            Scheduling::Nominated(node) => {
                self.intent += 1;
                if let Some(&i) = index.get(node.as_str()) {
                    self.nominated[i] = true;
                }
            }
            // Not the scheduler's to place yet, or not ours: neither rents nor keeps.
            Scheduling::Gated | Scheduling::OtherScheduler(_) | Scheduling::MissingClaim(_) => {}
        }
        false
    }
}

/// The shapes on offer as the placement sees them, each counted at what it gives (learned,
/// else planned) and in its topology group: a new node keeps the shapes of one.
fn kinds<'a>(shapes: &[Rentable], labels: &'a Labels, slots: u32) -> Vec<NodeKind<'a>> {
    let mut groups: Vec<&Topology> = shapes.iter().map(|s| &s.topology).collect();
    groups.sort_unstable();
    groups.dedup();
    shapes
        .iter()
        .zip(&labels.shapes)
        .map(|(s, labels)| {
            let (cpu_millis, memory_bytes) = s.counted_at();
            NodeKind {
                capacity: Capacity {
                    cpu_millis,
                    memory_bytes,
                    slots,
                },
                labels,
                price: s.shape.price_micros_per_hour,
                group: groups.binary_search(&&s.topology).unwrap_or(0),
            }
        })
        .collect()
}

impl<'a> Picture<'a> {
    /// Counts `pods`: a bound one takes room on its live node (`index`), work counts as
    /// intent, a Pending one the scheduler refused every node is returned to place. Also
    /// returns what the DaemonSets' Pods take on each live node.
    fn sort(
        &mut self,
        pods: &'a [PodView],
        index: &HashMap<&str, usize>,
        k: &Knobs,
    ) -> (Vec<&'a PodView>, Vec<Usage>) {
        let mut pending = Vec::new();
        let mut daemonsets = vec![Usage::default(); self.existing.len()];
        for p in pods {
            if !matches!(p.phase, Phase::Pending | Phase::Running | Phase::Unknown) {
                continue;
            }
            let work = is_work(p, k.expendable_priority_cutoff);
            let expendable = !p.follows_nodes && p.priority <= k.expendable_priority_cutoff;
            if let Some(node) = &p.node_name {
                // Bound: it takes room on its node, an addon's or a DaemonSet's Pod too; an
                // expendable one does not, since the scheduler preempts it for work
                // (cluster-autoscaler leaves such Pods out of its picture too).
                if let Some(&i) = index.get(node.as_str())
                    && !expendable
                {
                    self.existing[i].pods.push(p.placeable(work));
                    if p.follows_nodes {
                        daemonsets[i].cpu_millis += p.cpu_millis;
                        daemonsets[i].memory_bytes += p.memory_bytes;
                    }
                }
                self.intent += u32::from(work);
            } else if work && p.phase == Phase::Pending {
                if self.unbound(p, index) {
                    pending.push(p);
                }
            } else if work {
                self.intent += 1;
            }
        }
        (pending, daemonsets)
    }

    /// A Node's `pods` capacity counts every Pod on it: the slots left for work are what
    /// the Pods that take none (a DaemonSet's, an addon's) leave of it.
    fn limit_slots(&mut self, live: &[&LeaseView]) {
        for (e, l) in self.existing.iter_mut().zip(live) {
            if let Some(cap) = l.pod_capacity {
                let others = e.pods.iter().filter(|p| !p.takes_slot).count() as u32;
                e.kind.capacity.slots = e.kind.capacity.slots.min(cap.saturating_sub(others));
            }
        }
    }

    /// Takes each Pending Pod that a new node could hold as waiting (intent), and tells
    /// the others why none can.
    fn admit(&mut self, pending: Vec<&'a PodView>, shapes: &[Rentable]) {
        for p in pending {
            let x = p.placeable(true);
            if p.extended.is_empty()
                && placement::holdable(&x, &self.offers, self.overhead)
                && missing_key(p, &self.offers).is_none()
            {
                self.waiting.push(x);
                self.waiting_pods.push(p);
                self.intent += 1;
            } else {
                let why = unfit(p, &self.offers, shapes, self.overhead);
                self.unfit.push((p.key(), why));
            }
        }
    }
}

fn picture<'a>(
    pods: &'a [PodView],
    live: &[&LeaseView],
    shapes: &[Rentable],
    labels: &'a Labels,
    daemonset_specs: &[DaemonView],
    k: &Knobs,
) -> Picture<'a> {
    let index: HashMap<&str, usize> = live
        .iter()
        .enumerate()
        .map(|(i, l)| (l.node.as_str(), i))
        .collect();
    let mut pic = Picture {
        existing: existing(live, labels, k.pods_per_node),
        offers: kinds(shapes, labels, k.pods_per_node),
        overhead: Usage::default(),
        waiting: Vec::new(),
        waiting_pods: Vec::new(),
        nominated: vec![false; live.len()],
        intent: 0,
        unfit: Vec::new(),
    };
    let (pending, daemonsets) = pic.sort(pods, &index, k);
    pic.limit_slots(live);
    // What every new node pays before any work: what the DaemonSets' specs ask of it, or
    // the most their Pods take on any live node, whichever is more in each dimension.
    let seen = daemonsets
        .into_iter()
        .max_by_key(|u| (u.cpu_millis, u.memory_bytes))
        .unwrap_or_default();
    let specs = daemonset_overhead(daemonset_specs, &pic.offers);
    pic.overhead = Usage {
        cpu_millis: seen.cpu_millis.max(specs.cpu_millis),
        memory_bytes: seen.memory_bytes.max(specs.memory_bytes),
        slots: 0,
    };
    pic.admit(pending, shapes);
    pic
}

/// The decision. `last_intent_at` is when intent was last seen non-zero (the cluster's
/// creation when never).
pub fn decide(
    pods: &[PodView],
    leases: &[LeaseView],
    offers: &Offers<'_>,
    pool: &Pool,
    k: &Knobs,
    now: SystemTime,
    last_intent_at: SystemTime,
) -> Decision {
    let live: Vec<&LeaseView> = leases.iter().filter(|l| l.live).collect();
    let nodes = live.len() as u32;
    let shapes = rentable(offers, pool, k);
    let shapes = &shapes[..];
    let labels = labels(&live, shapes, offers.labels);
    let pic = picture(pods, &live, shapes, &labels, offers.daemonsets, k);
    let intent = pic.intent;
    let max_new = k.max_nodes.saturating_sub(nodes) as usize;
    let mut plan = placement::plan(
        &pic.existing,
        &pic.waiting,
        &pic.offers,
        pic.overhead,
        max_new,
    );
    within_limits(&mut plan, &live, shapes, pool);
    let placed = Placed::of(&plan, &pic.waiting, pool);
    let new = placed.new;
    let empty = if intent > 0 {
        empty_nodes(&live, &pic.existing, &pic.nominated, &plan.places)
    } else {
        Vec::new()
    };
    let on_registered = plan
        .places
        .iter()
        .zip(&pic.waiting_pods)
        .filter_map(|(x, p)| match x {
            Place::Existing(i) if live[*i].allocatable.is_some() => Some(p.key()),
            _ => None,
        })
        .collect();
    let mut d = Decision {
        action: Action::Hold,
        target: nodes + new,
        nodes,
        intent,
        unfit: pic.unfit,
        last_intent_at: if intent > 0 { now } else { last_intent_at },
        reason: String::new(),
        shapes: plan.new_nodes.iter().map(|&i| shapes[i].clone()).collect(),
        empty,
        on_registered,
    };
    if intent > 0 {
        work(&mut d, &placed, k);
        return d;
    }
    idle(
        &mut d,
        k,
        now.duration_since(last_intent_at).unwrap_or_default(),
    );
    d
}

/// What the placement did with the Pods that wait, for the reason.
struct Placed {
    waiting: usize,
    on_leased: usize,
    new: u32,
    capped: usize,
    /// Pods with pod affinity that no node can take (none has the Pods they want, with room).
    grouped: usize,
    /// The NodePool limits CPU or memory.
    limits: bool,
}

impl Placed {
    fn of(plan: &Plan, waiting: &[Placeable<'_>], pool: &Pool) -> Placed {
        // Unplaced: past the caps, or (with pod affinity) no node has the Pods it wants
        // with room beside them.
        let unplaced = |grouped: bool| {
            plan.places
                .iter()
                .zip(waiting)
                .filter(|(x, p)| **x == Place::Capped && p.affinity.is_empty() != grouped)
                .count()
        };
        Placed {
            waiting: waiting.len(),
            on_leased: plan
                .places
                .iter()
                .filter(|x| matches!(x, Place::Existing(_)))
                .count(),
            new: plan.new_nodes.len() as u32,
            capped: unplaced(false),
            grouped: unplaced(true),
            limits: pool.has_limits(),
        }
    }
}

/// The shapes the cluster may rent: those on offer (none known: the `[node]` size at price
/// 0) that the tenant's pool allows.
fn rentable(offers: &Offers<'_>, pool: &Pool, k: &Knobs) -> Vec<Rentable> {
    let fallback = [Rentable::anywhere(Shape {
        spec: k.node.into(),
        price_micros_per_hour: 0,
    })];
    let on_offer = if offers.shapes.is_empty() {
        &fallback[..]
    } else {
        offers.shapes
    };
    on_offer
        .iter()
        .filter(|s| {
            pool.allows(&node_labels(
                offers.labels,
                &s.shape.spec,
                &s.topology,
                NEW_NODE,
            ))
        })
        .cloned()
        .collect()
}

/// Drops the new nodes past the pool's CPU and memory limits (counted over the live nodes'
/// shapes and the new ones', in the order they would be rented); their Pods are capped.
fn within_limits(plan: &mut Plan, live: &[&LeaseView], shapes: &[Rentable], pool: &Pool) {
    if !pool.has_limits() {
        return;
    }
    let size = |s: &NodeSpec| (u64::from(s.vcpu) * 1000, s.mem_mib << 20);
    let (mut cpu, mut mem) = live.iter().fold((0, 0), |(c, m), l| {
        let (dc, dm) = size(&l.spec);
        (c + dc, m + dm)
    });
    let mut kept = Vec::new();
    let mut renumber = vec![None; plan.new_nodes.len()];
    for (i, &s) in plan.new_nodes.iter().enumerate() {
        let (dc, dm) = size(&shapes[s].shape.spec);
        if pool.max_cpu_millis.is_some_and(|x| cpu + dc > x)
            || pool.max_memory_bytes.is_some_and(|x| mem + dm > x)
        {
            continue;
        }
        (cpu, mem) = (cpu + dc, mem + dm);
        renumber[i] = Some(kept.len());
        kept.push(s);
    }
    for p in &mut plan.places {
        if let Place::New(i) = *p {
            *p = renumber[i].map_or(Place::Capped, Place::New);
        }
    }
    plan.new_nodes = kept;
}

/// The decision of a cluster with work: Provision the new nodes, or Hold.
fn work(d: &mut Decision, p: &Placed, k: &Knobs) {
    let (intent, nodes, new, capped) = (d.intent, d.nodes, p.new, p.capped);
    let mut cap = if capped > 0 {
        format!(
            "; {capped} would need more nodes, capped at max_nodes {}{}",
            k.max_nodes,
            if p.limits {
                " and the NodePool's limits"
            } else {
                ""
            }
        )
    } else {
        String::new()
    };
    if p.grouped > 0 {
        cap += &format!(
            "; {} wait for the Pods their affinity wants, with room beside them",
            p.grouped
        );
    }
    if new > 0 {
        d.action = Action::Provision { count: new };
        d.reason = if nodes == 0 && capped == 0 && p.grouped == 0 {
            "Provision: intent and no node".into()
        } else {
            format!(
                "Provision: {} pods wait, {} fit the {nodes} nodes leased, {new} more nodes for \
                 the rest{cap}",
                p.waiting, p.on_leased
            )
        };
    } else {
        d.reason = format!("Hold: {intent} pods on {nodes} nodes{cap}");
    }
}

/// The live nodes no work is bound to, nominated to, or sent by the placement.
fn empty_nodes(
    live: &[&LeaseView],
    existing: &[Existing<'_>],
    nominated: &[bool],
    places: &[Place],
) -> Vec<String> {
    let mut used: Vec<bool> = existing
        .iter()
        .zip(nominated)
        .map(|(e, nominated)| *nominated || e.pods.iter().any(|p| p.takes_slot))
        .collect();
    for p in places {
        if let Place::Existing(i) = p {
            used[*i] = true;
        }
    }
    live.iter()
        .zip(used)
        .filter(|(_, used)| !used)
        .map(|(l, _)| l.node.clone())
        .collect()
}

/// The empty nodes to release now: those empty for longer than `hold`. `since` remembers
/// when each node was first seen empty (kept by the caller between decisions; a node with
/// work again is forgotten, so its clock starts over).
pub fn releases(
    empty: &[String],
    since: &mut HashMap<String, SystemTime>,
    now: SystemTime,
    hold: Duration,
) -> Vec<(String, Duration)> {
    held_past(empty, since, now, hold)
}

/// Of `names` (seen now), those seen at every call for longer than `hold`, and for how
/// long. `since` remembers when each was first seen; one missing from a call is forgotten,
/// so its clock starts over.
pub fn held_past(
    names: &[String],
    since: &mut HashMap<String, SystemTime>,
    now: SystemTime,
    hold: Duration,
) -> Vec<(String, Duration)> {
    let seen: std::collections::HashSet<&String> = names.iter().collect();
    since.retain(|n, _| seen.contains(n));
    let mut due = Vec::new();
    for n in names {
        let at = *since.entry(n.clone()).or_insert(now);
        let idle = now.duration_since(at).unwrap_or_default();
        if idle > hold {
            due.push((n.clone(), idle));
        }
    }
    due
}

/// When the next empty node's hold ends, if one is empty.
pub fn next_release(since: &HashMap<String, SystemTime>, hold: Duration) -> Option<SystemTime> {
    since.values().min().map(|t| *t + hold)
}

/// The decision of a cluster with no intent, idle for `idle`: Teardown past the hold.
fn idle(d: &mut Decision, k: &Knobs, idle: Duration) {
    d.target = 0;
    if d.nodes == 0 {
        d.reason = "Hold: nothing running and no node".into();
    } else if idle > k.hold {
        d.action = Action::Teardown;
        d.reason = format!(
            "Teardown: nothing running for {}, past the {} hold",
            go_duration(idle),
            go_duration(k.hold)
        );
    } else {
        d.reason = format!(
            "Hold: nothing running for {}, within the {} hold",
            go_duration(idle),
            go_duration(k.hold)
        );
    }
}

/// When a decision made now with zero intent would turn into a Teardown, if it would.
pub fn teardown_due(d: &Decision, k: &Knobs) -> Option<SystemTime> {
    (d.intent == 0 && d.nodes > 0 && d.action == Action::Hold).then(|| d.last_intent_at + k.hold)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn knobs() -> Knobs {
        Knobs {
            max_nodes: 5,
            pods_per_node: 1,
            hold: Duration::from_secs(60),
            expendable_priority_cutoff: -10,
            node: NodeSize {
                vcpu: 2,
                mem_mib: 4096,
                disk_mib: 20480,
            },
            max_hold: Duration::from_secs(3600),
        }
    }

    fn pod(name: &str, phase: Phase) -> PodView {
        PodView {
            namespace: "gitlab-runner".into(),
            name: name.into(),
            phase,
            priority: 0,
            node_name: None,
            follows_nodes: false,
            cpu_millis: 500,
            memory_bytes: 256 << 20,
            extended: Vec::new(),
            scheduling: Scheduling::Unschedulable(String::new()),
            claims: Vec::new(),
            labels: BTreeMap::new(),
            anti_affinity: Vec::new(),
            affinity: Vec::new(),
            spread: Vec::new(),
            node: NodeRequirements::default(),
            host_ports: Vec::new(),
        }
    }

    /// The decision with no shape known from the market: the `[node]` size.
    fn decide_on(
        pods: &[PodView],
        leases: &[LeaseView],
        k: &Knobs,
        now: SystemTime,
        last: SystemTime,
    ) -> Decision {
        let none = BTreeMap::new();
        let offers = Offers {
            shapes: &[],
            labels: &none,
            daemonsets: &[],
        };
        decide(pods, leases, &offers, &Pool::default(), k, now, last)
    }

    /// The seeds' GitLab job: one per node.
    fn job(name: &str) -> PodView {
        use crate::placement::{Namespaces, Requirement, Selector};
        let key = "project.runner.gitlab.com/id";
        let mut p = pod(name, Phase::Pending);
        p.cpu_millis = 100;
        p.labels = [(key.to_string(), "42".to_string())].into();
        p.anti_affinity = vec![AntiAffinity {
            selector: Selector {
                match_expressions: vec![Requirement::Exists(key.into())],
                ..Default::default()
            },
            namespaces: Namespaces::Listed(vec![]),
            topology_key: HOSTNAME.into(),
        }];
        p
    }

    fn leases(n: usize) -> Vec<LeaseView> {
        (0..n)
            .map(|i| LeaseView {
                node: format!("n{i}"),
                live: true,
                spec: knobs().node.into(),
                allocatable: None,
                topology: Topology::default(),
                pod_capacity: None,
            })
            .collect()
    }

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + secs)
    }

    #[test]
    fn one_pending_pod_and_no_node_provisions_one() {
        let d = decide_on(&[pod("a", Phase::Pending)], &[], &knobs(), t(10), t(0));
        assert_eq!(d.action, Action::Provision { count: 1 });
        assert_eq!(d.reason, "Provision: intent and no node");
        assert_eq!((d.target, d.nodes, d.intent), (1, 0, 1));
        assert_eq!(d.last_intent_at, t(10));
    }

    #[test]
    fn five_pods_one_per_node_provision_five_then_the_rest() {
        let pods: Vec<_> = (0..5)
            .map(|i| pod(&format!("j{i}"), Phase::Pending))
            .collect();
        let d = decide_on(&pods, &[], &knobs(), t(1), t(0));
        assert_eq!(d.action, Action::Provision { count: 5 });
        let d = decide_on(&pods, &leases(2), &knobs(), t(1), t(0));
        assert_eq!(d.action, Action::Provision { count: 3 });
        assert_eq!(
            d.reason,
            "Provision: 5 pods wait, 2 fit the 2 nodes leased, 3 more nodes for the rest"
        );
        let d = decide_on(&pods, &leases(5), &knobs(), t(1), t(0));
        assert_eq!(d.action, Action::Hold);
    }

    #[test]
    fn pods_per_node_rounds_up_and_max_nodes_caps() {
        let mut k = knobs();
        k.pods_per_node = 8;
        // (100m each: the slots, not the CPU, bound them.)
        let pods: Vec<_> = (0..9)
            .map(|i| {
                let mut p = pod(&format!("p{i}"), Phase::Pending);
                p.cpu_millis = 100;
                p
            })
            .collect();
        assert_eq!(decide_on(&pods, &[], &k, t(1), t(0)).target, 2);
        k.pods_per_node = 1;
        let d = decide_on(&pods, &leases(5), &k, t(1), t(0));
        assert_eq!((d.target, d.action), (5, Action::Hold));
        assert!(d.reason.contains("capped at max_nodes 5"), "{}", d.reason);
    }

    #[test]
    fn anti_affine_jobs_get_a_node_each_whatever_pods_per_node_says() {
        let mut k = knobs();
        k.pods_per_node = 8;
        let jobs: Vec<_> = (0..4).map(|i| job(&format!("j{i}"))).collect();
        let d = decide_on(&jobs, &[], &k, t(1), t(0));
        assert_eq!((d.action, d.target), (Action::Provision { count: 4 }, 4));
        // One runs on n0; the three others wait: three more nodes, not none.
        let mut some = jobs.clone();
        some[0].phase = Phase::Running;
        some[0].node_name = Some("n0".into());
        let d = decide_on(&some, &leases(1), &k, t(1), t(0));
        assert_eq!(d.action, Action::Provision { count: 3 }, "{}", d.reason);
        // Plain Pods still pack 8 to a node beside a job.
        let plain: Vec<_> = (0..7)
            .map(|i| {
                let mut p = pod(&format!("p{i}"), Phase::Pending);
                p.cpu_millis = 100;
                p
            })
            .collect();
        let mut mixed = vec![some[0].clone()];
        mixed.extend(plain);
        let d = decide_on(&mixed, &leases(1), &k, t(1), t(0));
        assert_eq!(d.action, Action::Hold, "{}", d.reason);
    }

    #[test]
    fn requests_decide_how_many_pods_a_node_holds() {
        let mut k = knobs();
        k.pods_per_node = 8;
        // 1500m each on 2-vCPU nodes: one a node.
        let pods: Vec<_> = (0..3)
            .map(|i| {
                let mut p = pod(&format!("big{i}"), Phase::Pending);
                p.cpu_millis = 1500;
                p
            })
            .collect();
        assert_eq!(decide_on(&pods, &[], &k, t(1), t(0)).target, 3);
        // A DaemonSet's Pod on the leased node takes room too.
        let mut ds = pod("ds", Phase::Running);
        ds.follows_nodes = true;
        ds.node_name = Some("n0".into());
        ds.cpu_millis = 1000;
        let mut work = pod("work", Phase::Running);
        work.node_name = Some("n0".into());
        work.cpu_millis = 500;
        let mut small = pod("small", Phase::Pending);
        small.cpu_millis = 800;
        let d = decide_on(&[ds, work, small], &leases(1), &k, t(1), t(0));
        assert_eq!(d.action, Action::Provision { count: 1 }, "{}", d.reason);
    }

    #[test]
    fn a_node_whose_work_ended_is_released_past_the_hold_while_others_work() {
        let k = knobs();
        // Three jobs on three nodes; two have finished.
        let mut jobs: Vec<_> = (0..3).map(|i| job(&format!("j{i}"))).collect();
        for (i, j) in jobs.iter_mut().enumerate() {
            j.node_name = Some(format!("n{i}"));
            j.phase = if i == 2 {
                Phase::Running
            } else {
                Phase::Succeeded
            };
        }
        let d = decide_on(&jobs, &leases(3), &k, t(100), t(0));
        assert_eq!((d.action, d.intent), (Action::Hold, 1));
        assert_eq!(d.empty, vec!["n0".to_string(), "n1".to_string()]);
        let mut since = HashMap::new();
        assert!(releases(&d.empty, &mut since, t(100), k.hold).is_empty());
        assert_eq!(next_release(&since, k.hold), Some(t(160)));
        assert!(
            releases(&d.empty, &mut since, t(160), k.hold).is_empty(),
            "at the hold, kept"
        );
        let due = releases(&d.empty, &mut since, t(161), k.hold);
        assert_eq!(
            due,
            vec![
                ("n0".into(), Duration::from_secs(61)),
                ("n1".into(), Duration::from_secs(61))
            ]
        );
        // A node a waiting Pod will go to is not empty, and its clock starts over.
        let mut next = jobs.clone();
        next.push(pod("waits", Phase::Pending));
        let d = decide_on(&next, &leases(3), &k, t(162), t(0));
        assert_eq!(d.empty, vec!["n1".to_string()]);
        releases(&d.empty, &mut since, t(162), k.hold);
        assert_eq!(since.keys().collect::<Vec<_>>(), vec!["n1"]);
        // An expendable Pod (GitLab's pause Pods) or a DaemonSet's keeps no node.
        let mut pause = pod("pause", Phase::Running);
        pause.priority = -10;
        pause.node_name = Some("n0".into());
        let mut ds = pod("ds", Phase::Running);
        ds.follows_nodes = true;
        ds.node_name = Some("n1".into());
        let d = decide_on(&[pause, ds, jobs[2].clone()], &leases(3), &k, t(1), t(0));
        assert_eq!(d.empty, vec!["n0".to_string(), "n1".to_string()]);
        // With no work at all, the whole cluster follows the hold instead.
        assert!(decide_on(&[], &leases(3), &k, t(1), t(0)).empty.is_empty());
    }

    fn shape(vcpu: u32, price: u64) -> Rentable {
        Rentable::anywhere(Shape {
            spec: NodeSpec {
                vcpu,
                mem_mib: 2048 * u64::from(vcpu),
                disk_mib: 20480,
            },
            price_micros_per_hour: price,
        })
    }

    #[test]
    fn each_node_is_rented_as_the_cheapest_shape_on_offer_that_holds_its_pods() {
        // The issue's operator: `[node]` of 1 vCPU, a provider with 1- and 2-vCPU shapes.
        let mut k = knobs();
        k.node.vcpu = 1;
        k.pods_per_node = 8;
        let shapes = [shape(1, 10), shape(2, 20)];
        let base = BTreeMap::from([("socialweb.computer/cluster".to_string(), "ci".to_string())]);
        let offers = Offers {
            shapes: &shapes,
            labels: &base,
            daemonsets: &[],
        };
        let mut big = pod("big", Phase::Pending);
        big.cpu_millis = 1500;
        let d = decide(
            &[big.clone()],
            &[],
            &offers,
            &Pool::default(),
            &k,
            t(1),
            t(0),
        );
        assert_eq!(d.action, Action::Provision { count: 1 });
        assert_eq!(d.shapes, vec![shapes[1].clone()]);
        // With only the `[node]` size known it is unfit, and says what is on offer.
        let d = decide_on(&[big.clone()], &[], &k, t(1), t(0));
        assert_eq!(d.action, Action::Hold);
        assert!(d.unfit[0].1.contains("1500m CPU"), "{:?}", d.unfit);
        assert!(
            d.unfit[0].1.contains("shapes: 1vcpu-4096mib)"),
            "{:?}",
            d.unfit
        );
        // A small Pod gets the small shape; a nodeSelector on the shape gets that shape.
        let small = pod("small", Phase::Pending);
        let d = decide(
            std::slice::from_ref(&small),
            &[],
            &offers,
            &Pool::default(),
            &k,
            t(1),
            t(0),
        );
        assert_eq!(d.shapes, vec![shapes[0].clone()]);
        let mut pinned = small.clone();
        pinned.node.selector = [(INSTANCE_TYPE.to_string(), "2vcpu-4096mib".to_string())].into();
        let d = decide(
            &[pinned.clone()],
            &[],
            &offers,
            &Pool::default(),
            &k,
            t(1),
            t(0),
        );
        assert_eq!(d.shapes, vec![shapes[1].clone()]);
        // The cluster's own label matches; a label no node carries is unfit, and said so.
        pinned.node.selector = base.clone();
        let d = decide(
            &[pinned.clone()],
            &[],
            &offers,
            &Pool::default(),
            &k,
            t(1),
            t(0),
        );
        assert_eq!(d.shapes, vec![shapes[0].clone()]);
        pinned.node.selector = [("gpu".to_string(), "true".to_string())].into();
        let d = decide(&[pinned], &[], &offers, &Pool::default(), &k, t(1), t(0));
        assert_eq!((d.action, d.intent), (Action::Hold, 0));
        assert!(
            d.unfit[0].1.contains("matches no node on offer"),
            "{:?}",
            d.unfit
        );
        // A leased node keeps its own shape: the 1500m Pod fits beside nothing on a 2-vCPU
        // node, not on a 1-vCPU one.
        let two = LeaseView {
            node: "n0".into(),
            live: true,
            spec: shapes[1].shape.spec,
            allocatable: None,
            topology: Topology::default(),
            pod_capacity: None,
        };
        let d = decide(
            &[big.clone()],
            std::slice::from_ref(&two),
            &offers,
            &Pool::default(),
            &k,
            t(1),
            t(0),
        );
        assert_eq!(d.action, Action::Hold, "{}", d.reason);
        let one = LeaseView {
            spec: shapes[0].shape.spec,
            ..two
        };
        let d = decide(&[big], &[one], &offers, &Pool::default(), &k, t(1), t(0));
        assert_eq!(d.action, Action::Provision { count: 1 }, "{}", d.reason);
    }

    #[test]
    fn the_daemonsets_specs_size_the_first_node_at_zero() {
        let k = knobs();
        let shapes = [shape(1, 10), shape(2, 20)];
        let base = BTreeMap::new();
        // A 600m DaemonSet, and one that runs only on 4-vCPU nodes (none on offer).
        let daemonsets = [
            DaemonView {
                cpu_millis: 600,
                memory_bytes: 64 << 20,
                node: NodeRequirements::default(),
            },
            DaemonView {
                cpu_millis: 3000,
                memory_bytes: 0,
                node: NodeRequirements {
                    selector: [(INSTANCE_TYPE.to_string(), "4vcpu-8192mib".to_string())].into(),
                    ..Default::default()
                },
            },
        ];
        let job = pod("job", Phase::Pending);
        let decide_with = |daemonsets: &[DaemonView]| {
            let offers = Offers {
                shapes: &shapes,
                labels: &base,
                daemonsets,
            };
            decide(
                std::slice::from_ref(&job),
                &[],
                &offers,
                &Pool::default(),
                &k,
                t(1),
                t(0),
            )
        };
        // No node, so none seen: the 500m job would get the 1-vCPU shape, where the
        // DaemonSet's 600m leaves it 400m.
        assert_eq!(decide_with(&[]).shapes, vec![shapes[0].clone()]);
        let d = decide_with(&daemonsets);
        assert_eq!(d.shapes, vec![shapes[1].clone()], "{}", d.reason);
    }

    #[test]
    fn zone_spread_rents_where_zones_are_on_offer_and_nothing_where_none_is() {
        let k = knobs();
        let mut web = pod("web", Phase::Pending);
        web.labels = [("app".to_string(), "web".to_string())].into();
        web.spread = vec![Spread {
            max_skew: 1,
            selector: crate::placement::Selector {
                match_labels: web.labels.clone(),
                ..Default::default()
            },
            topology_key: ZONE.into(),
        }];
        let mut other = web.clone();
        other.name = "web2".into();
        // No provider names a zone: nothing is rented, and the Pod is told why.
        let d = decide_on(&[web.clone(), other.clone()], &[], &k, t(1), t(0));
        assert_eq!((d.action, d.intent), (Action::Hold, 0), "{}", d.reason);
        assert!(
            d.unfit[0].1.contains("topology.kubernetes.io/zone"),
            "{:?}",
            d.unfit
        );
        // Zones a and b on offer: a node in each, each rented where its Pod's zone is.
        let zone = |z: &str, price| Rentable {
            topology: Topology {
                region: Some("eu".into()),
                zone: Some(z.into()),
            },
            ..shape(2, price)
        };
        let shapes = [zone("a", 10), zone("b", 20)];
        let base = BTreeMap::new();
        let offers = Offers {
            shapes: &shapes,
            labels: &base,
            daemonsets: &[],
        };
        let d = decide(
            &[web, other],
            &[],
            &offers,
            &Pool::default(),
            &k,
            t(1),
            t(0),
        );
        assert_eq!(d.action, Action::Provision { count: 2 }, "{}", d.reason);
        assert_eq!(d.shapes, shapes.to_vec());
        assert!(d.unfit.is_empty(), "{:?}", d.unfit);
    }

    #[test]
    fn the_tenants_node_pool_narrows_the_shapes_limits_the_nodes_and_sets_the_hold() {
        let mut k = knobs();
        k.pods_per_node = 8;
        let shapes = [shape(1, 10), shape(2, 20)];
        let base = BTreeMap::new();
        let offers = Offers {
            shapes: &shapes,
            labels: &base,
            daemonsets: &[],
        };
        let small = pod("small", Phase::Pending);
        // Only the 2-vCPU shape: the small Pod gets it.
        let only_big = Pool {
            requirements: vec![Requirement::In(
                INSTANCE_TYPE.into(),
                vec!["2vcpu-4096mib".into()],
            )],
            ..Default::default()
        };
        let d = decide(
            std::slice::from_ref(&small),
            &[],
            &offers,
            &only_big,
            &k,
            t(1),
            t(0),
        );
        assert_eq!(d.shapes, vec![shapes[1].clone()]);
        // No shape left: unfit, and said why.
        let none = Pool {
            requirements: vec![Requirement::In(INSTANCE_TYPE.into(), vec!["gpu".into()])],
            ..Default::default()
        };
        let d = decide(
            std::slice::from_ref(&small),
            &[],
            &offers,
            &none,
            &k,
            t(1),
            t(0),
        );
        assert_eq!((d.action, d.intent), (Action::Hold, 0));
        assert!(d.unfit[0].1.contains("NodePool"), "{:?}", d.unfit);
        // Four anti-affine jobs under a 3-vCPU limit: a 1-vCPU node each, three of them.
        let jobs: Vec<_> = (0..4).map(|i| job(&format!("j{i}"))).collect();
        let cpu = Pool {
            max_cpu_millis: Some(3000),
            ..Default::default()
        };
        let d = decide(&jobs, &[], &offers, &cpu, &k, t(1), t(0));
        assert_eq!(d.action, Action::Provision { count: 3 }, "{}", d.reason);
        assert!(d.reason.contains("1 would need more nodes"), "{}", d.reason);
        assert!(d.reason.contains("NodePool's limits"), "{}", d.reason);
        // A node limit below the operator's, and consolidateAfter within the operator's cap.
        let pool = Pool {
            max_nodes: Some(2),
            consolidate_after: Some(Duration::from_secs(7200)),
            ..Default::default()
        };
        let kk = pool.knobs(&k);
        assert_eq!((kk.max_nodes, kk.hold), (2, Duration::from_secs(3600)));
        let d = decide(&jobs, &[], &offers, &Pool::default(), &kk, t(1), t(0));
        assert_eq!(d.action, Action::Provision { count: 2 });
        let more = Pool {
            max_nodes: Some(50),
            consolidate_after: Some(Duration::from_secs(5)),
            ..Default::default()
        };
        let kk = more.knobs(&k);
        assert_eq!(
            (kk.max_nodes, kk.hold),
            (k.max_nodes, Duration::from_secs(5))
        );
    }

    #[test]
    fn a_new_node_pays_the_daemonsets_overhead() {
        let mut k = knobs();
        k.pods_per_node = 8;
        let mut ds = pod("ds", Phase::Running);
        ds.follows_nodes = true;
        ds.node_name = Some("n0".into());
        ds.cpu_millis = 600;
        let mut work = pod("w", Phase::Running);
        work.node_name = Some("n0".into());
        work.cpu_millis = 1400;
        // 1500m wait: not on n0 (full), and a new 2-vCPU node has 1400m after the 600m.
        let mut big = pod("big", Phase::Pending);
        big.cpu_millis = 1500;
        let d = decide_on(&[ds.clone(), work.clone(), big], &leases(1), &k, t(1), t(0));
        assert_eq!((d.action, d.intent), (Action::Hold, 1), "{}", d.reason);
        assert!(
            d.unfit[0].1.contains("DaemonSets' 600m CPU"),
            "{:?}",
            d.unfit
        );
        let mut fits = pod("fits", Phase::Pending);
        fits.cpu_millis = 1400;
        let d = decide_on(&[ds, work, fits], &leases(1), &k, t(1), t(0));
        assert_eq!(d.action, Action::Provision { count: 1 }, "{}", d.reason);
    }

    #[test]
    fn running_and_unknown_count_finished_pods_do_not() {
        let pods = [
            pod("r", Phase::Running),
            pod("u", Phase::Unknown),
            pod("s", Phase::Succeeded),
            pod("f", Phase::Failed),
        ];
        assert_eq!(decide_on(&pods, &leases(2), &knobs(), t(1), t(0)).intent, 2);
    }

    #[test]
    fn addons_daemonsets_and_expendable_pods_are_not_intent() {
        let mut addon = pod("coredns", Phase::Pending);
        addon.namespace = "kube-system".into();
        let mut ds = pod("agent", Phase::Pending);
        ds.follows_nodes = true;
        let mut pause = pod("pause", Phase::Pending);
        pause.priority = -10;
        let mut lower = pod("lower", Phase::Pending);
        lower.priority = -100;
        let mut just_above = pod("above", Phase::Pending);
        just_above.priority = -9;
        let d = decide_on(&[addon, ds, pause, lower], &[], &knobs(), t(1), t(0));
        assert_eq!((d.intent, d.action), (0, Action::Hold));
        assert_eq!(
            decide_on(&[just_above], &[], &knobs(), t(1), t(0)).intent,
            1
        );
    }

    #[test]
    fn a_pod_no_node_can_hold_rents_nothing_and_is_reported() {
        let mut big = pod("big", Phase::Pending);
        big.cpu_millis = 4000;
        let mut huge = pod("huge", Phase::Pending);
        huge.memory_bytes = 64 << 30;
        let d = decide_on(&[big, huge], &[], &knobs(), t(1), t(0));
        assert_eq!((d.intent, d.action), (0, Action::Hold));
        assert_eq!(d.unfit.len(), 2);
        assert!(d.unfit[0].1.contains("4000m CPU"), "{:?}", d.unfit);
        assert!(d.unfit[1].1.contains("65536 MiB"), "{:?}", d.unfit);
        // Once placed (on a node someone else made), it is intent like any other.
        let mut placed = pod("big", Phase::Pending);
        placed.cpu_millis = 4000;
        placed.node_name = Some("n0".into());
        assert_eq!(
            decide_on(&[placed], &leases(1), &knobs(), t(1), t(0)).intent,
            1
        );
    }

    #[test]
    fn zero_intent_tears_down_only_past_the_hold() {
        let k = knobs();
        let within = decide_on(&[], &leases(3), &k, t(60), t(0));
        assert_eq!(within.action, Action::Hold);
        assert_eq!(
            within.reason,
            "Hold: nothing running for 1m0s, within the 1m0s hold"
        );
        assert_eq!(teardown_due(&within, &k), Some(t(60)));
        let past = decide_on(
            &[],
            &leases(3),
            &k,
            t(0) + Duration::from_millis(60_900),
            t(0),
        );
        assert_eq!(past.action, Action::Teardown);
        assert_eq!(past.target, 0);
        assert_eq!(
            past.reason,
            "Teardown: nothing running for 1m0.9s, past the 1m0s hold"
        );
        assert_eq!(past.last_intent_at, t(0), "the hold clock is not reset");
        let idle = decide_on(&[], &[], &k, t(500), t(0));
        assert_eq!(idle.action, Action::Hold);
        assert_eq!(idle.reason, "Hold: nothing running and no node");
    }

    #[test]
    fn released_leases_are_not_nodes() {
        let l = vec![
            LeaseView {
                node: "a".into(),
                live: false,
                spec: knobs().node.into(),
                allocatable: None,
                topology: Topology::default(),
                pod_capacity: None,
            },
            LeaseView {
                node: "b".into(),
                live: true,
                spec: knobs().node.into(),
                allocatable: None,
                topology: Topology::default(),
                pod_capacity: None,
            },
        ];
        let d = decide_on(&[pod("p", Phase::Pending)], &l, &knobs(), t(1), t(0));
        assert_eq!((d.nodes, d.action), (1, Action::Hold));
    }

    #[test]
    fn durations_read_like_go() {
        for (ms, s) in [
            (60_900, "1m0.9s"),
            (60_000, "1m0s"),
            (120_000, "2m0s"),
            (12_340, "12.3s"),
            (450, "450ms"),
            (40, "40ms"),
            (3_600_000, "1h0m0s"),
        ] {
            assert_eq!(go_duration(Duration::from_millis(ms)), s, "{ms}");
        }
    }

    #[test]
    fn ten_thousand_pods_are_counted() {
        let pods: Vec<_> = (0..10_000)
            .map(|i| pod(&format!("p{i}"), Phase::Pending))
            .collect();
        let d = decide_on(&pods, &leases(3), &knobs(), t(1), t(0));
        assert_eq!(d.intent, 10_000);
        assert_eq!((d.target, d.action), (5, Action::Provision { count: 2 }));
        assert!(
            d.reason
                .ends_with("9995 would need more nodes, capped at max_nodes 5"),
            "{}",
            d.reason
        );
    }

    #[test]
    fn only_what_the_scheduler_refused_rents() {
        let k = knobs();
        let with = |name: &str, s: Scheduling| {
            let mut p = pod(name, Phase::Pending);
            p.scheduling = s;
            p
        };
        // Gated, another scheduler's: no intent, no node, and no hold on the nodes there are.
        for s in [
            Scheduling::Gated,
            Scheduling::OtherScheduler("gitlab".into()),
            Scheduling::MissingClaim("data".into()),
        ] {
            let d = decide_on(&[with("a", s.clone())], &[], &k, t(1), t(0));
            assert_eq!((d.action, d.intent), (Action::Hold, 0), "{s:?}");
            let d = decide_on(&[with("a", s.clone())], &leases(1), &k, t(100), t(0));
            assert_eq!(d.action, Action::Teardown, "{s:?}: {}", d.reason);
        }
        // Not looked at yet: intent (the hold does not end under it), but no rent.
        let d = decide_on(&[with("a", Scheduling::Unseen)], &[], &k, t(1), t(0));
        assert_eq!((d.action, d.intent), (Action::Hold, 1), "{}", d.reason);
        // Refused every node there is: rents.
        let refused = with("a", Scheduling::Unschedulable("0/0 nodes".into()));
        let d = decide_on(&[refused], &[], &k, t(1), t(0));
        assert_eq!(d.action, Action::Provision { count: 1 });
    }

    #[test]
    fn a_preempting_pod_rents_nothing_and_keeps_its_node() {
        // The pause-Pod recipe: a -10 Pod holds n0; the job is nominated to n0.
        let k = knobs();
        let mut pause = pod("pause", Phase::Running);
        pause.priority = -10;
        pause.node_name = Some("n0".into());
        pause.cpu_millis = 1900;
        let mut job = pod("job", Phase::Pending);
        job.cpu_millis = 1500;
        job.scheduling = Scheduling::Nominated("n0".into());
        let d = decide_on(&[pause.clone(), job.clone()], &leases(2), &k, t(1), t(0));
        assert_eq!((d.action, d.intent), (Action::Hold, 1), "{}", d.reason);
        assert_eq!(d.empty, vec!["n1".to_string()], "n0 is the job's");
        // Before the scheduler nominates it, the plan sees the room the pause Pod will
        // give up: still no second node.
        job.scheduling = Scheduling::Unschedulable("Insufficient cpu".into());
        let d = decide_on(&[pause, job], &leases(1), &k, t(1), t(0));
        assert_eq!(d.action, Action::Hold, "{}", d.reason);
    }

    #[test]
    fn an_extended_resource_rents_nothing_and_is_told() {
        let mut gpu = pod("cuda", Phase::Pending);
        gpu.extended = vec![("nvidia.com/gpu".into(), 1)];
        let d = decide_on(&[gpu], &[], &knobs(), t(1), t(0));
        assert_eq!((d.action, d.intent), (Action::Hold, 0));
        assert_eq!(d.unfit.len(), 1);
        assert!(
            d.unfit[0].1.contains("nvidia.com/gpu: 1"),
            "{}",
            d.unfit[0].1
        );
    }

    #[test]
    fn a_pod_the_scheduler_keeps_refusing_lets_its_node_go() {
        let k = knobs();
        let mut registered = leases(1);
        registered[0].allocatable = Some((2000, 3 << 30));
        let mut p = pod("odd", Phase::Pending);
        p.scheduling = Scheduling::Unschedulable("1 node(s) had untolerated taint".into());
        let d = decide_on(std::slice::from_ref(&p), &registered, &k, t(1), t(0));
        assert_eq!(d.action, Action::Hold);
        assert_eq!(d.on_registered, vec!["gitlab-runner/odd".to_string()]);
        // Not before the node registered: the scheduler has not seen it.
        let d = decide_on(std::slice::from_ref(&p), &leases(1), &k, t(1), t(0));
        assert!(d.on_registered.is_empty());
        // The clock: seen at every pass for longer than MISJUDGED_AFTER.
        let mut since = HashMap::new();
        let names = vec!["gitlab-runner/odd".to_string()];
        assert!(held_past(&names, &mut since, t(0), MISJUDGED_AFTER).is_empty());
        assert!(held_past(&names, &mut since, t(60), MISJUDGED_AFTER).is_empty());
        assert_eq!(
            held_past(&names, &mut since, t(61), MISJUDGED_AFTER).len(),
            1
        );
        // Refused: told, no intent, and the node goes with the hold.
        p.scheduling = Scheduling::Refused("kube-scheduler has refused it".into());
        let d = decide_on(std::slice::from_ref(&p), &registered, &k, t(200), t(100));
        assert_eq!(d.intent, 0);
        assert_eq!(d.unfit[0].1, "kube-scheduler has refused it");
        assert_eq!(d.action, Action::Teardown, "{}", d.reason);
    }

    #[test]
    fn a_bound_expendable_pod_takes_no_room() {
        let k = knobs();
        let mut pause = pod("pause", Phase::Running);
        pause.priority = -10;
        pause.node_name = Some("n0".into());
        pause.cpu_millis = 2000;
        let d = decide_on(
            &[pause, pod("a", Phase::Pending)],
            &leases(1),
            &k,
            t(1),
            t(0),
        );
        assert_eq!(d.action, Action::Hold, "{}", d.reason);
    }

    proptest::proptest! {
        /// Pods the scheduler will not place on any node we could rent (gated, another
        /// scheduler's, a missing claim, an extended resource, refused, nominated, not
        /// looked at) never
        /// change how many nodes are rented: the plan is the plan of the others alone.
        #[test]
        fn pods_no_new_node_helps_rent_nothing(
            pods in proptest::collection::vec((0u64..2500, 0u64..(3 << 30), 0u8..8), 0..30),
        ) {
            let k = knobs();
            let views: Vec<PodView> = pods
                .iter()
                .enumerate()
                .map(|(i, &(cpu, mem, kind))| {
                    let mut p = pod(&format!("p{i}"), Phase::Pending);
                    (p.cpu_millis, p.memory_bytes) = (cpu, mem);
                    p.scheduling = match kind {
                        0 => Scheduling::Gated,
                        1 => Scheduling::OtherScheduler("other".into()),
                        2 => Scheduling::Refused("no".into()),
                        3 => Scheduling::Nominated("elsewhere".into()),
                        4 => Scheduling::Unseen,
                        5 => Scheduling::MissingClaim("data".into()),
                        _ => Scheduling::Unschedulable(String::new()),
                    };
                    if kind == 6 && cpu % 2 == 0 {
                        p.extended = vec![("nvidia.com/gpu".into(), 1)];
                    }
                    p
                })
                .collect();
            let rentable: Vec<PodView> = views
                .iter()
                .filter(|p| matches!(p.scheduling, Scheduling::Unschedulable(_)) && p.extended.is_empty())
                .cloned()
                .collect();
            let all = decide_on(&views, &[], &k, t(1), t(0));
            let some = decide_on(&rentable, &[], &k, t(1), t(0));
            proptest::prop_assert_eq!(all.shapes, some.shapes);
        }
    }
}
