//! `[node]`: the node size rented when no provider says its shapes. The value is
//! [`NodeSize`], a pure crate's type; this module gives it its schema.

use schemars::JsonSchema;
use serde::Serialize;

use super::NodeSize;

/// `[node]`, as [`NodeSize`] (a pure crate's type) reads it: its schema, with what each key
/// means. The reference's test holds it to the keys `NodeSize` writes.
#[derive(Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub(super) struct NodeSection {
    /// Virtual CPUs.
    vcpu: u32,
    /// Memory in MiB (at least 256).
    #[serde(rename = "memMiB")]
    mem_mib: u64,
    /// Disk in MiB (at least 1024).
    #[serde(rename = "diskMiB")]
    disk_mib: u64,
}

impl Default for NodeSection {
    fn default() -> NodeSection {
        let n = NodeSize::default();
        NodeSection {
            vcpu: n.vcpu,
            mem_mib: n.mem_mib,
            disk_mib: n.disk_mib,
        }
    }
}
