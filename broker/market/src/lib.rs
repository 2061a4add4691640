//! Contract 6, the market protocol, version 1: HTTP and JSON under `/v1` (docs/market.md).
//! Types and validation only, shared by the broker (the client) and the provider (the
//! server); neither side shares anything else with the other.
//!
//! Vocabulary: an RFP is Akash's order and Golem's demand, a bid their bid and proposal, a
//! lease their lease and agreement. The client chooses every id (RFP, lease) before it calls,
//! so a call repeated after a crash or a timeout is the same request, never a second one.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The path prefix of this version.
pub const PREFIX: &str = "/v1";

/// What a node must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    pub vcpu: u32,
    #[serde(rename = "memMiB")]
    pub mem_mib: u64,
    #[serde(rename = "diskMiB")]
    pub disk_mib: u64,
}

/// A request for proposals.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RfpRequest {
    /// Chosen by the client; a repeat with the same id is the same RFP.
    pub id: String,
    pub spec: NodeSpec,
    /// The node image's fingerprint (its name): what the node boots.
    pub image: String,
    /// Free-form tags the provider keeps on the RFP and the lease (the broker's identity, the
    /// cluster, the node), so the client can find its leases again.
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// How long the client waits for bids, in milliseconds.
    pub bid_deadline_ms: u64,
    /// The least isolation the node must have from its provider's host and other guests;
    /// a provider whose nodes have less does not bid (docs/security.md).
    #[serde(default)]
    pub isolation: Isolation,
}

/// How a node is kept apart from its provider's host and other guests, least first.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    /// Network namespaces on the provider's host: its kernel, its root, its filesystem.
    /// For tenants the provider trusts.
    #[default]
    Namespace,
    /// A virtual machine: its own kernel.
    Vm,
}

impl Isolation {
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Namespace => "namespace",
            Isolation::Vm => "vm",
        }
    }
}

impl NodeSpec {
    /// Whether a node of `self` holds `other` (every dimension at least as large).
    pub fn holds(&self, other: &NodeSpec) -> bool {
        self.vcpu >= other.vcpu && self.mem_mib >= other.mem_mib && self.disk_mib >= other.disk_mib
    }

    /// The shape's name as nodes carry it (`node.kubernetes.io/instance-type`): `2vcpu-4096mib`.
    pub fn instance_type(&self) -> String {
        format!("{}vcpu-{}mib", self.vcpu, self.mem_mib)
    }

    /// Checks the ranges both sides accept; the error names `field`'s part.
    pub fn validate(&self, field: &str) -> Result<(), String> {
        if self.vcpu == 0 || self.vcpu > 1024 {
            return Err(format!("{field}.vcpu: {} is not 1-1024", self.vcpu));
        }
        if self.mem_mib == 0 || self.mem_mib > 1 << 24 {
            return Err(format!("{field}.memMiB: {} is out of range", self.mem_mib));
        }
        if self.disk_mib == 0 || self.disk_mib > 1 << 30 {
            return Err(format!(
                "{field}.diskMiB: {} is out of range",
                self.disk_mib
            ));
        }
        Ok(())
    }
}

/// A node size a provider rents, and its price.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shape {
    pub spec: NodeSpec,
    /// Millionths of the provider's currency unit per hour.
    pub price_micros_per_hour: u64,
}

/// `GET /v1/offer` answer: what a provider rents, so that a client can size its RFPs (an
/// RFP for a spec no shape holds gets no bid). A provider bids on an RFP at the price of its
/// cheapest shape that holds the spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Offer {
    pub provider: String,
    pub isolation: Isolation,
    /// As in bids (`namespace`, `vm/kvm`, `vm/tcg`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    pub shapes: Vec<Shape>,
    /// Nodes it could start now.
    pub free: u32,
    /// Where its nodes run, as their Nodes' `topology.kubernetes.io/region` and `zone`
    /// labels say (docs/market.md); a provider that does not say rents nodes that carry
    /// neither.
    #[serde(default, flatten)]
    pub topology: Topology,
}

/// Where a provider's nodes run: the region and zone its offer names, which its nodes carry
/// as the well-known labels (`topology.kubernetes.io/region`, `.../zone`), so that a Pod's
/// zone spread and affinity can be met.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Topology {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
}

