//! What the broker does inside a tenant cluster, as its admin: bootstrap tokens for joining
//! nodes, removing a released node's Node and token, Events on Pods nothing can hold, and the
//! Pod view the scale decision reads.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Event, Node, Pod, Secret};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, Config};

use socialweb_broker_core::placement::NodeRequirements;
use socialweb_broker_core::placement::{AntiAffinity, HostPort, Selector, Spread};
use socialweb_broker_core::requests::{Amounts, Init, is_extended, pod_requests};
use socialweb_broker_core::scale::{Phase, PodView, Pool, Scheduling};

/// A client for a tenant cluster, from its admin kubeconfig.
pub async fn client(admin_kubeconfig: &Path) -> Result<Client> {
    let kc = kube::config::Kubeconfig::read_from(admin_kubeconfig)
        .with_context(|| format!("reading {}", admin_kubeconfig.display()))?;
    let mut cfg = Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .context("the admin kubeconfig")?;
    cfg.connect_timeout = Some(std::time::Duration::from_secs(5));
    cfg.read_timeout = Some(std::time::Duration::from_secs(30));
    Client::try_from(cfg).context("building the Kubernetes client")
}

/// Writes one of the broker's ConfigMaps in a tenant cluster (server-side apply, the broker's
/// field manager, forced): its whole `data`.
pub async fn apply_configmap(
    c: &Client,
    (namespace, name): (&str, &str),
    data: &serde_json::Value,
) -> Result<()> {
    let cm = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"app.kubernetes.io/managed-by": "socialweb"}},
        "data": data,
    });
    Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(c.clone(), namespace)
        .patch(
            name,
            &PatchParams::apply("socialweb-broker").force(),
            &Patch::Apply(&cm),
        )
        .await
        .with_context(|| format!("writing ConfigMap {namespace}/{name}"))?;
    Ok(())
}

/// Creates (or replaces) the bootstrap token Secret for a node.
pub async fn put_token(c: &Client, secret: &serde_json::Value) -> Result<()> {
    let s: Secret = serde_json::from_value(secret.clone())?;
    let name = s
        .metadata
        .name
        .clone()
        .context("a token Secret has a name")?;
    Api::<Secret>::namespaced(c.clone(), "kube-system")
        .patch(
            &name,
            &PatchParams::apply("socialweb-broker").force(),
            &Patch::Apply(&s),
        )
        .await
        .with_context(|| format!("writing bootstrap token {name}"))?;
    Ok(())
}

/// The annotation that says the broker cordoned a node to release it (and may uncordon it).
pub const RELEASING: &str = "socialweb.io/releasing";

/// Cordons `node` (unschedulable, annotated [`RELEASING`]) so that the scheduler places
/// nothing more on it; `false` when there is no such Node (not registered, or gone).
pub async fn cordon(c: &Client, node: &str) -> Result<bool> {
    set_cordon(c, node, true).await
}

/// Lifts a cordon of ours ([`cordon`]); a cordon someone else set is left alone.
pub async fn uncordon_ours(c: &Client, node: &str) -> Result<()> {
    let api = Api::<Node>::all(c.clone());
    match api.get_opt(node).await? {
        Some(n)
            if n.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(RELEASING)) =>
        {
            set_cordon(c, node, false).await.map(|_| ())
        }
        _ => Ok(()),
    }
}

async fn set_cordon(c: &Client, node: &str, on: bool) -> Result<bool> {
    let patch = if on {
        serde_json::json!({"metadata": {"annotations": {RELEASING: "true"}},
                           "spec": {"unschedulable": true}})
    } else {
        serde_json::json!({"metadata": {"annotations": {RELEASING: null}},
                           "spec": {"unschedulable": null}})
    };
    match Api::<Node>::all(c.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e).with_context(|| format!("cordoning Node {node}")),
    }
}

