//! Where the Pods that wait would go, as kube-scheduler would place them, and on which node
//! shapes (issue 37), pure: the nodes the cluster has (each with the Pods bound to it), the
//! shapes the market rents and the waiting Pods in; for each waiting Pod an existing node, a
//! node to rent, or none, and each new node's shape, out. The scale decision
//! ([`crate::scale`]) rents the new nodes.
//!
//! What it simulates of the scheduler's filters: requests (CPU, memory, and a Pod slot:
//! `pods_per_node` is the fallback bound for Pods without requests), `nodeSelector` and
//! required node affinity against the labels our nodes carry (the shape's included),
//! required pod anti-affinity on `kubernetes.io/hostname` in both directions (a waiting Pod's
//! terms against the Pods on a node, and theirs against it), required pod affinity and
//! `DoNotSchedule` topology spread on the hostname. Every new node pays the DaemonSets'
//! overhead.
//!
//! Pods are placed first-fit-decreasing (the largest requests first, onto the first node
//! that holds them, existing nodes before new ones), which is what kube-scheduler's filters
//! allow; its scores may spread Pods where the plan packs them, which only leaves room. A
//! new node is not given a shape when it is opened: it keeps every shape on offer that holds
//! what was placed on it and matches each of its Pods' node requirements (Karpenter's
//! scheduling simulation does the same), so it packs up to the largest; once every Pod is
//! placed it takes the cheapest shape it kept.
//!
//! Not simulated: taints (our nodes carry none but the cordon of a node being released,
//! which the decision leaves out); terms and constraints on other topology keys (our nodes
//! carry no zone: the scheduler lets such a term pass) are ignored.

use std::collections::BTreeMap;

/// The label every node carries with its own name: the topology key of "one per node".
pub const HOSTNAME: &str = "kubernetes.io/hostname";

/// The well-known label that names a node's shape (one a kubelet may set on its own Node).
pub const INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";

/// A label selector's or node selector term's requirement (`matchExpressions`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
    /// Node selector terms only: the label's value, an integer, is greater (less).
    Gt(String, i64),
    Lt(String, i64),
}

impl Requirement {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let int = |k: &String| labels.get(k).and_then(|v| v.parse::<i64>().ok());
        match self {
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
            Requirement::Gt(k, n) => int(k).is_some_and(|v| v > *n),
            Requirement::Lt(k, n) => int(k).is_some_and(|v| v < *n),
        }
    }
}

/// A label selector (`matchLabels` and `matchExpressions`, ANDed; empty matches all).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    pub match_labels: BTreeMap<String, String>,
    pub match_expressions: Vec<Requirement>,
}

impl Selector {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| r.matches(labels))
    }
}

/// Which nodes a Pod may go to by their labels: its `nodeSelector` and its required node
/// affinity.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeRequirements {
    /// `nodeSelector`: every label, equal.
    pub selector: BTreeMap<String, String>,
    /// `requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms`, ORed, each
    /// term's requirements ANDed (a term with none matches no node, as the API says; a
    /// `matchFields` on `metadata.name` is a requirement on [`HOSTNAME`]). Empty: no affinity.
    pub terms: Vec<Vec<Requirement>>,
}

/// No labels and no requirement: what the placement's stand-in for the least Pod carries.
static EMPTY: BTreeMap<String, String> = BTreeMap::new();
static ANY_NODE: NodeRequirements = NodeRequirements::ANY;

impl NodeRequirements {
    /// No requirement: every node matches.
    pub const ANY: NodeRequirements = NodeRequirements {
        selector: BTreeMap::new(),
        terms: Vec::new(),
    };

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.selector.iter().all(|(k, v)| labels.get(k) == Some(v))
            && (self.terms.is_empty()
                || self
                    .terms
                    .iter()
                    .any(|t| !t.is_empty() && t.iter().all(|r| r.matches(labels))))
    }

    pub fn is_empty(&self) -> bool {
        self.selector.is_empty() && self.terms.is_empty()
    }
}

/// Which namespaces a term's selector looks in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Namespaces {
    /// The listed ones (`namespaces`; empty with no `namespaceSelector`: the Pod's own).
    Listed(Vec<String>),
    /// Every namespace (a `namespaceSelector`: `{}` selects all; one with terms is taken as
    /// all too, since the decision does not read namespaces' labels: at worst a node more).
    All,
}

/// A required pod anti-affinity term on [`HOSTNAME`]: no Pod it selects may share the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AntiAffinity {
    pub selector: Selector,
    pub namespaces: Namespaces,
}

