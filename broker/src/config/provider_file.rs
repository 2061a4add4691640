//! The file `socialweb-broker provider` reads on a provider machine: some of the broker's
//! sections, with the broker's defaults.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::node::NodeSection;
use super::{Config, LocalProvider, Metrics, NodeSize};

/// What `socialweb-broker provider` reads on a provider machine: a part of the broker's
/// configuration, in the same format; the rest of a file is not read there
/// (`check-config --provider` names it).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ProviderFile {
    /// Where the provider machine keeps its key (`provider-tls/`, what `provider-pin`
    /// prints), its records and its machines' directories (`local-provider/`).
    pub state_dir: PathBuf,
    /// The Kubernetes we ship: a directory with `kube` and `pause`, which nodes run when
    /// `local_provider.image` is not set.
    pub kube_dir: PathBuf,
    /// The node size offered, at price 0, when `local_provider.shapes` is empty.
    #[schemars(with = "NodeSection")]
    pub node: NodeSize,
    /// The provider itself: where it listens, whom it serves, how it makes nodes.
    pub local_provider: LocalProvider,
    /// Where it serves `/metrics`, `/healthz` and `/readyz` (another port than the broker's
    /// when both run on one host).
    pub metrics: Metrics,
}

impl Default for ProviderFile {
    fn default() -> ProviderFile {
        let c = Config::default();
        ProviderFile {
            state_dir: c.state_dir,
            kube_dir: c.kube_dir,
            node: c.node,
            local_provider: c.local_provider,
            metrics: c.metrics,
        }
    }
}
