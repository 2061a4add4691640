//! A CI-like trace replayed against a scale decision, for `bench/scale`: jobs of mixed sizes
//! and lengths arrive over an hour; a simple scheduler binds each waiting job to the first
//! Ready node with room; each pass, the decision under test says what to rent and release;
//! nodes take a boot time to become Ready. Out: what was paid (node-minutes, and
//! vCPU-minutes, which is what a price linear in vCPUs charges) and how long jobs waited.
//!
//! Two decisions replay the same trace: the product's ([`Product`]: the placement onto
//! shapes on offer, empty nodes released after the hold) and the one it replaced
//! ([`Count`]: `ceil(intent / pods_per_node)` nodes of one configured size, released only
//! when nothing at all runs for the hold), so the ratio is like for like: the same jobs, the
//! same boot time, the same scheduler, the same hold.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime};

use socialweb_broker_core::scale::{
    Action, Knobs, LeaseView, Offers, Phase, PodView, Pool, decide, releases,
};
use socialweb_market::{NodeSpec, Shape};

/// A job of the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Job {
    pub arrives_s: u64,
    pub runs_s: u64,
    pub cpu_millis: u64,
    pub memory_bytes: u64,
}

/// A small deterministic generator (xorshift64*): the trace is the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// An hour of CI: about `per_minute` jobs a minute (uniform gaps), 70 % of 2-5 minutes, 25 %
/// of 5-20 and 5 % of 30-60; half of them ask 500m and 1 GiB, 30 % 1000m and 2 GiB, 20 %
/// 1500m and 3 GiB.
pub fn ci_hour(per_minute: u64, seed: u64) -> Vec<Job> {
    let mut rng = Rng(seed | 1);
    let mut jobs = Vec::new();
    let mut t = 0;
    while t < 3600 {
        let runs_s = match rng.below(100) {
            0..70 => 120 + rng.below(180),
            70..95 => 300 + rng.below(900),
            _ => 1800 + rng.below(1800),
        };
        let (cpu_millis, gib) = match rng.below(100) {
            0..50 => (500, 1),
            50..80 => (1000, 2),
            _ => (1500, 3),
        };
        jobs.push(Job {
            arrives_s: t,
            runs_s,
            cpu_millis,
            memory_bytes: gib << 30,
        });
        t += 1 + rng.below(120 / per_minute.max(1));
    }
    jobs
}

/// What a decision under test answers each pass.
#[derive(Debug, Default)]
pub struct Moves {
    /// Shapes of the nodes to rent.
    pub rent: Vec<NodeSpec>,
    /// Nodes to release.
    pub release: Vec<String>,
}

/// A scale decision the trace is replayed against.
pub trait Decider {
    fn pass(&mut self, pods: &[PodView], leases: &[LeaseView], now: SystemTime) -> Moves;
}

/// The product's decision: [`decide`] on the shapes on offer, empty nodes released after the
/// hold as the driver does.
#[derive(Debug)]
pub struct Product {
    pub knobs: Knobs,
    pub shapes: Vec<Shape>,
    pub last_intent: SystemTime,
    pub empty_since: HashMap<String, SystemTime>,
}

impl Decider for Product {
    fn pass(&mut self, pods: &[PodView], leases: &[LeaseView], now: SystemTime) -> Moves {
        let labels = BTreeMap::new();
        let offers = Offers {
            shapes: &self.shapes,
            labels: &labels,
        };
        let d = decide(
            pods,
            leases,
            &offers,
            &Pool::default(),
            &self.knobs,
            now,
            self.last_intent,
        );
        self.last_intent = d.last_intent_at;
        let mut m = Moves::default();
        match d.action {
            Action::Provision { .. } => m.rent = d.shapes.clone(),
            Action::Teardown => m.release = leases.iter().map(|l| l.node.clone()).collect(),
            Action::Hold => {}
        }
        if d.action != Action::Teardown {
            m.release.extend(
                releases(&d.empty, &mut self.empty_since, now, self.knobs.hold)
                    .into_iter()
                    .map(|(n, _)| n),
            );
        }
        m
    }
}

/// The decision the product replaced (contract 7 before issue 37): intent is the work that
/// is not finished; the target is `ceil(intent / pods_per_node)` nodes of the one
/// configured size, up to `max_nodes`; nodes go only when there has been no intent for the
/// hold, all at once.
#[derive(Debug)]
pub struct Count {
    pub pods_per_node: u32,
    pub max_nodes: u32,
    pub hold: Duration,
    pub node: NodeSpec,
    pub last_intent: SystemTime,
}

