//! Where the Pods that wait would go, as kube-scheduler would place them (issue 37's first
//! step), pure: the nodes the cluster has (each with the Pods bound to it) and the waiting
//! Pods in; for each waiting Pod an existing node, a node to rent, or none out. The scale
//! decision ([`crate::scale`]) rents the nodes to rent.
//!
//! What it simulates of the scheduler's filters: requests (CPU, memory, and a Pod slot:
//! `pods_per_node` is the broker's own packing target), and required pod anti-affinity on
//! `kubernetes.io/hostname` in both directions (a waiting Pod's terms against the Pods on a
//! node, and theirs against it). Pods are placed first-fit-decreasing (the largest requests
//! first, onto the first node that holds them, existing nodes before new ones), which is
//! what kube-scheduler's filters allow; its scores may spread Pods where the plan packs
//! them, which only leaves room.
//!
//! Not simulated yet: node affinity and `nodeSelector`, pod affinity, topology spread and
//! taints (our nodes carry none); anti-affinity on other topology keys (our nodes carry no
//! zone: the scheduler lets such a term pass) is ignored.

use std::collections::BTreeMap;

/// The label every node carries with its own name: the topology key of "one per node".
pub const HOSTNAME: &str = "kubernetes.io/hostname";

/// A label selector's requirement (`matchExpressions`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
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
            && self.match_expressions.iter().all(|r| match r {
                Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
                Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
                Requirement::Exists(k) => labels.contains_key(k),
                Requirement::DoesNotExist(k) => !labels.contains_key(k),
            })
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

/// A node of the simulation: what is left of it and the Pods on it.
#[derive(Debug, Clone)]
struct SimNode<'a> {
    cpu: u64,
    memory: u64,
    slots: u32,
    pods: Vec<Placeable<'a>>,
}

impl<'a> SimNode<'a> {
    fn new(c: Capacity) -> SimNode<'a> {
        SimNode {
            cpu: c.cpu_millis,
            memory: c.memory_bytes,
            slots: c.slots,
            pods: Vec::new(),
        }
    }

    /// Takes `p` in regardless of fit (a Pod already bound there).
    fn take(&mut self, p: Placeable<'a>) {
        self.cpu = self.cpu.saturating_sub(p.cpu_millis);
        self.memory = self.memory.saturating_sub(p.memory_bytes);
        if p.takes_slot {
            self.slots = self.slots.saturating_sub(1);
        }
        self.pods.push(p);
    }

    /// Whether the scheduler's filters (those simulated) let `p` onto this node.
    fn fits(&self, p: &Placeable<'_>) -> bool {
        p.cpu_millis <= self.cpu
            && p.memory_bytes <= self.memory
            && (!p.takes_slot || self.slots > 0)
            && self.pods.iter().all(|q| {
                !p.anti_affinity.iter().any(|t| t.selects(p.namespace, q))
                    && !q.anti_affinity.iter().any(|t| t.selects(q.namespace, p))
            })
    }
}

/// Where a waiting Pod goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// The existing node of that index.
    Existing(usize),
    /// The new node of that index (0-based, in the order they would be rented).
    New(usize),
    /// Nowhere: it would need a node past the cap.
    Capped,
}

/// The plan: for each waiting Pod (in the order given) its place, and how many nodes to rent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub places: Vec<Place>,
    pub new_nodes: usize,
}