impl Topology {
    pub fn is_empty(&self) -> bool {
        self.region.is_none() && self.zone.is_none()
    }

    /// Checks that each part is a label value a Node may carry; the error names it.
    pub fn validate(&self) -> Result<(), String> {
        for (field, v) in [("region", &self.region), ("zone", &self.zone)] {
            if let Some(v) = v
                && !valid_label_value(v)
            {
                return Err(format!(
                    "{field}: {v:?} is not a label value (1-63 of A-Z a-z 0-9 - _ ., \
                     alphanumeric at both ends)"
                ));
            }
        }
        Ok(())
    }
}

impl std::fmt::Display for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.region, &self.zone) {
            (None, None) => f.write_str("no region or zone"),
            (Some(r), None) => write!(f, "region {r}"),
            (None, Some(z)) => write!(f, "zone {z}"),
            (Some(r), Some(z)) => write!(f, "region {r}, zone {z}"),
        }
    }
}

/// Whether `v` is a non-empty Kubernetes label value: at most 63 characters of
/// `[A-Za-z0-9._-]`, beginning and ending with an alphanumeric one.
pub fn valid_label_value(v: &str) -> bool {
    let b = v.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// The most shapes an offer may list (a provider is another party).
pub const MAX_SHAPES: usize = 64;

impl Offer {
    /// Checks what a client must not trust blindly; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        if self.shapes.is_empty() || self.shapes.len() > MAX_SHAPES {
            return Err(format!(
                "shapes: {} listed, not 1-{MAX_SHAPES}",
                self.shapes.len()
            ));
        }
        for (i, s) in self.shapes.iter().enumerate() {
            s.spec.validate(&format!("shapes[{i}].spec"))?;
        }
        if self.provider.is_empty() || self.provider.len() > 253 {
            return Err("provider: must be 1-253 characters".into());
        }
        self.topology.validate()
    }

    /// The cheapest shape that holds `spec` (the smaller of two at one price), if any.
    pub fn cheapest_holding(&self, spec: &NodeSpec) -> Option<&Shape> {
        cheapest_holding(&self.shapes, spec)
    }
}

/// The cheapest of `shapes` that holds `spec` (the smaller of two at one price), if any.
pub fn cheapest_holding<'a>(shapes: &'a [Shape], spec: &NodeSpec) -> Option<&'a Shape> {
    shapes
        .iter()
        .filter(|s| s.spec.holds(spec))
        .min_by_key(|s| {
            (
                s.price_micros_per_hour,
                s.spec.vcpu,
                s.spec.mem_mib,
                s.spec.disk_mib,
            )
        })
}

/// An offer to run a node for an RFP.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bid {
    pub id: String,
    pub rfp_id: String,
    pub provider: String,
    /// Price in millionths of the provider's currency unit per hour.
    pub price_micros_per_hour: u64,
    /// How long the provider expects the node to take to boot, in milliseconds.
    pub eta_ms: u64,
    /// What the node will be, for the client's records: `namespace`, `vm/kvm`, `vm/tcg`
    /// (the VM's accelerator). Optional: a provider may not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    /// RFC 3339; accepting after it fails.
    pub expires_at: String,
}

/// An RFP as the provider holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rfp {
    pub id: String,
    /// `open` while it takes acceptances, `closed` once one was accepted or it expired.
    pub state: String,
    pub bids: Vec<Bid>,
}

/// Accepting a bid: the lease id the client chose and the node's identity document, which
/// the provider hands to the node read-only (contract 1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Accept {
    pub lease_id: String,
    pub identity: serde_json::Value,
}

/// Where a lease is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseState {
    Booting,
    Running,
    Failed,
    Released,
}

impl LeaseState {
    /// Whether the node exists (is paid for): booting or running.
    pub fn live(self) -> bool {
        matches!(self, LeaseState::Booting | LeaseState::Running)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            LeaseState::Booting => "booting",
            LeaseState::Running => "running",
            LeaseState::Failed => "failed",
            LeaseState::Released => "released",
        }
    }
}