impl Decider for Count {
    fn pass(&mut self, pods: &[PodView], leases: &[LeaseView], now: SystemTime) -> Moves {
        let intent = pods
            .iter()
            .filter(|p| matches!(p.phase, Phase::Pending | Phase::Running))
            .count() as u32;
        let mut m = Moves::default();
        if intent > 0 {
            self.last_intent = now;
            let target = intent.div_ceil(self.pods_per_node).min(self.max_nodes);
            let have = leases.len() as u32;
            m.rent = vec![self.node; target.saturating_sub(have) as usize];
        } else if now.duration_since(self.last_intent).unwrap_or_default() > self.hold {
            m.release = leases.iter().map(|l| l.node.clone()).collect();
        }
        m
    }
}

/// What a replay paid and how long its jobs waited.
#[derive(Debug, Clone, PartialEq)]
pub struct Bill {
    pub node_minutes: f64,
    pub vcpu_minutes: f64,
    pub nodes_rented: usize,
    pub wait_p50_s: Option<f64>,
    pub wait_p99_s: Option<f64>,
    /// Jobs that never ran before the replay's end.
    pub never_ran: usize,
}

struct SimNode {
    name: String,
    spec: NodeSpec,
    rented_at: u64,
    ready_at: u64,
    released_at: Option<u64>,
}

/// Replays `jobs` against `decider` in steps of `step_s`, nodes Ready `boot_s` after they
/// are rented, until every job has ended (or `limit_s`).
pub fn replay(
    jobs: &[Job],
    decider: &mut dyn Decider,
    step_s: u64,
    boot_s: u64,
    limit_s: u64,
) -> Bill {
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let at = |s: u64| t0 + Duration::from_secs(s);
    let mut nodes: Vec<SimNode> = Vec::new();
    // Each job's node and start, once bound.
    let mut bound: Vec<Option<(usize, u64)>> = vec![None; jobs.len()];
    let mut now = 0;
    while now <= limit_s {
        let done = |i: usize, b: &Option<(usize, u64)>| {
            b.is_some_and(|(_, start)| start + jobs[i].runs_s <= now)
        };
        schedule(jobs, &nodes, &mut bound, now);
        let pods: Vec<PodView> = jobs
            .iter()
            .enumerate()
            .filter(|(i, j)| j.arrives_s <= now && !done(*i, &bound[*i]))
            .map(|(i, j)| view(i, j, bound[i].map(|(n, _)| nodes[n].name.clone())))
            .collect();
        if pods.is_empty() && jobs.iter().all(|j| j.arrives_s <= now) && live(&nodes) == 0 {
            break;
        }
        let leases: Vec<LeaseView> = nodes
            .iter()
            .filter(|n| n.released_at.is_none())
            .map(|n| LeaseView {
                node: n.name.clone(),
                live: true,
                spec: n.spec,
                allocatable: None,
            })
            .collect();
        let m = decider.pass(&pods, &leases, at(now));
        for spec in m.rent {
            nodes.push(SimNode {
                name: format!("n{}", nodes.len()),
                spec,
                rented_at: now,
                ready_at: now + boot_s,
                released_at: None,
            });
        }
        for name in m.release {
            let Some(i) = nodes.iter().position(|n| n.name == name) else {
                continue;
            };
            // The driver cordons first and calls the release off if a job is on it.
            let busy = (0..jobs.len())
                .any(|j| bound[j].is_some_and(|(n, _)| n == i) && !done(j, &bound[j]));
            if !busy {
                nodes[i].released_at = Some(now);
            }
        }
        now += step_s;
    }
    bill(jobs, &nodes, &bound, now)
}

fn live(nodes: &[SimNode]) -> usize {
    nodes.iter().filter(|n| n.released_at.is_none()).count()
}

fn view(i: usize, j: &Job, node: Option<String>) -> PodView {
    PodView {
        namespace: "ci".into(),
        name: format!("job-{i}"),
        phase: if node.is_some() {
            Phase::Running
        } else {
            Phase::Pending
        },
        priority: 0,
        node_name: node,
        follows_nodes: false,
        cpu_millis: j.cpu_millis,
        memory_bytes: j.memory_bytes,
        labels: BTreeMap::new(),
        anti_affinity: Vec::new(),
        affinity: Vec::new(),
        spread: Vec::new(),
        node: Default::default(),
    }
}