/// The Pods bound to `node` that are work ([`socialweb_broker_core::scale::is_work`]), as
/// `namespace/name`.
pub async fn work_on(c: &Client, node: &str, expendable_cutoff: i32) -> Result<Vec<String>> {
    let pods = Api::<Pod>::all(c.clone())
        .list(&kube::api::ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .with_context(|| format!("listing the Pods on {node}"))?;
    Ok(pods
        .items
        .iter()
        // (Bound: whose scheduler it was does not matter.)
        .map(|p| pod_view(p, &[]))
        .filter(|v| socialweb_broker_core::scale::is_work(v, expendable_cutoff))
        .map(|v| format!("{}/{}", v.namespace, v.name))
        .collect())
}

/// Removes a node's Node object and its bootstrap token; what is already gone is fine.
pub async fn forget_node(c: &Client, node: &str, token_id: &str) -> Result<()> {
    let gone = |r: Result<_, kube::Error>| match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    };
    gone(
        Api::<Node>::all(c.clone())
            .delete(node, &DeleteParams::default())
            .await
            .map(|_| ()),
    )
    .with_context(|| format!("deleting Node {node}"))?;
    gone(
        Api::<Secret>::namespaced(c.clone(), "kube-system")
            .delete(
                &format!("bootstrap-token-{token_id}"),
                &DeleteParams::default(),
            )
            .await
            .map(|_| ()),
    )
    .with_context(|| format!("deleting bootstrap token {token_id}"))?;
    Ok(())
}

/// Whether Node `name` exists and is Ready.
pub fn node_ready(n: &Node) -> bool {
    condition(n, "Ready", "True")
}

fn condition(n: &Node, kind: &str, status: &str) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == kind && c.status == status))
}

/// Whether a node has joined: Ready, and its agent has made it schedulable
/// (`NetworkUnavailable` False: the mesh reaches every peer and the kubelet has its serving
/// certificate, so exec, attach and logs work from its first Pod).
pub fn node_joined(n: &Node) -> bool {
    node_ready(n) && condition(n, "NetworkUnavailable", "False")
}

/// Deletes a joined node's bootstrap token: its kubelet has its own certificate, and the
/// token must not outlive the join (what is gone already is fine).
pub async fn delete_token(c: &Client, token_id: &str) -> Result<()> {
    match Api::<Secret>::namespaced(c.clone(), "kube-system")
        .delete(
            &format!("bootstrap-token-{token_id}"),
            &DeleteParams::default(),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("deleting bootstrap token {token_id}")),
    }
}

/// Tells a Pod, with a Warning Event, that no node will be rented for it, and why.
pub async fn warn_pod(
    c: &Client,
    namespace: &str,
    name: &str,
    uid: Option<&str>,
    message: &str,
) -> Result<()> {
    let about = serde_json::json!({"kind": "Pod", "namespace": namespace, "name": name, "uid": uid, "apiVersion": "v1"});
    let message = format!("socialweb-broker rents no node for this pod: {message}");
    warn_about(c, namespace, about, "NotTriggerScaleUp", &message).await
}

/// Tells the tenant, with a Warning Event on its NodePool `default`, what the broker
/// could not read in it (the operator's settings stand meanwhile).
pub async fn warn_node_pool(c: &Client, uid: Option<&str>, message: &str) -> Result<()> {
    let about = serde_json::json!({"kind": "NodePool", "name": "default", "uid": uid,
                                   "apiVersion": "socialweb.computer/v1alpha1"});
    let message = format!("socialweb-broker ignores this NodePool: {message}");
    warn_about(c, "default", about, "InvalidNodePool", &message).await
}

/// Posts a Warning Event about `about` (an `involvedObject`) in `namespace`.
async fn warn_about(
    c: &Client,
    namespace: &str,
    about: serde_json::Value,
    reason: &str,
    message: &str,
) -> Result<()> {
    let now =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    let name = about["name"].as_str().unwrap_or("object").to_string();
    let ev: Event = serde_json::from_value(serde_json::json!({
        "metadata": {"generateName": format!("{name}."), "namespace": namespace},
        "involvedObject": about,
        "reason": reason,
        "message": message,
        "type": "Warning",
        "source": {"component": "socialweb-broker"},
        "count": 1,
    }))?;
    let mut ev = ev;
    ev.first_timestamp = Some(now.clone());
    ev.last_timestamp = Some(now);
    Api::<Event>::namespaced(c.clone(), namespace)
        .create(&PostParams::default(), &ev)
        .await
        .with_context(|| format!("posting an Event on {namespace}/{name}"))?;
    Ok(())
}

