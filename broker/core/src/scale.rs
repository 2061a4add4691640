//! The scale decision (contract 7), a pure function: Pods, leases, the configuration and the
//! time in; the node target, what to do and why out. No I/O, no clock of its own: tested as a
//! table, and cheap enough to run on every change (microseconds for 10,000 Pods).
//!
//! - Intent = Pods Pending, Running or Unknown, except the cluster's own addons (kube-system,
//!   DaemonSet and static Pods, which follow nodes rather than ask for them), Pods at or below
//!   the expendable priority cutoff (GitLab's pause Pods run at -10), and Pending Pods whose
//!   requests no node size on offer can hold (those are reported, to get an Event).
//! - Target = min(max_nodes, ceil(intent / pods_per_node)).
//! - Provision when the target exceeds the live leases; with zero intent for longer than the
//!   hold, Teardown to zero. Never an intermediate scale-in: a node with work stays.

use std::time::{Duration, SystemTime};

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
    /// Sum of the containers' requests (init containers: the largest, as the scheduler counts).
    pub cpu_millis: u64,
    pub memory_bytes: u64,
}

/// A lease the broker holds for the cluster (booting or running: a node paid for).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseView {
    pub node: String,
    pub live: bool,
}

/// The decision's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Knobs {
    pub max_nodes: u32,
    pub pods_per_node: u32,
    pub hold: Duration,
    pub expendable_priority_cutoff: i32,
    pub node: NodeSize,
}

/// What to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Rent this many more nodes.
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
}

