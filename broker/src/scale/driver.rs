//! The scale driver of one cluster: level-triggered. Pod and Node watches (kube reflectors)
//! and the hold timer only say "look again"; every pass recomputes the decision from the whole
//! picture -- the cluster's Pods, the store's provisions, the provider's leases -- records it
//! when it changed, and acts on the difference. A missed event costs latency, never
//! correctness.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::decision::{Action, Knobs, LeaseView, decide, teardown_due};
use crate::provision::{ClusterCtx, Provisioner};
use crate::store::{DecisionRow, Provision, Step, from_millis, millis};
use crate::tenant;

/// How often the provider's view is compared with the store's.
const RECONCILE_EVERY: Duration = Duration::from_secs(15);
/// A change is acted on once no other came for this long ([`settle`]).
const SETTLE: Duration = Duration::from_millis(200);
/// ... or this long after it, whatever keeps coming.
const SETTLE_MAX: Duration = Duration::from_secs(1);

/// Watches a resource and nudges on every change.
fn watch_into<K>(api: Api<K>, nudge: Arc<Notify>, stop: CancellationToken) -> reflector::Store<K>
where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (store, writer) = reflector::store();
    let stream = reflector(
        writer,
        watcher(api, watcher::Config::default()).default_backoff(),
    );
    tokio::spawn(async move {
        futures_util::pin_mut!(stream);
        loop {
            tokio::select! {
                ev = stream.next() => match ev {
                    None => return,
                    Some(Err(e)) => warn!("watch: {e}"),
                    // Mid-list the store still holds the old state; it swaps at InitDone.
                    Some(Ok(watcher::Event::Init | watcher::Event::InitApply(_))) => {}
                    Some(Ok(_)) => nudge.notify_one(),
                },
                _ = stop.cancelled() => return,
            }
        }
    });
    store
}

