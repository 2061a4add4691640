//! A Pod's requests as kube-scheduler counts them (`k8s.io/component-helpers/resource`'s
//! `PodRequests`, which the scheduler's `NodeResourcesFit` filter calls), pure: the
//! containers' requests in, the Pod's out. The rules, each one a way to get a node too small
//! when left out:
//!
//! - the containers run together: their requests add up;
//! - a native sidecar (an init container with `restartPolicy: Always`, stable since 1.33)
//!   starts before the containers and runs beside them to the end: it adds to the sum, and to
//!   every init container started after it;
//! - ordinary init containers run one at a time before the containers: the Pod needs the
//!   largest of them (with the sidecars started before it) when that is more than the sum;
//! - Pod-level `spec.resources.requests` (CPU and memory), when set, stand for the Pod's;
//! - `spec.overhead` (the RuntimeClass's) is added last.
//!
//! Every figure is in its resource's base unit: CPU in millicores, the rest in units.

use std::collections::BTreeMap;

/// Requests by resource name (`cpu` in millicores, `memory` in bytes, `nvidia.com/gpu` in
/// devices).
pub type Amounts = BTreeMap<String, u64>;

/// One init container's requests, and whether it is a native sidecar.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Init {
    pub requests: Amounts,
    /// `restartPolicy: Always`.
    pub sidecar: bool,
}

/// The resources Pod-level requests may set (the API admits no other there).
const POD_LEVEL: [&str; 2] = ["cpu", "memory"];

fn add(to: &mut Amounts, what: &Amounts) {
    for (k, v) in what {
        let e = to.entry(k.clone()).or_default();
        *e = e.saturating_add(*v);
    }
}

fn max_into(to: &mut Amounts, what: &Amounts) {
    for (k, v) in what {
        let e = to.entry(k.clone()).or_default();
        *e = (*e).max(*v);
    }
}

/// The Pod's requests, as the scheduler fits them to a node.
pub fn pod_requests(
    containers: &[Amounts],
    init: &[Init],
    pod_level: &Amounts,
    overhead: &Amounts,
) -> Amounts {
    let mut sum = Amounts::new();
    for c in containers {
        add(&mut sum, c);
    }
    let mut sidecars = Amounts::new();
    let mut init_peak = Amounts::new();
    for i in init {
        if i.sidecar {
            add(&mut sum, &i.requests);
            add(&mut sidecars, &i.requests);
            max_into(&mut init_peak, &sidecars);
        } else {
            let mut during = i.requests.clone();
            add(&mut during, &sidecars);
            max_into(&mut init_peak, &during);
        }
    }
    max_into(&mut sum, &init_peak);
    for name in POD_LEVEL {
        if let Some(v) = pod_level.get(name) {
            sum.insert(name.to_string(), *v);
        }
    }
    add(&mut sum, overhead);
    sum.retain(|_, v| *v > 0);
    sum
}

/// Whether a resource is one a node has only when a device plugin or an operator says so
/// (`nvidia.com/gpu`, `example.com/dongle`): not CPU, memory, ephemeral storage or huge
/// pages, which every node has.
pub fn is_extended(name: &str) -> bool {
    !matches!(name, "cpu" | "memory" | "ephemeral-storage" | "pods")
        && !name.starts_with("hugepages-")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn a(cpu: u64, mem: u64) -> Amounts {
        Amounts::from([("cpu".into(), cpu), ("memory".into(), mem)])
    }

    fn init(cpu: u64, mem: u64, sidecar: bool) -> Init {
        Init {
            requests: a(cpu, mem),
            sidecar,
        }
    }

    #[test]
    fn a_native_sidecar_adds_to_the_containers() {
        // The job: build 600m, helper 100m, a 600m sidecar: 1300m, not 700m.
        let r = pod_requests(
            &[a(600, 0), a(100, 0)],
            &[init(600, 0, true)],
            &Amounts::new(),
            &Amounts::new(),
        );
        assert_eq!(r["cpu"], 1300);
    }

    #[test]
    fn an_init_container_counts_with_the_sidecars_started_before_it() {
        // sidecar 500m, then an init container of 1000m: 1500m while it runs, more than the
        // 200m + 500m the Pod takes after.
        let r = pod_requests(
            &[a(200, 0)],
            &[init(500, 0, true), init(1000, 0, false)],
            &Amounts::new(),
            &Amounts::new(),
        );
        assert_eq!(r["cpu"], 1500);
        // Started before the sidecar, it runs without it.
        let r = pod_requests(
            &[a(200, 0)],
            &[init(1000, 0, false), init(500, 0, true)],
            &Amounts::new(),
            &Amounts::new(),
        );
        assert_eq!(r["cpu"], 1000);
    }

    #[test]
    fn the_largest_init_container_wins_when_more_than_the_sum() {
        let r = pod_requests(
            &[a(500, 1 << 30), a(1000, 512 << 20)],
            &[init(2000, 0, false)],
            &Amounts::new(),
            &Amounts::new(),
        );
        assert_eq!(r, a(2000, (1 << 30) + (512 << 20)));
    }

    #[test]
    fn pod_level_requests_stand_and_overhead_adds() {
        let r = pod_requests(
            &[a(100, 1 << 20)],
            &[],
            &Amounts::from([("cpu".into(), 1500)]),
            &a(250, 64 << 20),
        );
        assert_eq!(r, a(1750, (1 << 20) + (64 << 20)));
    }

    #[test]
    fn extended_resources_are_named() {
        assert!(is_extended("nvidia.com/gpu"));
        assert!(!is_extended("cpu"));
        assert!(!is_extended("hugepages-2Mi"));
        assert!(!is_extended("ephemeral-storage"));
    }

    fn amounts() -> impl Strategy<Value = Amounts> {
        (0u64..4000, 0u64..(8 << 30)).prop_map(|(c, m)| a(c, m))
    }

    proptest! {
        /// The Pod asks at least what any one of its containers asks, and at least what
        /// runs together after the init containers (the containers and the sidecars).
        #[test]
        fn the_pod_asks_at_least_any_phase_of_its_life(
            containers in proptest::collection::vec(amounts(), 1..4),
            inits in proptest::collection::vec((amounts(), any::<bool>()), 0..4),
            overhead in amounts(),
        ) {
            let inits: Vec<Init> = inits.into_iter().map(|(requests, sidecar)| Init { requests, sidecar }).collect();
            let r = pod_requests(&containers, &inits, &Amounts::new(), &overhead);
            let mut steady = Amounts::new();
            for c in &containers { add(&mut steady, c); }
            for i in inits.iter().filter(|i| i.sidecar) { add(&mut steady, &i.requests); }
            add(&mut steady, &overhead);
            for k in ["cpu", "memory"] {
                let got = r.get(k).copied().unwrap_or(0);
                prop_assert!(got >= steady.get(k).copied().unwrap_or(0));
                for i in &inits {
                    prop_assert!(got >= i.requests.get(k).copied().unwrap_or(0));
                }
            }
        }
    }
}
