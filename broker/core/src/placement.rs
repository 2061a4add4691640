//! Where the Pods that wait would go, as kube-scheduler would place them, and on which node
//! shapes (issue 37), pure: the nodes the cluster has (each with the Pods bound to it), the
//! shapes the market rents and the waiting Pods in; for each waiting Pod an existing node, a
//! node to rent, or none, and each new node's shape, out. The scale decision
//! ([`crate::scale`]) rents the new nodes.
//!
//! What it simulates of the scheduler's filters: requests (CPU, memory, and a Pod slot:
//! `pods_per_node` is the fallback bound for Pods without requests), `nodeSelector` and
//! required node affinity against the labels our nodes carry (the shape's included),
//! required pod anti-affinity in both directions (a waiting Pod's terms against the Pods in
//! a node's topology domain, and theirs against it), required pod affinity and
//! `DoNotSchedule` topology spread, each on any topology key: the hostname (a node is its
//! own domain) or a label such as `topology.kubernetes.io/zone` (the nodes that carry one
//! value are a domain; a node without the label meets no affinity and no spread on it, as
//! the scheduler rules). Every new node pays the DaemonSets' overhead.
//!
//! Pods are placed first-fit-decreasing (the largest requests first, onto the first node
//! that holds them, existing nodes before new ones), which is what kube-scheduler's filters
//! allow; its scores may spread Pods where the plan packs them, which only leaves room. A
//! new node is not given a shape when it is opened: it keeps every shape on offer that holds
//! what was placed on it and matches each of its Pods' node requirements (Karpenter's
//! scheduling simulation does the same), so it packs up to the largest; once every Pod is
//! placed it takes the cheapest shape it kept.
//!
//! A new node is opened in one topology group (the shapes on offer that share every label
//! but the instance type: one provider's region and zone), the cheapest group that holds its
//! first Pod and meets that Pod's affinity and spread; it keeps that group's shapes only, so
//! its zone is known to the Pods placed after it.
//!
//! Not simulated: taints (our nodes carry none but the cordon of a node being released,
//! which the decision leaves out).

use std::collections::BTreeMap;

/// The label every node carries with its own name: the topology key of "one per node".
pub const HOSTNAME: &str = "kubernetes.io/hostname";

/// The well-known label that names a node's shape (one a kubelet may set on its own Node).
pub const INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";

/// The well-known labels of where a node runs: its provider's region and zone.
pub const REGION: &str = "topology.kubernetes.io/region";
pub const ZONE: &str = "topology.kubernetes.io/zone";

/// The label that names the provider a node was rented from (the broker's name for it).
pub const PROVIDER: &str = "socialweb.computer/provider";

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

/// A required pod (anti-)affinity term: for anti-affinity, no Pod it selects may be in the
/// node's domain of `topology_key`; for affinity, one must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AntiAffinity {
    pub selector: Selector,
    pub namespaces: Namespaces,
    /// [`HOSTNAME`] (the node) or a label whose value groups nodes (a zone).
    pub topology_key: String,
}

/// A topology spread constraint with `whenUnsatisfiable: DoNotSchedule`: the Pods it selects
/// in the Pod's namespace may differ by at most `max_skew` between the domain of
/// `topology_key` the Pod goes to and the emptiest domain it could go to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spread {
    pub max_skew: u32,
    pub selector: Selector,
    pub topology_key: String,
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
    /// Its required pod affinity terms (the same shape as anti-affinity's): the node's
    /// domain must have a Pod each selects.
    pub affinity: &'a [AntiAffinity],
    pub spread: &'a [Spread],
    pub node: &'a NodeRequirements,
    /// The host ports its containers bind (`hostPort`): no two Pods on a node may bind one.
    pub host_ports: &'a [HostPort],
}

/// A port a Pod binds on its node (`ports[].hostPort` and its protocol). Its `hostIP` is
/// not read: two Pods on one port conflict here whatever their addresses, which at worst
/// rents a node more.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct HostPort {
    pub protocol: String,
    pub port: u16,
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
    /// Its topology group: kinds on offer with one group share every label but the instance
    /// type (one provider's region and zone); a new node keeps kinds of one group.
    pub group: usize,
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
        host_ports: &[],
    }
}