pub fn quantity_millis(q: &str) -> Option<u64> {
    if let Some(m) = q.strip_suffix('m') {
        return m.parse().ok();
    }
    q.parse::<f64>().ok().map(|c| (c * 1000.0).ceil() as u64)
}

pub fn quantity_bytes(q: &str) -> Option<u64> {
    const UNITS: &[(&str, u64)] = &[
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    for (suffix, mult) in UNITS {
        if let Some(n) = q.strip_suffix(suffix) {
            return n
                .parse::<f64>()
                .ok()
                .map(|v| (v * *mult as f64).ceil() as u64);
        }
    }
    q.parse::<f64>().ok().map(|v| v.ceil() as u64)
}

/// A container's requests (resource name to amount: CPU in millicores, the rest in units);
/// a quantity that does not parse counts as none (the API admits none such).
fn amounts(list: Option<&BTreeMap<String, Quantity>>) -> Amounts {
    list.into_iter()
        .flatten()
        .filter_map(|(name, q)| {
            let v = if name == "cpu" {
                quantity_millis(&q.0)
            } else {
                quantity_bytes(&q.0)
            };
            Some((name.clone(), v?))
        })
        .collect()
}

/// kube-scheduler's name, which a Pod without `spec.schedulerName` is for; the operator
/// lists the schedulers the broker rents for (`scale.schedulers`, this one by default).
pub const DEFAULT_SCHEDULER: &str = "default-scheduler";

/// The most of the scheduler's message the broker keeps (it names every node's reason: a
/// tenant grows it with nodes and rules).
const MAX_VERDICT_TEXT: usize = 512;

/// Which of a Node's figures: what its machine has, or what it gives Pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resources {
    Capacity,
    Allocatable,
}

/// A Node's CPU (millis) and memory (bytes), as it reports them, once it has.
pub fn node_resources(n: &Node, which: Resources) -> Option<(u64, u64)> {
    let status = n.status.as_ref()?;
    let r = match which {
        Resources::Capacity => status.capacity.as_ref()?,
        Resources::Allocatable => status.allocatable.as_ref()?,
    };
    Some((
        quantity_millis(&r.get("cpu")?.0)?,
        quantity_bytes(&r.get("memory")?.0)?,
    ))
}

/// The scheduler's message, at most [`MAX_VERDICT_TEXT`] bytes.
pub fn verdict_text(message: &str) -> String {
    let mut end = message.len().min(MAX_VERDICT_TEXT);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    message[..end].to_string()
}

/// What kube-scheduler has said of an unbound Pod, or why it will not say; a Pod for a
/// scheduler not in `schedulers` is not ours.
fn scheduling(p: &Pod, schedulers: &[String]) -> Scheduling {
    let spec = p.spec.as_ref();
    let status = p.status.as_ref();
    let name = spec
        .and_then(|s| s.scheduler_name.as_deref())
        .unwrap_or(DEFAULT_SCHEDULER);
    if !schedulers.iter().any(|s| s == name) {
        return Scheduling::OtherScheduler(name.to_string());
    }
    if spec
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| !g.is_empty())
    {
        return Scheduling::Gated;
    }
    if let Some(node) = status
        .and_then(|s| s.nominated_node_name.as_deref())
        .filter(|n| !n.is_empty())
    {
        return Scheduling::Nominated(node.to_string());
    }
    let refused = status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| {
            c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
        });
    match refused {
        Some(c) => Scheduling::Unschedulable(verdict_text(c.message.as_deref().unwrap_or(""))),
        None => Scheduling::Unseen,
    }
}