/// A topology spread constraint on [`HOSTNAME`] with `whenUnsatisfiable: DoNotSchedule`:
/// the Pods it selects in the Pod's namespace may differ by at most `max_skew` between the
/// node the Pod goes to and the emptiest node it could go to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spread {
    pub max_skew: u32,
    pub selector: Selector,
}

/// What placement needs of a Pod (borrowed from the decision's view of it: no copies of
/// labels for 10,000 Pods).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placeable<'a> {
    pub namespace: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    /// Whether it takes one of a node's `pods_per_node` slots (work does; a DaemonSet's
    /// Pod only takes its requests).
    pub takes_slot: bool,
    pub anti_affinity: &'a [AntiAffinity],
    /// Its required pod affinity terms on [`HOSTNAME`] (the same shape as anti-affinity's:
    /// a selector and its namespaces): the node must have a Pod each selects.
    pub affinity: &'a [AntiAffinity],
    pub spread: &'a [Spread],
    pub node: &'a NodeRequirements,
}

impl AntiAffinity {
    /// Whether this term, of a Pod in namespace `own`, selects `other`.
    fn selects(&self, own: &str, other: &Placeable<'_>) -> bool {
        let ns = match &self.namespaces {
            Namespaces::All => true,
            Namespaces::Listed(l) if l.is_empty() => other.namespace == own,
            Namespaces::Listed(l) => l.iter().any(|n| n == other.namespace),
        };
        ns && self.selector.matches(other.labels)
    }
}

/// What a node offers Pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub slots: u32,
}

/// What is taken of a node: requests and slots.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub slots: u32,
}

impl Usage {
    fn add(&mut self, p: &Placeable<'_>) {
        self.cpu_millis += p.cpu_millis;
        self.memory_bytes += p.memory_bytes;
        self.slots += u32::from(p.takes_slot);
    }
}

/// A kind of node: a shape on offer, or a node the cluster has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeKind<'a> {
    pub capacity: Capacity,
    /// The labels its Node carries (for a new node, [`HOSTNAME`] is a stand-in: any value
    /// a Pod could name is another node's).
    pub labels: &'a BTreeMap<String, String>,
    /// What it costs an hour (the decision picks the cheapest that holds a new node's Pods).
    pub price: u64,
}

impl NodeKind<'_> {
    /// Whether `p` fits beside `used` on a node of this kind, by requests, slots and labels.
    fn room(&self, used: &Usage, p: &Placeable<'_>) -> bool {
        let c = &self.capacity;
        used.cpu_millis + p.cpu_millis <= c.cpu_millis
            && used.memory_bytes + p.memory_bytes <= c.memory_bytes
            && (!p.takes_slot || used.slots < c.slots)
            && p.node.matches(self.labels)
    }
}

/// A node the cluster has, and the Pods bound to it.
#[derive(Debug, Clone)]
pub struct Existing<'a> {
    pub kind: NodeKind<'a>,
    pub pods: Vec<Placeable<'a>>,
}

/// A node of the simulation: what is taken of it, the kinds it may still be (one for a node
/// that exists; for a new one, `(offer index, kind)` of every shape that holds its Pods), and
/// the Pods on it.
#[derive(Debug, Clone)]
struct SimNode<'a> {
    used: Usage,
    kinds: Vec<(usize, NodeKind<'a>)>,
    pods: Vec<Placeable<'a>>,
    /// Past holding the least any waiting Pod asks: never scanned again.
    closed: bool,
}

/// The least any of `waiting` asks in each dimension: a node that cannot hold it can hold
/// none of them.
fn least<'a>(waiting: &[Placeable<'a>]) -> Placeable<'a> {
    Placeable {
        namespace: "",
        labels: &EMPTY,
        cpu_millis: waiting.iter().map(|p| p.cpu_millis).min().unwrap_or(0),
        memory_bytes: waiting.iter().map(|p| p.memory_bytes).min().unwrap_or(0),
        takes_slot: waiting.iter().all(|p| p.takes_slot),
        anti_affinity: &[],
        affinity: &[],
        spread: &[],
        node: &ANY_NODE,
    }
}

