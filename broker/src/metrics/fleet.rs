//! A fleet host's ownership, as metrics (docs/operations.md, "A fleet"): how many clusters
//! it runs, the leases it claimed and took over, those it lost (its control plane killed),
//! the connections it closed at the store as it started a cluster, and how long renewals
//! take -- the figure that, past 0.7 of `fleet.lease_ttl`, kills healthy clusters.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The fleet's families; cheap to clone.
#[derive(Debug, Clone)]
pub struct Fleet {
    owned: Gauge,
    claims: Counter,
    takeovers: Counter,
    lost: Counter,
    fenced_connections: Counter,
    renew_seconds: Histogram,
    cut_off: Gauge,
}

impl Default for Fleet {
    fn default() -> Fleet {
        Fleet {
            owned: Gauge::default(),
            claims: Counter::default(),
            takeovers: Counter::default(),
            lost: Counter::default(),
            fenced_connections: Counter::default(),
            renew_seconds: Histogram::new([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5]),
            cut_off: Gauge::default(),
        }
    }
}

impl Fleet {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "fleet_owned_clusters",
            "Clusters whose lease this host holds",
            self.owned.clone(),
        );
        r.register(
            "fleet_claims",
            "Leases this host claimed (a new cluster, a wake, a takeover)",
            self.claims.clone(),
        );
        r.register(
            "fleet_takeovers",
            "Claims of a lease another host held and let expire",
            self.takeovers.clone(),
        );
        r.register(
            "fleet_leases_lost",
            "Leases lost while held (not renewed in time, or taken): the control plane killed",
            self.lost.clone(),
        );
        r.register(
            "fleet_fenced_connections",
            "Connections to a cluster's database closed as this host started it (a former owner's)",
            self.fenced_connections.clone(),
        );
        r.register(
            "fleet_renew_seconds",
            "Time one lease renewal takes at the store",
            self.renew_seconds.clone(),
        );
        r.register(
            "fleet_cut_off",
            "1 while no peer of the fleet reaches this host and they reach each other: it gives its clusters up",
            self.cut_off.clone(),
        );
    }

    /// A claim won; `from_another`: over another host's expired lease.
    pub fn claimed(&self, from_another: bool) {
        self.claims.inc();
        self.owned.inc();
        if from_another {
            self.takeovers.inc();
        }
    }

    /// A held lease ended (released or lost); `lost`: not by this host's choice.
    pub fn ended(&self, lost: bool) {
        self.owned.dec();
        if lost {
            self.lost.inc();
        }
    }

    pub fn fenced(&self, connections: u64) {
        self.fenced_connections.inc_by(connections);
    }

    pub fn cut_off(&self, cut: bool) {
        self.cut_off.set(i64::from(cut));
    }

    pub fn renewed(&self, seconds: f64) {
        self.renew_seconds.observe(seconds);
    }
}
