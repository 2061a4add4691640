//! The store's view against the provider's (broker-notes: "reconcile against the provider's
//! own view"): what to fix, as a list the driver carries out. Run on start for every lease
//! of this broker, and periodically per cluster; the same rules both times.
//!
//! - A live lease of this broker that no live provision owns is an orphan (a crash before
//!   the provision was written, or a cluster deleted while the broker was down): release it.
//! - A provision the store thinks is live (booting, running, joined) whose lease the
//!   provider does not have, or has ended, is failed: the decision plans again.
//! - A joined node may still be cordoned by a release that a crash cut short: lift our
//!   cordon (the driver skips provisions it has a task for, which may be releasing).

use socialweb_market::Lease;

use crate::records::{Provision, Step};

/// The tag every RFP and lease of a broker carries: its identity.
pub const BROKER_TAG: &str = "broker";

/// One thing to fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fix {
    /// Release this lease at the provider.
    Release { lease: String, why: String },
    /// Fail this provision (its lease is gone or ended at the provider).
    Fail { provision: String, why: String },
    /// Lift the broker's cordon of this provision's node, if it has one.
    Uncordon { provision: String, node: String },
}

/// The fixes for `leases` (as the provider lists them) against `provisions` (the store's),
/// for the broker whose identity is `broker`. Leases of other brokers are none of ours.
pub fn reconcile(broker: &str, leases: &[Lease], provisions: &[Provision]) -> Vec<Fix> {
    let ours: Vec<&Lease> = leases
        .iter()
        .filter(|l| l.tags.get(BROKER_TAG).is_some_and(|b| b == broker))
        .collect();
    let mut fixes = Vec::new();
    for l in ours.iter().filter(|l| l.state.live()) {
        let owners: Vec<&Provision> = provisions.iter().filter(|p| p.lease_id == l.id).collect();
        if owners.iter().any(|p| !p.state.ended()) {
            continue;
        }
        let why = match owners.last() {
            None => "no provision of this broker owns it (its cluster is gone, or the broker \
                     crashed before writing it)"
                .to_string(),
            Some(p) => format!("its provision of {} is {}", p.node, p.state.as_str()),
        };
        fixes.push(Fix::Release {
            lease: l.id.clone(),
            why: format!("lease {} at the provider: {why}", l.id),
        });
    }
    for p in provisions
        .iter()
        .filter(|p| matches!(p.state, Step::Booting | Step::Running | Step::Joined))
    {
        let why = match ours.iter().find(|l| l.id == p.lease_id) {
            None => Some(format!("the provider does not have lease {}", p.lease_id)),
            Some(l) if !l.state.live() => Some(format!(
                "lease {} is {} at the provider{}",
                l.id,
                l.state.as_str(),
                l.reason
                    .as_ref()
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default()
            )),
            Some(_) => None,
        };
        match why {
            Some(why) => fixes.push(Fix::Fail {
                provision: p.id.clone(),
                why,
            }),
            None if p.state == Step::Joined => fixes.push(Fix::Uncordon {
                provision: p.id.clone(),
                node: p.node.clone(),
            }),
            None => {}
        }
    }
    fixes
}

#[cfg(test)]
mod tests {
    use super::*;
    use socialweb_market::LeaseState;
    use std::collections::BTreeMap;

    fn lease(id: &str, broker: &str, state: LeaseState) -> Lease {
        Lease {
            id: id.into(),
            rfp_id: format!("r-{id}"),
            bid_id: format!("b-{id}"),
            state,
            reason: (state == LeaseState::Failed).then(|| "the machine died".into()),
            tags: BTreeMap::from([(BROKER_TAG.to_string(), broker.to_string())]),
            node_addr: None,
            created_at: String::new(),
            updated_at: String::new(),
        }
    }

    fn prov(id: &str, lease: &str, state: Step) -> Provision {
        Provision {
            id: id.into(),
            cluster: "c".into(),
            node: format!("c-{id}"),
            state,
            rfp_id: String::new(),
            bid_id: None,
            lease_id: lease.into(),
            provider: None,
            token_id: String::new(),
            token_secret: String::new(),
            mesh_key: String::new(),
            endpoint: String::new(),
            node_ip: None,
            spec: None,
            topology: Default::default(),
            reason: None,
            attempts: 0,
            created_at: 0,
            updated_at: 0,
        }
    }

