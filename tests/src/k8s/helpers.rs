//! Steps tests and the demo share: the CNI plugin directory a node's containerd runs plugins
//! from, node options for a topology's node, a whole cluster (control plane, relay, nodes),
//! waiting for Ready, running a pod on a node.

use std::time::Duration;

use anyhow::{Context, Result};

use super::node::CaMode;
use super::{ControlPlane, KubeNode, NodeOptions, wait_for};
use crate::cni::workspace_bin;
use crate::mesh::mesh_keygen;
use crate::mesh::{Relay, relay_url};
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

/// Options for node `i` of `topo`: named `node-<i>`, the host's service address as the
/// upstream resolver, the host's relay, the CA pinned.
pub fn node_options(topo: &Topology, i: u8, cni_bin: &TempDir) -> NodeOptions {
    NodeOptions {
        name: format!("node-{i}"),
        node_ip: topo.node(i).addr,
        cni_bin_dir: cni_bin.path().to_path_buf(),
        upstream_dns: HOST_SERVICE_ADDR,
        relay_url: relay_url(),
        mesh_key: None,
        ca: CaMode::Pin,
        identity_overrides: Default::default(),
        mtu: 1280,
    }
}

/// A cluster as users get one, on this machine: the control plane and the relay (admitting
/// only the cluster's nodes) on the topology's host, and a node joining by itself on every
/// node namespace. Field order is drop order: nodes first.
#[derive(Debug)]
pub struct Cluster<'t> {
    pub nodes: Vec<KubeNode>,
    pub relay: Relay,
    pub cp: ControlPlane<'t>,
    pub cni_bin: TempDir,
    pub topo: &'t Topology,
}

impl<'t> Cluster<'t> {
    /// Starts the control plane, the relay and every node's agent; does not wait for the
    /// nodes (see [`Cluster::wait_ready`]). `tweak` may change each node's options.
    pub fn start(
        topo: &'t Topology,
        mut tweak: impl FnMut(&mut NodeOptions),
    ) -> Result<Cluster<'t>> {
        let cp = ControlPlane::start(&topo.host, HOST_SERVICE_ADDR)?;
        let cni_bin = cni_bin_dir()?;
        let keys = topo
            .nodes
            .iter()
            .map(|_| mesh_keygen())
            .collect::<Result<Vec<_>>>()?;
        let endpoints: Vec<String> = keys.iter().map(|(_, ep)| ep.clone()).collect();
        let relay = Relay::start(&topo.host, Some(&endpoints), &cp.dir().join("relay.log"))?;
        let mut nodes = Vec::new();
        for (n, key) in topo.nodes.iter().zip(keys) {
            let mut opts = node_options(topo, n.index, &cni_bin);
            opts.mesh_key = Some(key);
            tweak(&mut opts);
            nodes.push(KubeNode::start(&cp, &n.ns, opts)?);
        }
        Ok(Cluster {
            nodes,
            relay,
            cp,
            cni_bin,
            topo,
        })
    }

    /// Node `i` (1-based).
    pub fn node(&self, i: u8) -> &KubeNode {
        &self.nodes[usize::from(i) - 1]
    }

    pub fn node_mut(&mut self, i: u8) -> &mut KubeNode {
        &mut self.nodes[usize::from(i) - 1]
    }

    /// Waits until every agent is ready and every Node reports Ready.
    pub fn wait_ready(&self, timeout: Duration) -> Result<()> {
        for n in &self.nodes {
            n.wait_ready(timeout)?;
            wait_node_ready(&self.cp, n, timeout)?;
        }
        Ok(())
    }

    /// Every node's diagnostics and the relay's log tail.
    pub fn diagnostics(&self) -> String {
        let mut out: String = self.nodes.iter().map(|n| n.diagnostics()).collect();
        out.push_str(&format!(
            "--- relay ---\n{}\n",
            super::tail(&self.relay.log, 10)
        ));
        out
    }
}

/// Waits until the Node reports Ready (the kubelet runs and a CNI configuration exists).
pub fn wait_node_ready(cp: &ControlPlane<'_>, node: &KubeNode, timeout: Duration) -> Result<()> {
    wait_for(&format!("{} Ready", node.name), timeout, || {
        let v = cp.kubectl_json(&["get", "node", &node.name])?;
        Ok(super::node_is_ready(&v).then_some(()))
    })
    .with_context(|| node.diagnostics())
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
