//! What a new directory view does to the running peers, pure: which connections end (and
//! why), which peers get a fresh slot, which of those this node dials, and whether the routes
//! of the peers it keeps must be installed again. The runtime carries the plan out.

use std::collections::BTreeMap;

use ipnet::IpNet;

use crate::directory::{self, Change, NodeEntry, View};

/// Why a running peer's slot is retired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retire {
    /// The directory no longer lists it.
    Left,
    /// Its entry changed (pod CIDR, endpoint or addresses): the slot is replaced by a new one.
    Changed,
}

impl Retire {
    /// The reason as logged and sent in the connection's close frame.
    pub fn reason(self) -> &'static str {
        match self {
            Retire::Left => "left the peer directory",
            Retire::Changed => "its directory entry changed",
        }
    }
}

/// A peer that gets a fresh slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Add {
    pub entry: NodeEntry,
    /// Whether this node dials it (otherwise it waits for the peer to dial).
    pub dial: bool,
}

/// What to do, in this order: retire, add (and dial), then re-route the kept peers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Slots to retire, by node name.
    pub retire: Vec<(String, Retire)>,
    pub add: Vec<Add>,
    /// This node's pod CIDR changed: the routes of connected peers that are kept carry the old
    /// gateway as their source address and are installed again.
    pub reroute_kept: bool,
}

/// The plan that turns the `running` peers (this node's pod CIDR was `own_before`) into
/// `view`'s, for the node whose endpoint id is `own_endpoint`.
pub fn plan(
    running: &BTreeMap<String, NodeEntry>,
    own_before: Option<IpNet>,
    view: &View,
    own_endpoint: &[u8; 32],
) -> Plan {
    let mut p = Plan {
        reroute_kept: view.own.as_ref().map(|o| o.pod_cidr) != own_before,
        ..Plan::default()
    };
    let mut add = |entry: NodeEntry| {
        let dial = endpoint_bytes(&entry.endpoint).is_some_and(|peer| dials(own_endpoint, &peer));
        p.add.push(Add { entry, dial });
    };
    let mut retire = Vec::new();
    for change in directory::diff(running, &view.peers) {
        match change {
            Change::Removed(e) => retire.push((e.node, Retire::Left)),
            Change::Updated { new, .. } => {
                retire.push((new.node.clone(), Retire::Changed));
                add(new);
            }
            Change::Added(e) => add(e),
        }
    }
    p.retire = retire;
    p
}

/// Whether the node with endpoint `own` dials the one with `peer`: the smaller id dials, so
/// each pair has exactly one connection and both ends agree which.
pub fn dials(own: &[u8; 32], peer: &[u8; 32]) -> bool {
    own < peer
}

/// An endpoint id's 32 bytes from its 64 hex digits (the directory's form).
pub fn endpoint_bytes(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.as_bytes();
    if hex.len() != 64 {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = digit(hex[2 * i])? << 4 | digit(hex[2 * i + 1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(node: &str, ep: char, cidr: &str) -> NodeEntry {
        NodeEntry {
            node: node.into(),
            endpoint: ep.to_string().repeat(64),
            pod_cidr: cidr.parse().unwrap(),
            addrs: vec![],
            node_ip: None,
        }
    }

    fn view(own: Option<NodeEntry>, peers: &[NodeEntry]) -> View {
        View {
            own,
            peers: peers.iter().map(|p| (p.node.clone(), p.clone())).collect(),
            rejected: vec![],
        }
    }

    fn running(peers: &[NodeEntry]) -> BTreeMap<String, NodeEntry> {
        peers.iter().map(|p| (p.node.clone(), p.clone())).collect()
    }

    const ME: [u8; 32] = [0x55; 32];

    #[test]
    fn the_first_view_adds_every_peer_and_dials_the_larger_ids() {
        let me = e("me", '5', "10.42.5.0/24");
        let v = view(
            Some(me.clone()),
            &[
                e("low", '1', "10.42.1.0/24"),
                e("high", 'a', "10.42.10.0/24"),
            ],
        );
        let p = plan(&BTreeMap::new(), None, &v, &ME);
        assert!(p.retire.is_empty());
        let dial: Vec<(&str, bool)> = p
            .add
            .iter()
            .map(|a| (a.entry.node.as_str(), a.dial))
            .collect();
        assert_eq!(dial, [("high", true), ("low", false)]);
        assert!(p.reroute_kept, "our CIDR went from none to one");
    }

    #[test]
    fn a_peer_that_left_is_retired_and_a_changed_one_replaced() {
        let me = e("me", '5', "10.42.5.0/24");
        let (b, c, d) = (
            e("b", '6', "10.42.6.0/24"),
            e("c", '7', "10.42.7.0/24"),
            e("d", '8', "10.42.8.0/24"),
        );
        let moved = e("c", '7', "10.42.77.0/24");
        let p = plan(
            &running(&[b.clone(), c, d]),
            Some(me.pod_cidr),
            &view(Some(me), &[b, moved.clone(), e("x", '9', "10.42.9.0/24")]),
            &ME,
        );
        assert_eq!(
            p.retire,
            [
                ("c".to_string(), Retire::Changed),
                ("d".into(), Retire::Left)
            ]
        );
        let added: Vec<&NodeEntry> = p.add.iter().map(|a| &a.entry).collect();
        assert_eq!(added[0], &moved);
        assert_eq!(added[1].node, "x");
        assert!(!p.reroute_kept);
    }

    #[test]
    fn an_unchanged_view_changes_nothing() {
        let me = e("me", '5', "10.42.5.0/24");
        let peers = [e("b", '6', "10.42.6.0/24")];
        let p = plan(
            &running(&peers),
            Some(me.pod_cidr),
            &view(Some(me), &peers),
            &ME,
        );
        assert_eq!(p, Plan::default());
    }

    #[test]
    fn a_new_own_cidr_reroutes_the_kept_peers() {
        let peers = [e("b", '6', "10.42.6.0/24")];
        let p = plan(
            &running(&peers),
            Some("10.42.5.0/24".parse().unwrap()),
            &view(Some(e("me", '5', "10.42.50.0/24")), &peers),
            &ME,
        );
        assert!(p.reroute_kept && p.add.is_empty() && p.retire.is_empty());
    }

    #[test]
    fn endpoint_ids_read_as_hex() {
        let id = endpoint_bytes(&"0f".repeat(32)).unwrap();
        assert_eq!(id, [0x0f; 32]);
        assert_eq!(endpoint_bytes(&"0F".repeat(32)), Some([0x0f; 32]));
        assert_eq!(endpoint_bytes("0f"), None);
        assert_eq!(endpoint_bytes(&"zz".repeat(32)), None);
    }

    proptest::proptest! {
        /// Of two different endpoints exactly one dials the other.
        #[test]
        fn exactly_one_end_of_a_pair_dials(a in proptest::prelude::any::<[u8; 32]>(), b in proptest::prelude::any::<[u8; 32]>()) {
            proptest::prop_assume!(a != b);
            proptest::prop_assert!(dials(&a, &b) != dials(&b, &a));
        }
    }
}
