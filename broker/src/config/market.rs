//! `[market]`: the providers the broker rents nodes from (docs/market.md), and how it
//! reaches them.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::durations::{HumanDuration, humantime_serde_compat};

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Market {
    /// One provider's base URL (a provider named `market`); `providers` names several.
    /// Neither: the embedded local provider.
    pub url: Option<String>,
    /// That provider's key, for an `https://` `url` (as `providers[].pin`).
    pub pin: Option<String>,
    /// The providers the broker rents from: every RFP goes to each, and the best bid wins.
    pub providers: Vec<ProviderRef>,
    /// How long to wait for bids on an RFP.
    #[serde(with = "humantime_serde_compat")]
    #[schemars(with = "HumanDuration")]
    pub bid_deadline: Duration,
    /// How long a lease may stay `booting` before it is given up.
    #[serde(with = "humantime_serde_compat")]
    #[schemars(with = "HumanDuration")]
    pub boot_timeout: Duration,
    /// Per-request timeout of the market client.
    #[serde(with = "humantime_serde_compat")]
    #[schemars(with = "HumanDuration")]
    pub request_timeout: Duration,
    /// The nodes this broker rents: `namespace` (network namespaces on the provider's
    /// host, for trusted tenants only: see `access.tenants_trusted`) or `vm`. RFPs ask for
    /// at least this; a provider with less does not bid.
    #[schemars(with = "String")]
    pub isolation: socialweb_market::Isolation,
    /// The node image RFPs name, so a provider boots exactly it: a node image directory
    /// (its `nodeimage.json`'s fingerprint is read at start) or a fingerprint
    /// (`sha256:<64 hex>`) or name (`socialweb-node-<16 hex>`). Default: the embedded
    /// provider's `local_provider.image`, else `local` (a provider's own binaries).
    pub image: Option<String>,
}

/// A provider of the market, as `[[market.providers]]` names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProviderRef {
    /// How the broker calls it (in its records and messages): 1-32 of a-z, 0-9, '-'.
    pub name: String,
    /// Its base URL: `https://...` (mutual TLS; plain `http://` only on loopback).
    pub url: String,
    /// The provider's key, as `socialweb-broker provider-pin` prints it on its machine
    /// (`sha256:<hex>`): required for `https://`; the broker talks to no other key there.
    #[serde(default)]
    pub pin: Option<String>,
    /// The region its nodes run in, in the operator's word (a label value): it stands for
    /// the region the provider's offer names, which is only checked against it (an offer
    /// that says otherwise is logged; this is kept). Unset: the offer's word.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// The zone its nodes run in, in the operator's word, as `region` (docs/scale.md,
    /// "Zones"). Unset: the offer's word.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
}

impl Default for Market {
    fn default() -> Market {
        Market {
            url: None,
            pin: None,
            providers: Vec::new(),
            bid_deadline: Duration::from_secs(5),
            boot_timeout: Duration::from_secs(300),
            request_timeout: Duration::from_secs(10),
            isolation: socialweb_market::Isolation::Namespace,
            image: None,
        }
    }
}
