//! What the broker keeps of a cluster's Pods and Nodes between passes (docs/security.md,
//! "Budgets"): a tenant grows both, and the broker watches every awake cluster. Two bounds:
//!
//! - each object is kept without what no reader of the broker's needs (a Pod's containers'
//!   environment, commands, probes and mounts, its statuses of containers, every object's
//!   managed fields and annotations but the few read, a Node's list of images): the view the
//!   scale decision takes ([`crate::tenant::pod_view`]) reads none of them;
//! - at most [`MAX_PODS`] Pods, [`MAX_NODES`] Nodes, [`MAX_CLAIMS`] claims (names only)
//!   and [`MAX_DAEMONSETS`] DaemonSets (their Pod templates, slimmed as a Pod) per cluster;
//!   past that, new ones are
//!   not kept (and the log says so once per listing), so the decision sees that many.
//!
//! Finished Pods (Succeeded, Failed) are not watched at all: they are no intent and hold no
//! node (the watch's field selector).

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod, PodSpec};
use kube::runtime::watcher::Event;
use tracing::warn;

/// The most Pods a cluster's watch keeps: twice the 10,000 the scale decision is measured at
/// (`bench/scale`).
pub const MAX_PODS: usize = 20_000;
/// The most Nodes: past any `scale.max_nodes` a broker allows.
pub const MAX_NODES: usize = 2_000;

/// The most PersistentVolumeClaims: as many as Pods.
pub const MAX_CLAIMS: usize = MAX_PODS;

/// The field selector of the Pod watch: the Pods that may still run.
pub const LIVE_PODS: &str = "status.phase!=Succeeded,status.phase!=Failed";

/// The annotations the broker reads of a Pod.
const POD_ANNOTATIONS: [&str; 1] = ["kubernetes.io/config.mirror"];

fn keep_annotations(a: &mut Option<BTreeMap<String, String>>, keep: &[&str]) {
    if let Some(map) = a {
        map.retain(|k, _| keep.contains(&k.as_str()));
        if map.is_empty() {
            *a = None;
        }
    }
}

/// A Pod spec without what the decision does not read: its containers' requests, ports,
/// restart policies and names stay; their commands, environments, probes and mounts go.
fn slim_pod_spec(spec: &mut PodSpec) {
    let containers = spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten());
    for c in containers {
        c.env = None;
        c.env_from = None;
        c.command = None;
        c.args = None;
        c.volume_mounts = None;
        c.volume_devices = None;
        c.liveness_probe = None;
        c.readiness_probe = None;
        c.startup_probe = None;
        c.lifecycle = None;
        // The ports that bind the node's: what the placement reads of them.
        if let Some(ports) = &mut c.ports {
            ports.retain(|p| p.host_port.is_some_and(|n| n > 0));
        }
    }
    spec.ephemeral_containers = None;
    if let Some(volumes) = &mut spec.volumes {
        // Their names and claims: what a volume costs a node is not a rented node's.
        for v in volumes.iter_mut() {
            *v = k8s_openapi::api::core::v1::Volume {
                name: std::mem::take(&mut v.name),
                persistent_volume_claim: v.persistent_volume_claim.take(),
                ephemeral: v.ephemeral.take(),
                ..Default::default()
            };
        }
    }
}

/// The most DaemonSets a cluster's driver keeps.
pub const MAX_DAEMONSETS: usize = 512;

/// `d` as the decision reads it: its Pod template's spec, slimmed as a Pod's.
pub fn slim_daemonset(d: &mut DaemonSet) {
    d.metadata.managed_fields = None;
    d.metadata.annotations = None;
    d.metadata.labels = None;
    d.status = None;
    if let Some(spec) = &mut d.spec {
        spec.template.metadata = None;
        if let Some(p) = &mut spec.template.spec {
            slim_pod_spec(p);
        }
    }
}

/// `p` without what no reader of the broker's needs.
pub fn slim_pod(p: &mut Pod) {
    p.metadata.managed_fields = None;
    keep_annotations(&mut p.metadata.annotations, &POD_ANNOTATIONS);
    if let Some(spec) = &mut p.spec {
        slim_pod_spec(spec);
    }
    if let Some(status) = &mut p.status {
        status.container_statuses = None;
        status.init_container_statuses = None;
        status.ephemeral_container_statuses = None;
        status.resource_claim_statuses = None;
        if let Some(conditions) = &mut status.conditions {
            for c in conditions {
                // The scheduler's word on why it cannot place the Pod is read (and told back
                // to the tenant); the rest is not.
                c.message = match c.type_.as_str() {
                    "PodScheduled" => c.message.take().map(|m| crate::tenant::verdict_text(&m)),
                    _ => None,
                };
            }
        }
    }
}

/// `n` without what no reader of the broker's needs.
pub fn slim_node(n: &mut Node) {
    n.metadata.managed_fields = None;
    if let Some(status) = &mut n.status {
        status.images = None;
        status.volumes_attached = None;
        status.volumes_in_use = None;
        status.config = None;
    }
}