/// Whether nodes `a` and `b` share a domain of `key`: one node for the hostname; else both
/// carry the label, with one value.
fn same_domain(nodes: &[SimNode<'_>], a: usize, b: usize, key: &str) -> bool {
    if key == HOSTNAME {
        return a == b;
    }
    match (nodes[a].label(key), nodes[b].label(key)) {
        (Some(x), Some(y)) => x == y,
        _ => false,
    }
}

/// Whether node `n` is in a domain of `key` at all (every node is its own host).
fn has_key(nodes: &[SimNode<'_>], n: usize, key: &str) -> bool {
    key == HOSTNAME || nodes[n].label(key).is_some()
}

/// The nodes in node `n`'s domain of `key` (`n` alone for the hostname).
fn near<'s>(nodes: &'s [SimNode<'_>], n: usize, key: &'s str) -> impl Iterator<Item = usize> + 's {
    let all = if key == HOSTNAME {
        n..n + 1
    } else {
        0..nodes.len()
    };
    all.filter(move |&m| same_domain(nodes, n, m, key))
}

/// Required anti-affinity, both ways: none of `p`'s terms selects a Pod in node `n`'s domain
/// of the term's key, and no Pod's term there selects `p`. `zonal`: some Pod has a term on
/// a key other than the hostname, so every node is looked at (else `n` alone).
fn apart(nodes: &[SimNode<'_>], n: usize, p: &Placeable<'_>, zonal: bool) -> bool {
    let scan = if zonal { 0..nodes.len() } else { n..n + 1 };
    scan.into_iter().all(|m| {
        let near = |t: &AntiAffinity| same_domain(nodes, n, m, &t.topology_key);
        nodes[m].pods.iter().all(|q| {
            !p.anti_affinity
                .iter()
                .any(|t| near(t) && t.selects(p.namespace, q))
                && !q
                    .anti_affinity
                    .iter()
                    .any(|t| near(t) && t.selects(q.namespace, p))
        })
    })
}

/// New nodes that could still be rented for a Pod: the shapes on offer and the overhead
/// each pays.
type Open<'o, 'a> = Option<(&'o [NodeKind<'a>], Usage)>;

/// Pod affinity and topology spread, the filters that look past the node: whether `p` may go
/// to node `n` given every node of the simulation. With `open` (a new node could still be
/// rented for `p`), a node to rent counts as an empty domain, as Karpenter counts it: Pods
/// spread at skew 1 get a node (a zone) each rather than all going to the one that exists
/// (where the scheduler would put them only if it saw no other).
fn together(nodes: &[SimNode<'_>], n: usize, p: &Placeable<'_>, open: Open<'_, '_>) -> bool {
    // An affinity term is met by a Pod it selects in the node's domain (a node without the
    // key meets none); a Pod that matches its own term may start the group when no Pod
    // anywhere does (the scheduler's rule).
    let affine = p.affinity.iter().all(|t| {
        let key = t.topology_key.as_str();
        has_key(nodes, n, key)
            && (near(nodes, n, key)
                .any(|m| nodes[m].pods.iter().any(|q| t.selects(p.namespace, q)))
                || (t.selects(p.namespace, p)
                    && !nodes
                        .iter()
                        .any(|m| m.pods.iter().any(|q| t.selects(p.namespace, q)))))
    });
    affine && p.spread.iter().all(|s| spread(nodes, n, p, s, open))
}

/// One `DoNotSchedule` spread constraint of `p` on node `n`: the node carries its key, and
/// the Pods it selects in `n`'s domain stay within `max_skew` of the emptiest domain among
/// the nodes `p` could go to (by its node requirements, carrying every key it spreads on).
fn spread(
    nodes: &[SimNode<'_>],
    n: usize,
    p: &Placeable<'_>,
    s: &Spread,
    open: Open<'_, '_>,
) -> bool {
    let key = s.topology_key.as_str();
    if !has_key(nodes, n, key) {
        return false;
    }
    let count = |m: &SimNode<'_>| {
        m.pods
            .iter()
            .filter(|q| q.namespace == p.namespace && s.selector.matches(q.labels))
            .count()
    };
    let eligible = |m: usize| {
        nodes[m].kinds.iter().any(|(_, k)| p.node.matches(k.labels))
            && p.spread.iter().all(|c| has_key(nodes, m, &c.topology_key))
    };
    if key == HOSTNAME {
        let least = (0..nodes.len())
            .filter(|&m| eligible(m))
            .map(|m| count(&nodes[m]))
            .chain(open.map(|_| 0))
            .min()
            .unwrap_or(0);
        return count(&nodes[n]) < least + s.max_skew as usize;
    }
    let mut per: BTreeMap<&str, usize> = BTreeMap::new();
    for m in (0..nodes.len()).filter(|&m| eligible(m)) {
        if let Some(v) = nodes[m].label(key) {
            *per.entry(v).or_default() += count(&nodes[m]);
        }
    }
    // A domain a new node could be rented in counts, empty.
    if let Some((offers, overhead)) = open {
        for k in offers.iter().filter(|k| k.room(&overhead, p)) {
            if let Some(v) = k.labels.get(key) {
                per.entry(v.as_str()).or_default();
            }
        }
    }
    let least = per.values().copied().min().unwrap_or(0);
    let here = nodes[n]
        .label(key)
        .and_then(|v| per.get(v).copied())
        .unwrap_or(0);
    here < least + s.max_skew as usize
}

/// Opens a new node for `p` in the cheapest topology group that holds it and lets it in
/// (its anti-affinity, affinity and spread); its index, or none.
fn open_new<'a>(
    nodes: &mut Vec<SimNode<'a>>,
    offers: &[NodeKind<'a>],
    overhead: Usage,
    p: &Placeable<'_>,
    zonal: bool,
) -> Option<usize> {
    let mut groups: Vec<(u64, usize)> = offers
        .iter()
        .filter(|k| k.room(&overhead, p))
        .map(|k| (k.price, k.group))
        .collect();
    groups.sort_unstable();
    let mut tried: Vec<usize> = Vec::new();
    for (_, g) in groups {
        if tried.contains(&g) {
            continue;
        }
        tried.push(g);
        let Some(node) = SimNode::new(offers, g, overhead, p) else {
            continue;
        };
        nodes.push(node);
        let at = nodes.len() - 1;
        if apart(nodes, at, p, zonal) && together(nodes, at, p, Some((offers, overhead))) {
            return Some(at);
        }
        nodes.pop();
    }
    None
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

    /// A new node of topology `group` for `p`: every shape of the group on offer that holds
    /// it beside the `overhead`; none when no shape does.
    fn new(
        offers: &[NodeKind<'a>],
        group: usize,
        overhead: Usage,
        p: &Placeable<'_>,
    ) -> Option<SimNode<'a>> {
        let kinds: Vec<(usize, NodeKind<'a>)> = offers
            .iter()
            .copied()
            .enumerate()
            .filter(|(_, k)| k.group == group && k.room(&overhead, p))
            .collect();
        (!kinds.is_empty()).then_some(SimNode {
            used: overhead,
            kinds,
            pods: Vec::new(),
            closed: false,
        })
    }

    /// Whether `p` fits beside what is taken of the node, by requests, slots, labels and
    /// host ports.
    fn fits(&self, p: &Placeable<'_>) -> bool {
        self.kinds.iter().any(|(_, k)| k.room(&self.used, p))
            && (p.host_ports.is_empty()
                || !self
                    .pods
                    .iter()
                    .any(|q| q.host_ports.iter().any(|h| p.host_ports.contains(h))))
    }

    /// Its value of the label `key` (a new node's kinds share every topology label).
    fn label(&self, key: &str) -> Option<&str> {
        self.kinds
            .first()
            .and_then(|(_, k)| k.labels.get(key))
            .map(String::as_str)
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
    // Anti-affinity past the node (on a zone) makes every node worth a look; without it, a
    // Pod's node alone is (the common case, kept cheap).
    let zonal = existing
        .iter()
        .flat_map(|e| &e.pods)
        .chain(waiting)
        .any(|p| p.anti_affinity.iter().any(|t| t.topology_key != HOSTNAME));
    // The nodes that may still take a Pod, in first-fit order: one that cannot hold the
    // least any waiting Pod asks is closed for good (10,000 Pods on 3,000 nodes would
    // otherwise scan every full node for every Pod).
    let least = least(waiting);
    let mut open: Vec<usize> = (0..nodes.len()).collect();
    let mut closed = 0;
    for i in order(waiting) {
        let p = waiting[i];
        let may_open = nodes.len() - first_new < max_new;
        let rentable = (may_open && holdable(&p, offers, overhead)).then_some((offers, overhead));
        let at = match open.iter().copied().find(|&n| {
            nodes[n].fits(&p) && apart(&nodes, n, &p, zonal) && together(&nodes, n, &p, rentable)
        }) {
            Some(at) => at,
            None if may_open => {
                let Some(at) = open_new(&mut nodes, offers, overhead, &p, zonal) else {
                    continue;
                };
                open.push(at);
                at
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
            group: 0,
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
        ports: Vec<HostPort>,
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
                host_ports: &self.ports,
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
                topology_key: HOSTNAME.into(),
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
                group: 0,
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
            topology_key: HOSTNAME.into(),
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
            topology_key: HOSTNAME.into(),
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

    /// One 2-vCPU shape in each of zones `a` (price 10) and `b` (price 20), groups 0 and 1.
    fn zoned(l: &[BTreeMap<String, String>; 2]) -> Vec<NodeKind<'_>> {
        (0..2)
            .map(|i| NodeKind {
                capacity: CAP,
                labels: &l[i],
                price: 10 * (i as u64 + 1),
                group: i,
            })
            .collect()
    }

    fn zone_labels() -> [BTreeMap<String, String>; 2] {
        ["a", "b"].map(|z| {
            let mut l = labels("2vcpu-4096mib");
            l.insert(ZONE.into(), z.into());
            l
        })
    }

    #[test]
    fn zone_spread_and_affinity_use_the_zones_on_offer() {
        let l = zone_labels();
        let m = zoned(&l);
        let mut web = labelled("web", 100);
        web.spread = vec![Spread {
            max_skew: 1,
            selector: app("web"),
            topology_key: ZONE.into(),
        }];
        // Two web Pods at skew 1 over two zones: a node in each, the cheaper zone first.
        let p = plan(&[], &ps(&[web.clone(), web.clone()]), &m, NONE, 10);
        assert_eq!(p.new_nodes, vec![0, 1], "{p:?}");
        // Only zone a on offer: both go to one node there (one domain, no skew).
        let p = plan(&[], &ps(&[web.clone(), web.clone()]), &m[..1], NONE, 10);
        assert_eq!(p.new_nodes, vec![0], "{p:?}");
        // No zone on offer: the scheduler refuses every node without the label.
        let bare = labels("2vcpu-4096mib");
        let p = plan(&[], &ps(&[web.clone()]), &one(&bare), NONE, 10);
        assert_eq!(
            (p.places[0], p.new_nodes.len()),
            (Place::Capped, 0),
            "{p:?}"
        );
        // Anti-affinity on the zone: the second Pod goes to the other zone, a third nowhere.
        let mut solo = labelled("solo", 100);
        solo.terms = vec![AntiAffinity {
            selector: app("solo"),
            namespaces: Namespaces::Listed(vec![]),
            topology_key: ZONE.into(),
        }];
        let p = plan(
            &[],
            &ps(&[solo.clone(), solo.clone(), solo.clone()]),
            &m,
            NONE,
            10,
        );
        assert_eq!(p.new_nodes, vec![0, 1], "{p:?}");
        assert_eq!(p.places[2], Place::Capped, "{p:?}");
        // Affinity on the zone: beside a cache in zone b, on a new node there when the
        // cache's node is full.
        let mut client = plain(1500);
        client.affinity = vec![AntiAffinity {
            selector: app("cache"),
            namespaces: Namespaces::Listed(vec![]),
            topology_key: ZONE.into(),
        }];
        let running = [labelled("cache", 1000)];
        let e = Existing {
            kind: m[1],
            pods: ps(&running),
        };
        let p = plan(&[e], &[client.p()], &m, NONE, 10);
        assert_eq!(
            (p.places[0], p.new_nodes.clone()),
            (Place::New(0), vec![1]),
            "{p:?}"
        );
    }

    #[test]
    fn two_pods_that_bind_one_host_port_take_two_nodes() {
        let l = labels("2vcpu-4096mib");
        let mut web = plain(100);
        web.ports = vec![HostPort {
            protocol: "TCP".into(),
            port: 8080,
        }];
        let mut udp = web.clone();
        udp.ports[0].protocol = "UDP".into();
        let p = plan(
            &[],
            &ps(&[web.clone(), web.clone(), udp]),
            &one(&l),
            NONE,
            10,
        );
        assert_eq!(
            p.places,
            vec![Place::New(0), Place::New(1), Place::New(0)],
            "{p:?}"
        );
        // Beside a bound Pod on the port: a new node.
        let running = [web.clone()];
        let p = plan(&[on(&l, &running)], &[web.p()], &one(&l), NONE, 10);
        assert_eq!(p.places, vec![Place::New(0)], "{p:?}");
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
                            topology_key: HOSTNAME.into(),
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

    /// Shapes of 1, 2 and 4 vCPU in each of zones a and b (groups 0 and 1), zone b dearer.
    fn two_zones(l: &[BTreeMap<String, String>; 6]) -> Vec<NodeKind<'_>> {
        (0..6)
            .map(|i| NodeKind {
                capacity: Capacity {
                    cpu_millis: 1000 << (i % 3),
                    memory_bytes: 2u64 << 30 << (i % 3),
                    slots: 8,
                },
                labels: &l[i],
                price: (10 << (i % 3)) + 5 * (i / 3) as u64,
                group: i / 3,
            })
            .collect()
    }

    fn two_zone_labels() -> [BTreeMap<String, String>; 6] {
        std::array::from_fn(|i| {
            let mut l = labels(["1vcpu-2048mib", "2vcpu-4096mib", "4vcpu-8192mib"][i % 3]);
            l.insert(ZONE.into(), ["a", "b"][i / 3].into());
            l
        })
    }

    /// A Pod with, now and then, anti-affinity by zone, a spread by zone, a spread on a key
    /// no node carries, a host port.
    fn arb_zoned_pod() -> impl Strategy<Value = Pod> {
        (0u64..2500, 0u8..6, any::<bool>()).prop_map(|(cpu, rule, port)| {
            let mut p = labelled(["db", "web"][usize::from(rule % 2)], cpu);
            let key = |k: &str| k.to_string();
            match rule {
                0 => {
                    p.terms = vec![AntiAffinity {
                        selector: app("db"),
                        namespaces: Namespaces::Listed(vec![]),
                        topology_key: key(ZONE),
                    }]
                }
                1 | 3 => {
                    p.spread = vec![Spread {
                        max_skew: 1,
                        selector: app("web"),
                        topology_key: key(ZONE),
                    }]
                }
                5 => {
                    p.spread = vec![Spread {
                        max_skew: 1,
                        selector: app("web"),
                        topology_key: key("example.com/rack"),
                    }]
                }
                _ => {}
            }
            if port {
                p.ports = vec![HostPort {
                    protocol: "TCP".into(),
                    port: 8080,
                }];
            }
            p
        })
    }

    proptest! {
        /// With zones on offer: every new node keeps one zone; no two Pods on one node bind
        /// one host port; no two Pods in one zone where either's zone anti-affinity selects
        /// the other; every Pod spread on a key is on a node that carries it (a Pod spread
        /// on a key no shape carries is never placed: no rent for it).
        #[test]
        fn zoned_plans_keep_zones_ports_and_keys(
            waiting in proptest::collection::vec(arb_zoned_pod(), 0..20),
            max_new in 0usize..20,
        ) {
            let l = two_zone_labels();
            let m = two_zones(&l);
            let w = ps(&waiting);
            let plan = plan(&[], &w, &m, NONE, max_new);
            let zone_of = |n: usize| m[plan.new_nodes[n]].labels[ZONE].as_str();
            let mut on: Vec<Vec<usize>> = vec![Vec::new(); plan.new_nodes.len()];
            for (i, place) in plan.places.iter().enumerate() {
                match place {
                    Place::New(n) => on[*n].push(i),
                    Place::Existing(_) => prop_assert!(false, "no node exists"),
                    Place::Capped => {}
                }
                if let Place::New(n) = place {
                    for s in w[i].spread {
                        prop_assert!(
                            m[plan.new_nodes[*n]].labels.contains_key(&s.topology_key),
                            "pod {} spread on {} placed on a node without it", i, s.topology_key
                        );
                    }
                }
            }
            for (n, pods) in on.iter().enumerate() {
                prop_assert!(!pods.is_empty(), "new node {} rented for nothing", n);
                let mut ports = Vec::new();
                for &i in pods {
                    for h in w[i].host_ports {
                        prop_assert!(!ports.contains(h), "two pods bind {:?} on node {}", h, n);
                        ports.push(h.clone());
                    }
                }
            }
            let placed: Vec<(usize, usize)> = on
                .iter()
                .enumerate()
                .flat_map(|(n, pods)| pods.iter().map(move |&i| (n, i)))
                .collect();
            for &(n, a) in &placed {
                for &(o, b) in &placed {
                    if a == b || zone_of(n) != zone_of(o) {
                        continue;
                    }
                    let apart = w[a].anti_affinity.iter().any(|t| t.selects(w[a].namespace, &w[b]));
                    prop_assert!(!apart, "pods {} and {} share zone {}", a, b, zone_of(n));
                }
            }
        }
    }
}
