//! The scale decision asks the scheduler (issue 59): each cluster from zero, with the real
//! kube-scheduler, Pods as CI users write them. A node is rented only for a Pod the
//! scheduler has refused every node there is, sized as the scheduler sums its requests;
//! a Pod no new node can help rents nothing; a Pod the plan misjudges keeps no node.

use std::time::{Duration, Instant};

use testbed::broker::{Broker, BrokerOptions};
use testbed::k8s::wait_for;

use super::{event, event_within, step, two_shapes, world};

/// A Pod with `spec` (YAML lines at two spaces, with its containers) in `default`.
fn pod_with(name: &str, spec: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
{spec}---
"#
    )
}

/// A container asking `cpu` and 64 MiB, sleeping.
fn container(name: &str, cpu: &str) -> String {
    container_with(
        name,
        &format!("{{requests: {{cpu: \"{cpu}\", memory: 64Mi}}}}"),
    )
}

/// A container with `resources` (a YAML flow mapping), sleeping.
fn container_with(name: &str, resources: &str) -> String {
    format!(
        r#"  - name: {name}
    image: socialweb.local/busybox:1
    imagePullPolicy: Never
    command: ["sleep", "600"]
    resources: {resources}
"#
    )
}

pub(super) fn running_on(b: &Broker<'_>, cluster: &str, pod: &str, within: Duration) -> String {
    wait_for(&format!("{pod} Running"), within, || {
        let v = b.kubectl_json(cluster, &["get", "pod", pod])?;
        Ok((v["status"]["phase"] == "Running")
            .then(|| v["spec"]["nodeName"].as_str().unwrap_or("").to_string()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", b.diagnostics()))
}

fn created(b: &Broker<'_>, name: &str) {
    assert_eq!(
        b.cli_json(&["cluster", "create", name]).unwrap()["state"],
        "ready"
    );
}

/// The issue's job: `build` 600m and `helper` 100m beside a 600m native sidecar (an init
/// container with `restartPolicy: Always`) ask 1300m as the scheduler sums them. On a
/// broker whose `[node]` is 1 vCPU with 1- and 2-vCPU shapes on offer, the plan rents the
/// 2-vCPU node and the job runs there (counted as 700m, it got a 1-vCPU node and stayed
/// Pending with `Insufficient cpu`).
#[test]
fn a_job_with_a_native_sidecar_runs_on_a_node_that_holds_it() {
    let t = Instant::now();
    let world = world();
    let b = Broker::start(&world, two_shapes()).unwrap();
    created(&b, "side");
    let spec = format!(
        "  initContainers:\n{}    restartPolicy: Always\n  containers:\n{}{}",
        container("svc", "600m"),
        container("build", "600m"),
        container("helper", "100m")
    );
    b.apply("side", &pod_with("job", &spec)).unwrap();
    step(t, "applied the job with a sidecar");
    let node = running_on(&b, "side", "job", Duration::from_secs(180));
    step(t, &format!("job Running on {node}"));
    let n = b.kubectl_json("side", &["get", "node", &node]).unwrap();
    assert_eq!(
        n["metadata"]["labels"]["node.kubernetes.io/instance-type"], "2vcpu-4096mib",
        "1300m needs the 2-vCPU shape: {n}"
    );
    assert_eq!(b.provider_leases().unwrap().len(), 1, "one node rented");
}

/// A Pod held by a scheduling gate (Kueue's), one for another scheduler (GitLab Runner's
/// `scheduler_name`), one asking for a GPU and one mounting a claim that does not exist: no
/// node we rent can help any of them, so for 30 s nothing is rented; the GPU Pod is told
/// why. The gate's removal then rents one node
/// and the Pod runs there.
#[test]
fn pods_no_new_node_can_help_rent_nothing_until_a_gate_is_lifted() {
    let t = Instant::now();
    let world = world();
    let b = Broker::start(
        &world,
        BrokerOptions {
            pods_per_node: 8,
            ..Default::default()
        },
    )
    .unwrap();
    created(&b, "held");
    let gated = format!(
        "  schedulingGates: [{{name: kueue.x-k8s.io/admission}}]\n  containers:\n{}",
        container("c", "100m")
    );
    let other = format!(
        "  schedulerName: gitlab-scheduler\n  containers:\n{}",
        container("c", "100m")
    );
    // An extended resource is asked as a limit (its request is defaulted to it).
    let gpu = format!(
        "  containers:\n{}",
        container_with(
            "c",
            "{requests: {cpu: 100m, memory: 64Mi}, limits: {nvidia.com/gpu: 1}}"
        )
    );
    let claimed = format!(
        "  volumes: [{{name: data, persistentVolumeClaim: {{claimName: data}}}}]\n  containers:\n{}",
        container("c", "100m")
    );
    b.apply(
        "held",
        &format!(
            "{}{}{}{}",
            pod_with("gated", &gated),
            pod_with("other", &other),
            pod_with("cuda", &gpu),
            pod_with("claimed", &claimed)
        ),
    )
    .unwrap();
    step(
        t,
        "applied the gated, other-scheduler, GPU and missing-claim Pods",
    );
    let ev = event(&b, "held", "cuda", "NotTriggerScaleUp");
    assert!(ev.contains("nvidia.com/gpu: 1"), "{ev}");
    let quiet = Instant::now();
    while quiet.elapsed() < Duration::from_secs(30) {
        let leases = b.provider_leases().unwrap();
        assert!(
            leases.is_empty(),
            "a node rented {:.1}s after the Pods no node can help: {leases:?}\n{}",
            quiet.elapsed().as_secs_f64(),
            b.diagnostics()
        );
        std::thread::sleep(Duration::from_secs(2));
    }
    step(t, "30 s and nothing rented");
    b.kubectl(
        "held",
        &[
            "patch",
            "pod",
            "gated",
            "--type=json",
            "-p",
            r#"[{"op": "remove", "path": "/spec/schedulingGates"}]"#,
        ],
    )
    .unwrap();
    let node = running_on(&b, "held", "gated", Duration::from_secs(180));
    step(t, &format!("the gate lifted, gated Running on {node}"));
    assert_eq!(b.provider_leases().unwrap().len(), 1, "one node, for gated");
}

/// docs/gitlab.md's pause Pod: a job rents a node, a pause Pod at priority -10 keeps it
/// warm after the job, and the next job preempts it there. The expendable Pod's requests
/// do not count against the node, so the next job rents no second node.
#[test]
fn the_pause_pod_recipe_rents_no_second_node() {
    let t = Instant::now();
    let world = world();
    let b = Broker::start(
        &world,
        BrokerOptions {
            pods_per_node: 8,
            hold: Duration::from_secs(300),
            ..Default::default()
        },
    )
    .unwrap();
    created(&b, "warm");
    let class = "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {name: gitlab-pause}\nvalue: -10\ndescription: pause pods\n---\n";
    let job = |name: &str| format!("  containers:\n{}", container(name, "1200m"));
    b.apply(
        "warm",
        &format!("{class}{}", pod_with("job-1", &job("build"))),
    )
    .unwrap();
    let node = running_on(&b, "warm", "job-1", Duration::from_secs(180));
    step(t, &format!("job-1 Running on {node}"));
    b.kubectl("warm", &["delete", "pod", "job-1", "--wait=true"])
        .unwrap();
    let pause = format!(
        "  priorityClassName: gitlab-pause\n  containers:\n{}",
        container("pause", "1200m")
    );
    b.apply("warm", &pod_with("pause", &pause)).unwrap();
    assert_eq!(
        running_on(&b, "warm", "pause", Duration::from_secs(60)),
        node
    );
    step(t, "the pause Pod keeps the node warm");
    b.apply("warm", &pod_with("job-2", &job("build"))).unwrap();
    assert_eq!(
        running_on(&b, "warm", "job-2", Duration::from_secs(120)),
        node,
        "job-2 preempts the pause Pod on its node"
    );
    step(t, "job-2 Running where the pause Pod was");
    // Had a second node been planned, its lease would show within the bid deadline.
    std::thread::sleep(Duration::from_secs(10));
    assert_eq!(
        b.provider_leases().unwrap().len(),
        1,
        "no second node\n{}",
        b.diagnostics()
    );
}

/// A Pod the plan misjudges: it asks more `ephemeral-storage` than any node has, which the
/// plan does not model and the scheduler refuses on every node. The plan rents a node for
/// it; the scheduler keeps refusing it there; past the plan's patience the Pod is told in
/// the scheduler's words, and the node goes with the hold.
#[test]
fn a_pod_the_plan_misjudges_keeps_no_node_past_the_hold() {
    let t = Instant::now();
    let world = world();
    let b = Broker::start(
        &world,
        BrokerOptions {
            pods_per_node: 8,
            hold: Duration::from_secs(15),
            ..Default::default()
        },
    )
    .unwrap();
    created(&b, "odd");
    let spec = format!(
        "  containers:\n{}",
        container_with(
            "c",
            "{requests: {cpu: 100m, memory: 64Mi, ephemeral-storage: 100Ti}}"
        )
    );
    b.apply("odd", &pod_with("odd", &spec)).unwrap();
    step(t, "applied a Pod asking 100Ti of ephemeral-storage");
    wait_for("a node rented", Duration::from_secs(120), || {
        Ok((!b.provider_leases()?.is_empty()).then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", b.diagnostics()));
    step(t, "the plan rented a node (it does not model the rule)");
    let ev = event_within(
        &b,
        "odd",
        "odd",
        "NotTriggerScaleUp",
        Duration::from_secs(240),
    );
    assert!(ev.contains("kube-scheduler has refused it"), "{ev}");
    assert!(
        ev.contains("ephemeral-storage"),
        "in the scheduler's words: {ev}"
    );
    step(t, &format!("told: {ev}"));
    wait_for("no node leased", Duration::from_secs(180), || {
        Ok(b.live_leases()?.is_empty().then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", b.diagnostics()));
    step(t, "the node is gone");
    let p = b.kubectl_json("odd", &["get", "pod", "odd"]).unwrap();
    assert_eq!(p["status"]["phase"], "Pending");
}

/// A Pod labelled `app: web` spread over `key` at skew 1, `DoNotSchedule`.
fn spread_pod(name: &str, key: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default, labels: {{app: web}}}}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  topologySpreadConstraints:
  - {{maxSkew: 1, topologyKey: "{key}", whenUnsatisfiable: DoNotSchedule,
      labelSelector: {{matchLabels: {{app: web}}}}}}
  containers:
{}---
"#,
        container("c", "100m")
    )
}

/// Zones: two providers, in zones `a` and `b` of region `test`. Two Pods spread over
/// `topology.kubernetes.io/zone` run on nodes that carry a zone, each node labelled with
/// the region, zone and provider it was rented from (before, the plan dropped the zone
/// constraint and rented nodes with no zone, which the scheduler refuses every such Pod).
/// A Pod spread on a key no node on offer carries rents nothing for 30 s and is told why.
#[test]
fn zone_spread_pods_run_on_nodes_that_carry_a_zone_or_nothing_is_rented() {
    let t = Instant::now();
    let world = testbed::world::World::new(2).unwrap();
    let b = Broker::start(
        &world,
        BrokerOptions {
            providers: 2,
            provider_capacity: 2,
            max_nodes: 4,
            pods_per_node: 8,
            zones: vec!["a".into(), "b".into()],
            ..Default::default()
        },
    )
    .unwrap();
    created(&b, "zones");
    let zone = "topology.kubernetes.io/zone";
    b.apply(
        "zones",
        &format!("{}{}", spread_pod("web-0", zone), spread_pod("web-1", zone)),
    )
    .unwrap();
    step(t, "applied two Pods spread over zones");
    for pod in ["web-0", "web-1"] {
        let node = running_on(&b, "zones", pod, Duration::from_secs(240));
        let n = b.kubectl_json("zones", &["get", "node", &node]).unwrap();
        let l = &n["metadata"]["labels"];
        let provider = l["socialweb.computer/provider"].as_str().unwrap_or("");
        let expected = match provider {
            "p1" => "a",
            "p2" => "b",
            other => panic!("{node} names no provider of ours ({other:?}): {n}"),
        };
        assert_eq!(l[zone], expected, "{node} carries its provider's zone: {l}");
        assert_eq!(l["topology.kubernetes.io/region"], "test", "{l}");
        step(t, &format!("{pod} Running on {node} in zone {expected}"));
    }
    let before: Vec<String> = b
        .provider_leases()
        .unwrap()
        .iter()
        .map(|l| l["id"].as_str().unwrap_or("").to_string())
        .collect();
    b.apply("zones", &spread_pod("rack", "example.com/rack"))
        .unwrap();
    let ev = event(&b, "zones", "rack", "NotTriggerScaleUp");
    assert!(ev.contains("example.com/rack"), "{ev}");
    step(
        t,
        "the rack-spread Pod is told no node on offer carries its key",
    );
    let quiet = Instant::now();
    while quiet.elapsed() < Duration::from_secs(30) {
        let new: Vec<_> = b
            .provider_leases()
            .unwrap()
            .into_iter()
            .filter(|l| !before.iter().any(|id| l["id"] == id.as_str()))
            .collect();
        assert!(
            new.is_empty(),
            "a node rented {:.1}s after the rack-spread Pod: {new:?}\n{}",
            quiet.elapsed().as_secs_f64(),
            b.diagnostics()
        );
        std::thread::sleep(Duration::from_secs(2));
    }
    step(t, "30 s and nothing rented for it");
}

/// A DaemonSet asking 600m CPU, in `default`.
const DAEMONSET: &str = r#"apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent, namespace: default}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: agent
        image: socialweb.local/busybox:1
        imagePullPolicy: Never
        command: ["sleep", "600"]
        resources: {requests: {cpu: 600m, memory: 64Mi}}
---
"#;

/// DaemonSet overhead from the specs: a cluster at zero with a 600m DaemonSet and a 600m
/// job, on a broker whose `[node]` is 1 vCPU with 1- and 2-vCPU shapes on offer. The first
/// node rented is the 2-vCPU one, where both fit, and it is the only one (the overhead was
/// learned only from live nodes, so at zero the 1-vCPU node was rented, the DaemonSet's Pod
/// took 600m of it and the job needed a second node).
#[test]
fn the_first_node_at_zero_has_room_for_the_daemonsets_and_the_job() {
    let t = Instant::now();
    let world = world();
    let b = Broker::start(&world, two_shapes()).unwrap();
    created(&b, "ds");
    b.apply("ds", DAEMONSET).unwrap();
    // The DaemonSet is known before the job asks for a node.
    std::thread::sleep(Duration::from_secs(2));
    b.apply(
        "ds",
        &pod_with("job", &format!("  containers:\n{}", container("c", "600m"))),
    )
    .unwrap();
    step(t, "applied a 600m DaemonSet and a 600m job at zero");
    let node = running_on(&b, "ds", "job", Duration::from_secs(180));
    step(t, &format!("job Running on {node}"));
    let n = b.kubectl_json("ds", &["get", "node", &node]).unwrap();
    assert_eq!(
        n["metadata"]["labels"]["node.kubernetes.io/instance-type"], "2vcpu-4096mib",
        "600m + 600m need the 2-vCPU shape: {n}"
    );
    let leases = b.provider_leases().unwrap();
    assert_eq!(leases.len(), 1, "one node rented: {leases:?}");
}

/// A provider's word on a shape is not taken: the local provider offers a shape of twice
/// this machine's CPUs, which a namespace node, seeing the host, cannot give. A 2500m job
/// only that shape holds (by its word) rents one; once its Node reports, the node fails, the
/// reason naming the provider; what it gave is learned, so the next plan knows no shape on
/// offer holds the job: it rents nothing more and the job is told. The node is idle from its
/// registration (the job does not fit it), so with the default 3 s hold it may be released
/// before its provider calls it running: it is checked at its release too.
#[test]
fn a_node_short_of_its_shape_fails_naming_its_provider_and_the_plan_learns_it() {
    let t = Instant::now();
    let cores = std::thread::available_parallelism().unwrap().get() as u32;
    let world = world();
    let b = Broker::start(
        &world,
        BrokerOptions {
            pods_per_node: 8,
            shapes: vec![(2, 4096, 20_000), (2 * cores, 4096, 10_000)],
            ..Default::default()
        },
    )
    .unwrap();
    created(&b, "short");
    let job = format!("{}m", cores * 1000 + 500);
    b.apply(
        "short",
        &pod_with("job", &format!("  containers:\n{}", container("c", &job))),
    )
    .unwrap();
    step(
        t,
        &format!("applied a {job} job; a {}-vCPU shape on offer", 2 * cores),
    );
    let ev = event_within(
        &b,
        "short",
        "job",
        "NotTriggerScaleUp",
        Duration::from_secs(180),
    );
    assert!(ev.contains("more than any node on offer holds"), "{ev}");
    step(t, &format!("the job is told: {ev}"));
    // The node registers (its shape learned, so the job is told) before the provider calls
    // it running; its shape is checked from then on, and at its release if the hold
    // releases it first.
    let provisions = wait_for("the node failed", Duration::from_secs(180), || {
        let out = b.cli(&["cluster", "show", "short", "--json"])?;
        let detail: serde_json::Value = serde_json::from_str(&out)?;
        let all = detail["provisions"].as_array().cloned().unwrap_or_default();
        Ok(all.iter().any(|p| p["state"] == "failed").then_some(all))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", b.diagnostics()));
    assert_eq!(provisions.len(), 1, "one node rented: {provisions:?}");
    let why = provisions[0]["reason"].as_str().unwrap_or("");
    assert!(
        why.contains(&format!(
            "provider {} rented a node short of its shape",
            provisions[0]["provider"].as_str().unwrap_or("?")
        )) && why.contains(&format!("{}m CPU", cores * 1000)),
        "the reason names the provider and what its node has: {why}"
    );
    std::thread::sleep(Duration::from_secs(10));
    assert!(
        b.live_leases().unwrap().is_empty(),
        "nothing more rented\n{}",
        b.diagnostics()
    );
}
