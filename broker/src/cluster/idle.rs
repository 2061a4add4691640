//! When an awake cluster may hibernate: every second the core's verdict on what it has now
//! (its nodes, leases, Pods, the front's requests in flight), the Jobs and CronJobs listed
//! only when the rest says it may, and the front made to hold new requests before it stops.

use std::time::{Duration, Instant};

use anyhow::Result;
use futures_util::FutureExt;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use socialweb_broker_core::hibernation::{Observed, Verdict, blockers, verdict};
use socialweb_broker_core::life::Event;
use tracing::{info, warn};

use super::Clusters;
use super::writer::Writer;
use crate::scale::driver::Watches;

/// How often an awake cluster is looked at for hibernation.
const IDLE_CHECK: Duration = Duration::from_secs(1);
/// How long Jobs and CronJobs (listed, not watched) that kept it awake are not listed again.
const RELIST_AFTER: Duration = Duration::from_secs(10);

impl Clusters {
    /// Returns once the cluster may hibernate, with the front already holding its requests
    /// (the mount says hibernating; a request that slips in before that keeps it awake).
    pub(super) async fn until_idle(
        &self,
        name: &str,
        life: &Writer,
        client: &kube::Client,
        watches: &Watches,
    ) {
        let activity = self.front.activity(name);
        let mut last_busy = Instant::now();
        let mut said = String::new();
        let mut listed: Option<(Instant, Vec<String>, Vec<String>)> = None;
        loop {
            tokio::time::sleep(IDLE_CHECK).await;
            let Some((after, mut o)) = self.observe(name, watches, &activity).await else {
                continue;
            };
            let cutoff = self.settings.knobs.expendable_priority_cutoff;
            let seen = blockers(&o, cutoff);
            if !seen.is_empty() {
                last_busy = Instant::now();
            }
            let quiet = activity
                .idle_for()
                .unwrap_or_default()
                .min(last_busy.elapsed());
            let mut v = verdict(after, quiet, &seen);
            if v == Verdict::Hibernate {
                // What is only listed, when it matters: Jobs and CronJobs (a list kept for
                // a while, so a CronJob does not cost a list a second).
                if listed
                    .as_ref()
                    .is_none_or(|(t, ..)| t.elapsed() > RELIST_AFTER)
                {
                    let (jobs, crons) = jobs_and_cron_jobs(client)
                        .await
                        .unwrap_or_else(|e| (vec![format!("(unlisted: {e})")], Vec::new()));
                    listed = Some((Instant::now(), jobs, crons));
                }
                let (_, jobs, crons) = listed.clone().expect("listed");
                (o.unfinished_jobs, o.cron_jobs) = (jobs, crons);
                v = verdict(after, quiet, &blockers(&o, cutoff));
            }
            match v {
                Verdict::Hibernate if self.hold_requests(name, life, &activity) => return,
                Verdict::Hibernate => last_busy = Instant::now(),
                Verdict::After(_) => {}
                Verdict::Stay(why) => {
                    if why != said {
                        info!(cluster = %name, "stays awake: {why}");
                    }
                    said = why;
                }
            }
        }
    }

    /// The cluster's `hibernate_after` and what it has now (`None`: the store did not answer).
    async fn observe(
        &self,
        name: &str,
        watches: &Watches,
        activity: &crate::front::listener::Activity,
    ) -> Option<(Duration, Observed)> {
        let record = match self.store.cluster(name).await {
            Ok(Some(r)) => r,
            Ok(None) => return None,
            Err(e) => {
                warn!(cluster = %name, "reading the cluster: {e:#}");
                return None;
            }
        };
        let after = record
            .hibernate_after_secs
            .map(|s| Duration::from_secs(s.max(0) as u64))
            .unwrap_or(self.settings.hibernate_after);
        let provisions = self.store.provisions(Some(name)).await.ok()?;
        Some((
            after,
            Observed {
                nodes: watches.nodes.state().len(),
                live_leases: provisions.iter().filter(|p| p.state.live()).count(),
                front_in_flight: activity.in_flight(),
                pods: watches
                    .pods
                    .state()
                    .iter()
                    .map(|p| crate::tenant::pod_view(p, &self.settings.schedulers))
                    .collect(),
                unfinished_jobs: Vec::new(),
                cron_jobs: Vec::new(),
            },
        ))
    }

    /// Mounts the cluster as hibernating so that requests are held from now on; `false`
    /// (and mounted up again) when one was in flight already.
    fn hold_requests(
        &self,
        name: &str,
        life: &Writer,
        activity: &crate::front::listener::Activity,
    ) -> bool {
        // A wake asked before now is for the cluster as it is: awake.
        let _ = self.front.wake_signal(name).notified().now_or_never();
        life.now(Event::Idle);
        if activity.in_flight() > 0 {
            life.now(Event::Busy);
            return false;
        }
        true
    }
}

/// How many Jobs or CronJobs a look for idleness reads per request, and the most names it
/// keeps of each (the verdict needs one; its reason names a few): a tenant's thousands of
/// finished Jobs are read a page at a time, never held whole.
const JOBS_PAGE: u32 = 250;
const JOBS_KEPT: usize = 16;

/// Up to [`JOBS_KEPT`] names (`ns/name`) of the `K`s that `keep` selects, read in pages.
async fn some_of<K>(client: &kube::Client, keep: impl Fn(&K) -> bool) -> Result<Vec<String>>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
    K::DynamicType: Default,
{
    let api = kube::Api::<K>::all(client.clone());
    let mut lp = kube::api::ListParams::default().limit(JOBS_PAGE);
    let mut out = Vec::new();
    loop {
        let page = api.list(&lp).await?;
        for k in page.items.iter().filter(|k| keep(k)) {
            let m = k.meta();
            out.push(format!(
                "{}/{}",
                m.namespace.as_deref().unwrap_or(""),
                m.name.as_deref().unwrap_or("")
            ));
            if out.len() >= JOBS_KEPT {
                return Ok(out);
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = lp.continue_token(&c),
            None => return Ok(out),
        }
    }
}

/// Some of the Jobs not finished and the CronJobs not suspended, as `ns/name`.
async fn jobs_and_cron_jobs(client: &kube::Client) -> Result<(Vec<String>, Vec<String>)> {
    let unfinished = some_of::<Job>(client, |j| {
        !j.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
            })
    })
    .await?;
    let active = some_of::<CronJob>(client, |c| {
        !c.spec.as_ref().and_then(|s| s.suspend).unwrap_or(false)
    })
    .await?;
    Ok((unfinished, active))
}
