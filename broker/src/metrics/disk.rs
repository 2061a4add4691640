//! The state directory's filesystem, as metrics (docs/operations.md, "The disk guard"):
//! what it has free, whether the broker refuses new work for it, and how often it did.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use socialweb_broker_core::disk::Space;

/// The disk guard's families; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Disk {
    free_bytes: Gauge,
    free_inodes: Gauge,
    low: Gauge,
    refusals: Counter,
}

impl Disk {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "state_disk_free_bytes",
            "Bytes free (to the broker) on the state directory's filesystem",
            self.free_bytes.clone(),
        );
        r.register(
            "state_disk_free_inodes",
            "Inodes free (to the broker) on the state directory's filesystem",
            self.free_inodes.clone(),
        );
        r.register(
            "state_disk_low",
            "1 while the state directory's filesystem is under a [disk] floor: no new cluster, no wake",
            self.low.clone(),
        );
        r.register(
            "disk_refusals",
            "Creates and wakes refused because the state directory's filesystem was under a [disk] floor",
            self.refusals.clone(),
        );
    }

    /// A sample of the filesystem, and whether it is under a floor.
    pub fn sampled(&self, space: Space, low: bool) {
        self.free_bytes
            .set(i64::try_from(space.free_bytes).unwrap_or(i64::MAX));
        self.free_inodes
            .set(i64::try_from(space.free_inodes).unwrap_or(i64::MAX));
        self.low.set(i64::from(low));
    }

    pub fn refused(&self) {
        self.refusals.inc();
    }
}
