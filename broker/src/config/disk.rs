//! `[disk]`: the disk guard's floors for the state directory's filesystem.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use socialweb_broker_core::disk::Floor;

/// `[disk]`: below either floor on the state directory's filesystem the broker creates no
/// cluster and wakes none (each refused with the floor named); awake clusters go on, and
/// nothing written is touched. The free space is a metric
/// (`socialweb_broker_state_disk_free_bytes`) and an alert either way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Disk {
    /// The MiB the state directory's filesystem keeps free for the clusters that run (their
    /// datastores, logs and the store grow there). 0: no floor.
    pub min_free_mib: u64,
    /// The inodes it keeps free. 0: no floor.
    pub min_free_inodes: u64,
}

impl Disk {
    /// The defaults: what need not be written (an older broker knows no `[disk]`).
    pub fn is_default(&self) -> bool {
        *self == Disk::default()
    }

    /// The floors, for the core's rule.
    pub fn floor(&self) -> Floor {
        Floor {
            min_free_bytes: self.min_free_mib.saturating_mul(1 << 20),
            min_free_inodes: self.min_free_inodes,
        }
    }
}

impl Default for Disk {
    fn default() -> Disk {
        Disk {
            min_free_mib: 1024,
            min_free_inodes: 10_000,
        }
    }
}
