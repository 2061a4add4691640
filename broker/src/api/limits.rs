//! The gateway API's request rates (docs/security.md): per source address before anything
//! is verified (a stranger's tokens cost DID resolutions and signature checks), per DID
//! once its token is good, and createCluster calls per DID an hour (each starts a control
//! plane). Keyed GCRA buckets ([`governor`]); an IPv6 source counts by its /64, which one
//! host can fill. Idle keys are forgotten by [`Rates::sweep`].

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

/// The rates, from `[access]`.
#[derive(Debug, Clone, Copy)]
pub struct RateSettings {
    pub per_source_per_minute: u32,
    pub per_did_per_minute: u32,
    pub creates_per_did_per_hour: u32,
}

/// The limiters.
#[derive(Debug)]
pub struct Rates {
    source: DefaultKeyedRateLimiter<IpAddr>,
    did: DefaultKeyedRateLimiter<String>,
    creates: DefaultKeyedRateLimiter<String>,
}

/// A refusal: what was exceeded, and when to try again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exceeded {
    pub what: &'static str,
    pub retry_after: Duration,
}

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN)
}

fn check<K: std::hash::Hash + Eq + Clone>(
    l: &DefaultKeyedRateLimiter<K>,
    key: &K,
    what: &'static str,
) -> Result<(), Exceeded> {
    l.check_key(key).map_err(|not_until| Exceeded {
        what,
        retry_after: not_until.wait_time_from(DefaultClock::default().now()),
    })
}

impl Rates {
    pub fn new(s: RateSettings) -> Rates {
        Rates {
            source: RateLimiter::keyed(Quota::per_minute(nz(s.per_source_per_minute))),
            did: RateLimiter::keyed(Quota::per_minute(nz(s.per_did_per_minute))),
            creates: RateLimiter::keyed(Quota::per_hour(nz(s.creates_per_did_per_hour))),
        }
    }

    /// One request from `ip`, before its token is looked at.
    pub fn source(&self, ip: IpAddr) -> Result<(), Exceeded> {
        check(
            &self.source,
            &socialweb_broker_core::source::source_key(ip),
            "requests from this address (access.requests_per_minute_per_source)",
        )
    }

    /// One request of `did`, its token verified.
    pub fn did(&self, did: &str) -> Result<(), Exceeded> {
        check(
            &self.did,
            &did.to_string(),
            "requests of this DID (access.requests_per_minute_per_did)",
        )
    }

    /// One createCluster of `did`.
    pub fn create(&self, did: &str) -> Result<(), Exceeded> {
        check(
            &self.creates,
            &did.to_string(),
            "createCluster calls of this DID (access.creates_per_hour_per_did)",
        )
    }

    /// Forgets keys whose buckets are full again (they are what a fresh key would be).
    pub fn sweep(&self) {
        self.source.retain_recent();
        self.did.retain_recent();
        self.creates.retain_recent();
    }

    /// Keys held, for the metrics and the tests.
    pub fn keys(&self) -> usize {
        self.source.len() + self.did.len() + self.creates.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_key_has_its_own_budget_and_an_ipv6_host_counts_by_its_64() {
        let r = Rates::new(RateSettings {
            per_source_per_minute: 2,
            per_did_per_minute: 1,
            creates_per_did_per_hour: 1,
        });
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        assert!(r.source(a).is_ok() && r.source(a).is_ok());
        let e = r.source(a).unwrap_err();
        assert!(e.what.contains("requests_per_minute_per_source"), "{e:?}");
        assert!(e.retry_after > Duration::ZERO && e.retry_after <= Duration::from_secs(30));
        assert!(
            r.source("192.0.2.2".parse().unwrap()).is_ok(),
            "another address"
        );
        let (v1, v2): (IpAddr, IpAddr) = (
            "2001:db8:1:2::1".parse().unwrap(),
            "2001:db8:1:2:ffff::9".parse().unwrap(),
        );
        assert!(r.source(v1).is_ok() && r.source(v2).is_ok());
        assert!(r.source(v1).is_err(), "one /64 shares a budget");
        assert!(r.did("did:key:a").is_ok());
        assert!(r.did("did:key:a").is_err());
        assert!(r.did("did:key:b").is_ok());
        assert!(r.create("did:key:a").is_ok());
        assert!(
            r.create("did:key:a")
                .unwrap_err()
                .what
                .contains("creates_per_hour")
        );
    }
}
