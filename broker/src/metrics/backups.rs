//! Scheduled backups (`[backup]`), as metrics: how many were taken and failed, when the last
//! one finished, and how often they should (for the alert on a stale one).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The scheduled backups' families; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Backups {
    taken: Counter,
    failed: Counter,
    last: Gauge,
    interval: Gauge,
}

impl Backups {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "backups",
            "Scheduled backups finished (and their command run, if any)",
            self.taken.clone(),
        );
        r.register(
            "backup_failures",
            "Scheduled backups that failed, or whose command failed",
            self.failed.clone(),
        );
        r.register(
            "last_backup_timestamp_seconds",
            "When the last scheduled backup finished, or the schedule began (Unix seconds)",
            self.last.clone(),
        );
        r.register(
            "backup_interval_seconds",
            "backup.interval (0: no scheduled backups)",
            self.interval.clone(),
        );
    }

    /// The schedule began at `unix_secs`: the staleness alert counts from there until
    /// the first backup.
    pub fn scheduled(&self, every: std::time::Duration, unix_secs: u64) {
        self.interval
            .set(i64::try_from(every.as_secs()).unwrap_or(i64::MAX));
        self.last.set(i64::try_from(unix_secs).unwrap_or(i64::MAX));
    }

    /// A backup finished at `unix_secs`.
    pub fn taken(&self, unix_secs: u64) {
        self.taken.inc();
        self.last.set(i64::try_from(unix_secs).unwrap_or(i64::MAX));
    }

    pub fn failed(&self) {
        self.failed.inc();
    }
}