/// The decision's view of a Pod. Requests are what the scheduler counts
/// ([`socialweb_broker_core::requests`]): the containers and native sidecars, or the
/// largest init container if that is more, Pod-level requests, the overhead.
pub fn pod_view(p: &Pod, schedulers: &[String]) -> PodView {
    let spec = p.spec.as_ref();
    let requests = |c: &k8s_openapi::api::core::v1::Container| {
        amounts(c.resources.as_ref().and_then(|r| r.requests.as_ref()))
    };
    let containers: Vec<Amounts> = spec
        .map(|s| s.containers.iter().map(requests).collect())
        .unwrap_or_default();
    let init: Vec<Init> = spec
        .and_then(|s| s.init_containers.as_ref())
        .into_iter()
        .flatten()
        .map(|c| Init {
            requests: requests(c),
            sidecar: c.restart_policy.as_deref() == Some("Always"),
        })
        .collect();
    let pod_level = amounts(
        spec.and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref()),
    );
    let overhead = amounts(spec.and_then(|s| s.overhead.as_ref()));
    let total = pod_requests(&containers, &init, &pod_level, &overhead);
    let phase = match p.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Running") => Phase::Running,
        Some("Succeeded") => Phase::Succeeded,
        Some("Failed") => Phase::Failed,
        Some("Unknown") => Phase::Unknown,
        _ => Phase::Pending,
    };
    let owners = p.metadata.owner_references.as_deref().unwrap_or_default();
    let mirror = p
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
    PodView {
        namespace: p.metadata.namespace.clone().unwrap_or_default(),
        name: p.metadata.name.clone().unwrap_or_default(),
        phase,
        priority: spec.and_then(|s| s.priority).unwrap_or(0),
        node_name: spec.and_then(|s| s.node_name.clone()),
        follows_nodes: mirror || owners.iter().any(|o| o.kind == "DaemonSet"),
        cpu_millis: total.get("cpu").copied().unwrap_or(0),
        memory_bytes: total.get("memory").copied().unwrap_or(0),
        extended: total
            .iter()
            .filter(|(name, _)| is_extended(name))
            .map(|(name, n)| (name.clone(), *n))
            .collect(),
        scheduling: if p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some() {
            Scheduling::Unseen
        } else {
            scheduling(p, schedulers)
        },
        claims: spec
            .and_then(|s| s.volumes.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|v| Some(v.persistent_volume_claim.as_ref()?.claim_name.clone()))
            .collect(),
        labels: p.metadata.labels.clone().unwrap_or_default(),
        anti_affinity: anti_affinity(spec),
        affinity: affinity(spec),
        spread: spread(spec),
        node: node_requirements(spec),
        host_ports: host_ports(spec),
    }
}

