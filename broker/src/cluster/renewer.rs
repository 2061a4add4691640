//! A fleet host's lease renewals, batched: one statement a renewal period for every lease
//! the host holds, instead of one per lease (issue 61: at a thousand awake clusters, 500
//! statements a second that the store's five connections queued, and a renewal queued past
//! 0.7 of the TTL kills a healthy control plane). Each lease's keeper
//! ([`super::ownership::Lease::keep`]) registers here and is told each renewal that got
//! through (when it was sent) or that its lease is gone; its deadline stays its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use socialweb_broker_core::ownership::Timing;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::store::Store;

/// What a lease's keeper is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// Nothing yet.
    Pending,
    /// The last renewal that got through was sent then.
    Sent(Instant),
    /// The lease is no longer this host's under its fence.
    Gone,
}

/// The leases this host holds, and their keepers.
#[derive(Debug, Default)]
pub struct Renewer {
    leases: Mutex<HashMap<String, (i64, watch::Sender<Renewal>)>>,
}

/// A lease's registration: its renewals, and its removal when dropped.
#[derive(Debug)]
pub struct Registered {
    renewer: Arc<Renewer>,
    cluster: String,
    fence: i64,
    pub told: watch::Receiver<Renewal>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut leases = self.renewer.leases.lock().expect("lock");
        if leases
            .get(&self.cluster)
            .is_some_and(|(f, _)| *f == self.fence)
        {
            leases.remove(&self.cluster);
        }
    }
}

impl Renewer {
    /// Registers `cluster`'s lease under `fence`, renewed from the next batch on.
    pub fn register(self: &Arc<Self>, cluster: &str, fence: i64) -> Registered {
        let (tx, rx) = watch::channel(Renewal::Pending);
        self.leases
            .lock()
            .expect("lock")
            .insert(cluster.to_string(), (fence, tx));
        Registered {
            renewer: self.clone(),
            cluster: cluster.to_string(),
            fence,
            told: rx,
        }
    }

    /// Renews every registered lease once a renewal period until `stop`.
    pub async fn run(
        self: Arc<Self>,
        store: Store,
        host: String,
        timing: Timing,
        metrics: crate::metrics::Fleet,
        stop: CancellationToken,
    ) {
        let ttl = i64::try_from(timing.ttl.as_millis()).unwrap_or(i64::MAX);
        loop {
            tokio::select! {
                _ = tokio::time::sleep(timing.renew_every()) => {}
                _ = stop.cancelled() => return,
            }
            let batch: Vec<(String, i64)> = self
                .leases
                .lock()
                .expect("lock")
                .iter()
                .map(|(c, (f, _))| (c.clone(), *f))
                .collect();
            if batch.is_empty() {
                continue;
            }
            let sent = Instant::now();
            let renewed = match store.renew_owners(&host, &batch, ttl).await {
                Ok(r) => r,
                Err(e) => {
                    warn!(leases = batch.len(), "renewing this host's leases: {e:#}");
                    continue;
                }
            };
            metrics.renewed(sent.elapsed().as_secs_f64());
            let leases = self.leases.lock().expect("lock");
            for (cluster, fence) in &batch {
                if let Some((f, tx)) = leases.get(cluster)
                    && f == fence
                {
                    tx.send_replace(if renewed.contains(cluster) {
                        Renewal::Sent(sent)
                    } else {
                        Renewal::Gone
                    });
                }
            }
        }
    }
}
