//! A fleet host follows the store: clusters another host creates get a life here too (which
//! waits for their lease, and takes them over if their owner is lost), and the life of a
//! cluster another host deletes ends here. And the operator drains a host: it gives its
//! clusters up, one control plane stopped and its lease released at a time, and claims none
//! until undrained.

use std::collections::HashSet;
use std::sync::Arc;

use socialweb_broker_core::ClusterPhase;
use tracing::{info, warn};

use super::Clusters;
use super::view::View;
use crate::command::{ClusterState, ServiceError};

impl Clusters {
    /// Reads the store's clusters and leases into this host's view (`super::view`), which
    /// every cluster life of this host reads instead of the store; the clusters, as read.
    pub(super) async fn read_view(&self) -> anyhow::Result<Vec<socialweb_broker_core::Cluster>> {
        let all = self.store.clusters().await?;
        let (owners, now) = self.store.owners().await?;
        let read_at = tokio::time::Instant::now();
        self.view.send_replace(Arc::new(View {
            clusters: all.iter().map(|c| (c.name.clone(), c.state)).collect(),
            owners: owners.into_iter().collect(),
            now,
            read_at: Some(read_at),
        }));
        Ok(all)
    }

    /// Follows the store until the broker stops, reading it into the view once a renewal
    /// period; returns at once outside a fleet.
    pub(super) async fn follow_store(self: Arc<Self>) {
        let Some(own) = self.ownership() else {
            return;
        };
        loop {
            tokio::select! {
                _ = tokio::time::sleep(own.timing.renew_every()) => {}
                _ = self.stop.cancelled() => return,
            }
            // This host is alive: nodes' identities keep naming its tunnel and relay.
            if let Err(e) = self.store.heartbeat(&own.host).await {
                warn!("recording this host's heartbeat: {e:#}");
            }
            let all = match self.read_view().await {
                Ok(all) => all,
                Err(e) => {
                    warn!("reading the fleet's clusters and leases: {e:#}");
                    continue;
                }
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

impl Clusters {
    /// Drains this host (`undo`: undrains it), kept across restarts; the clusters it runs
    /// now, which move to other hosts.
    pub async fn drain(&self, undo: bool) -> Result<Vec<String>, ServiceError> {
        if self.settings.fleet.is_none() {
            return Err(ServiceError::Invalid(
                "drain moves clusters to the other hosts of a fleet, and this broker is not one \
                 (fleet.enabled)"
                    .into(),
            ));
        }
        let marker = &self.settings.drain_marker;
        let written = if undo {
            std::fs::remove_file(marker).or_else(|e| {
                (e.kind() == std::io::ErrorKind::NotFound)
                    .then_some(())
                    .ok_or(e)
            })
        } else {
            std::fs::write(marker, "drained by socialweb-broker drain\n")
        };
        written.map_err(|e| {
            ServiceError::internal(anyhow::anyhow!("writing {}: {e}", marker.display()))
        })?;
        self.drained_by_operator
            .store(!undo, std::sync::atomic::Ordering::SeqCst);
        self.give_up_or_not();
        info!(
            drained = !undo,
            "this host of the fleet is {}",
            if undo { "undrained" } else { "drained" }
        );
        let running = self.running.lock().expect("lock");
        Ok(running
            .iter()
            .filter(|(_, h)| !undo && !matches!(*h.state.borrow(), ClusterState::Elsewhere { .. }))
            .map(|(n, _)| n.clone())
            .collect())
    }

    /// Tells the clusters' lives whether this host gives its clusters up now: drained by
    /// the operator, or cut off from its users (`super::reach`).
    pub(super) fn give_up_or_not(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        let give_up = self.drained_by_operator.load(SeqCst) || self.cut_off.load(SeqCst);
        self.draining
            .send_if_modified(|d| std::mem::replace(d, give_up) != give_up);
    }

    /// Whether this host gives its clusters up now (drained or cut off).
    pub(super) fn drained(&self) -> tokio::sync::watch::Receiver<bool> {
        self.draining.subscribe()
    }

    /// Returns when another host of the fleet has woken the cluster (the store no longer
    /// says it hibernates, as a view read after this began shows); never outside a fleet.
    pub(super) async fn woken_elsewhere(&self, name: &str) {
        if self.ownership().is_none() {
            return std::future::pending().await;
        }
        let mut view = self.view.subscribe();
        // Only a reading that began after this: the one before may predate this host's
        // own record of the hibernation.
        view.mark_unchanged();
        let _ = view.changed().await;
        loop {
            if view.changed().await.is_err() {
                return std::future::pending().await;
            }
            if view.borrow_and_update().active(name) {
                return;
            }
        }
    }
}