/// The host ports a Pod's containers and init containers bind (`hostPort`, TCP when the
/// protocol is unsaid), each once.
fn host_ports(spec: Option<&k8s_openapi::api::core::v1::PodSpec>) -> Vec<HostPort> {
    let Some(spec) = spec else {
        return Vec::new();
    };
    let mut out: Vec<HostPort> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            Some(HostPort {
                protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                port: u16::try_from(p.host_port?).ok().filter(|&n| n > 0)?,
            })
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The tenant's NodePool `default` (`broker/deploy/nodepool.yaml`), as its JSON `spec`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct NodePoolSpec {
    #[serde(default)]
    template: Option<PoolTemplate>,
    #[serde(default)]
    limits: Option<PoolLimits>,
    #[serde(default)]
    disruption: Option<PoolDisruption>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct PoolTemplate {
    #[serde(default)]
    spec: Option<PoolTemplateSpec>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct PoolTemplateSpec {
    #[serde(default)]
    requirements: Vec<PoolRequirement>,
}

#[derive(Debug, serde::Deserialize)]
struct PoolRequirement {
    key: String,
    operator: String,
    #[serde(default)]
    values: Vec<String>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct PoolLimits {
    nodes: Option<u32>,
    cpu: Option<serde_json::Value>,
    memory: Option<serde_json::Value>,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct PoolDisruption {
    consolidate_after: Option<String>,
}

/// A quantity given as a number or a string (`4`, `"4"`, `"4000m"`, `"16Gi"`).
fn quantity_text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The decision's view of a NodePool's `spec`; the error names the field at fault.
pub fn node_pool(spec: &serde_json::Value) -> Result<Pool, String> {
    use socialweb_broker_core::placement::Requirement;
    let s: NodePoolSpec = serde_json::from_value(spec.clone()).map_err(|e| format!("spec: {e}"))?;
    let mut pool = Pool::default();
    let reqs = s.template.and_then(|t| t.spec).map(|t| t.requirements);
    for (i, r) in reqs.into_iter().flatten().enumerate() {
        let at = format!("spec.template.spec.requirements[{i}]");
        let int = || {
            r.values
                .first()
                .and_then(|v| v.parse::<i64>().ok())
                .ok_or_else(|| format!("{at}.values: {} takes one integer", r.operator))
        };
        pool.requirements.push(match r.operator.as_str() {
            "In" => Requirement::In(r.key.clone(), r.values.clone()),
            "NotIn" => Requirement::NotIn(r.key.clone(), r.values.clone()),
            "Exists" => Requirement::Exists(r.key.clone()),
            "DoesNotExist" => Requirement::DoesNotExist(r.key.clone()),
            "Gt" => Requirement::Gt(r.key.clone(), int()?),
            "Lt" => Requirement::Lt(r.key.clone(), int()?),
            other => {
                return Err(format!(
                    "{at}.operator: {other:?} is not In, NotIn, Exists, DoesNotExist, Gt or Lt"
                ));
            }
        });
    }
    if let Some(l) = s.limits {
        pool.max_nodes = l.nodes;
        if let Some(cpu) = &l.cpu {
            let text = quantity_text(cpu);
            pool.max_cpu_millis = Some(
                quantity_millis(&text)
                    .ok_or_else(|| format!("spec.limits.cpu: {text:?} is not a CPU quantity"))?,
            );
        }
        if let Some(mem) = &l.memory {
            let text = quantity_text(mem);
            pool.max_memory_bytes = Some(
                quantity_bytes(&text)
                    .ok_or_else(|| format!("spec.limits.memory: {text:?} is not a quantity"))?,
            );
        }
    }
    if let Some(after) = s.disruption.and_then(|d| d.consolidate_after) {
        pool.consolidate_after = Some(if after == "Never" {
            Duration::MAX
        } else {
            humantime::parse_duration(&after).map_err(|e| {
                format!(
                    "spec.disruption.consolidateAfter: {after:?} is not a duration (30s, 5m): {e}"
                )
            })?
        });
    }
    Ok(pool)
}

/// A Pod's `nodeSelector` and required node affinity, as the placement reads them (a
/// `matchFields` on `metadata.name` is the node's name, which is its hostname label here).
fn node_requirements(spec: Option<&k8s_openapi::api::core::v1::PodSpec>) -> NodeRequirements {
    use socialweb_broker_core::placement::{HOSTNAME, Requirement};
    let requirement =
        |key: String, op: &str, values: Option<&Vec<String>>| -> Option<Requirement> {
            let vs = values.cloned().unwrap_or_default();
            let int = || vs.first().and_then(|v| v.parse::<i64>().ok());
            Some(match op {
                "In" => Requirement::In(key, vs),
                "NotIn" => Requirement::NotIn(key, vs),
                "Exists" => Requirement::Exists(key),
                "DoesNotExist" => Requirement::DoesNotExist(key),
                "Gt" => Requirement::Gt(key, int()?),
                "Lt" => Requirement::Lt(key, int()?),
                _ => return None,
            })
        };
    let terms = spec
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| r.node_selector_terms.as_slice())
        .unwrap_or_default();
    NodeRequirements {
        selector: spec
            .and_then(|s| s.node_selector.clone())
            .unwrap_or_default(),
        terms: terms
            .iter()
            .map(|t| {
                let exprs = t
                    .match_expressions
                    .iter()
                    .flatten()
                    .filter_map(|e| requirement(e.key.clone(), &e.operator, e.values.as_ref()));
                let fields = t
                    .match_fields
                    .iter()
                    .flatten()
                    .filter(|f| f.key == "metadata.name")
                    .filter_map(|f| requirement(HOSTNAME.into(), &f.operator, f.values.as_ref()));
                exprs.chain(fields).collect()
            })
            .collect(),
    }
}

/// A Pod's required anti-affinity terms, as the placement reads them.
fn anti_affinity(spec: Option<&k8s_openapi::api::core::v1::PodSpec>) -> Vec<AntiAffinity> {
    let terms = spec
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.pod_anti_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    pod_terms(terms.map(Vec::as_slice).unwrap_or_default(), false)
}

/// A Pod's required pod affinity terms, as the placement reads them.
fn affinity(spec: Option<&k8s_openapi::api::core::v1::PodSpec>) -> Vec<AntiAffinity> {
    let terms = spec
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.pod_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    pod_terms(terms.map(Vec::as_slice).unwrap_or_default(), true)
}

/// A label selector as the placement reads it (an operator it does not know is dropped:
/// the API admits none).
fn selector(sel: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector) -> Selector {
    use socialweb_broker_core::placement::Requirement;
    let match_expressions = sel
        .match_expressions
        .iter()
        .flatten()
        .filter_map(|e| {
            let (k, vs) = (e.key.clone(), e.values.clone().unwrap_or_default());
            Some(match e.operator.as_str() {
                "In" => Requirement::In(k, vs),
                "NotIn" => Requirement::NotIn(k, vs),
                "Exists" => Requirement::Exists(k),
                "DoesNotExist" => Requirement::DoesNotExist(k),
                _ => return None,
            })
        })
        .collect();
    Selector {
        match_labels: sel.match_labels.clone().unwrap_or_default(),
        match_expressions,
    }
}

/// Pod (anti-)affinity terms, on every topology key (a term with no label selector selects
/// no Pod, as the API defines it: an anti-affinity one keeps nothing away; an affinity one
/// is met by no Pod, so it is kept, with a selector that matches none).
fn pod_terms(
    terms: &[k8s_openapi::api::core::v1::PodAffinityTerm],
    affinity: bool,
) -> Vec<AntiAffinity> {
    use socialweb_broker_core::placement::Namespaces;
    terms
        .iter()
        .filter(|t| !t.topology_key.is_empty())
        .filter_map(|t| {
            let selector = match t.label_selector.as_ref() {
                Some(s) => selector(s),
                None if affinity => none_selected(),
                None => return None,
            };
            Some(AntiAffinity {
                selector,
                namespaces: match &t.namespace_selector {
                    Some(_) => Namespaces::All,
                    None => Namespaces::Listed(t.namespaces.clone().unwrap_or_default()),
                },
                topology_key: t.topology_key.clone(),
            })
        })
        .collect()
}

/// A selector no Pod matches (`In` no value).
fn none_selected() -> Selector {
    Selector {
        match_expressions: vec![socialweb_broker_core::placement::Requirement::In(
            "socialweb.computer/none".into(),
            Vec::new(),
        )],
        ..Default::default()
    }
}

/// A Pod's topology spread constraints with `DoNotSchedule`, on every topology key (one
/// with no label selector counts no Pod, so its skew never binds; its key still does: the
/// scheduler takes no node without the label).
fn spread(spec: Option<&k8s_openapi::api::core::v1::PodSpec>) -> Vec<Spread> {
    spec.and_then(|s| s.topology_spread_constraints.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| !c.topology_key.is_empty() && c.when_unsatisfiable == "DoNotSchedule")
        .filter_map(|c| {
            let (max_skew, selector) = match c.label_selector.as_ref() {
                Some(s) => (u32::try_from(c.max_skew).ok()?.max(1), selector(s)),
                None => (u32::MAX, none_selected()),
            };
            Some(Spread {
                max_skew,
                selector,
                topology_key: c.topology_key.clone(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default `scale.schedulers`.
    fn ours() -> Vec<String> {
        vec![DEFAULT_SCHEDULER.to_string()]
    }

    #[test]
    fn quantities_read_as_kubernetes_writes_them() {
        assert_eq!(quantity_millis("500m"), Some(500));
        assert_eq!(quantity_millis("2"), Some(2000));
        assert_eq!(quantity_millis("0.25"), Some(250));
        assert_eq!(quantity_bytes("256Mi"), Some(256 << 20));
        assert_eq!(quantity_bytes("1G"), Some(1_000_000_000));
        assert_eq!(quantity_bytes("1024"), Some(1024));
    }

    #[test]
    fn a_pod_becomes_its_view() {
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "job", "namespace": "ci",
                         "ownerReferences": [{"apiVersion": "v1", "kind": "ReplicaSet", "name": "x", "uid": "u"}]},
            "spec": {"priority": -5, "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
                {"name": "b", "resources": {"requests": {"cpu": "1", "memory": "512Mi"}}}],
                "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "2"}}}]},
            "status": {"phase": "Pending"}
        }))
        .unwrap();
        let v = pod_view(&p, &ours());
        assert_eq!(v.phase, Phase::Pending);
        assert_eq!(v.priority, -5);
        assert_eq!(v.cpu_millis, 2000, "the init container is larger");
        assert_eq!(v.memory_bytes, (1 << 30) + (512 << 20));
        assert!(!v.follows_nodes);
    }

    #[test]
    fn a_pod_is_read_as_the_scheduler_reads_it() {
        // The job: build 600m, helper 100m, and a 600m native sidecar.
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "job", "namespace": "ci"},
            "spec": {"containers": [
                {"name": "build", "resources": {"requests": {"cpu": "600m", "nvidia.com/gpu": "1"}}},
                {"name": "helper", "resources": {"requests": {"cpu": "100m"}}}],
                "initContainers": [{"name": "svc", "restartPolicy": "Always",
                                    "resources": {"requests": {"cpu": "600m", "memory": "64Mi"}}}],
                "overhead": {"memory": "32Mi"}},
            "status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": "0/1 nodes are available: 1 Insufficient cpu."}]}
        }))
        .unwrap();
        let v = pod_view(&p, &ours());
        assert_eq!((v.cpu_millis, v.memory_bytes), (1300, 96 << 20));
        assert_eq!(v.extended, vec![("nvidia.com/gpu".to_string(), 1)]);
        assert_eq!(
            v.scheduling,
            Scheduling::Unschedulable("0/1 nodes are available: 1 Insufficient cpu.".into())
        );
        let with = |patch: serde_json::Value| {
            let mut j = serde_json::to_value(&p).unwrap();
            json_patch_merge(&mut j, &patch);
            pod_view(&serde_json::from_value(j).unwrap(), &ours()).scheduling
        };
        assert_eq!(
            with(
                serde_json::json!({"spec": {"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]}})
            ),
            Scheduling::Gated
        );
        assert_eq!(
            with(serde_json::json!({"spec": {"schedulerName": "gitlab"}})),
            Scheduling::OtherScheduler("gitlab".into())
        );
        // A scheduler the operator lists is ours.
        let mut j = serde_json::to_value(&p).unwrap();
        json_patch_merge(
            &mut j,
            &serde_json::json!({"spec": {"schedulerName": "gitlab"}}),
        );
        let listed = ["default-scheduler".to_string(), "gitlab".to_string()];
        assert!(matches!(
            pod_view(&serde_json::from_value(j).unwrap(), &listed).scheduling,
            Scheduling::Unschedulable(_)
        ));
        assert_eq!(
            with(serde_json::json!({"status": {"nominatedNodeName": "n1"}})),
            Scheduling::Nominated("n1".into())
        );
        assert_eq!(
            with(serde_json::json!({"status": {"conditions": []}})),
            Scheduling::Unseen
        );
        // Pod-level requests stand for the containers'.
        let mut j = serde_json::to_value(&p).unwrap();
        json_patch_merge(
            &mut j,
            &serde_json::json!({"spec": {"resources": {"requests": {"cpu": "2"}}}}),
        );
        let v = pod_view(&serde_json::from_value(j).unwrap(), &ours());
        assert_eq!(v.cpu_millis, 2000);
    }

    /// RFC 7386 merge of `patch` into `doc`.
    fn json_patch_merge(doc: &mut serde_json::Value, patch: &serde_json::Value) {
        match (doc, patch) {
            (serde_json::Value::Object(d), serde_json::Value::Object(p)) => {
                for (k, v) in p {
                    if v.is_null() {
                        d.remove(k);
                    } else {
                        json_patch_merge(d.entry(k.clone()).or_insert(serde_json::Value::Null), v);
                    }
                }
            }
            (d, p) => *d = p.clone(),
        }
    }

    #[test]
    fn a_node_pool_is_read_and_its_errors_name_the_field() {
        use socialweb_broker_core::placement::Requirement;
        let p = node_pool(&serde_json::json!({
            "template": {"spec": {"requirements": [
                {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["2vcpu-4096mib"]}]}},
            "limits": {"nodes": 3, "cpu": "6", "memory": "12Gi"},
            "disruption": {"consolidateAfter": "30s"}
        }))
        .unwrap();
        assert_eq!(
            p.requirements,
            vec![Requirement::In(
                "node.kubernetes.io/instance-type".into(),
                vec!["2vcpu-4096mib".into()]
            )]
        );
        assert_eq!(
            (p.max_nodes, p.max_cpu_millis, p.max_memory_bytes),
            (Some(3), Some(6000), Some(12 << 30))
        );
        assert_eq!(p.consolidate_after, Some(Duration::from_secs(30)));
        assert_eq!(node_pool(&serde_json::json!({})).unwrap(), Pool::default());
        let e = node_pool(&serde_json::json!({"limits": {"cpu": "lots"}})).unwrap_err();
        assert!(e.starts_with("spec.limits.cpu"), "{e}");
        let e = node_pool(&serde_json::json!({"disruption": {"consolidateAfter": "soon"}}))
            .unwrap_err();
        assert!(e.starts_with("spec.disruption.consolidateAfter"), "{e}");
        let e = node_pool(&serde_json::json!({"template": {"spec": {"requirements": [
            {"key": "cores", "operator": "Gt", "values": ["many"]}]}}}))
        .unwrap_err();
        assert!(
            e.starts_with("spec.template.spec.requirements[0].values"),
            "{e}"
        );
    }

    #[test]
    fn pod_affinity_and_spread_become_terms_on_every_key() {
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "client", "namespace": "ci"},
            "spec": {"containers": [{"name": "a"}],
                "affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "cache"}}},
                    {"topologyKey": "topology.kubernetes.io/zone", "labelSelector": {"matchLabels": {"app": "db"}}}]}},
                "topologySpreadConstraints": [
                    {"maxSkew": 2, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
                     "labelSelector": {"matchLabels": {"app": "client"}}},
                    {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
                     "labelSelector": {"matchLabels": {"app": "client"}}}]}
        }))
        .unwrap();
        let v = pod_view(&p, &ours());
        assert_eq!(v.affinity.len(), 2, "{:?}", v.affinity);
        assert_eq!(v.affinity[0].selector.match_labels["app"], "cache");
        assert_eq!(v.affinity[1].topology_key, "topology.kubernetes.io/zone");
        assert_eq!(v.spread.len(), 1, "ScheduleAnyway never holds a Pod back");
        assert_eq!(v.spread[0].max_skew, 2);
        assert!(v.anti_affinity.is_empty());
    }

    #[test]
    fn node_selector_and_required_node_affinity_become_requirements() {
        use socialweb_broker_core::placement::{HOSTNAME, Requirement};
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "job", "namespace": "ci"},
            "spec": {"containers": [{"name": "a"}],
                "nodeSelector": {"kubernetes.io/arch": "amd64"},
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [
                            {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["2vcpu-4096mib"]},
                            {"key": "cores", "operator": "Gt", "values": ["1"]}]},
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}}
        }))
        .unwrap();
        let v = pod_view(&p, &ours()).node;
        assert_eq!(
            v.selector.get("kubernetes.io/arch").map(String::as_str),
            Some("amd64")
        );
        assert_eq!(
            v.terms,
            vec![
                vec![
                    Requirement::In(
                        "node.kubernetes.io/instance-type".into(),
                        vec!["2vcpu-4096mib".into()]
                    ),
                    Requirement::Gt("cores".into(), 1),
                ],
                vec![Requirement::In(HOSTNAME.into(), vec!["n1".into()])],
            ]
        );
    }
}
