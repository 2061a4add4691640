//! `[scale]`: the scale decision's knobs (docs/scale.md).

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::durations::{HumanDuration, humantime_serde_compat};
use super::{ConfigError, err};

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

impl Scale {
    /// The schedulers it rents for, then its bounds, refused rather than clamped: a node and
    /// a Pod a node at least, a hold longer than 0s, a consolidation of 1s at least.
    pub(super) fn check(&self, o: &impl Fn(&str) -> String) -> Result<(), ConfigError> {
        self.check_schedulers()?;
        if self.max_nodes < 1 {
            return Err(err(
                &o("scale.max_nodes"),
                "0 must be at least 1; it is refused, not clamped",
            ));
        }
        if self.pods_per_node < 1 {
            return Err(err(&o("scale.pods_per_node"), "0 must be at least 1"));
        }
        if self.max_consolidate_after < Duration::from_secs(1) {
            return Err(err("scale.max_consolidate_after", "must be at least 1s"));
        }
        if self.hold.is_zero() {
            return Err(err(&o("scale.hold"), "must be longer than 0s"));
        }
        Ok(())
    }

    /// At least one scheduler, each a name a Pod's `spec.schedulerName` can hold.
    fn check_schedulers(&self) -> Result<(), ConfigError> {
        if self.schedulers.is_empty() {
            return Err(err(
                "scale.schedulers",
                "lists no scheduler: no Pod would ever rent a node (the default is \
                 [\"default-scheduler\"])",
            ));
        }
        if let Some(bad) = self
            .schedulers
            .iter()
            .find(|n| n.is_empty() || n.len() > 253 || !n.bytes().all(|b| b.is_ascii_graphic()))
        {
            return Err(err(
                "scale.schedulers",
                format!("{bad:?} is not a scheduler name (1-253 printable characters)"),
            ));
        }
        Ok(())
    }
}
