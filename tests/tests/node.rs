//! This node's own network as the agent keeps it: the `cni0` bridge on the node's pod CIDR,
//! the CNI configuration and the masquerade, retried on a timer until they hold and redone
//! when the pod CIDR changes. Nodes with a static directory; the Kubernetes source feeds the
//! same code (`run::follow_directory`).

use std::time::Duration;

use serde_json::{Value, json};
use testbed::k8s::wait_for;
use testbed::mesh::{MeshCluster, MeshOptions};
use testbed::{Netns, Reach, Topology};

/// Gives `node` a new pod CIDR in the static directory every agent reads.
fn set_pod_cidr(mesh: &MeshCluster<'_>, node: &str, cidr: &str) {
    let mut dir: Value = serde_json::from_slice(&std::fs::read(&mesh.peers_file).unwrap()).unwrap();
    for n in dir["nodes"].as_array_mut().unwrap() {
        if n["node"] == node {
            n["pod_cidr"] = json!(cidr);
        }
    }
    std::fs::write(&mesh.peers_file, dir.to_string()).unwrap();
}

/// The IPv4 addresses on `cni0`, in CIDR notation.
fn bridge_addrs(ns: &Netns) -> Vec<String> {
    ns.ip(&["-4", "-o", "addr", "show", "dev", "cni0"])
        .unwrap()
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            words.find(|w| *w == "inet")?;
            words.next().map(str::to_string)
        })
        .collect()
}

/// The subnet in the CNI configuration the agent wrote, if there is one.
fn conflist_subnet(mesh: &MeshCluster<'_>, node: u8) -> Option<String> {
    let path = mesh.agent(node).cni_conf_dir.join("10-socialweb.conflist");
    let conf: Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    conf["plugins"][0]["subnet"].as_str().map(str::to_string)
}

/// The agent's `pod-network` step as `status --json` shows it.
fn pod_network_step(mesh: &MeshCluster<'_>, node: u8) -> Value {
    let status: Value =
        serde_json::from_str(&mesh.cli(node, &["status", "--json"]).unwrap()).unwrap();
    status["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "pod-network")
        .cloned()
        .unwrap_or_else(|| panic!("no pod-network step: {status}"))
}

#[test]
fn a_changed_pod_cidr_leaves_only_the_new_gateway_on_the_bridge() {
    let topo = Topology::new(1, Reach::HostOnly).unwrap();
    let mesh = MeshCluster::start(&topo, MeshOptions::default()).unwrap();
    let node = &topo.node(1).ns;
    wait_for("the pod network", Duration::from_secs(30), || {
        Ok(mesh.agent_ready(1)?.then_some(()))
    })
    .unwrap();
    assert_eq!(bridge_addrs(node), ["10.42.1.1/24"]);

    set_pod_cidr(&mesh, "node-1", "10.42.101.0/24");
    wait_for("the new pod CIDR", Duration::from_secs(30), || {
        Ok((conflist_subnet(&mesh, 1).as_deref() == Some("10.42.101.0/24")).then_some(()))
    })
    .unwrap();
    // The old gateway would keep routing 10.42.1.0/24 to the bridge, shadowing the mesh's
    // route to whichever node holds that CIDR now.
    assert_eq!(bridge_addrs(node), ["10.42.101.1/24"]);
    let routes = node.ip(&["-4", "route", "show", "dev", "cni0"]).unwrap();
    assert!(!routes.contains("10.42.1.0/24"), "{routes}");
    let nat = node
        .exec("nft", &["list", "table", "ip", "socialweb"])
        .unwrap();
    assert!(nat.contains("10.42.101.0/24"), "{nat}");
}

#[test]
fn a_pod_network_that_fails_is_retried_until_it_holds() {
    let topo = Topology::new(1, Reach::HostOnly).unwrap();
    let mesh = MeshCluster::start(&topo, MeshOptions::default()).unwrap();
    wait_for("the pod network", Duration::from_secs(30), || {
        Ok(mesh.agent_ready(1)?.then_some(()))
    })
    .unwrap();

    // The next attempt fails: the CNI configuration's directory is a file now.
    let conf_dir = mesh.agent(1).cni_conf_dir.clone();
    std::fs::remove_dir_all(&conf_dir).unwrap();
    std::fs::write(&conf_dir, "in the way").unwrap();
    set_pod_cidr(&mesh, "node-1", "10.42.102.0/24");
    let failed = wait_for("the step to fail", Duration::from_secs(30), || {
        let step = pod_network_step(&mesh, 1);
        Ok((step["state"] == "retrying").then_some(step))
    })
    .unwrap();
    assert!(
        failed["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("net.d")),
        "the status names what failed: {failed}"
    );
    assert!(!mesh.agent_ready(1).unwrap());

    // Nothing else changes (no directory update): the retry timer alone brings it back.
    std::fs::remove_file(&conf_dir).unwrap();
    wait_for("the retry to succeed", Duration::from_secs(60), || {
        Ok(mesh.agent_ready(1)?.then_some(()))
    })
    .unwrap();
    let done = pod_network_step(&mesh, 1);
    assert_eq!(done["state"], "done", "{done}");
    assert!(done["attempts"].as_u64() >= Some(2), "{done}");
    assert_eq!(conflist_subnet(&mesh, 1).as_deref(), Some("10.42.102.0/24"));
    assert_eq!(bridge_addrs(&topo.node(1).ns), ["10.42.102.1/24"]);
}
