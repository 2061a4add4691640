//! What a fleet host knows of the fleet: every cluster's phase and every lease, read from
//! the store once a renewal period ([`Clusters::follow_store`](super::Clusters)) and shared
//! by all of this host's cluster lives. The store's load at rest is then two reads a period
//! per host, whatever the number of clusters (it was one read per cluster and period per
//! host, for each hibernating cluster and each cluster another host runs: issue 61). A
//! view is only ever a hint: a claim is still one conditional statement the store decides.

use std::collections::HashMap;

use socialweb_broker_core::ClusterPhase;
use tokio::time::Instant;

use crate::store::{Owner, Seen};

/// One reading of the store.
#[derive(Debug, Clone, Default)]
pub struct View {
    /// Each cluster's phase, by name.
    pub clusters: HashMap<String, ClusterPhase>,
    /// Each lease, by cluster.
    pub owners: HashMap<String, Owner>,
    /// The store's clock at the reading (Unix ms).
    pub now: i64,
    /// This host's monotonic clock at the reading (`None`: nothing read yet).
    pub read_at: Option<Instant>,
}

impl View {
    /// Cluster `name`'s lease as of now: the store's clock at the reading, moved on by
    /// the time this host's monotonic clock counted since (a rate, not an offset: no
    /// host's wall clock enters).
    pub fn lease(&self, name: &str) -> Seen {
        let since = self.read_at.map_or(0, |t| {
            i64::try_from(t.elapsed().as_millis()).unwrap_or(i64::MAX)
        });
        Seen {
            owner: self.owners.get(name).cloned(),
            now: self.now.saturating_add(since),
        }
    }

    /// Whether the store said cluster `name` runs (not hibernating, not being deleted).
    pub fn active(&self, name: &str) -> bool {
        self.clusters.get(name) == Some(&ClusterPhase::Active)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_lease_is_read_at_the_stores_time_moved_on_by_this_hosts_monotonic_clock() {
        let v = View {
            clusters: HashMap::from([
                ("a".to_string(), ClusterPhase::Active),
                ("h".to_string(), ClusterPhase::Hibernating),
            ]),
            owners: HashMap::from([(
                "a".to_string(),
                Owner {
                    host: "h1".into(),
                    fence: 3,
                    expires_at: 10_000,
                },
            )]),
            now: 5_000,
            read_at: Some(Instant::now()),
        };
        tokio::time::advance(std::time::Duration::from_millis(1_500)).await;
        let seen = v.lease("a");
        assert_eq!(seen.now, 6_500);
        assert_eq!(
            seen.owner.map(|o| (o.host, o.fence)),
            Some(("h1".into(), 3))
        );
        assert_eq!(v.lease("b").owner, None);
        assert!(v.active("a") && !v.active("h") && !v.active("gone"));
        assert_eq!(View::default().lease("a").now, 0);
    }
}
