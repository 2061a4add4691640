//! `[certificates]`: how long the certificates the broker makes live, and when it issues a
//! leaf again.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::durations::{HumanDuration, days_compat};
use super::{ConfigError, err};
use crate::pki::Lifetimes;

/// `[certificates]`: lifetimes of what the broker's authorities make -- each cluster's CAs
/// (its own, its front-proxy's, its etcd's) and the certificates its components use, the
/// front's and the fleet's CAs and the front's serving certificate. kubeadm's by default. A
/// leaf with less than `renew_before` left is issued again at its control plane's next
/// start, or by its awake period, which restarts the control plane with the front holding
/// requests (docs/operations.md, "Certificates"). A CA already made keeps its validity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Certificates {
    /// How long a new CA lives.
    #[serde(with = "days_compat")]
    #[schemars(with = "HumanDuration")]
    pub ca_validity: Duration,
    /// How long a leaf certificate lives (never past its CA's end).
    #[serde(with = "days_compat")]
    #[schemars(with = "HumanDuration")]
    pub leaf_validity: Duration,
    /// A leaf with less than this left is issued again; under `leaf_validity`.
    #[serde(with = "days_compat")]
    #[schemars(with = "HumanDuration")]
    pub renew_before: Duration,
}

impl Certificates {
    /// The defaults: what need not be written (an older broker knows no `[certificates]`).
    pub fn is_default(&self) -> bool {
        *self == Certificates::default()
    }

    pub fn lifetimes(&self) -> Lifetimes {
        Lifetimes {
            ca: self.ca_validity,
            leaf: self.leaf_validity,
            renew_before: self.renew_before,
        }
    }

    /// A leaf of at least a minute, outliving its margin, within its CA's life.
    pub(super) fn check(&self, o: &impl Fn(&str) -> String) -> Result<(), ConfigError> {
        if self.leaf_validity < Duration::from_secs(60) {
            return Err(err(&o("certificates.leaf_validity"), "must be at least 1m"));
        }
        if self.renew_before >= self.leaf_validity {
            return Err(err(
                &o("certificates.renew_before"),
                format!(
                    "must be under certificates.leaf_validity ({}): every leaf would be \
                     issued again at every look",
                    humantime::format_duration(self.leaf_validity)
                ),
            ));
        }
        if self.ca_validity < self.leaf_validity {
            return Err(err(
                &o("certificates.ca_validity"),
                format!(
                    "must be at least certificates.leaf_validity ({})",
                    humantime::format_duration(self.leaf_validity)
                ),
            ));
        }
        Ok(())
    }
}

impl Default for Certificates {
    fn default() -> Certificates {
        let l = Lifetimes::KUBEADM;
        Certificates {
            ca_validity: l.ca,
            leaf_validity: l.leaf,
            renew_before: l.renew_before,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<crate::config::Config, ConfigError> {
        let dir = std::env::temp_dir().join(format!(
            "sw-cfg-certs-{}-{}",
            std::process::id(),
            text.len()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("broker.toml");
        std::fs::write(&f, text).unwrap();
        let c = crate::config::Config::load(Some(&f), |_| None);
        let _ = std::fs::remove_dir_all(dir);
        c
    }

    #[test]
    fn kubeadms_lifetimes_written_in_days_and_bad_ones_named() {
        let c = load("").unwrap();
        assert_eq!(c.certificates.lifetimes(), Lifetimes::KUBEADM);
        let c = load("[certificates]\nleaf_validity = \"3m\"\nrenew_before = \"2m\"\n").unwrap();
        assert_eq!(c.certificates.leaf_validity, Duration::from_secs(180));
        let written = toml::to_string(&Certificates::default()).unwrap();
        assert!(written.contains("ca_validity = \"3650d\""), "{written}");
        assert!(written.contains("renew_before = \"90d\""), "{written}");
        for (text, key) in [
            ("renew_before = \"365d\"", "certificates.renew_before"),
            ("leaf_validity = \"30s\"", "certificates.leaf_validity"),
            ("ca_validity = \"100d\"", "certificates.ca_validity"),
        ] {
            let e = load(&format!("[certificates]\n{text}\n")).unwrap_err();
            assert_eq!(e.source_name, key, "{e}");
        }
    }
}
