//! When an idle cluster's control plane may stop (docs/hibernation.md): never while anything
//! inside the cluster or outside it still needs it, and only once it has been quiet for the
//! cluster's `hibernate_after`. The daemon observes, calls [`blockers`] and [`verdict`], and
//! carries out the answer; nothing here reads a clock.

use std::time::Duration;

use crate::scale::{PodView, is_work};

/// What the cluster has now, as the daemon observed it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// Nodes registered in the cluster.
    pub nodes: usize,
    /// Provisions that may hold a lease (booting, running, joined, releasing).
    pub live_leases: usize,
    /// Requests (watches and exec streams included) in flight at the front.
    pub front_in_flight: usize,
    /// The cluster's Pods.
    pub pods: Vec<PodView>,
    /// Jobs that have not finished (no `Complete` or `Failed` condition), as `ns/name`.
    pub unfinished_jobs: Vec<String>,
    /// CronJobs that are not suspended, as `ns/name`.
    pub cron_jobs: Vec<String>,
}

/// Why the cluster must stay awake now, one line each (empty: nothing keeps it awake).
///
/// A CronJob keeps the cluster awake for as long as it exists unsuspended: its next run is
/// made by the controller-manager, which a hibernating cluster does not run, and waking in
/// time would mean reading its schedule, time zone and `startingDeadlineSeconds` exactly as
/// the CronJob controller does; a misreading would lose a run without a trace.
pub fn blockers(o: &Observed, expendable_priority_cutoff: i32) -> Vec<String> {
    let mut why = Vec::new();
    if o.nodes > 0 {
        why.push(format!("{} node(s) registered", o.nodes));
    }
    if o.live_leases > 0 {
        why.push(format!("{} lease(s) live", o.live_leases));
    }
    if o.front_in_flight > 0 {
        why.push(format!(
            "{} request(s) in flight at the front",
            o.front_in_flight
        ));
    }
    let work: Vec<String> = o
        .pods
        .iter()
        .filter(|p| is_work(p, expendable_priority_cutoff))
        .map(|p| format!("{}/{}", p.namespace, p.name))
        .collect();
    if !work.is_empty() {
        why.push(format!("Pod(s) not finished: {}", sample(&work)));
    }
    if !o.unfinished_jobs.is_empty() {
        why.push(format!(
            "Job(s) not finished: {}",
            sample(&o.unfinished_jobs)
        ));
    }
    if !o.cron_jobs.is_empty() {
        why.push(format!(
            "CronJob(s) not suspended: {} (suspend or delete them to let it hibernate)",
            sample(&o.cron_jobs)
        ));
    }
    why
}

/// At most three names, and how many more.
fn sample(names: &[String]) -> String {
    let mut s = names.iter().take(3).cloned().collect::<Vec<_>>().join(", ");
    if names.len() > 3 {
        s.push_str(&format!(" and {} more", names.len() - 3));
    }
    s
}

/// What to do about an awake cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Stop its control plane now.
    Hibernate,
    /// Look again after this long, when it will have been quiet long enough (unless
    /// something happens first).
    After(Duration),
    /// Stay awake: hibernation is off for it, or something keeps it awake.
    Stay(String),
}

/// The verdict for a cluster quiet for `quiet_for` (since its last request at the front ended,
/// since it last had a blocker, since it woke: whichever is latest) with `blockers` now.
/// `hibernate_after` zero means never.
pub fn verdict(hibernate_after: Duration, quiet_for: Duration, blockers: &[String]) -> Verdict {
    if hibernate_after.is_zero() {
        return Verdict::Stay("hibernate_after is 0 (never)".into());
    }
    if !blockers.is_empty() {
        return Verdict::Stay(blockers.join("; "));
    }
    match hibernate_after.checked_sub(quiet_for) {
        Some(left) if !left.is_zero() => Verdict::After(left),
        _ => Verdict::Hibernate,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scale::Phase;

    fn pod(ns: &str, name: &str, phase: Phase, priority: i32) -> PodView {
        PodView {
            namespace: ns.into(),
            name: name.into(),
            phase,
            priority,
            node_name: None,
            follows_nodes: false,
            cpu_millis: 0,
            memory_bytes: 0,
            extended: Vec::new(),
            scheduling: crate::scale::Scheduling::Unschedulable(String::new()),
            claims: Vec::new(),
            labels: Default::default(),
            anti_affinity: Vec::new(),
            affinity: Vec::new(),
            spread: Vec::new(),
            node: Default::default(),
            host_ports: Vec::new(),
        }
    }

    const MIN10: Duration = Duration::from_secs(600);

    #[test]
    fn an_empty_cluster_hibernates_once_quiet_for_its_time() {
        let none = blockers(&Observed::default(), -10);
        assert!(none.is_empty());
        assert_eq!(
            verdict(MIN10, Duration::from_secs(60), &none),
            Verdict::After(Duration::from_secs(540))
        );
        assert_eq!(verdict(MIN10, MIN10, &none), Verdict::Hibernate);
        assert_eq!(verdict(MIN10, MIN10 * 2, &none), Verdict::Hibernate);
    }

    #[test]
    fn zero_means_never() {
        assert!(matches!(
            verdict(Duration::ZERO, MIN10 * 100, &[]),
            Verdict::Stay(w) if w.contains("never")
        ));
    }

    #[test]
    fn anything_that_will_act_keeps_it_awake() {
        let cases: Vec<(Observed, &str)> = vec![
            (
                Observed {
                    nodes: 1,
                    ..Default::default()
                },
                "node",
            ),
            (
                Observed {
                    live_leases: 2,
                    ..Default::default()
                },
                "lease",
            ),
            (
                Observed {
                    front_in_flight: 1,
                    ..Default::default()
                },
                "in flight",
            ),
            (
                Observed {
                    pods: vec![pod("ci", "job", Phase::Pending, 0)],
                    ..Default::default()
                },
                "ci/job",
            ),
            (
                Observed {
                    unfinished_jobs: vec!["ci/build".into()],
                    ..Default::default()
                },
                "Job(s) not finished: ci/build",
            ),
            (
                Observed {
                    cron_jobs: vec!["ci/nightly".into()],
                    ..Default::default()
                },
                "CronJob(s) not suspended: ci/nightly",
            ),
        ];
        for (o, want) in cases {
            let b = blockers(&o, -10);
            assert_eq!(b.len(), 1, "{o:?}");
            assert!(b[0].contains(want), "{b:?} lacks {want:?}");
            assert!(matches!(verdict(MIN10, MIN10 * 10, &b), Verdict::Stay(w) if w.contains(want)));
        }
    }

    #[test]
    fn finished_expendable_and_system_pods_do_not() {
        let o = Observed {
            pods: vec![
                pod("ci", "done", Phase::Succeeded, 0),
                pod("ci", "broke", Phase::Failed, 0),
                pod("ci", "pause", Phase::Pending, -10),
                pod("kube-system", "addon", Phase::Pending, 0),
            ],
            ..Default::default()
        };
        assert!(blockers(&o, -10).is_empty());
    }

    #[test]
    fn many_names_are_sampled() {
        let o = Observed {
            unfinished_jobs: (0..5).map(|i| format!("ci/j{i}")).collect(),
            ..Default::default()
        };
        assert_eq!(
            blockers(&o, -10),
            vec!["Job(s) not finished: ci/j0, ci/j1, ci/j2 and 2 more".to_string()]
        );
    }
}
