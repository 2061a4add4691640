//! Whether a fleet host is cut off from its users, from what its peers saw: each host tries
//! once a renewal period to reach every live peer's public address (the link, beside the
//! front and the tunnel), and the store keeps when each pair last succeeded. A host that
//! reaches the store but not its users would otherwise keep its leases, and its clusters
//! unserved, for ever (issue 61).
//!
//! The rule, for host `me` at the store's time `now`, over the last `window`:
//!
//! - a live peer reached `me`: [`Verdict::Reached`];
//! - else, some live host reached a peer: the fleet's network works without `me`, so `me`
//!   is [`Verdict::CutOff`] and gives its clusters up (it claims none until reached again);
//! - else nobody reached anybody (one host alone, the hosts cut from each other but maybe
//!   not from their users, two hosts each cut from the other): [`Verdict::Unknown`], and
//!   nothing changes. Two hosts cannot tell which of them is cut; three can.
//!
//! Probes from hosts that stopped heartbeating do not count: a dead host's last success is
//! not evidence. Pure: the broker's `cluster::reach` probes, records and carries it out.

use std::collections::HashSet;

/// One pair's last success: `prober` reached `target` at `at` (the store's clock, Unix ms).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reached {
    pub prober: String,
    pub target: String,
    pub at: i64,
}

/// What the probes say of one host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A live peer reached it within the window.
    Reached,
    /// No live peer reached it, while live hosts reached each other: it gives its clusters
    /// up. `peers`: the live peers that were reached.
    CutOff { peers: Vec<String> },
    /// Nothing to tell by: no live peer, or no pair of hosts reached each other.
    Unknown,
}

/// The verdict on host `me`, given the hosts seen alive (`live`, by id, `me` among them or
/// not), the pairs' last successes and the store's clock `now`; successes older than
/// `window_ms` do not count.
pub fn verdict(
    me: &str,
    live: &[String],
    reached: &[Reached],
    now: i64,
    window_ms: i64,
) -> Verdict {
    let live: HashSet<&str> = live.iter().map(String::as_str).collect();
    let recent = reached.iter().filter(|r| {
        r.prober != r.target
            && live.contains(r.prober.as_str())
            && live.contains(r.target.as_str())
            && r.at >= now.saturating_sub(window_ms)
    });
    let mut peers: Vec<String> = Vec::new();
    for r in recent {
        if r.target == me {
            return Verdict::Reached;
        }
        if !peers.contains(&r.target) {
            peers.push(r.target.clone());
        }
    }
    if peers.is_empty() {
        Verdict::Unknown
    } else {
        peers.sort();
        Verdict::CutOff { peers }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(prober: &str, target: &str, at: i64) -> Reached {
        Reached {
            prober: prober.into(),
            target: target.into(),
            at,
        }
    }

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// A case: what, for whom, the live hosts, the successes, the verdict wanted.
    type Case<'a> = (&'a str, &'a str, &'a [String], &'a [Reached], Verdict);

    const NOW: i64 = 100_000;
    const WINDOW: i64 = 10_000;

    #[test]
    fn the_fleet_decides_by_who_reached_whom() {
        let three = ids(&["h1", "h2", "h3"]);
        let all_pairs: Vec<Reached> = ["h1", "h2", "h3"]
            .iter()
            .flat_map(|a| ["h1", "h2", "h3"].iter().map(move |b| r(a, b, NOW - 1_000)))
            .collect();
        let cut_h1: Vec<Reached> = all_pairs
            .iter()
            .filter(|p| p.prober != "h1" && p.target != "h1")
            .cloned()
            .collect();
        // h1 cut off both ways: the others still reached each other, h1 sees it.
        let cases: &[Case<'_>] = &[
            ("healthy", "h1", &three, &all_pairs, Verdict::Reached),
            (
                "h1 cut off",
                "h1",
                &three,
                &cut_h1,
                Verdict::CutOff {
                    peers: ids(&["h2", "h3"]),
                },
            ),
            (
                "h2 beside a cut h1",
                "h2",
                &three,
                &cut_h1,
                Verdict::Reached,
            ),
            // Only h1's outgoing probes work (its incoming are cut): users cannot reach it
            // either, and h2 was reached, by h1 itself.
            (
                "h1 cut inbound, two hosts",
                "h1",
                &ids(&["h1", "h2"]),
                &[r("h1", "h2", NOW - 500)],
                Verdict::CutOff {
                    peers: ids(&["h2"]),
                },
            ),
            (
                "h2 beside it",
                "h2",
                &ids(&["h1", "h2"]),
                &[r("h1", "h2", NOW - 500)],
                Verdict::Reached,
            ),
            // Two hosts cut from each other: either may be the one cut from its users.
            (
                "two hosts, no pair",
                "h1",
                &ids(&["h1", "h2"]),
                &[],
                Verdict::Unknown,
            ),
            ("alone", "h1", &ids(&["h1"]), &[], Verdict::Unknown),
            // A host reaching itself proves nothing.
            (
                "itself",
                "h1",
                &ids(&["h1", "h2"]),
                &[r("h1", "h1", NOW)],
                Verdict::Unknown,
            ),
        ];
        for (what, me, live, reached, want) in cases {
            assert_eq!(&verdict(me, live, reached, NOW, WINDOW), want, "{what}");
        }
    }

    #[test]
    fn only_recent_successes_of_live_hosts_count() {
        let live = ids(&["h1", "h2", "h3"]);
        // h2 reached h1 too long ago; h3 reached h2 just now.
        let old = [r("h2", "h1", NOW - WINDOW - 1), r("h3", "h2", NOW - 10)];
        assert_eq!(
            verdict("h1", &live, &old, NOW, WINDOW),
            Verdict::CutOff {
                peers: ids(&["h2"])
            }
        );
        // At the window's edge it still counts.
        let edge = [r("h2", "h1", NOW - WINDOW), r("h3", "h2", NOW - 10)];
        assert_eq!(verdict("h1", &live, &edge, NOW, WINDOW), Verdict::Reached);
        // A dead host (not live) reached h1 just now: no evidence for h1, nor is a dead
        // target evidence that the network works.
        let dead = [r("h4", "h1", NOW), r("h2", "h4", NOW)];
        assert_eq!(verdict("h1", &live, &dead, NOW, WINDOW), Verdict::Unknown);
    }
}
