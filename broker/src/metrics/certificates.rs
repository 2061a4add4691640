//! When the certificates the broker made end (docs/operations.md, "Certificates"): the
//! earliest end among the CAs and among the leaves of the clusters this host ran and of its
//! front, as each was last seen (a cluster's at each awake period's start, after its start
//! renewed what was due; the front's at each of its renewal looks).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::pki::Expiry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

/// The certificates' families; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Certificates {
    earliest: Family<KindLabel, Gauge>,
    /// Each holder's last look (`front`, or a cluster's name).
    seen: Arc<Mutex<BTreeMap<String, Expiry>>>,
}

fn unix(t: Option<SystemTime>) -> i64 {
    t.and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

impl Certificates {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "certificate_earliest_expiry_timestamp_seconds",
            "When the first of the broker's certificates ends (Unix time), CAs (kind=ca) and leaves (kind=leaf) apart; 0 while none is known",
            self.earliest.clone(),
        );
    }

    /// `holder`'s certificates end as `expiry` says.
    pub fn seen(&self, holder: &str, expiry: Expiry) {
        let mut seen = self.seen.lock().expect("lock");
        seen.insert(holder.to_string(), expiry);
        self.set(&seen);
    }

    /// A deleted cluster's certificates are gone.
    pub fn forget(&self, holder: &str) {
        let mut seen = self.seen.lock().expect("lock");
        if seen.remove(holder).is_some() {
            self.set(&seen);
        }
    }

    fn set(&self, seen: &BTreeMap<String, Expiry>) {
        let all = seen.values().fold(Expiry::default(), |a, b| a.min(*b));
        for (kind, t) in [("ca", all.ca), ("leaf", all.leaf)] {
            self.earliest
                .get_or_create(&KindLabel { kind })
                .set(unix(t));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_earliest_of_every_holder_and_a_forgotten_one_leaves() {
        let c = Certificates::default();
        let at = |s| Some(SystemTime::UNIX_EPOCH + Duration::from_secs(s));
        let value = |kind| c.earliest.get_or_create(&KindLabel { kind }).get();
        c.seen(
            "front",
            Expiry {
                ca: at(1000),
                leaf: at(500),
            },
        );
        c.seen(
            "a",
            Expiry {
                ca: at(900),
                leaf: at(600),
            },
        );
        assert_eq!((value("ca"), value("leaf")), (900, 500));
        c.seen(
            "a",
            Expiry {
                ca: at(900),
                leaf: at(100),
            },
        );
        assert_eq!(value("leaf"), 100, "renewed or not, the last look counts");
        c.forget("a");
        assert_eq!((value("ca"), value("leaf")), (1000, 500));
        c.forget("front");
        assert_eq!((value("ca"), value("leaf")), (0, 0));
    }
}