/// Pod affinity and topology spread on the hostname, the filters that look past the node:
/// whether `p` may go to node `n` given every node of the simulation. With `may_open` (a
/// new node could still be rented for `p`), a node to rent counts as an empty one, as
/// Karpenter counts it: Pods spread at skew 1 get a node each rather than all going to the
/// one node that exists (where the scheduler would put them only if it saw no other).
fn together(nodes: &[SimNode<'_>], n: usize, p: &Placeable<'_>, may_open: bool) -> bool {
    // An affinity term is met by a Pod it selects on the node; a Pod that matches its own
    // term may start the group when no Pod anywhere does (the scheduler's rule).
    let affine = p.affinity.iter().all(|t| {
        nodes[n].pods.iter().any(|q| t.selects(p.namespace, q))
            || (t.selects(p.namespace, p)
                && !nodes
                    .iter()
                    .any(|m| m.pods.iter().any(|q| t.selects(p.namespace, q))))
    });
    affine
        && p.spread.iter().all(|s| {
            let count = |m: &SimNode<'_>| {
                m.pods
                    .iter()
                    .filter(|q| q.namespace == p.namespace && s.selector.matches(q.labels))
                    .count()
            };
            // The emptiest node the Pod could go to by its node requirements.
            let least = nodes
                .iter()
                .filter(|m| m.kinds.iter().any(|(_, k)| p.node.matches(k.labels)))
                .map(count)
                .chain(may_open.then_some(0))
                .min()
                .unwrap_or(0);
            count(&nodes[n]) < least + s.max_skew as usize
        })
}

impl<'a> SimNode<'a> {
    /// A node that exists, with the Pods bound to it taken in whatever they say.
    fn existing(e: &Existing<'a>) -> SimNode<'a> {
        let mut n = SimNode {
            used: Usage::default(),
            kinds: vec![(usize::MAX, e.kind)],
            pods: Vec::with_capacity(e.pods.len()),
            closed: false,
        };
        for p in &e.pods {
            n.used.add(p);
            n.pods.push(*p);
        }
        n
    }

    /// A new node for `p`: every shape on offer that holds it beside the `overhead`; none
    /// when no shape does.
    fn new(offers: &[NodeKind<'a>], overhead: Usage, p: &Placeable<'_>) -> Option<SimNode<'a>> {
        let kinds: Vec<(usize, NodeKind<'a>)> = offers
            .iter()
            .copied()
            .enumerate()
            .filter(|(_, k)| k.room(&overhead, p))
            .collect();
        (!kinds.is_empty()).then_some(SimNode {
            used: overhead,
            kinds,
            pods: Vec::new(),
            closed: false,
        })
    }

    /// Whether the scheduler's filters (those simulated) let `p` onto this node.
    fn fits(&self, p: &Placeable<'_>) -> bool {
        self.kinds.iter().any(|(_, k)| k.room(&self.used, p))
            && self.pods.iter().all(|q| {
                !p.anti_affinity.iter().any(|t| t.selects(p.namespace, q))
                    && !q.anti_affinity.iter().any(|t| t.selects(q.namespace, p))
            })
    }

    /// Places `p` (it [`fits`](Self::fits)): the kinds that no longer hold it go.
    fn place(&mut self, p: Placeable<'a>) {
        let used = self.used;
        self.kinds.retain(|(_, k)| k.room(&used, &p));
        self.used.add(&p);
        self.pods.push(p);
    }

    /// The cheapest kind it kept (the smaller of two at one price).
    fn cheapest(&self) -> Option<usize> {
        self.kinds
            .iter()
            .min_by_key(|(i, k)| (k.price, k.capacity.cpu_millis, k.capacity.memory_bytes, *i))
            .map(|(i, _)| *i)
    }
}

/// Whether any shape in `offers` holds `p` on a new node that pays `overhead`.
pub fn holdable(p: &Placeable<'_>, offers: &[NodeKind<'_>], overhead: Usage) -> bool {
    offers.iter().any(|k| k.room(&overhead, p))
}

/// Where a waiting Pod goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// The existing node of that index.
    Existing(usize),
    /// The new node of that index (0-based, in the order they would be rented).
    New(usize),
    /// Nowhere: it would need a node past the cap (or no shape holds it: the caller keeps
    /// those out, with [`holdable`]).
    Capped,
}

/// The plan: for each waiting Pod (in the order given) its place, and the shape (an index
/// into the offers) of each node to rent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub places: Vec<Place>,
    pub new_nodes: Vec<usize>,
}

/// The order first-fit-decreasing places `waiting` in: CPU, then memory, largest first;
/// Pods with node requirements or anti-affinity before others of the same size; Pods with
/// pod affinity after all others (the Pods they want to be with are placed by then).
pub fn order(waiting: &[Placeable<'_>]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..waiting.len()).collect();
    order.sort_by(|&a, &b| {
        let (pa, pb) = (&waiting[a], &waiting[b]);
        let alone = |p: &Placeable<'_>| p.affinity.is_empty();
        let key = |p: &Placeable<'_>| {
            (
                p.cpu_millis,
                p.memory_bytes,
                !p.node.is_empty(),
                p.anti_affinity.len(),
            )
        };
        alone(pb)
            .cmp(&alone(pa))
            .then(key(pb).cmp(&key(pa)))
            .then(a.cmp(&b))
    });
    order
}