/// `c` as its name: whether a claim exists is all the broker reads of it.
pub fn slim_claim(c: &mut PersistentVolumeClaim) {
    c.metadata.managed_fields = None;
    c.metadata.annotations = None;
    c.metadata.labels = None;
    c.spec = None;
    c.status = None;
}

/// A watch's events with at most `cap` objects kept: a new object past it is left out (a
/// change or a deletion of one kept always passes).
#[derive(Debug)]
pub struct Bounded {
    what: &'static str,
    cap: usize,
    kept: HashSet<(Option<String>, String)>,
    /// The listing under way (the store swaps to it at `InitDone`).
    listing: HashSet<(Option<String>, String)>,
    left_out: usize,
}

impl Bounded {
    pub fn new(what: &'static str, cap: usize) -> Bounded {
        Bounded {
            what,
            cap,
            kept: HashSet::new(),
            listing: HashSet::new(),
            left_out: 0,
        }
    }

    /// Whether `e` goes on to the store.
    pub fn admit<K: kube::Resource>(&mut self, e: &Event<K>) -> bool {
        let key = |k: &K| {
            (
                k.meta().namespace.clone(),
                k.meta().name.clone().unwrap_or_default(),
            )
        };
        match e {
            Event::Init => {
                self.listing.clear();
                self.left_out = 0;
                true
            }
            Event::InitApply(k) => {
                let key = key(k);
                if self.listing.len() < self.cap || self.listing.contains(&key) {
                    self.listing.insert(key);
                    true
                } else {
                    self.left_out += 1;
                    false
                }
            }
            Event::InitDone => {
                self.kept = std::mem::take(&mut self.listing);
                if self.left_out > 0 {
                    warn!(
                        kept = self.kept.len(),
                        left_out = self.left_out,
                        "the cluster has more {} than the broker keeps",
                        self.what
                    );
                }
                true
            }
            Event::Apply(k) => {
                let key = key(k);
                if self.kept.contains(&key) {
                    return true;
                }
                if self.kept.len() < self.cap {
                    self.kept.insert(key);
                    return true;
                }
                self.left_out += 1;
                false
            }
            Event::Delete(k) => {
                self.kept.remove(&key(k));
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ci",
                         "annotations": {"kubernetes.io/config.mirror": "x", "big": "y".repeat(4096)},
                         "labels": {"app": "web"},
                         "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
            "spec": {"nodeName": "n-1", "priority": 5,
                     "containers": [{"name": "c", "image": "busybox",
                                     "env": [{"name": "X", "value": "z".repeat(65536)}],
                                     "command": ["sh"], "args": ["-c", "sleep 1"],
                                     "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}},
                                     "volumeMounts": [{"name": "v", "mountPath": "/v"}]}],
                     "volumes": [{"name": "v", "configMap": {"name": "big"}},
                                 {"name": "w", "persistentVolumeClaim": {"claimName": "data"}}]},
            "status": {"phase": "Pending",
                       "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                       "message": "m".repeat(1000)}],
                       "containerStatuses": [{"name": "c", "image": "busybox", "imageID": "",
                                              "ready": false, "restartCount": 0}]}
        }))
        .unwrap()
    }

    #[test]
    fn a_slim_pod_is_small_and_decides_alike() {
        let mut p = pod("a");
        let before = crate::tenant::pod_view(&p, &[crate::tenant::DEFAULT_SCHEDULER.to_string()]);
        let big = serde_json::to_vec(&p).unwrap().len();
        slim_pod(&mut p);
        let small = serde_json::to_vec(&p).unwrap().len();
        assert!(small * 20 < big, "{big} -> {small} bytes");
        assert_eq!(
            crate::tenant::pod_view(&p, &[crate::tenant::DEFAULT_SCHEDULER.to_string()]),
            before
        );
        let v = p.spec.as_ref().unwrap().volumes.as_ref().unwrap();
        assert_eq!(
            v[1].persistent_volume_claim.as_ref().unwrap().claim_name,
            "data"
        );
        assert!(v[0].config_map.is_none());
        let c = &p.status.as_ref().unwrap().conditions.as_ref().unwrap()[0];
        assert_eq!(c.reason.as_deref(), Some("Unschedulable"));
    }

    #[test]
    fn a_bounded_watch_keeps_at_most_its_cap_and_always_lets_known_objects_change() {
        let mut b = Bounded::new("Pods", 2);
        assert!(b.admit(&Event::<Pod>::Init));
        assert!(b.admit(&Event::InitApply(pod("a"))));
        assert!(b.admit(&Event::InitApply(pod("b"))));
        assert!(!b.admit(&Event::InitApply(pod("c"))));
        assert!(b.admit(&Event::<Pod>::InitDone));
        assert!(!b.admit(&Event::Apply(pod("d"))), "past the cap");
        assert!(b.admit(&Event::Apply(pod("a"))), "a kept one changes");
        assert!(b.admit(&Event::Delete(pod("a"))));
        assert!(b.admit(&Event::Apply(pod("d"))), "room again");
        assert!(!b.admit(&Event::Apply(pod("e"))));
    }
}
