//! `[node]`: the node size rented when no provider says its shapes. The value is
//! [`NodeSize`], a pure crate's type; this module gives it its schema and its checks.

use schemars::JsonSchema;
use serde::Serialize;

use super::{ConfigError, NodeSize, err};

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

/// A node the size says can boot Kubernetes: a CPU, 256 MiB of memory, 1024 MiB of disk.
pub(super) fn check(node: &NodeSize, o: &impl Fn(&str) -> String) -> Result<(), ConfigError> {
    if node.vcpu < 1 {
        return Err(err(&o("node.vcpu"), "must be at least 1"));
    }
    if node.mem_mib < 256 {
        return Err(err(
            &o("node.memMiB"),
            format!(
                "{} MiB is too small for a node (at least 256)",
                node.mem_mib
            ),
        ));
    }
    if node.disk_mib < 1024 {
        return Err(err(
            &o("node.diskMiB"),
            format!(
                "{} MiB is too small for a node (at least 1024)",
                node.disk_mib
            ),
        ));
    }
    Ok(())
}