/// Places `waiting` on `existing` nodes and as few new nodes of the `offers`' shapes, at
/// most `max_new`, as first-fit-decreasing finds; each new node pays `overhead` (the
/// DaemonSets' requests) and takes the cheapest shape that holds its Pods.
pub fn plan<'a>(
    existing: &[Existing<'a>],
    waiting: &[Placeable<'a>],
    offers: &[NodeKind<'a>],
    overhead: Usage,
    max_new: usize,
) -> Plan {
    let mut nodes: Vec<SimNode<'a>> = existing.iter().map(SimNode::existing).collect();
    let first_new = nodes.len();
    let mut places = vec![Place::Capped; waiting.len()];
    // The nodes that may still take a Pod, in first-fit order: one that cannot hold the
    // least any waiting Pod asks is closed for good (10,000 Pods on 3,000 nodes would
    // otherwise scan every full node for every Pod).
    let least = least(waiting);
    let mut open: Vec<usize> = (0..nodes.len()).collect();
    let mut closed = 0;
    for i in order(waiting) {
        let p = waiting[i];
        let may_open = nodes.len() - first_new < max_new && holdable(&p, offers, overhead);
        let at = match open
            .iter()
            .copied()
            .find(|&n| nodes[n].fits(&p) && together(&nodes, n, &p, may_open))
        {
            Some(at) => at,
            None if nodes.len() - first_new < max_new => {
                let Some(n) = SimNode::new(offers, overhead, &p) else {
                    continue;
                };
                nodes.push(n);
                if !together(&nodes, nodes.len() - 1, &p, true) {
                    // (Its affinity wants Pods on a node that has no room.)
                    nodes.pop();
                    continue;
                }
                open.push(nodes.len() - 1);
                nodes.len() - 1
            }
            None => continue,
        };
        nodes[at].place(p);
        if !nodes[at]
            .kinds
            .iter()
            .any(|(_, k)| k.room(&nodes[at].used, &least))
        {
            nodes[at].closed = true;
            closed += 1;
            if closed * 4 > open.len() {
                open.retain(|&n| !nodes[n].closed);
                closed = 0;
            }
        }
        places[i] = if at < first_new {
            Place::Existing(at)
        } else {
            Place::New(at - first_new)
        };
    }
    Plan {
        places,
        new_nodes: nodes[first_new..]
            .iter()
            .map(|n| {
                n.cheapest()
                    .expect("a new node keeps a shape that holds its Pods")
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: Capacity = Capacity {
        cpu_millis: 2000,
        memory_bytes: 4 << 30,
        slots: 8,
    };

    fn labels(shape: &str) -> BTreeMap<String, String> {
        [
            (HOSTNAME.to_string(), "(new)".to_string()),
            (INSTANCE_TYPE.to_string(), shape.to_string()),
        ]
        .into()
    }

    /// One shape, 2 vCPU and 4 GiB, at price 0.
    fn one(l: &BTreeMap<String, String>) -> Vec<NodeKind<'_>> {
        vec![NodeKind {
            capacity: CAP,
            labels: l,
            price: 0,
        }]
    }

    /// A Pod's owned parts, to borrow a [`Placeable`] from.
    #[derive(Debug, Clone, Default)]
    struct Pod {
        namespace: String,
        labels: BTreeMap<String, String>,
        cpu: u64,
        slot: bool,
        terms: Vec<AntiAffinity>,
        affinity: Vec<AntiAffinity>,
        spread: Vec<Spread>,
        node: NodeRequirements,
    }

    impl Pod {
        fn p(&self) -> Placeable<'_> {
            Placeable {
                namespace: &self.namespace,
                labels: &self.labels,
                cpu_millis: self.cpu,
                memory_bytes: 128 << 20,
                takes_slot: self.slot,
                anti_affinity: &self.terms,
                affinity: &self.affinity,
                spread: &self.spread,
                node: &self.node,
            }
        }
    }

    const RUNNER: &str = "project.runner.gitlab.com/id";

    /// The seeds' runner's job: one per node.
    fn job(cpu: u64) -> Pod {
        Pod {
            namespace: "gitlab".into(),
            labels: [(RUNNER.to_string(), "7".to_string())].into(),
            cpu,
            slot: true,
            terms: vec![AntiAffinity {
                selector: Selector {
                    match_expressions: vec![Requirement::Exists(RUNNER.into())],
                    ..Default::default()
                },
                namespaces: Namespaces::Listed(vec![]),
            }],
            ..Default::default()
        }
    }

    fn plain(cpu: u64) -> Pod {
        Pod {
            namespace: "default".into(),
            cpu,
            slot: true,
            ..Default::default()
        }
    }

    fn ps(pods: &[Pod]) -> Vec<Placeable<'_>> {
        pods.iter().map(Pod::p).collect()
    }

    fn on<'a>(l: &'a BTreeMap<String, String>, pods: &'a [Pod]) -> Existing<'a> {
        Existing {
            kind: one(l)[0],
            pods: ps(pods),
        }
    }

    const NONE: Usage = Usage {
        cpu_millis: 0,
        memory_bytes: 0,
        slots: 0,
    };

    #[test]
    fn four_anti_affine_jobs_need_four_nodes() {
        let l = labels("2vcpu-4096mib");
        let jobs: Vec<Pod> = (0..4).map(|_| job(100)).collect();
        let p = plan(&[], &ps(&jobs), &one(&l), NONE, 10);
        assert_eq!(p.new_nodes, vec![0; 4]);
        let mut at = p.places.clone();
        at.dedup();
        assert_eq!(at.len(), 4, "each on its own node: {:?}", p.places);
        // At most two new nodes: two placed, two capped.
        let p = plan(&[], &ps(&jobs), &one(&l), NONE, 2);
        assert_eq!(p.new_nodes.len(), 2);
        assert_eq!(p.places.iter().filter(|x| **x == Place::Capped).count(), 2);
    }

    #[test]
    fn a_job_goes_to_an_existing_node_without_one() {
        let l = labels("2vcpu-4096mib");
        let (running, other) = ([job(100)], [plain(100)]);
        let waiting = [job(100), job(100)];
        let p = plan(
            &[on(&l, &running), on(&l, &other)],
            &ps(&waiting),
            &one(&l),
            NONE,
            10,
        );
        assert_eq!(p.places, vec![Place::Existing(1), Place::New(0)]);
        assert_eq!(p.new_nodes.len(), 1);
    }

    #[test]
    fn an_existing_pods_anti_affinity_keeps_others_away() {
        let l = labels("2vcpu-4096mib");
        // The waiting Pod has no terms; the running job's term selects it.
        let running = [job(100)];
        let mut labelled = plain(100);
        labelled.namespace = "gitlab".into();
        labelled.labels = running[0].labels.clone();
        let p = plan(&[on(&l, &running)], &[labelled.p()], &one(&l), NONE, 10);
        assert_eq!(p.places, vec![Place::New(0)]);
        // In another namespace, the term (its own namespace only) does not select it.
        labelled.namespace = "default".into();
        let p = plan(&[on(&l, &running)], &[labelled.p()], &one(&l), NONE, 10);
        assert_eq!(p.places, vec![Place::Existing(0)]);
        // Unless the term looks in every namespace.
        let mut wide = running.clone();
        wide[0].terms[0].namespaces = Namespaces::All;
        let p = plan(&[on(&l, &wide)], &[labelled.p()], &one(&l), NONE, 10);
        assert_eq!(p.places, vec![Place::New(0)]);
    }

    #[test]
    fn requests_pack_first_fit_decreasing() {
        let l = labels("2vcpu-4096mib");
        // 1500m, 1000m, 1000m, 500m on 2000m nodes: {1500, 500}, {1000, 1000}.
        let pods = [plain(1000), plain(1500), plain(500), plain(1000)];
        let p = plan(&[], &ps(&pods), &one(&l), NONE, 10);
        assert_eq!(p.new_nodes.len(), 2);
        assert_eq!(p.places[1], p.places[2], "{:?}", p.places);
        assert_eq!(p.places[0], p.places[3], "{:?}", p.places);
    }

    #[test]
    fn slots_bound_pods_without_requests() {
        let l = labels("2vcpu-4096mib");
        // pods_per_node as the fallback: 9 Pods without requests at 8 a node.
        let pods: Vec<Pod> = (0..9).map(|_| plain(0)).collect();
        assert_eq!(plan(&[], &ps(&pods), &one(&l), NONE, 10).new_nodes.len(), 2);
        // A DaemonSet's Pod on a node takes its requests, not a slot.
        let mut ds = [plain(1900)];
        ds[0].slot = false;
        let p = plan(&[on(&l, &ds)], &[plain(200).p()], &one(&l), NONE, 10);
        assert_eq!(p.places, vec![Place::New(0)], "1900m of 2000m taken");
        // A new node pays the DaemonSets' overhead too.
        let overhead = Usage {
            cpu_millis: 1900,
            ..NONE
        };
        let p = plan(&[], &[plain(200).p()], &one(&l), overhead, 10);
        assert_eq!(
            p.places,
            vec![Place::Capped],
            "no shape holds 200m beside 1900m"
        );
        assert!(!holdable(&plain(200).p(), &one(&l), overhead));
    }

    /// Shapes of 1, 2 and 4 vCPU (2, 4 and 8 GiB) at 10, 20 and 40 an hour.
    fn market(l: &[BTreeMap<String, String>; 3]) -> Vec<NodeKind<'_>> {
        (0..3)
            .map(|i| NodeKind {
                capacity: Capacity {
                    cpu_millis: 1000 << i,
                    memory_bytes: 2u64 << 30 << i,
                    slots: 8,
                },
                labels: &l[i],
                price: 10 << i,
            })
            .collect()
    }

    fn market_labels() -> [BTreeMap<String, String>; 3] {
        [
            labels("1vcpu-2048mib"),
            labels("2vcpu-4096mib"),
            labels("4vcpu-8192mib"),
        ]
    }

    #[test]
    fn each_new_node_takes_the_cheapest_shape_that_holds_its_pods() {
        let l = market_labels();
        let m = market(&l);
        // The seeds' 1500m job: a 2-vCPU node, not the 1-vCPU default nor the 4.
        let p = plan(&[], &[plain(1500).p()], &m, NONE, 10);
        assert_eq!(p.new_nodes, vec![1]);
        // Five of 700m pack onto the largest (3500m of 4000m), not five small nodes.
        let pods: Vec<Pod> = (0..5).map(|_| plain(700)).collect();
        let p = plan(&[], &ps(&pods), &m, NONE, 10);
        assert_eq!(p.new_nodes, vec![2]);
        // Anti-affine jobs of 300m: one each, on the smallest.
        let jobs: Vec<Pod> = (0..3).map(|_| job(300)).collect();
        assert_eq!(plan(&[], &ps(&jobs), &m, NONE, 10).new_nodes, vec![0; 3]);
        // 5000m fits no shape.
        assert!(!holdable(&plain(5000).p(), &m, NONE));
    }

    #[test]
    fn node_requirements_choose_the_shape_and_keep_pods_apart() {
        let l = market_labels();
        let m = market(&l);
        // nodeSelector on the shape: a 100m Pod on a 4-vCPU node.
        let mut big = plain(100);
        big.node.selector = [(INSTANCE_TYPE.to_string(), "4vcpu-8192mib".to_string())].into();
        let p = plan(&[], &[big.p()], &m, NONE, 10);
        assert_eq!(p.new_nodes, vec![2]);
        // A Pod that wants the small shape never shares a node with it.
        let mut small = plain(100);
        small.node.terms = vec![vec![Requirement::In(
            INSTANCE_TYPE.into(),
            vec!["1vcpu-2048mib".into()],
        )]];
        let p = plan(&[], &ps(&[big.clone(), small.clone()]), &m, NONE, 10);
        assert_eq!(p.new_nodes.len(), 2, "{p:?}");
        assert_ne!(p.places[0], p.places[1]);
        // A label no shape carries: no node holds it.
        let mut nowhere = plain(100);
        nowhere.node.selector = [("gpu".to_string(), "true".to_string())].into();
        assert!(!holdable(&nowhere.p(), &m, NONE));
        // An existing node by its hostname.
        let mut named = labels("2vcpu-4096mib");
        named.insert(HOSTNAME.into(), "n1".into());
        let mut pinned = plain(100);
        pinned.node.terms = vec![vec![Requirement::In(HOSTNAME.into(), vec!["n1".into()])]];
        let e = Existing {
            kind: one(&named)[0],
            pods: vec![],
        };
        let p = plan(&[e], &[pinned.p()], &m, NONE, 10);
        assert_eq!(p.places, vec![Place::Existing(0)]);
    }

    fn app(name: &str) -> Selector {
        Selector {
            match_labels: [("app".to_string(), name.to_string())].into(),
            ..Default::default()
        }
    }

    fn labelled(name: &str, cpu: u64) -> Pod {
        let mut p = plain(cpu);
        p.labels = app(name).match_labels;
        p
    }

    #[test]
    fn pod_affinity_puts_a_pod_beside_the_pods_it_wants() {
        let l = labels("2vcpu-4096mib");
        // A cache and its two clients: the clients want a cache on their node.
        let cache = labelled("cache", 1000);
        let mut client = plain(300);
        client.affinity = vec![AntiAffinity {
            selector: app("cache"),
            namespaces: Namespaces::Listed(vec![]),
        }];
        let filler = plain(1200);
        // Largest first, the clients last: the cache on one node, the filler (no room
        // beside it) on another, both clients beside the cache.
        let pods = [client.clone(), filler, cache.clone(), client.clone()];
        let p = plan(&[], &ps(&pods), &one(&l), NONE, 10);
        assert_eq!(
            p.places,
            vec![Place::New(1), Place::New(0), Place::New(1), Place::New(1)]
        );
        // Four clients: three fit beside the cache, the fourth nowhere (a new node has
        // no cache).
        let mut five = vec![cache.clone()];
        five.extend((0..4).map(|_| client.clone()));
        let p = plan(&[], &ps(&five), &one(&l), NONE, 10);
        assert_eq!(p.new_nodes.len(), 1, "{p:?}");
        assert_eq!(p.places[4], Place::Capped, "{p:?}");
        // Beside a cache on a node that exists.
        let running = [cache.clone()];
        let p = plan(&[on(&l, &running)], &[client.p()], &one(&l), NONE, 10);
        assert_eq!(p.places, vec![Place::Existing(0)]);
        // A Pod that matches its own term starts the group when none runs.
        let mut first = labelled("cache", 100);
        first.affinity = client.affinity.clone();
        let p = plan(&[], &ps(&[first.clone(), first]), &one(&l), NONE, 10);
        assert_eq!(p.places, vec![Place::New(0), Place::New(0)]);
    }

    #[test]
    fn topology_spread_on_the_hostname_spreads_pods_over_new_nodes() {
        let l = labels("2vcpu-4096mib");
        let mut web = labelled("web", 100);
        web.spread = vec![Spread {
            max_skew: 1,
            selector: app("web"),
        }];
        let pods: Vec<Pod> = (0..4).map(|_| web.clone()).collect();
        let p = plan(&[], &ps(&pods), &one(&l), NONE, 10);
        assert_eq!(p.new_nodes.len(), 4, "one a node at skew 1: {p:?}");
        // At skew 2, two a node.
        let mut two = web.clone();
        two.spread[0].max_skew = 2;
        let pods: Vec<Pod> = (0..4).map(|_| two.clone()).collect();
        let p = plan(&[], &ps(&pods), &one(&l), NONE, 10);
        assert_eq!(p.new_nodes.len(), 2, "{p:?}");
        // Two web Pods run on n0 and none on the empty n1: the next goes to n1.
        let running = [labelled("web", 100), labelled("web", 100)];
        let p = plan(
            &[on(&l, &running), on(&l, &[])],
            &[web.p()],
            &one(&l),
            NONE,
            10,
        );
        assert_eq!(p.places, vec![Place::Existing(1)]);
    }

    #[test]
    fn selectors_match_as_the_api_defines() {
        let labels: BTreeMap<String, String> = [
            ("app".to_string(), "web".to_string()),
            ("cores".to_string(), "4".to_string()),
        ]
        .into();
        let s = |e: Requirement| Selector {
            match_expressions: vec![e],
            ..Default::default()
        };
        assert!(Selector::default().matches(&labels), "empty matches all");
        assert!(s(Requirement::In("app".into(), vec!["web".into()])).matches(&labels));
        assert!(!s(Requirement::In("app".into(), vec!["db".into()])).matches(&labels));
        assert!(s(Requirement::NotIn("app".into(), vec!["db".into()])).matches(&labels));
        assert!(s(Requirement::NotIn("tier".into(), vec!["x".into()])).matches(&labels));
        assert!(s(Requirement::Exists("app".into())).matches(&labels));
        assert!(s(Requirement::DoesNotExist("tier".into())).matches(&labels));
        assert!(!s(Requirement::DoesNotExist("app".into())).matches(&labels));
        assert!(s(Requirement::Gt("cores".into(), 2)).matches(&labels));
        assert!(!s(Requirement::Lt("cores".into(), 4)).matches(&labels));
        assert!(
            !s(Requirement::Gt("app".into(), 0)).matches(&labels),
            "not a number"
        );
        let ml = Selector {
            match_labels: [("app".to_string(), "db".to_string())].into(),
            ..Default::default()
        };
        assert!(!ml.matches(&labels));
        // Node selector terms: ORed; a term with no requirement matches nothing.
        let terms = |t: Vec<Vec<Requirement>>| NodeRequirements {
            terms: t,
            ..Default::default()
        };
        assert!(NodeRequirements::default().matches(&labels));
        assert!(!terms(vec![vec![]]).matches(&labels));
        assert!(
            terms(vec![
                vec![Requirement::Exists("gpu".into())],
                vec![Requirement::In("app".into(), vec!["web".into()])],
            ])
            .matches(&labels)
        );
    }

    use proptest::prelude::*;

    fn arb_pod() -> impl Strategy<Value = Pod> {
        (0u64..4500, any::<bool>(), 0u8..3, 0u8..5, 0u8..6).prop_map(
            |(cpu, anti, ns, want, group)| {
                let mut p = if anti { job(cpu) } else { plain(cpu) };
                p.namespace = ["a", "b", "gitlab"][ns as usize].into();
                // Now and then a cache, or a Pod that wants one on its node.
                match group {
                    0 => {
                        p.labels.insert("app".into(), "cache".into());
                    }
                    1 => {
                        p.affinity = vec![AntiAffinity {
                            selector: app("cache"),
                            namespaces: Namespaces::All,
                        }];
                    }
                    _ => {}
                }
                // Now and then a nodeSelector on one of the shapes.
                if let Some(shape) =
                    ["1vcpu-2048mib", "2vcpu-4096mib", "4vcpu-8192mib"].get(want as usize)
                {
                    p.node.selector = [(INSTANCE_TYPE.to_string(), shape.to_string())].into();
                }
                p
            },
        )
    }

    proptest! {
        /// Every placed Pod fits its node by the scheduler's rules (those simulated) on the
        /// shape the plan chose: the requests and slots of all its Pods within the shape's,
        /// each Pod's node requirements matched by the shape's labels, no two Pods on it
        /// that anti-affinity keeps apart. Every new node gets a Pod; nothing holdable is
        /// capped while the cap has room.
        #[test]
        fn every_placed_pod_fits_its_chosen_shape_and_no_new_node_is_empty(
            bound in proptest::collection::vec(proptest::collection::vec(arb_pod(), 0..3), 0..4),
            waiting in proptest::collection::vec(arb_pod(), 0..24),
            max_new in 0usize..30,
            overhead_cpu in 0u64..600,
        ) {
            let l = market_labels();
            let m = market(&l);
            let overhead = Usage { cpu_millis: overhead_cpu, ..NONE };
            // Existing nodes of the largest shape, their Pods bound regardless of fit.
            let existing: Vec<Existing<'_>> = bound
                .iter()
                .map(|pods| Existing { kind: m[2], pods: ps(pods) })
                .collect();
            let w = ps(&waiting);
            let plan = plan(&existing, &w, &m, overhead, max_new);
            prop_assert!(plan.new_nodes.len() <= max_new);
            let mut on_node: Vec<Vec<Placeable<'_>>> =
                existing.iter().map(|e| e.pods.clone()).collect();
            on_node.extend(plan.new_nodes.iter().map(|_| Vec::new()));
            let first_new = existing.len();
            for (i, place) in plan.places.iter().enumerate() {
                match place {
                    Place::Existing(e) => on_node[*e].push(w[i]),
                    Place::New(n) => on_node[first_new + n].push(w[i]),
                    Place::Capped => prop_assert!(
                        plan.new_nodes.len() == max_new || !holdable(&w[i], &m, overhead)
                            // (No node has a Pod its affinity wants, nor room beside one.)
                            || !w[i].affinity.is_empty(),
                        "pod {} capped with room left", i
                    ),
                }
            }
            for (n, pods) in on_node.iter().enumerate() {
                let (kind, mut used, placed) = if n < first_new {
                    // Only what the plan added is checked on an existing node.
                    let e = &existing[n];
                    let mut u = Usage::default();
                    e.pods.iter().for_each(|p| u.add(p));
                    (e.kind, u, &pods[e.pods.len()..])
                } else {
                    prop_assert!(!pods.is_empty(), "new node {} rented for nothing", n);
                    (m[plan.new_nodes[n - first_new]], overhead, &pods[..])
                };
                for p in placed {
                    prop_assert!(p.node.matches(kind.labels), "a pod's selector misses node {}", n);
                    used.add(p);
                }
                if !placed.is_empty() {
                    let c = kind.capacity;
                    prop_assert!(used.cpu_millis <= c.cpu_millis, "node {} over CPU", n);
                    prop_assert!(used.memory_bytes <= c.memory_bytes, "node {} over memory", n);
                    let slots = pods.iter().filter(|p| p.takes_slot).count() as u32;
                    prop_assert!(slots <= c.slots || placed.iter().all(|p| !p.takes_slot), "node {} over slots", n);
                }
                let bound_len = pods.len() - placed.len();
                for (a, p) in pods.iter().enumerate().skip(bound_len) {
                    for (b, q) in pods.iter().enumerate() {
                        let apart = p.anti_affinity.iter().any(|t| t.selects(p.namespace, q))
                            || q.anti_affinity.iter().any(|t| t.selects(q.namespace, p));
                        prop_assert!(a == b || !apart, "anti-affine pods share node {}", n);
                    }
                    // Pod affinity: a Pod it selects on the node, or it started the group.
                    for t in p.affinity {
                        let met = pods
                            .iter()
                            .enumerate()
                            .any(|(b, q)| b != a && t.selects(p.namespace, q))
                            || t.selects(p.namespace, p);
                        prop_assert!(met, "pod affinity unmet on node {}", n);
                    }
                }
            }
        }
    }
}