/// A lease as the provider holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub id: String,
    pub rfp_id: String,
    pub bid_id: String,
    pub state: LeaseState,
    /// Why it failed or was released.
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// The node's address, once known (for the operator; the broker does not need it).
    #[serde(default)]
    pub node_addr: Option<String>,
    pub created_at: String,
    pub updated_at: String,
}

/// `GET /v1/leases` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseList {
    pub leases: Vec<Lease>,
}

/// Every error answer: `{"error": {"code": ..., "message": ...}}` with a 4xx or 5xx status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// `bad_request`, `not_found`, `conflict`, `expired`, `no_capacity`, `image_not_held`,
    /// `internal`.
    pub code: String,
    pub message: String,
}

/// What [`valid_id`] accepts, for error messages.
pub const ID_RULE: &str = "1-64 of [A-Za-z0-9_-], the first a letter or digit";

/// An id as both sides accept it: 1 to 64 of `[A-Za-z0-9_-]`, the first a letter or digit (a
/// UUID fits). No dot and no slash: a provider names files after ids, and an id must never be
/// a path component such as `.` or `..` (one lease id `.` made a provider remove every
/// other lease's machine directory).
pub fn valid_id(s: &str) -> bool {
    s.len() <= 64
        && s.as_bytes().first().is_some_and(u8::is_ascii_alphanumeric)
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
}

impl RfpRequest {
    /// Checks what the provider must not trust blindly; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        if !valid_id(&self.id) {
            return Err(format!("id: {:?} is not {ID_RULE}", self.id));
        }
        self.spec.validate("spec")?;
        if self.image.is_empty() || self.image.len() > 256 {
            return Err("image: must be 1-256 characters".into());
        }
        if self.tags.len() > 32
            || self
                .tags
                .iter()
                .any(|(k, v)| k.is_empty() || k.len() > 63 || v.len() > 253)
        {
            return Err("tags: at most 32, keys 1-63 and values up to 253 characters".into());
        }
        if self.bid_deadline_ms == 0 || self.bid_deadline_ms > 3_600_000 {
            return Err(format!(
                "bid_deadline_ms: {} is not 1 ms - 1 h",
                self.bid_deadline_ms
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_never_a_path_component() {
        for ok in ["6f1c0b2e-8c1a-4c55-9d3e-0a2b4c6d8e0f", "r-1", "a", "A_b-9"] {
            assert!(valid_id(ok), "{ok}");
        }
        let long = "a".repeat(65);
        for bad in [
            "",
            ".",
            "..",
            ".x",
            "-x",
            "_x",
            "a/b",
            "a.b",
            "a b",
            "é",
            long.as_str(),
        ] {
            assert!(!valid_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn documents_round_trip_and_unknown_fields_are_refused() {
        let r: RfpRequest = serde_json::from_value(serde_json::json!({
            "id": "6c0b", "spec": {"vcpu": 2, "memMiB": 4096, "diskMiB": 20480},
            "image": "sha256:abc", "tags": {"cluster": "demo"}, "bid_deadline_ms": 5000}))
        .unwrap();
        assert!(r.validate().is_ok());
        assert!(
            serde_json::from_value::<RfpRequest>(serde_json::json!({
            "id": "x", "spec": {"vcpu": 2, "memMiB": 1, "diskMiB": 1, "gpu": 1},
            "image": "i", "bid_deadline_ms": 1}))
            .is_err()
        );
        let mut bad = r.clone();
        bad.id = "../etc".into();
        assert!(bad.validate().unwrap_err().starts_with("id:"));
        bad = r;
        bad.spec.vcpu = 0;
        assert!(bad.validate().unwrap_err().starts_with("spec.vcpu"));
        assert_eq!(
            serde_json::to_value(LeaseState::Booting).unwrap(),
            serde_json::json!("booting")
        );
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_json_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400)) {
            if let Ok(r) = serde_json::from_slice::<RfpRequest>(&bytes) { let _ = r.validate(); }
            let _ = serde_json::from_slice::<Accept>(&bytes);
            let _ = serde_json::from_slice::<LeaseList>(&bytes);
            let _ = serde_json::from_slice::<Rfp>(&bytes);
            if let Ok(o) = serde_json::from_slice::<Offer>(&bytes) { let _ = o.validate(); }
        }
    }
}