    #[test]
    fn agreeing_views_need_nothing_but_the_cordon_check() {
        let leases = [lease("l1", "me", LeaseState::Running)];
        let provs = [prov("p1", "l1", Step::Joined)];
        assert_eq!(
            reconcile("me", &leases, &provs),
            [Fix::Uncordon {
                provision: "p1".into(),
                node: "c-p1".into()
            }]
        );
        let provs = [prov("p1", "l1", Step::Booting)];
        assert_eq!(reconcile("me", &leases, &provs), []);
    }

    #[test]
    fn orphans_are_released_and_other_brokers_leases_left_alone() {
        let leases = [
            lease("nobody", "me", LeaseState::Running),
            lease("ended", "me", LeaseState::Booting),
            lease("done", "me", LeaseState::Released),
            lease("theirs", "other", LeaseState::Running),
        ];
        let provs = [prov("p2", "ended", Step::Failed)];
        let fixes = reconcile("me", &leases, &provs);
        assert_eq!(fixes.len(), 2, "{fixes:?}");
        assert!(matches!(&fixes[0], Fix::Release { lease, why }
            if lease == "nobody" && why.contains("no provision of this broker owns it")));
        assert!(matches!(&fixes[1], Fix::Release { lease, why }
            if lease == "ended" && why.contains("its provision of c-p2 is failed")));
    }

    #[test]
    fn a_lease_gone_or_ended_at_the_provider_fails_its_provision() {
        let leases = [lease("dead", "me", LeaseState::Failed)];
        let provs = [
            prov("p1", "missing", Step::Running),
            prov("p2", "dead", Step::Joined),
            // Not yet accepted: no lease is expected.
            prov("p3", "later", Step::RfpSent),
        ];
        assert_eq!(
            reconcile("me", &leases, &provs),
            [
                Fix::Fail {
                    provision: "p1".into(),
                    why: "the provider does not have lease missing".into()
                },
                Fix::Fail {
                    provision: "p2".into(),
                    why: "lease dead is failed at the provider: the machine died".into()
                },
            ]
        );
    }

    #[test]
    fn a_lease_of_another_broker_is_not_ours_to_find() {
        let leases = [lease("l1", "other", LeaseState::Running)];
        let provs = [prov("p1", "l1", Step::Running)];
        assert!(matches!(
            &reconcile("me", &leases, &provs)[..],
            [Fix::Fail { .. }]
        ));
    }

    proptest::proptest! {
        /// Whatever the two views hold, a lease a live provision owns is never released,
        /// only live leases of this broker are, and only provisions that should have a
        /// lease are failed.
        #[test]
        fn the_fixes_never_touch_what_is_in_order(
            lease_states in proptest::collection::vec((0u8..4, 0u8..6, proptest::bool::ANY), 0..12),
            prov_states in proptest::collection::vec((0usize..9, 0u8..6), 0..12),
        ) {
            let state = |s: u8| [LeaseState::Booting, LeaseState::Running, LeaseState::Failed, LeaseState::Released][s as usize];
            let leases: Vec<Lease> = lease_states.iter().enumerate()
                .map(|(i, (s, _, mine))| lease(&format!("l{i}"), if *mine { "me" } else { "other" }, state(*s)))
                .collect();
            let provs: Vec<Provision> = prov_states.iter().enumerate()
                .map(|(i, (s, l))| prov(&format!("p{i}"), &format!("l{l}"), Step::ALL[*s]))
                .collect();
            for fix in reconcile("me", &leases, &provs) {
                match fix {
                    Fix::Release { lease: id, .. } => {
                        let l = leases.iter().find(|l| l.id == id).unwrap();
                        proptest::prop_assert!(l.state.live());
                        proptest::prop_assert_eq!(l.tags.get(BROKER_TAG).unwrap(), "me");
                        proptest::prop_assert!(!provs.iter().any(|p| p.lease_id == id && !p.state.ended()));
                    }
                    Fix::Fail { provision, .. } | Fix::Uncordon { provision, .. } => {
                        let p = provs.iter().find(|p| p.id == provision).unwrap();
                        proptest::prop_assert!(matches!(p.state, Step::Booting | Step::Running | Step::Joined));
                    }
                }
            }
        }
    }
}
