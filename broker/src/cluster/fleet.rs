//! A fleet host follows the store: clusters another host creates get a life here too (which
//! waits for their lease, and takes them over if their owner is lost), and the life of a
//! cluster another host deletes ends here.

use std::collections::HashSet;
use std::sync::Arc;

use socialweb_broker_core::ClusterPhase;
use tracing::info;

use super::Clusters;

impl Clusters {
    /// Follows the store until the broker stops; returns at once outside a fleet.
    pub(super) async fn follow_store(self: Arc<Self>) {
        let Some(own) = self.ownership() else {
            return;
        };
        loop {
            tokio::select! {
                _ = tokio::time::sleep(own.timing.renew_every()) => {}
                _ = self.stop.cancelled() => return,
            }
            let Ok(all) = self.store.clusters().await else {
                continue;
            };
            let listed: HashSet<String> = all
                .into_iter()
                .filter(|c| c.state != ClusterPhase::Deleting)
                .map(|c| c.name)
                .collect();
            let running: HashSet<String> =
                self.running.lock().expect("lock").keys().cloned().collect();
            for name in listed.difference(&running) {
                // Under the cluster's lock, as a create and a delete here are: neither runs
                // between the look and the spawn.
                let lock = self.lock(name).await;
                let known = self.running.lock().expect("lock").contains_key(name);
                if !known
                    && matches!(self.store.cluster(name).await, Ok(Some(c)) if c.state != ClusterPhase::Deleting)
                {
                    info!(cluster = %name, "a cluster of the fleet's: following it");
                    self.spawn(name);
                }
                drop(lock);
            }
            for name in running.difference(&listed) {
                let lock = self.lock(name).await;
                let gone = !matches!(self.store.cluster(name).await, Ok(Some(c)) if c.state != ClusterPhase::Deleting);
                let handle = gone
                    .then(|| self.running.lock().expect("lock").remove(name))
                    .flatten();
                if let Some(h) = handle {
                    info!(cluster = %name, "deleted by another host of the fleet");
                    self.front.unmount(name);
                    self.access.forget_cluster(name);
                    h.stop.cancel();
                    let _ = h.task.await;
                }
                drop(lock);
                self.unlock_gone(name);
            }
        }
    }
}
