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
    Action, Knobs, LeaseView, Offers, Phase, PodView, Pool, Rentable, Scheduling, decide, releases,
};
use socialweb_market::NodeSpec;

/// A job of the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Job {
    pub arrives_s: u64,
    pub runs_s: u64,
    /// Its containers' requests; a native sidecar's come on top ([`Job::cpu`]).
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    /// A native sidecar's CPU (a job's service), 0 for none.
    pub sidecar_millis: u64,
    /// When its scheduling gate is lifted (Kueue admits it): `arrives_s` for none.
    pub gated_until_s: u64,
    /// -10 for a pause Pod (expendable: it runs on a node's spare room until preempted).
    pub priority: i32,
}

impl Job {
    /// What the scheduler counts: the containers and the sidecar.
    pub fn cpu(&self) -> u64 {
        self.cpu_millis + self.sidecar_millis
    }

    fn is_pause(&self) -> bool {
        self.priority < 0
    }

    fn plain(arrives_s: u64, runs_s: u64, cpu_millis: u64, memory_bytes: u64) -> Job {
        Job {
            arrives_s,
            runs_s,
            cpu_millis,
            memory_bytes,
            sidecar_millis: 0,
            gated_until_s: arrives_s,
            priority: 0,
        }
    }
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
        jobs.push(Job::plain(t, runs_s, cpu_millis, gib << 30));
        t += 1 + rng.below(120 / per_minute.max(1));
    }
    jobs
}

/// [`ci_hour`] as CI is written now (issue 59): 30 % of the jobs with a 250m native sidecar
/// (a service beside the build), 20 % held by a scheduling gate for 1-5 minutes after they
/// arrive (a queue admitting them), and two pause Pods of 500m at priority -10 from the
/// start (docs/gitlab.md: they keep spare room warm and are preempted by jobs).
pub fn ci_hour_mixed(per_minute: u64, seed: u64) -> Vec<Job> {
    let mut rng = Rng(seed.wrapping_mul(31) | 1);
    let mut jobs = ci_hour(per_minute, seed);
    for j in &mut jobs {
        if rng.below(100) < 30 {
            j.sidecar_millis = 250;
        }
        if rng.below(100) < 20 {
            j.gated_until_s = j.arrives_s + 60 + rng.below(240);
        }
    }
    for _ in 0..2 {
        let mut pause = Job::plain(0, u64::MAX / 4, 500, 64 << 20);
        pause.priority = -10;
        jobs.push(pause);
    }
    jobs
}

/// The least a replay of `jobs` could pay, each job running the moment its gate lifts (no
/// boot, no wait, no hold) on nodes of `largest` packed perfectly by CPU and memory: at each
/// step, the work's requests over the largest shape, rounded up. Pause Pods ask nothing of
/// the bound: they only fill room. Node-minutes and the requests' vCPU-minutes.
pub fn lower_bound(jobs: &[Job], largest: NodeSpec, step_s: u64) -> (f64, f64) {
    let end = jobs
        .iter()
        .filter(|j| !j.is_pause())
        .map(|j| j.gated_until_s + j.runs_s)
        .max()
        .unwrap_or(0);
    let mem = largest.mem_mib << 20;
    let alloc_mem = mem - mem * socialweb_broker_core::scale::MEMORY_RESERVE_PERCENT / 100;
    let (mut node_minutes, mut vcpu_minutes) = (0.0, 0.0);
    let mut t = 0;
    while t < end {
        let (cpu, mem) = jobs
            .iter()
            .filter(|j| !j.is_pause() && j.gated_until_s <= t && t < j.gated_until_s + j.runs_s)
            .fold((0, 0), |(c, m), j| (c + j.cpu(), m + j.memory_bytes));
        let nodes = cpu
            .div_ceil(u64::from(largest.vcpu) * 1000)
            .max(mem.div_ceil(alloc_mem));
        node_minutes += nodes as f64 * step_s as f64 / 60.0;
        vcpu_minutes += cpu as f64 / 1000.0 * step_s as f64 / 60.0;
        t += step_s;
    }
    (node_minutes, vcpu_minutes)
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
    pub shapes: Vec<Rentable>,
    pub last_intent: SystemTime,
    pub empty_since: HashMap<String, SystemTime>,
}

