//! The providers' view against the store's ([`socialweb_broker_core::reconcile`]), carried
//! out in one place for both its callers: the daemon at start, over every lease this broker
//! holds, and each cluster's driver every turn, over that cluster's. Orphaned leases are
//! released here; the fixes only the driver can make (failing a provision whose task it
//! runs, lifting its cordon) are handed back.

use socialweb_broker_core::Provision;
use socialweb_broker_core::reconcile::{Fix, reconcile};
use socialweb_market::Lease;
use tracing::warn;

use super::Provisioner;

/// Whose leases a reconcile looks at.
#[derive(Debug, Clone, Copy)]
pub enum Scope<'a> {
    /// Every lease this broker holds (at start, before any cluster runs: leases of
    /// clusters deleted while it was down, or of a crash mid-delete).
    Broker,
    /// One cluster's.
    Cluster(&'a str),
}

impl Provisioner {
    /// The leases the providers hold in `scope`, each with the provider it is at, as this
    /// broker names it.
    pub async fn leases(
        &self,
        scope: Scope<'_>,
    ) -> Result<Vec<(String, Lease)>, crate::market::MarketError> {
        match scope {
            Scope::Broker => self.market.leases("broker", &self.broker_id).await,
            Scope::Cluster(name) => self.market.leases("cluster", name).await,
        }
    }

    /// Reconciles the providers' leases in `scope` with the store's provisions (all of
    /// them for [`Scope::Broker`], `provisions` otherwise): releases every orphan, and
    /// returns the other fixes for the caller. `None`: the leases could not be listed
    /// (said in the log; the next turn tries again).
    pub async fn reconcile(
        &self,
        scope: Scope<'_>,
        provisions: Option<&[Provision]>,
    ) -> Option<Vec<Fix>> {
        let listed = match self.leases(scope).await {
            Ok(l) => l,
            Err(e) => {
                warn!(?scope, "reconcile: listing the providers' leases: {e}");
                return None;
            }
        };
        let all;
        let provisions = match provisions {
            Some(p) => p,
            None => {
                all = self.store.provisions(None).await.unwrap_or_default();
                &all
            }
        };
        if let Scope::Cluster(name) = scope
            && let Err(e) = self.still_holds(name).await
        {
            warn!(?scope, "reconcile: {e:#}");
            return None;
        }
        let leases: Vec<Lease> = listed.iter().map(|(_, l)| l.clone()).collect();
        let mut left = Vec::new();
        for fix in reconcile(&self.broker_id, &leases, provisions) {
            let Fix::Release { lease, why } = fix else {
                left.push(fix);
                continue;
            };
            warn!(?scope, lease = %lease, "reconcile: {why}; releasing it");
            self.metrics.orphan();
            let provider = listed
                .iter()
                .find(|(_, l)| l.id == lease)
                .map(|(n, _)| n.as_str())
                .unwrap_or_default();
            if let Err(e) = self.release_lease(provider, &lease, &why).await {
                warn!(?scope, "reconcile: releasing {lease}: {e}");
            }
        }
        Some(left)
    }
}
