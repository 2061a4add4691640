//! A cluster's authorities (its CAs) before anything of it is served or signed: made where
//! missing and, with a vault (`store.key_file`), the same on every host -- restored from the
//! store onto an empty disk, sealed into it when made here.

use std::time::Duration;

use anyhow::Result;
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::Clusters;
use crate::control_plane::runner::Spec;

impl Clusters {
    /// The cluster's authorities made where missing and, with a vault (`store.key_file`),
    /// the same as the store's: restored from it onto an empty disk, sealed into it when
    /// made here. Before anything is served or signed. `Ok(false)`: stopped first.
    ///
    /// The users CA is the one authority this never makes: the host that creates the cluster
    /// makes it and seals it with the cluster's row (`Clusters::create`), and signs users'
    /// certificates with it. A follower finds it there; for a cluster an older broker
    /// created, it waits for the creator to seal it rather than make one of its own that no
    /// user's certificate would match.
    pub(super) async fn keep_authorities(
        &self,
        spec: &Spec,
        stop: &CancellationToken,
    ) -> Result<bool> {
        let Some(v) = self.vault() else {
            spec.ensure_authorities()?;
            return Ok(true);
        };
        let users_ca = spec.dir.join("users/ca.key");
        let mut told = false;
        loop {
            logged(&spec.cluster, v.sync(&spec.cluster, &spec.dir).await?);
            // Outside a fleet no other host can seal it: on without it, to the error that
            // names it.
            if users_ca.exists() || self.ownership().is_none() {
                break;
            }
            if !told {
                info!(cluster = %spec.cluster, "waiting for the creating host to seal the cluster's users CA");
                told = true;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                _ = stop.cancelled() => return Ok(false),
            }
        }
        spec.ensure_authorities()?;
        logged(&spec.cluster, v.sync(&spec.cluster, &spec.dir).await?);
        Ok(true)
    }
}

/// Says what a vault sync changed, if anything.
fn logged(cluster: &str, synced: crate::vault::Synced) {
    if !(synced.restored.is_empty() && synced.sealed.is_empty()) {
        info!(%cluster, restored = ?synced.restored, sealed = ?synced.sealed, "CA material kept in the store");
    }
}