impl Decider for Product {
    fn pass(&mut self, pods: &[PodView], leases: &[LeaseView], now: SystemTime) -> Moves {
        let labels = BTreeMap::new();
        let offers = Offers {
            shapes: &self.shapes,
            labels: &labels,
            daemonsets: &[],
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
            Action::Provision { .. } => m.rent = d.shapes.iter().map(|r| r.shape.spec).collect(),
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
            .map(|(i, j)| view(i, j, bound[i].map(|(n, _)| nodes[n].name.clone()), now))
            .collect();
        let work_left = pods.iter().any(|p| p.priority >= 0);
        if !work_left && jobs.iter().all(|j| j.arrives_s <= now) && live(&nodes) == 0 {
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
                topology: Default::default(),
                pod_capacity: None,
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
            // The driver cordons first and calls the release off if a job is on it; a
            // pause Pod there goes back to waiting.
            let on_it = |j: usize| bound[j].is_some_and(|(n, _)| n == i) && !done(j, &bound[j]);
            let busy = (0..jobs.len()).any(|j| on_it(j) && !jobs[j].is_pause());
            if !busy {
                nodes[i].released_at = Some(now);
                let paused: Vec<usize> = (0..jobs.len()).filter(|&j| on_it(j)).collect();
                for j in paused {
                    bound[j] = None;
                }
            }
        }
        now += step_s;
    }
    bill(jobs, &nodes, &bound, now)
}

fn live(nodes: &[SimNode]) -> usize {
    nodes.iter().filter(|n| n.released_at.is_none()).count()
}

fn view(i: usize, j: &Job, node: Option<String>, now: u64) -> PodView {
    PodView {
        namespace: "ci".into(),
        name: format!("job-{i}"),
        phase: if node.is_some() {
            Phase::Running
        } else {
            Phase::Pending
        },
        priority: j.priority,
        node_name: node,
        follows_nodes: false,
        cpu_millis: j.cpu(),
        memory_bytes: j.memory_bytes,
        extended: Vec::new(),
        scheduling: if j.gated_until_s > now {
            Scheduling::Gated
        } else {
            Scheduling::Unschedulable(String::new())
        },
        claims: Vec::new(),
        labels: BTreeMap::new(),
        anti_affinity: Vec::new(),
        affinity: Vec::new(),
        spread: Vec::new(),
        node: Default::default(),
        host_ports: Vec::new(),
    }
}

/// The scheduler: each waiting job whose gate is lifted, in arrival order, to the first
/// Ready node where its requests fit beside the Pods running there (the node's allocatable:
/// its shape less the decision's memory reserve); a job that fits nowhere preempts the
/// pause Pods of the first node where that makes room. Pause Pods take room left over.
fn schedule(jobs: &[Job], nodes: &[SimNode], bound: &mut [Option<(usize, u64)>], now: u64) {
    let running = |i: usize, b: &Option<(usize, u64)>| {
        b.is_some_and(|(_, start)| start + jobs[i].runs_s > now)
    };
    let mut used = vec![(0u64, 0u64); nodes.len()];
    let mut pause = vec![(0u64, 0u64); nodes.len()];
    for (i, b) in bound.iter().enumerate() {
        if let Some((n, _)) = b
            && running(i, b)
        {
            used[*n].0 += jobs[i].cpu();
            used[*n].1 += jobs[i].memory_bytes;
            if jobs[i].is_pause() {
                pause[*n].0 += jobs[i].cpu();
                pause[*n].1 += jobs[i].memory_bytes;
            }
        }
    }
    let room = |node: &SimNode, j: &Job, taken: (u64, u64)| {
        let mem = node.spec.mem_mib << 20;
        let alloc_mem = mem - mem * socialweb_broker_core::scale::MEMORY_RESERVE_PERCENT / 100;
        node.released_at.is_none()
            && node.ready_at <= now
            && taken.0 + j.cpu() <= u64::from(node.spec.vcpu) * 1000
            && taken.1 + j.memory_bytes <= alloc_mem
    };
    // Work first, then the pause Pods in what is left.
    let order = (0..jobs.len())
        .filter(|&i| !jobs[i].is_pause())
        .chain((0..jobs.len()).filter(|&i| jobs[i].is_pause()));
    for i in order.collect::<Vec<_>>() {
        let j = &jobs[i];
        if bound[i].is_some() || j.arrives_s > now || j.gated_until_s > now {
            continue;
        }
        let fit = nodes
            .iter()
            .enumerate()
            .position(|(n, node)| room(node, j, used[n]));
        if let Some(n) = fit {
            used[n].0 += j.cpu();
            used[n].1 += j.memory_bytes;
            bound[i] = Some((n, now));
            continue;
        }
        if j.is_pause() {
            continue;
        }
        let without_pause = |n: usize| (used[n].0 - pause[n].0, used[n].1 - pause[n].1);
        let Some(n) = nodes
            .iter()
            .enumerate()
            .position(|(n, node)| pause[n].0 > 0 && room(node, j, without_pause(n)))
        else {
            continue;
        };
        for (k, b) in bound.iter_mut().enumerate() {
            if jobs[k].is_pause() && b.is_some_and(|(m, _)| m == n) {
                *b = None;
            }
        }
        used[n] = without_pause(n);
        pause[n] = (0, 0);
        used[n].0 += j.cpu();
        used[n].1 += j.memory_bytes;
        bound[i] = Some((n, now));
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
    // A job waits from its gate's lifting: the queue, not the nodes, held it before.
    let mut waits: Vec<f64> = jobs
        .iter()
        .zip(bound)
        .filter(|(j, _)| !j.is_pause())
        .filter_map(|(j, b)| b.map(|(_, start)| start.saturating_sub(j.gated_until_s) as f64))
        .collect();
    waits.sort_by(f64::total_cmp);
    let pct = |q: f64| crate::stats::percentile_sorted(&waits, q);
    Bill {
        node_minutes,
        vcpu_minutes,
        nodes_rented: nodes.len(),
        wait_p50_s: pct(0.5),
        wait_p99_s: pct(0.99),
        never_ran: jobs
            .iter()
            .zip(bound)
            .filter(|(j, b)| !j.is_pause() && b.is_none())
            .count(),
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

    /// The product's decision on 1-, 2- and 4-vCPU shapes priced by the vCPU.
    fn product() -> Product {
        Product {
            knobs: Knobs {
                max_nodes: 100,
                pods_per_node: 8,
                hold: Duration::from_secs(120),
                expendable_priority_cutoff: -10,
                node: socialweb_broker_core::scale::NodeSize::default(),
                max_hold: Duration::from_secs(3600),
            },
            shapes: [1, 2, 4]
                .map(|v| {
                    Rentable::anywhere(socialweb_market::Shape {
                        spec: spec(v),
                        price_micros_per_hour: u64::from(v) * 10_000,
                    })
                })
                .to_vec(),
            last_intent: SystemTime::UNIX_EPOCH,
            empty_since: HashMap::new(),
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
        let mut product = product();
        let p = replay(&jobs, &mut product, 10, 30, 4 * 3600);
        assert_eq!(p.never_ran, 0, "{p:?}");
        assert!(p.vcpu_minutes > 0.0);
    }

    #[test]
    fn a_mixed_replay_runs_every_job_and_pays_at_least_the_lower_bound() {
        let jobs = ci_hour_mixed(2, 7);
        assert!(jobs.iter().any(|j| j.sidecar_millis > 0));
        assert!(jobs.iter().any(|j| j.gated_until_s > j.arrives_s));
        let mut product = product();
        let b = replay(&jobs, &mut product, 10, 30, 4 * 3600);
        assert_eq!(b.never_ran, 0, "{b:?}");
        let (nodes, vcpus) = lower_bound(&jobs, spec(4), 10);
        assert!(nodes > 0.0 && vcpus > 0.0);
        assert!(b.vcpu_minutes >= vcpus, "{b:?} against {vcpus}");
    }
}