/// Places `waiting` on `existing` nodes (each the Pods bound to it) and as few new nodes of
/// `capacity`, at most `max_new`, as first-fit-decreasing finds. A Pod larger than
/// `capacity` gets a node of its own (the caller keeps those out, as unfit).
pub fn plan<'a>(
    existing: &[Vec<Placeable<'a>>],
    waiting: &[Placeable<'a>],
    capacity: Capacity,
    max_new: usize,
) -> Plan {
    let mut nodes: Vec<SimNode<'a>> = existing
        .iter()
        .map(|pods| {
            let mut n = SimNode::new(capacity);
            for p in pods {
                n.take(*p);
            }
            n
        })
        .collect();
    let first_new = nodes.len();
    // Largest first: CPU, then memory; anti-affine Pods before others of the same size.
    let mut order: Vec<usize> = (0..waiting.len()).collect();
    order.sort_by(|&a, &b| {
        let (pa, pb) = (&waiting[a], &waiting[b]);
        (pb.cpu_millis, pb.memory_bytes, pb.anti_affinity.len())
            .cmp(&(pa.cpu_millis, pa.memory_bytes, pa.anti_affinity.len()))
            .then(a.cmp(&b))
    });
    let mut places = vec![Place::Capped; waiting.len()];
    for i in order {
        let p = waiting[i];
        let at = match nodes.iter().position(|n| n.fits(&p)) {
            Some(at) => at,
            None if nodes.len() - first_new < max_new => {
                nodes.push(SimNode::new(capacity));
                nodes.len() - 1
            }
            None => continue,
        };
        nodes[at].take(p);
        places[i] = if at < first_new {
            Place::Existing(at)
        } else {
            Place::New(at - first_new)
        };
    }
    Plan {
        places,
        new_nodes: nodes.len() - first_new,
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

    /// A Pod's owned parts, to borrow a [`Placeable`] from.
    #[derive(Debug, Clone, Default)]
    struct Pod {
        namespace: String,
        labels: BTreeMap<String, String>,
        cpu: u64,
        slot: bool,
        terms: Vec<AntiAffinity>,
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

    #[test]
    fn four_anti_affine_jobs_need_four_nodes() {
        let jobs: Vec<Pod> = (0..4).map(|_| job(100)).collect();
        let p = plan(&[], &ps(&jobs), CAP, 10);
        assert_eq!(p.new_nodes, 4);
        let mut at = p.places.clone();
        at.dedup();
        assert_eq!(at.len(), 4, "each on its own node: {:?}", p.places);
        // At most two new nodes: two placed, two capped.
        let p = plan(&[], &ps(&jobs), CAP, 2);
        assert_eq!(p.new_nodes, 2);
        assert_eq!(p.places.iter().filter(|x| **x == Place::Capped).count(), 2);
    }

    #[test]
    fn a_job_goes_to_an_existing_node_without_one() {
        let (running, other) = (job(100), plain(100));
        let waiting = [job(100), job(100)];
        let p = plan(
            &[vec![running.p()], vec![other.p()]],
            &ps(&waiting),
            CAP,
            10,
        );
        assert_eq!(p.places, vec![Place::Existing(1), Place::New(0)]);
        assert_eq!(p.new_nodes, 1);
    }

    #[test]
    fn an_existing_pods_anti_affinity_keeps_others_away() {
        // The waiting Pod has no terms; the running job's term selects it.
        let running = job(100);
        let mut labelled = plain(100);
        labelled.namespace = "gitlab".into();
        labelled.labels = running.labels.clone();
        let p = plan(&[vec![running.p()]], &[labelled.p()], CAP, 10);
        assert_eq!(p.places, vec![Place::New(0)]);
        // In another namespace, the term (its own namespace only) does not select it.
        labelled.namespace = "default".into();
        let p = plan(&[vec![running.p()]], &[labelled.p()], CAP, 10);
        assert_eq!(p.places, vec![Place::Existing(0)]);
        // Unless the term looks in every namespace.
        let mut wide = running.clone();
        wide.terms[0].namespaces = Namespaces::All;
        let p = plan(&[vec![wide.p()]], &[labelled.p()], CAP, 10);
        assert_eq!(p.places, vec![Place::New(0)]);
    }

    #[test]
    fn requests_pack_first_fit_decreasing() {
        // 1500m, 1000m, 1000m, 500m on 2000m nodes: {1500, 500}, {1000, 1000}.
        let pods = [plain(1000), plain(1500), plain(500), plain(1000)];
        let p = plan(&[], &ps(&pods), CAP, 10);
        assert_eq!(p.new_nodes, 2);
        assert_eq!(p.places[1], p.places[2], "{:?}", p.places);
        assert_eq!(p.places[0], p.places[3], "{:?}", p.places);
    }

    #[test]
    fn slots_bound_pods_without_requests() {
        // pods_per_node as the fallback: 9 Pods without requests at 8 a node.
        let pods: Vec<Pod> = (0..9).map(|_| plain(0)).collect();
        assert_eq!(plan(&[], &ps(&pods), CAP, 10).new_nodes, 2);
        // A DaemonSet's Pod on a node takes its requests, not a slot.
        let mut ds = plain(1900);
        ds.slot = false;
        let p = plan(&[vec![ds.p()]], &[plain(200).p()], CAP, 10);
        assert_eq!(p.places, vec![Place::New(0)], "1900m of 2000m taken");
    }

    #[test]
    fn selectors_match_as_the_api_defines() {
        let labels: BTreeMap<String, String> = [("app".to_string(), "web".to_string())].into();
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
        let ml = Selector {
            match_labels: [("app".to_string(), "db".to_string())].into(),
            ..Default::default()
        };
        assert!(!ml.matches(&labels));
    }

    use proptest::prelude::*;

    fn arb_pod() -> impl Strategy<Value = Pod> {
        (0u64..2500, any::<bool>(), 0u8..3).prop_map(|(cpu, anti, ns)| {
            let mut p = if anti { job(cpu) } else { plain(cpu) };
            p.namespace = ["a", "b", "gitlab"][ns as usize].into();
            p
        })
    }

    proptest! {
        /// Replaying the plan, every placed Pod fits its node by the simulated rules when it
        /// lands; every new node gets a Pod; nothing is capped while the cap has room.
        #[test]
        fn every_placed_pod_fits_and_no_new_node_is_empty(
            bound in proptest::collection::vec(proptest::collection::vec(arb_pod(), 0..4), 0..4),
            waiting in proptest::collection::vec(arb_pod(), 0..24),
            max_new in 0usize..30,
        ) {
            let existing: Vec<Vec<Placeable<'_>>> = bound.iter().map(|n| ps(n)).collect();
            let w = ps(&waiting);
            let plan = plan(&existing, &w, CAP, max_new);
            prop_assert!(plan.new_nodes <= max_new);
            let mut nodes: Vec<SimNode<'_>> = existing
                .iter()
                .map(|pods| {
                    let mut n = SimNode::new(CAP);
                    pods.iter().for_each(|p| n.take(*p));
                    n
                })
                .chain((0..plan.new_nodes).map(|_| SimNode::new(CAP)))
                .collect();
            let first_new = existing.len();
            // Replay in the plan's own order (largest first), as it placed them.
            let mut order: Vec<usize> = (0..w.len()).collect();
            order.sort_by(|&a, &b| {
                (w[b].cpu_millis, w[b].memory_bytes, w[b].anti_affinity.len())
                    .cmp(&(w[a].cpu_millis, w[a].memory_bytes, w[a].anti_affinity.len()))
                    .then(a.cmp(&b))
            });
            for i in order {
                let at = match plan.places[i] {
                    Place::Existing(e) => e,
                    Place::New(n) => first_new + n,
                    Place::Capped => {
                        prop_assert_eq!(plan.new_nodes, max_new, "capped with room left");
                        continue;
                    }
                };
                let fits = nodes[at].fits(&w[i]) || (at >= first_new && nodes[at].pods.is_empty());
                prop_assert!(fits, "pod {} does not fit node {}", i, at);
                nodes[at].take(w[i]);
            }
            for (n, node) in nodes.iter().enumerate().skip(first_new) {
                prop_assert!(!node.pods.is_empty(), "new node {} rented for nothing", n);
            }
        }
    }
}
