//! Steps tests and the demo share: the CNI plugin directory a node's containerd runs plugins
//! from, node options for a topology's node, waiting for Ready, running a pod on a node.

use std::time::Duration;

use anyhow::{Context, Result};

use super::{ControlPlane, KubeNode, NodeOptions, tail, wait_for};
use crate::cni::workspace_bin;
use crate::tmp::TempDir;
use crate::topology::{HOST_SERVICE_ADDR, Topology};

/// A directory with the plugins a node's containerd may run: `socialweb-cni`, and Debian's
/// reference `loopback` (containerd sets up every pod's lo with it) and `portmap`.
pub fn cni_bin_dir() -> Result<TempDir> {
    let dir = TempDir::new("cnibin")?;
    std::os::unix::fs::symlink(
        workspace_bin("socialweb-cni"),
        dir.path().join("socialweb-cni"),
    )?;
    for reference in ["loopback", "portmap"] {
        std::os::unix::fs::symlink(
            format!("/usr/lib/cni/{reference}"),
            dir.path().join(reference),
        )
        .with_context(|| {
            format!("linking /usr/lib/cni/{reference} (package containernetworking-plugins)")
        })?;
    }
    Ok(dir)
}

/// Options for node `i` of `topo`: named `node-<i>`, node-local DNS at 169.254.20.10, the
/// host's service address as the upstream resolver.
pub fn node_options(topo: &Topology, i: u8, cni_bin: &TempDir) -> NodeOptions {
    NodeOptions {
        name: format!("node-{i}"),
        node_ip: topo.node(i).addr,
        cni_bin_dir: cni_bin.path().to_path_buf(),
        cluster_dns: socialweb_wire_dns(),
        upstream_dns: HOST_SERVICE_ADDR,
    }
}

fn socialweb_wire_dns() -> std::net::Ipv4Addr {
    std::net::Ipv4Addr::new(169, 254, 20, 10)
}

/// Waits until the Node reports Ready (the kubelet runs and a CNI configuration exists).
pub fn wait_node_ready(cp: &ControlPlane<'_>, node: &KubeNode, timeout: Duration) -> Result<()> {
    wait_for(&format!("{} Ready", node.name), timeout, || {
        let v = cp.kubectl_json(&["get", "node", &node.name])?;
        let ready = v["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        Ok(ready.then_some(()))
    })
    .with_context(|| tail(&node.log("kubelet"), 30))
}

/// Runs a busybox pod named `name` on `node` with `command` and waits until it runs; returns
/// its IP.
pub fn run_pod(cp: &ControlPlane<'_>, name: &str, node: &str, command: &[&str]) -> Result<String> {
    let command = serde_json::to_string(command)?;
    cp.apply(&format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default, labels: {{app: {name}}}}}
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: {image}
    imagePullPolicy: Never
    command: {command}
    env:
    - name: NODE_NAME
      valueFrom: {{fieldRef: {{fieldPath: spec.nodeName}}}}
"#,
        image = crate::images::BUSYBOX_IMAGE,
    ))?;
    wait_for(
        &format!("pod {name} running"),
        Duration::from_secs(120),
        || {
            let v = cp.kubectl_json(&["get", "pod", name])?;
            Ok((v["status"]["phase"] == "Running")
                .then(|| v["status"]["podIP"].as_str().unwrap_or("").to_string()))
        },
    )
    .with_context(|| cp.kubectl(&["describe", "pod", name]).unwrap_or_default())
}