/// Runs the loop until `stop`; returns when stopped.
pub async fn run(p: Arc<Provisioner>, c: ClusterCtx, nudge: Arc<Notify>, stop: CancellationToken) {
    let pods = watch_into(
        Api::<Pod>::all(c.client.clone()),
        nudge.clone(),
        stop.clone(),
    );
    let nodes = watch_into(
        Api::<Node>::all(c.client.clone()),
        nudge.clone(),
        stop.clone(),
    );
    let knobs = Knobs {
        max_nodes: p.cfg.scale.max_nodes,
        pods_per_node: p.cfg.scale.pods_per_node,
        hold: p.cfg.scale.hold,
        expendable_priority_cutoff: p.cfg.scale.expendable_priority_cutoff,
        node: p.cfg.node,
    };
    let mut in_flight: HashMap<String, (Step, tokio::task::JoinHandle<()>)> = HashMap::new();
    let mut last_recorded: Option<(String, u32, u32, u32)> = None;
    let mut warned: HashSet<String> = HashSet::new();
    let mut last_reconcile: Option<Instant> = None;
    let mut next_plan_at = tokio::time::Instant::now();
    let _ = pods.wait_until_ready().await;
    let _ = nodes.wait_until_ready().await;
    info!(cluster = %c.name, "scale driver watching Pods and Nodes");
    loop {
        in_flight.retain(|_, (_, h)| !h.is_finished());
        let provisions = match p.store.provisions(Some(&c.name)).await {
            Ok(v) => v,
            Err(e) => {
                warn!(cluster = %c.name, "reading provisions: {e:#}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if last_reconcile.is_none_or(|t| t.elapsed() > RECONCILE_EVERY) {
            reconcile(&p, &c, &provisions, &mut in_flight).await;
            last_reconcile = Some(Instant::now());
        }
        let provisions = p
            .store
            .provisions(Some(&c.name))
            .await
            .unwrap_or(provisions);
        // Every provision that is not where it will stay gets its task.
        for prov in provisions
            .iter()
            .filter(|x| !x.state.ended() && x.state != Step::Joined)
        {
            if in_flight.contains_key(&prov.id) {
                continue;
            }
            let (pp, cc, pv, n) = (p.clone(), c.clone(), prov.clone(), nudge.clone());
            let h = tokio::spawn(async move {
                let res = if pv.state == Step::Releasing {
                    pp.release(cc, pv, "releasing".into()).await
                } else {
                    pp.drive(cc, pv).await
                };
                if let Err(e) = res {
                    warn!("provision: {e:#}");
                }
                n.notify_one();
            });
            in_flight.insert(prov.id.clone(), (prov.state, h));
        }

        let cluster = p.store.cluster(&c.name).await.ok().flatten();
        let last_intent = cluster
            .as_ref()
            .map(|x| from_millis(x.last_intent_at))
            .unwrap_or_else(SystemTime::now);
        let views: Vec<_> = pods.state().iter().map(|x| tenant::pod_view(x)).collect();
        let leases: Vec<LeaseView> = provisions
            .iter()
            .map(|x| LeaseView {
                node: x.node.clone(),
                live: x.state.live(),
            })
            .collect();
        let now = SystemTime::now();
        let t = Instant::now();
        let d = decide(&views, &leases, &knobs, now, last_intent);
        p.metrics.decided(t.elapsed().as_secs_f64());
        if d.intent > 0
            && let Err(e) = p.store.set_last_intent(&c.name, now).await
        {
            warn!(cluster = %c.name, "recording intent: {e:#}");
        }
        let key = (d.action.as_str().to_string(), d.target, d.nodes, d.intent);
        if last_recorded.as_ref() != Some(&key) {
            let row = DecisionRow {
                cluster: c.name.clone(),
                at: millis(now),
                action: d.action.as_str().into(),
                target: i64::from(d.target),
                nodes: i64::from(d.nodes),
                intent: i64::from(d.intent),
                reason: d.reason.clone(),
            };
            info!(cluster = %c.name, action = d.action.as_str(), target = d.target, nodes = d.nodes,
                  intent = d.intent, "{} nodes={}", d.reason, d.target);
            if let Err(e) = p.store.record_decision(&row).await {
                warn!(cluster = %c.name, "recording the decision: {e:#}");
            }
            p.metrics.decision(d.action.as_str());
            last_recorded = Some(key);
        }
        for (pod, why) in &d.unfit {
            if warned.insert(pod.clone())
                && let Some((ns, name)) = pod.split_once('/')
            {
                let uid = pods
                    .state()
                    .iter()
                    .find(|x| {
                        x.metadata.namespace.as_deref() == Some(ns)
                            && x.metadata.name.as_deref() == Some(name)
                    })
                    .and_then(|x| x.metadata.uid.clone());
                info!(cluster = %c.name, pod = %pod, "no node on offer can hold it: {why}");
                if let Err(e) = tenant::warn_pod(&c.client, ns, name, uid.as_deref(), why).await {
                    warn!(cluster = %c.name, "{e:#}");
                }
            }
        }
        match d.action {
            Action::Provision { count } => {
                // Back off while provisions keep failing: the market may be refusing us.
                let failures = recent_failures(&provisions);
                if failures > 0 && tokio::time::Instant::now() < next_plan_at {
                    // wait below
                } else {
                    for _ in 0..count {
                        match p.plan(&c.name).await {
                            Ok(_) => {}
                            Err(e) => warn!(cluster = %c.name, "planning a node: {e:#}"),
                        }
                    }
                    let delay = Duration::from_secs(1 << failures.min(6));
                    next_plan_at = tokio::time::Instant::now() + delay;
                    continue;
                }
            }
            Action::Teardown => {
                for prov in provisions.iter().filter(|x| x.state.live()) {
                    if let Some((_, h)) = in_flight.remove(&prov.id) {
                        // The step machine is crash-safe: stopping it mid-step is a crash.
                        h.abort();
                    }
                    let (pp, cc, pv, n) = (p.clone(), c.clone(), prov.clone(), nudge.clone());
                    let why = d.reason.clone();
                    let h = tokio::spawn(async move {
                        if let Err(e) = pp.release(cc, pv, why).await {
                            warn!("release: {e:#}");
                        }
                        n.notify_one();
                    });
                    in_flight.insert(prov.id.clone(), (Step::Releasing, h));
                }
            }
            Action::Hold => {}
        }
        // Wake on a change, on the hold's end, on the planning backoff's end, or in a second
        // (in-flight provisions move on their own and nudge when done).
        let mut wake = tokio::time::Instant::now() + Duration::from_secs(1);
        if let Some(due) = teardown_due(&d, &knobs)
            && let Ok(left) = due.duration_since(SystemTime::now())
        {
            wake = wake.min(tokio::time::Instant::now() + left + Duration::from_millis(50));
        }
        tokio::select! {
            _ = nudge.notified() => settle(&nudge).await,
            _ = tokio::time::sleep_until(wake) => {}
            _ = stop.cancelled() => break,
        }
    }
    for (_, (_, h)) in in_flight {
        h.abort();
    }
}

/// Waits out a burst of changes, so that one decision sees all of it: `kubectl apply` of
/// five job Pods arrives as five events, and deciding on the first would rent one node, then
/// another, in five RFP rounds instead of one. Quiet for [`SETTLE`] ends the wait, and so does
/// [`SETTLE_MAX`], so a steady trickle of changes cannot starve the loop.
async fn settle(nudge: &Notify) {
    let give_up = tokio::time::Instant::now() + SETTLE_MAX;
    loop {
        let quiet = tokio::time::Instant::now() + SETTLE;
        tokio::select! {
            _ = nudge.notified() => {
                if tokio::time::Instant::now() >= give_up {
                    return;
                }
            }
            _ = tokio::time::sleep_until(quiet.min(give_up)) => return,
        }
    }
}

/// Failed provisions since the last one that joined.
fn recent_failures(provisions: &[Provision]) -> u32 {
    provisions
        .iter()
        .rev()
        .take_while(|x| x.state != Step::Joined && x.state != Step::Released)
        .filter(|x| x.state == Step::Failed)
        .count() as u32
}

/// Compares the provider's view with the store's: a lease nothing owns is released; a lease
/// the store thinks is live but the provider does not have (or has failed) fails its
/// provision, and the decision plans again.
async fn reconcile(
    p: &Arc<Provisioner>,
    c: &ClusterCtx,
    provisions: &[Provision],
    in_flight: &mut HashMap<String, (Step, tokio::task::JoinHandle<()>)>,
) {
    let leases = match p.market.leases("cluster", &c.name).await {
        Ok(l) => l,
        Err(e) => {
            warn!(cluster = %c.name, "reconcile: listing leases: {e}");
            return;
        }
    };
    let ours: Vec<_> = leases
        .iter()
        .filter(|l| l.tags.get("broker") == Some(&p.broker_id))
        .collect();
    for l in &ours {
        let owner = provisions.iter().find(|x| x.lease_id == l.id);
        let orphan = match owner {
            None => true,
            Some(x) => x.state.ended(),
        };
        if orphan && l.state.live() {
            warn!(cluster = %c.name, lease = %l.id, "reconcile: lease {} at the provider has no live provision; releasing it", l.id);
            p.metrics.orphan();
            if let Err(e) = p.market.release(&l.id).await {
                warn!(cluster = %c.name, "reconcile: releasing {}: {e}", l.id);
            }
        }
    }
    for x in provisions
        .iter()
        .filter(|x| matches!(x.state, Step::Booting | Step::Running | Step::Joined))
    {
        let lease = ours.iter().find(|l| l.id == x.lease_id);
        let why = match lease {
            None => Some(format!("the provider does not have lease {}", x.lease_id)),
            Some(l) if !l.state.live() => Some(format!(
                "lease {} is {} at the provider{}",
                l.id,
                l.state.as_str(),
                l.reason
                    .as_ref()
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default()
            )),
            _ => None,
        };
        if let Some(why) = why {
            if let Some((_, h)) = in_flight.remove(&x.id) {
                h.abort();
            }
            let mut x = x.clone();
            if let Err(e) = p.fail(c, &mut x, why).await {
                warn!(cluster = %c.name, "reconcile: {e:#}");
            }
        } else if x.state == Step::Joined
            && !in_flight.contains_key(&x.id)
            && let Err(e) = tenant::uncordon_ours(&c.client, &x.node).await
        {
            // A broker that crashed between cordoning a node to release it and recording
            // the release left it cordoned; no release is under way, so lift it.
            warn!(cluster = %c.name, node = %x.node, "reconcile: {e:#}");
        }
    }
}
