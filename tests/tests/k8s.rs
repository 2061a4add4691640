//! The four-step proof against a real control plane and a real kubelet (seed plan 0004, §6):
//! the control plane is Ready with zero nodes; the cluster stays empty; a node joins (by
//! itself, from its identity); a Pod runs on it and its log is read back.

use std::time::{Duration, Instant};

use testbed::k8s::{ControlPlane, KubeNode, cni_bin_dir, node_options, wait_for, wait_node_ready};
use testbed::topology::HOST_SERVICE_ADDR;
use testbed::{Reach, Topology};

fn step(n: u32, what: &str, t: Instant) {
    eprintln!("step {n} ({:.1}s): {what}", t.elapsed().as_secs_f64());
}

#[test]
fn four_step_proof_zero_nodes_then_a_node_then_a_pod() {
    let t0 = Instant::now();
    let topo = Topology::new(1, Reach::HostOnly).unwrap();
    let cp = ControlPlane::start(&topo.host, HOST_SERVICE_ADDR).unwrap();
    eprintln!("control plane timings: {:?}", cp.timings);

    // 1. Ready with zero nodes.
    assert_eq!(
        cp.kubectl(&["get", "--raw", "/readyz"]).unwrap().trim(),
        "ok"
    );
    assert_eq!(cp.node_names().unwrap(), Vec::<String>::new());
    step(1, "control plane ready, zero nodes", t0);

    // 2. Empty, and staying empty for 10 s.
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        assert_eq!(
            cp.node_names().unwrap(),
            Vec::<String>::new(),
            "a node appeared unasked"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    step(2, "still zero nodes after 10 s", t0);

    // 3. A node joins: a machine with only an identity document and the agent.
    let bins = cni_bin_dir().unwrap();
    let node = KubeNode::start(&cp, &topo.node(1).ns, node_options(&topo, 1, &bins)).unwrap();
    let cidr = node.wait_registered(&cp, Duration::from_secs(90)).unwrap();
    assert!(
        cidr.starts_with("10.42."),
        "pod CIDR {cidr} from the cluster CIDR"
    );
    wait_node_ready(&cp, &node, Duration::from_secs(90)).unwrap();
    assert_eq!(cp.node_names().unwrap(), vec!["node-1"]);
    step(3, &format!("node-1 joined, Ready, pod CIDR {cidr}"), t0);

    // 4. A Pod runs on it and its log is read back.
    cp.apply(
        r#"apiVersion: v1
kind: Pod
metadata: {name: hello, namespace: default}
spec:
  restartPolicy: Never
  containers:
  - name: hello
    image: socialweb.local/busybox:1
    imagePullPolicy: Never
    command: ["sh", "-c", "echo hello from $(hostname) at $(ip -4 -o addr show eth0 | awk '{print $4}'); grep '^Seccomp:' /proc/self/status"]
"#,
    )
    .unwrap();
    let phase = wait_for("pod hello to finish", Duration::from_secs(120), || {
        let v = cp.kubectl_json(&["get", "pod", "hello"])?;
        let phase = v["status"]["phase"].as_str().unwrap_or("").to_string();
        Ok(matches!(phase.as_str(), "Succeeded" | "Failed").then_some(phase))
    })
    .unwrap_or_else(|e| {
        panic!(
            "{e:#}\n{}\nkubelet: {}",
            cp.kubectl(&["describe", "pod", "hello"])
                .unwrap_or_default(),
            std::fs::read_to_string(node.log("kubelet"))
                .unwrap_or_default()
                .lines()
                .rev()
                .take(30)
                .collect::<Vec<_>>()
                .join("\n")
        )
    });
    assert_eq!(phase, "Succeeded");
    let log = cp.kubectl(&["logs", "hello"]).unwrap();
    assert!(
        log.starts_with("hello from hello at 10.42."),
        "log: {log:?}"
    );
    // The kubelet's seccompDefault: a container that names no profile is filtered (mode 2),
    // not Unconfined (0).
    assert!(log.contains("Seccomp:\t2"), "log: {log:?}");
    let pod = cp.kubectl_json(&["get", "pod", "hello"]).unwrap();
    assert_eq!(pod["spec"]["nodeName"], "node-1");
    step(
        4,
        &format!("pod ran on node-1 and said {:?}", log.trim()),
        t0,
    );
}