/// The scheduler: each waiting job, in arrival order, to the first Ready node where its
/// requests fit beside the jobs running there (the node's allocatable: its shape less the
/// decision's memory reserve).
fn schedule(jobs: &[Job], nodes: &[SimNode], bound: &mut [Option<(usize, u64)>], now: u64) {
    let mut used = vec![(0u64, 0u64); nodes.len()];
    for (i, b) in bound.iter().enumerate() {
        if let Some((n, start)) = b
            && start + jobs[i].runs_s > now
        {
            used[*n].0 += jobs[i].cpu_millis;
            used[*n].1 += jobs[i].memory_bytes;
        }
    }
    for (i, j) in jobs.iter().enumerate() {
        if bound[i].is_some() || j.arrives_s > now {
            continue;
        }
        let fit = nodes.iter().enumerate().position(|(n, node)| {
            let mem = node.spec.mem_mib << 20;
            let alloc_mem = mem - mem * socialweb_broker_core::scale::MEMORY_RESERVE_PERCENT / 100;
            node.released_at.is_none()
                && node.ready_at <= now
                && used[n].0 + j.cpu_millis <= u64::from(node.spec.vcpu) * 1000
                && used[n].1 + j.memory_bytes <= alloc_mem
        });
        if let Some(n) = fit {
            used[n].0 += j.cpu_millis;
            used[n].1 += j.memory_bytes;
            bound[i] = Some((n, now));
        }
    }
}

fn bill(jobs: &[Job], nodes: &[SimNode], bound: &[Option<(usize, u64)>], end: u64) -> Bill {
    let mut node_minutes = 0.0;
    let mut vcpu_minutes = 0.0;
    for n in nodes {
        let minutes = (n.released_at.unwrap_or(end) - n.rented_at) as f64 / 60.0;
        node_minutes += minutes;
        vcpu_minutes += minutes * f64::from(n.spec.vcpu);
    }
    let mut waits: Vec<f64> = jobs
        .iter()
        .zip(bound)
        .filter_map(|(j, b)| b.map(|(_, start)| (start - j.arrives_s) as f64))
        .collect();
    waits.sort_by(f64::total_cmp);
    let pct = |q: f64| crate::stats::percentile_sorted(&waits, q);
    Bill {
        node_minutes,
        vcpu_minutes,
        nodes_rented: nodes.len(),
        wait_p50_s: pct(0.5),
        wait_p99_s: pct(0.99),
        never_ran: bound.iter().filter(|b| b.is_none()).count(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(vcpu: u32) -> NodeSpec {
        NodeSpec {
            vcpu,
            mem_mib: 4096 * u64::from(vcpu) / 2,
            disk_mib: 20480,
        }
    }

    #[test]
    fn a_replay_pays_for_the_nodes_its_decision_rents_and_runs_every_job() {
        let jobs = ci_hour(2, 7);
        assert!(jobs.len() > 60, "{}", jobs.len());
        let mut count = Count {
            pods_per_node: 2,
            max_nodes: 100,
            hold: Duration::from_secs(120),
            node: spec(2),
            last_intent: SystemTime::UNIX_EPOCH,
        };
        let b = replay(&jobs, &mut count, 10, 30, 4 * 3600);
        assert_eq!(b.never_ran, 0, "{b:?}");
        assert!(b.node_minutes > 60.0, "{b:?}");
        let mut product = Product {
            knobs: Knobs {
                max_nodes: 100,
                pods_per_node: 8,
                hold: Duration::from_secs(120),
                expendable_priority_cutoff: -10,
                node: socialweb_broker_core::scale::NodeSize::default(),
                max_hold: Duration::from_secs(3600),
            },
            shapes: [1, 2, 4]
                .map(|v| Shape {
                    spec: spec(v),
                    price_micros_per_hour: u64::from(v) * 10_000,
                })
                .to_vec(),
            last_intent: SystemTime::UNIX_EPOCH,
            empty_since: HashMap::new(),
        };
        let p = replay(&jobs, &mut product, 10, 30, 4 * 3600);
        assert_eq!(p.never_ran, 0, "{p:?}");
        assert!(p.vcpu_minutes > 0.0);
    }
}
