//! `[market]`: the providers the broker rents nodes from (docs/market.md), and how it
//! reaches them.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::durations::{HumanDuration, humantime_serde_compat};
use super::{ConfigError, err};

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

impl Market {
    /// The providers to rent from: `providers`, or `url` as one named `market`; empty: the
    /// embedded local provider.
    pub fn providers(&self) -> Vec<ProviderRef> {
        match &self.url {
            Some(url) => vec![ProviderRef {
                name: "market".into(),
                url: url.clone(),
                pin: self.pin.clone(),
                region: None,
                zone: None,
            }],
            None => self.providers.clone(),
        }
    }

    /// One way of naming the providers, each at a URL the broker can call over a transport
    /// it trusts and by a name of its own, and an image an RFP can name.
    pub(super) fn check(&self, o: &impl Fn(&str) -> String) -> Result<(), ConfigError> {
        self.check_urls(o)?;
        self.check_transport()?;
        self.check_image()?;
        self.check_names()
    }

    /// `url` or `providers`, not both, and every URL http(s).
    fn check_urls(&self, o: &impl Fn(&str) -> String) -> Result<(), ConfigError> {
        if self.url.is_some() && !self.providers.is_empty() {
            return Err(err(
                &o("market.url"),
                "give market.url (one provider) or market.providers (several), not both",
            ));
        }
        for (key, url) in self.url.iter().map(|u| (o("market.url"), u)).chain(
            self.providers
                .iter()
                .enumerate()
                .map(|(i, p)| (format!("market.providers[{i}].url"), &p.url)),
        ) {
            if url::Url::parse(url)
                .map(|u| !matches!(u.scheme(), "http" | "https"))
                .unwrap_or(true)
            {
                return Err(err(&key, format!("{url:?} is not an http(s) URL")));
            }
        }
        Ok(())
    }

    /// How the broker reaches each provider: mutual TLS with a pinned key, or plain HTTP on
    /// loopback only (docs/market.md).
    fn check_transport(&self) -> Result<(), ConfigError> {
        let key = |i: usize, f: &str| match &self.url {
            Some(_) => format!("market.{f}"),
            None => format!("market.providers[{i}].{f}"),
        };
        for (i, p) in self.providers().iter().enumerate() {
            let Ok(u) = url::Url::parse(&p.url) else {
                continue;
            };
            match (u.scheme(), &p.pin) {
                ("https", None) => {
                    return Err(err(
                        &key(i, "pin"),
                        format!(
                            "{} is https: give its key (`socialweb-broker provider-pin` on that machine prints it)",
                            p.url
                        ),
                    ));
                }
                ("https", Some(pin)) => {
                    socialweb_market_tls::parse_pin(pin)
                        .map_err(|e| err(&key(i, "pin"), e.to_string()))?;
                }
                _ => {
                    let loopback = match u.host() {
                        Some(url::Host::Ipv4(a)) => a.is_loopback(),
                        Some(url::Host::Ipv6(a)) => a.is_loopback(),
                        Some(url::Host::Domain(d)) => d == "localhost",
                        None => false,
                    };
                    if !loopback {
                        return Err(err(
                            &key(i, "url"),
                            format!(
                                "{} is plain HTTP off this host: use https:// with the provider's pin",
                                p.url
                            ),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// `image` is something an RFP can name.
    fn check_image(&self) -> Result<(), ConfigError> {
        if let Some(i) = &self.image
            && !image_ref_ok(i)
        {
            return Err(err(
                "market.image",
                format!(
                    "{i:?} is neither a directory with nodeimage.json, a fingerprint (sha256:<64 hex>), a name (socialweb-node-<16 hex>) nor \"local\""
                ),
            ));
        }
        Ok(())
    }

    /// Each provider's name is its own and can key its records; its region and zone are
    /// label values.
    fn check_names(&self) -> Result<(), ConfigError> {
        let mut names = std::collections::BTreeSet::new();
        for (i, p) in self.providers.iter().enumerate() {
            let ok = !p.name.is_empty()
                && p.name.len() <= 32
                && p.name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
            if !ok {
                return Err(err(
                    &format!("market.providers[{i}].name"),
                    format!("{:?} is not 1-32 of a-z, 0-9, '-'", p.name),
                ));
            }
            if !names.insert(p.name.as_str()) {
                return Err(err(
                    &format!("market.providers[{i}].name"),
                    format!("{:?} is named twice", p.name),
                ));
            }
            for (field, v) in [("region", &p.region), ("zone", &p.zone)] {
                if let Some(v) = v
                    && !socialweb_market::valid_label_value(v)
                {
                    return Err(err(
                        &format!("market.providers[{i}].{field}"),
                        format!("{v:?} is not a label value (1-63 of A-Z a-z 0-9 - _ .)"),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Whether `market.image` is something an RFP can name.
fn image_ref_ok(i: &str) -> bool {
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    i == "local"
        || i.strip_prefix("sha256:").is_some_and(|h| hex(h, 64))
        || i.strip_prefix("socialweb-node-")
            .is_some_and(|h| hex(h, 16))
        || std::path::Path::new(i).join("nodeimage.json").is_file()
}
