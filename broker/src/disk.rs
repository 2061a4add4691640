//! The disk guard (`[disk]`), carried out (`socialweb_broker_core::disk` decides): the
//! state directory's filesystem sampled with `statvfs` for the metrics every ten seconds,
//! and again at each create and wake, which wait while it is under a floor. What runs goes
//! on: a full disk costs new work, never the store or a cluster's data (docs/operations.md,
//! "The disk guard").

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use socialweb_broker_core::disk::{Floor, Space, short};
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// The guard of one state directory.
#[derive(Debug)]
pub struct DiskGuard {
    dir: PathBuf,
    floor: Floor,
    metrics: crate::metrics::Disk,
}

impl DiskGuard {
    pub fn new(dir: PathBuf, floor: Floor, metrics: crate::metrics::Disk) -> DiskGuard {
        DiskGuard {
            dir,
            floor,
            metrics,
        }
    }

    /// What the filesystem has free for the broker (not root's reserve).
    fn space(&self) -> nix::Result<Space> {
        let s = nix::sys::statvfs::statvfs(&self.dir)?;
        Ok(Space {
            free_bytes: s.blocks_available().saturating_mul(s.fragment_size()),
            free_inodes: s.files_available(),
        })
    }

    /// Why new work must wait now (`None`: there is room), the sample recorded. A
    /// filesystem that cannot be read is not a reason to refuse (it is logged).
    pub fn short(&self) -> Option<String> {
        match self.space() {
            Ok(space) => {
                let why = short(space, self.floor);
                self.metrics.sampled(space, why.is_some());
                why
            }
            Err(e) => {
                warn!(dir = %self.dir.display(), "the disk guard cannot read the state directory's filesystem: {e}");
                None
            }
        }
    }

    /// The refusal of `what` ("no new cluster", "not woken") when the filesystem is under
    /// a floor, counted; `None`: it may go on.
    pub fn refuse(&self, what: &str) -> Option<String> {
        let why = self.short()?;
        self.metrics.refused();
        warn!("{what}: {why}");
        Some(format!(
            "{what}: {why}; clusters that run go on (free space, or lower [disk], to go on)"
        ))
    }

    /// Samples the filesystem every ten seconds, for the metrics, until `stop`.
    pub async fn watch(self: Arc<Self>, stop: CancellationToken) {
        loop {
            let _ = self.short();
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(10)) => {}
                _ = stop.cancelled() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_directorys_filesystem_is_read_and_its_floors_applied() {
        let dir = std::env::temp_dir();
        let metrics = crate::metrics::Disk::default();
        let room = DiskGuard::new(dir.clone(), Floor::default(), metrics.clone());
        let space = room.space().unwrap();
        assert!(space.free_bytes > 0 && space.free_inodes > 0, "{space:?}");
        assert_eq!(room.refuse("no new cluster"), None);
        // A floor no filesystem here meets.
        let full = DiskGuard::new(
            dir,
            Floor {
                min_free_bytes: u64::MAX,
                min_free_inodes: 0,
            },
            metrics,
        );
        let why = full.refuse("no new cluster").unwrap();
        assert!(
            why.starts_with("no new cluster: the state directory's filesystem has"),
            "{why}"
        );
        assert!(why.contains("disk.min_free_mib"), "{why}");
        let gone = DiskGuard::new(
            "/nonexistent/state".into(),
            Floor::default(),
            Default::default(),
        );
        assert_eq!(gone.short(), None, "unreadable: logged, not refused");
    }
}