/// Why a Pending Pod cannot be placed on any node on offer, if it cannot.
pub fn unfit(p: &PodView, node: &NodeSize) -> Option<String> {
    let cpu = u64::from(node.vcpu) * 1000;
    let mem = node.mem_mib * 1024 * 1024;
    if p.cpu_millis > cpu {
        return Some(format!(
            "requests {}m CPU, more than a whole node on offer ({} vCPU)",
            p.cpu_millis, node.vcpu
        ));
    }
    if p.memory_bytes > mem {
        return Some(format!(
            "requests {} MiB of memory, more than a whole node on offer ({} MiB)",
            p.memory_bytes.div_ceil(1024 * 1024),
            node.mem_mib
        ));
    }
    None
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

/// The decision. `last_intent_at` is when intent was last seen non-zero (the cluster's
/// creation when never).
pub fn decide(
    pods: &[PodView],
    leases: &[LeaseView],
    k: &Knobs,
    now: SystemTime,
    last_intent_at: SystemTime,
) -> Decision {
    let mut intent: u32 = 0;
    let mut unfit_pods = Vec::new();
    for p in pods {
        if !is_work(p, k.expendable_priority_cutoff) {
            continue;
        }
        if p.phase == Phase::Pending
            && p.node_name.is_none()
            && let Some(why) = unfit(p, &k.node)
        {
            unfit_pods.push((format!("{}/{}", p.namespace, p.name), why));
            continue;
        }
        intent += 1;
    }
    let nodes = leases.iter().filter(|l| l.live).count() as u32;
    let target = intent.div_ceil(k.pods_per_node).min(k.max_nodes);
    let mut d = Decision {
        action: Action::Hold,
        target,
        nodes,
        intent,
        unfit: unfit_pods,
        last_intent_at: if intent > 0 { now } else { last_intent_at },
        reason: String::new(),
    };
    if intent > 0 {
        if target > nodes {
            d.action = Action::Provision {
                count: target - nodes,
            };
            d.reason = if nodes == 0 {
                "Provision: intent and no node".into()
            } else {
                format!(
                    "Provision: {intent} pods need {target} nodes at {} per node, {nodes} leased",
                    k.pods_per_node
                )
            };
        } else {
            d.reason = if target < intent.div_ceil(k.pods_per_node) {
                format!(
                    "Hold: {intent} pods would need {} nodes, capped at max_nodes {}",
                    intent.div_ceil(k.pods_per_node),
                    k.max_nodes
                )
            } else {
                format!("Hold: {intent} pods on {nodes} nodes")
            };
        }
        return d;
    }
    d.target = 0;
    let idle = now.duration_since(last_intent_at).unwrap_or_default();
    if nodes == 0 {
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
    d
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
        }
    }

    fn leases(n: usize) -> Vec<LeaseView> {
        (0..n)
            .map(|i| LeaseView {
                node: format!("n{i}"),
                live: true,
            })
            .collect()
    }

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + secs)
    }

    #[test]
    fn one_pending_pod_and_no_node_provisions_one() {
        let d = decide(&[pod("a", Phase::Pending)], &[], &knobs(), t(10), t(0));
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
        let d = decide(&pods, &[], &knobs(), t(1), t(0));
        assert_eq!(d.action, Action::Provision { count: 5 });
        let d = decide(&pods, &leases(2), &knobs(), t(1), t(0));
        assert_eq!(d.action, Action::Provision { count: 3 });
        assert!(d.reason.contains("5 pods need 5 nodes"), "{}", d.reason);
        let d = decide(&pods, &leases(5), &knobs(), t(1), t(0));
        assert_eq!(d.action, Action::Hold);
    }

    #[test]
    fn pods_per_node_rounds_up_and_max_nodes_caps() {
        let mut k = knobs();
        k.pods_per_node = 8;
        let pods: Vec<_> = (0..9)
            .map(|i| pod(&format!("p{i}"), Phase::Pending))
            .collect();
        assert_eq!(decide(&pods, &[], &k, t(1), t(0)).target, 2);
        k.pods_per_node = 1;
        let d = decide(&pods, &leases(5), &k, t(1), t(0));
        assert_eq!((d.target, d.action), (5, Action::Hold));
        assert!(d.reason.contains("capped at max_nodes 5"), "{}", d.reason);
    }

    #[test]
    fn running_and_unknown_count_finished_pods_do_not() {
        let pods = [
            pod("r", Phase::Running),
            pod("u", Phase::Unknown),
            pod("s", Phase::Succeeded),
            pod("f", Phase::Failed),
        ];
        assert_eq!(decide(&pods, &leases(2), &knobs(), t(1), t(0)).intent, 2);
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
        let d = decide(&[addon, ds, pause, lower], &[], &knobs(), t(1), t(0));
        assert_eq!((d.intent, d.action), (0, Action::Hold));
        assert_eq!(decide(&[just_above], &[], &knobs(), t(1), t(0)).intent, 1);
    }

    #[test]
    fn a_pod_no_node_can_hold_rents_nothing_and_is_reported() {
        let mut big = pod("big", Phase::Pending);
        big.cpu_millis = 4000;
        let mut huge = pod("huge", Phase::Pending);
        huge.memory_bytes = 64 << 30;
        let d = decide(&[big, huge], &[], &knobs(), t(1), t(0));
        assert_eq!((d.intent, d.action), (0, Action::Hold));
        assert_eq!(d.unfit.len(), 2);
        assert!(d.unfit[0].1.contains("4000m CPU"), "{:?}", d.unfit);
        assert!(d.unfit[1].1.contains("65536 MiB"), "{:?}", d.unfit);
        // Once placed (on a node someone else made), it is intent like any other.
        let mut placed = pod("big", Phase::Pending);
        placed.cpu_millis = 4000;
        placed.node_name = Some("n0".into());
        assert_eq!(
            decide(&[placed], &leases(1), &knobs(), t(1), t(0)).intent,
            1
        );
    }

    #[test]
    fn zero_intent_tears_down_only_past_the_hold() {
        let k = knobs();
        let within = decide(&[], &leases(3), &k, t(60), t(0));
        assert_eq!(within.action, Action::Hold);
        assert_eq!(
            within.reason,
            "Hold: nothing running for 1m0s, within the 1m0s hold"
        );
        assert_eq!(teardown_due(&within, &k), Some(t(60)));
        let past = decide(
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
        let idle = decide(&[], &[], &k, t(500), t(0));
        assert_eq!(idle.action, Action::Hold);
        assert_eq!(idle.reason, "Hold: nothing running and no node");
    }

    #[test]
    fn released_leases_are_not_nodes() {
        let l = vec![
            LeaseView {
                node: "a".into(),
                live: false,
            },
            LeaseView {
                node: "b".into(),
                live: true,
            },
        ];
        let d = decide(&[pod("p", Phase::Pending)], &l, &knobs(), t(1), t(0));
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
            .map(|i| pod(&format!("p{i}"), Phase::Running))
            .collect();
        let d = decide(&pods, &leases(3), &knobs(), t(1), t(0));
        assert_eq!(d.intent, 10_000);
        assert_eq!(d.target, 5);
    }
}
