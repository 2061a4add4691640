//! `[scale]`: the scale decision's knobs (docs/scale.md).

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::durations::{HumanDuration, humantime_serde_compat};

/// The scale decision's knobs (docs/scale.md).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Scale {
    /// The most nodes a cluster has at once (a tenant's NodePool may set fewer); below 1 is
    /// refused, not clamped.
    pub max_nodes: u32,
    /// The most work Pods one node holds, whatever their requests (Pods without requests
    /// are bound by it alone).
    pub pods_per_node: u32,
    /// How long a cluster with nothing to run keeps its nodes, and an empty node stays,
    /// before they are released.
    #[serde(with = "humantime_serde_compat")]
    #[schemars(with = "HumanDuration")]
    pub hold: Duration,
    /// Pods at or below this priority are expendable: they neither rent nor keep a node.
    pub expendable_priority_cutoff: i32,
    /// The longest `consolidateAfter` a tenant's NodePool may set (longer is taken as this):
    /// how long an empty node of a tenant may hold a provider's slot.
    #[serde(with = "humantime_serde_compat")]
    #[schemars(with = "HumanDuration")]
    pub max_consolidate_after: Duration,
    /// The schedulers whose Pods rent nodes (`spec.schedulerName`): kube-scheduler's
    /// `default-scheduler`, and any other the operator runs that places Pods by the same
    /// filters. A Pod for a scheduler not listed is not the broker's to rent for
    /// (docs/scale.md).
    pub schedulers: Vec<String>,
}

impl Default for Scale {
    fn default() -> Scale {
        Scale {
            max_nodes: 10,
            pods_per_node: 8,
            hold: Duration::from_secs(120),
            expendable_priority_cutoff: -10,
            max_consolidate_after: Duration::from_secs(3600),
            schedulers: vec!["default-scheduler".into()],
        }
    }
}
