//! The provider's books: every RFP with its bids, every lease with the machine that is its
//! node, kept in `provider.json` (rewritten atomically on every change), and the market's
//! rules over them -- an RFP repeated with its id is the same RFP, an acceptance repeated with
//! its lease id is the same lease, one acceptance per RFP, bids expire, capacity is counted
//! in live leases, and every RFP and lease belongs to the client that made it (the broker's
//! pinned key): another client neither sees nor touches it, and cannot take its ids. The rules
//! are plain functions on [`Book`]; [`Ledger`] is the one place that locks, applies and saves.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use socialweb_market::{Bid, Lease, LeaseState, Rfp, RfpRequest, Shape};
use tracing::warn;

use crate::ProviderError;
use crate::machine::MachineRecord;

/// One RFP and what became of it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RfpEntry {
    pub req: RfpRequest,
    pub bids: Vec<Bid>,
    pub accepted: Option<String>,
    /// The client that sent it ([`crate::Client`]); none in books written before owners were
    /// kept, which any client may still reach.
    #[serde(default)]
    pub owner: Option<String>,
}

/// One lease and the machine that is its node.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct LeaseEntry {
    pub lease: Lease,
    pub slot: u8,
    pub machine: Option<MachineRecord>,
    /// The agent's pid and start time.
    pub agent: Option<(u32, u64)>,
    /// The acceptance's identity, kept to start the agent again.
    pub identity: serde_json::Value,
    /// The qemu guest that is its node (a VM provider's lease).
    #[serde(default)]
    pub guest: Option<crate::vm::GuestRecord>,
    /// The client that accepted it (as [`RfpEntry::owner`]).
    #[serde(default)]
    pub owner: Option<String>,
}

/// Whether `client` may see and act on what `owner` made.
fn reachable(owner: &Option<String>, client: &str) -> bool {
    owner.as_deref().is_none_or(|o| o == client)
}

impl RfpEntry {
    pub fn owned_by(&self, client: &str) -> bool {
        reachable(&self.owner, client)
    }
}

impl LeaseEntry {
    pub fn owned_by(&self, client: &str) -> bool {
        reachable(&self.owner, client)
    }
}

/// Everything the provider has agreed to.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Book {
    pub rfps: BTreeMap<String, RfpEntry>,
    pub leases: BTreeMap<String, LeaseEntry>,
}

/// What the provider offers: its node shapes and their prices, how many at once, its name.
#[derive(Debug, Clone)]
pub(crate) struct Offer {
    pub shapes: Vec<Shape>,
    pub capacity: u32,
    pub name: String,
    /// How isolated its nodes are, and what they are (said in its bids).
    pub isolation: socialweb_market::Isolation,
    pub machine: String,
    pub eta_ms: u64,
}

pub(crate) fn now_text() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

pub(crate) fn set_state(l: &mut Lease, state: LeaseState, reason: Option<String>) {
    l.state = state;
    l.reason = reason;
    l.updated_at = now_text();
}

fn rfp_view(e: &RfpEntry) -> Rfp {
    Rfp {
        id: e.req.id.clone(),
        state: if e.accepted.is_some() {
            "closed"
        } else {
            "open"
        }
        .into(),
        bids: e.bids.clone(),
    }
}

/// What an acceptance asks for, once its identity has been read.
pub(crate) struct Acceptance<'a> {
    /// The client accepting ([`crate::Client`]).
    pub owner: &'a str,
    pub bid_id: &'a str,
    pub lease_id: &'a str,
    pub node: &'a str,
    pub identity: serde_json::Value,
}

impl Book {
    fn live(&self) -> impl Iterator<Item = &LeaseEntry> {
        self.leases.values().filter(|e| e.lease.state.live())
    }

    /// Takes an RFP and bids at once if the node fits and there is room (`bid` false: the
    /// tests' "no bid" failpoint). The same RFP again is answered as it was; an id another
    /// client used is refused (the answer says no more than that it is taken).
    pub fn rfp(
        &mut self,
        owner: &str,
        req: RfpRequest,
        offer: &Offer,
        bid: bool,
    ) -> Result<Rfp, ProviderError> {
        if let Some(e) = self.rfps.get(&req.id) {
            if !e.owned_by(owner) {
                return Err(ProviderError::Conflict(format!(
                    "RFP id {} is taken; choose another",
                    req.id
                )));
            }
            if e.req != req {
                return Err(ProviderError::Conflict(format!(
                    "RFP {} exists with other terms",
                    req.id
                )));
            }
            return Ok(rfp_view(e));
        }
        // Priced as its cheapest shape that holds the spec; none holds it: no bid.
        let shape = socialweb_market::cheapest_holding(&offer.shapes, &req.spec);
        let fits = shape.is_some();
        let live = self.live().count() as u32;
        // No bid on an RFP that needs more isolation than this provider's nodes have.
        let isolated = req.isolation <= offer.isolation;
        let mut bids = Vec::new();
        if let Some(shape) = shape.filter(|_| isolated && live < offer.capacity && bid) {
            let expires = SystemTime::now()
                + Duration::from_millis(req.bid_deadline_ms)
                + Duration::from_secs(60);
            bids.push(Bid {
                id: format!("{}-b1", req.id),
                rfp_id: req.id.clone(),
                provider: offer.name.clone(),
                price_micros_per_hour: shape.price_micros_per_hour,
                eta_ms: offer.eta_ms,
                machine: Some(offer.machine.clone()),
                expires_at: humantime::format_rfc3339_seconds(expires).to_string(),
            });
        } else {
            tracing::info!(rfp = %req.id, fits, live, "local provider: no bid");
        }
        let e = RfpEntry {
            req,
            bids,
            accepted: None,
            owner: Some(owner.to_string()),
        };
        let view = rfp_view(&e);
        self.rfps.insert(e.req.id.clone(), e);
        Ok(view)
    }

    /// An RFP as `client` may see it: only its own.
    pub fn rfp_view(&self, client: &str, id: &str) -> Option<Rfp> {
        self.rfps
            .get(id)
            .filter(|e| e.owned_by(client))
            .map(rfp_view)
    }

    /// A lease's entry as `client` may see it: only its own.
    pub fn lease_of(&self, client: &str, id: &str) -> Option<&LeaseEntry> {
        self.leases.get(id).filter(|e| e.owned_by(client))
    }

    /// The acceptance of a bid: a new lease in `booting` on a free slot, or the lease an
    /// earlier identical acceptance made (`Ok((lease, false))`).
    pub fn accept(
        &mut self,
        a: Acceptance<'_>,
        offer: &Offer,
        node_addr: impl Fn(u8) -> String,
    ) -> Result<(Lease, bool), ProviderError> {
        if let Some(e) = self.leases.get(a.lease_id) {
            if !e.owned_by(a.owner) {
                return Err(ProviderError::Conflict(format!(
                    "lease id {} is taken; choose another",
                    a.lease_id
                )));
            }
            if e.lease.bid_id != a.bid_id {
                return Err(ProviderError::Conflict(format!(
                    "lease {} exists for another bid",
                    a.lease_id
                )));
            }
            return Ok((e.lease.clone(), false));
        }
        let (rfp_id, bid) = self.open_bid(a.owner, a.bid_id)?;
        let used: Vec<u8> = self.live().map(|e| e.slot).collect();
        let slot = (1..=254u8)
            .take(offer.capacity as usize)
            .find(|s| !used.contains(s))
            .ok_or_else(|| ProviderError::Conflict("no capacity left".into()))?;
        let now = now_text();
        let entry = self.rfps.get_mut(&rfp_id).expect("open_bid found it");
        let mut tags = entry.req.tags.clone();
        tags.insert("node".into(), a.node.to_string());
        entry.accepted = Some(a.lease_id.to_string());
        let lease = Lease {
            id: a.lease_id.to_string(),
            rfp_id,
            bid_id: bid.id,
            state: LeaseState::Booting,
            reason: None,
            tags,
            node_addr: Some(node_addr(slot)),
            created_at: now.clone(),
            updated_at: now,
        };
        self.leases.insert(
            lease.id.clone(),
            LeaseEntry {
                lease: lease.clone(),
                slot,
                machine: None,
                agent: None,
                identity: a.identity,
                guest: None,
                owner: Some(a.owner.to_string()),
            },
        );
        Ok((lease, true))
    }

    /// The RFP a bid belongs to and the bid, if it may still be accepted by `client` (another
    /// client's bid is not found: a client learns nothing of what others asked for).
    fn open_bid(&self, client: &str, bid_id: &str) -> Result<(String, Bid), ProviderError> {
        let entry = self
            .rfps
            .values()
            .filter(|e| e.owned_by(client))
            .find(|e| e.bids.iter().any(|b| b.id == bid_id))
            .ok_or_else(|| ProviderError::NotFound(format!("no bid {bid_id}")))?;
        if let Some(other) = &entry.accepted {
            return Err(ProviderError::Conflict(format!(
                "RFP {} was accepted already (lease {other})",
                entry.req.id
            )));
        }
        let bid = entry
            .bids
            .iter()
            .find(|b| b.id == bid_id)
            .expect("found above")
            .clone();
        if humantime::parse_rfc3339(&bid.expires_at).is_ok_and(|t| t < SystemTime::now()) {
            return Err(ProviderError::Expired(format!(
                "bid {bid_id} expired at {}",
                bid.expires_at
            )));
        }
        Ok((entry.req.id.clone(), bid))
    }
}

/// The book behind a lock, saved after every change.
#[derive(Debug)]
pub(crate) struct Ledger {
    path: PathBuf,
    book: Mutex<Book>,
}

impl Ledger {
    /// Reads the records at `path` (none yet: an empty book).
    pub fn open(path: &Path) -> Result<Ledger> {
        let path = path.to_path_buf();
        if path.exists() {
            socialweb_proc::owner_only::file(&path)
                .with_context(|| format!("making {} owner-only", path.display()))?;
        }
        let book = match std::fs::read(&path) {
            Ok(b) => {
                serde_json::from_slice(&b).with_context(|| format!("reading {}", path.display()))?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Book::default(),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        Ok(Ledger {
            path,
            book: Mutex::new(book),
        })
    }

    /// Reads the book.
    pub fn read<T>(&self, f: impl FnOnce(&Book) -> T) -> T {
        f(&self.book.lock().expect("lock"))
    }

    /// Changes the book and saves it, whatever `f` returns (an unchanged book is saved
    /// unchanged).
    pub fn write<T>(&self, f: impl FnOnce(&mut Book) -> T) -> T {
        let mut b = self.book.lock().expect("lock");
        let out = f(&mut b);
        self.save(&b);
        out
    }

    /// A copy of one lease's entry.
    pub fn entry(&self, id: &str) -> Option<LeaseEntry> {
        self.read(|b| b.leases.get(id).cloned())
    }

    /// Changes one lease's entry (if it exists) and saves.
    pub fn update(&self, id: &str, f: impl FnOnce(&mut LeaseEntry)) {
        self.write(|b| {
            if let Some(e) = b.leases.get_mut(id) {
                f(e);
            }
        })
    }

    fn save(&self, b: &Book) {
        // It holds every lease's identity document (bootstrap-token secret, mesh key):
        // owner-only, written whole.
        let res = serde_json::to_vec_pretty(b)
            .map_err(anyhow::Error::from)
            .and_then(|bytes| {
                Ok(socialweb_proc::owner_only::write_atomic(
                    &self.path, &bytes,
                )?)
            });
        if let Err(e) = res {
            warn!("local provider: saving {}: {e:#}", self.path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use socialweb_market::NodeSpec;

    fn offer(capacity: u32) -> Offer {
        Offer {
            shapes: vec![Shape {
                spec: NodeSpec {
                    vcpu: 2,
                    mem_mib: 4096,
                    disk_mib: 20480,
                },
                price_micros_per_hour: 0,
            }],
            capacity,
            name: "local".into(),
            isolation: socialweb_market::Isolation::Namespace,
            machine: "namespace".into(),
            eta_ms: 3000,
        }
    }

    fn rfp(id: &str, vcpu: u32) -> RfpRequest {
        RfpRequest {
            id: id.into(),
            spec: NodeSpec {
                vcpu,
                mem_mib: 1024,
                disk_mib: 2048,
            },
            image: "local".into(),
            tags: BTreeMap::from([("broker".to_string(), "b1".to_string())]),
            bid_deadline_ms: 1000,
            isolation: socialweb_market::Isolation::Namespace,
        }
    }

    const B1: &str = "sha256:b1";
    const B2: &str = "sha256:b2";

    fn acceptance<'a>(bid: &'a str, lease: &'a str) -> Acceptance<'a> {
        Acceptance {
            owner: B1,
            bid_id: bid,
            lease_id: lease,
            node: "c-1",
            identity: serde_json::json!({}),
        }
    }

    #[test]
    fn an_rfp_repeated_is_the_same_rfp_and_other_terms_conflict() {
        let mut b = Book::default();
        let first = b.rfp(B1, rfp("r1", 2), &offer(4), true).unwrap();
        assert_eq!(first.bids.len(), 1);
        assert_eq!(b.rfp(B1, rfp("r1", 2), &offer(4), true).unwrap(), first);
        let e = b.rfp(B1, rfp("r1", 1), &offer(4), true).unwrap_err();
        assert!(matches!(e, ProviderError::Conflict(m) if m.contains("other terms")));
        // Too large a node, or a "no bid" provider: an RFP without bids.
        assert!(
            b.rfp(B1, rfp("r2", 64), &offer(4), true)
                .unwrap()
                .bids
                .is_empty()
        );
        assert!(
            b.rfp(B1, rfp("r3", 1), &offer(4), false)
                .unwrap()
                .bids
                .is_empty()
        );
    }

    #[test]
    fn an_acceptance_repeated_is_the_same_lease_and_an_rfp_takes_one() {
        let mut b = Book::default();
        let bid = b.rfp(B1, rfp("r1", 2), &offer(4), true).unwrap().bids[0]
            .id
            .clone();
        let addr = |slot: u8| format!("10.0.{slot}.2");
        let (lease, new) = b.accept(acceptance(&bid, "l1"), &offer(4), addr).unwrap();
        assert!(new);
        assert_eq!(
            (lease.state, lease.node_addr.as_deref()),
            (LeaseState::Booting, Some("10.0.1.2"))
        );
        assert_eq!(lease.tags["node"], "c-1");
        assert_eq!(lease.tags["broker"], "b1");
        let (again, new) = b.accept(acceptance(&bid, "l1"), &offer(4), addr).unwrap();
        assert!(!new);
        assert_eq!(again, lease);
        let e = b
            .accept(acceptance(&bid, "l2"), &offer(4), addr)
            .unwrap_err();
        assert!(matches!(e, ProviderError::Conflict(m) if m.contains("accepted already")));
        let e = b
            .accept(acceptance("nope", "l3"), &offer(4), addr)
            .unwrap_err();
        assert!(matches!(e, ProviderError::NotFound(_)));
    }

    #[test]
    fn capacity_counts_live_leases_and_bids_expire() {
        let mut b = Book::default();
        let addr = |slot: u8| format!("10.0.{slot}.2");
        let bid1 = b.rfp(B1, rfp("r1", 2), &offer(1), true).unwrap().bids[0]
            .id
            .clone();
        b.accept(acceptance(&bid1, "l1"), &offer(1), addr).unwrap();
        assert!(
            b.rfp(B1, rfp("r2", 2), &offer(1), true)
                .unwrap()
                .bids
                .is_empty(),
            "full"
        );
        set_state(
            &mut b.leases.get_mut("l1").unwrap().lease,
            LeaseState::Released,
            None,
        );
        let bid3 = b.rfp(B1, rfp("r3", 2), &offer(1), true).unwrap().bids[0]
            .id
            .clone();
        b.rfps.get_mut("r3").unwrap().bids[0].expires_at = "2000-01-01T00:00:00Z".into();
        let e = b
            .accept(acceptance(&bid3, "l3"), &offer(1), addr)
            .unwrap_err();
        assert!(matches!(e, ProviderError::Expired(m) if m.contains("expired at 2000")));
    }

    #[test]
    fn another_client_neither_sees_nor_takes_what_a_client_made() {
        let mut b = Book::default();
        let addr = |slot: u8| format!("10.0.{slot}.2");
        let bid = b.rfp(B1, rfp("r1", 2), &offer(4), true).unwrap().bids[0]
            .id
            .clone();
        // B2 cannot see B1's RFP, reuse its id, or accept its bid.
        assert!(b.rfp_view(B2, "r1").is_none());
        assert!(b.rfp_view(B1, "r1").is_some());
        let e = b.rfp(B2, rfp("r1", 2), &offer(4), true).unwrap_err();
        assert!(matches!(e, ProviderError::Conflict(m) if m.contains("taken")));
        let theirs = Acceptance {
            owner: B2,
            ..acceptance(&bid, "l2")
        };
        let e = b.accept(theirs, &offer(4), addr).unwrap_err();
        assert!(matches!(e, ProviderError::NotFound(_)), "{e:?}");
        // B1's lease is B1's: B2 cannot see it or take its id.
        b.accept(acceptance(&bid, "l1"), &offer(4), addr).unwrap();
        assert!(b.lease_of(B2, "l1").is_none());
        assert!(b.lease_of(B1, "l1").is_some());
        let bid2 = b.rfp(B2, rfp("r2", 2), &offer(4), true).unwrap().bids[0]
            .id
            .clone();
        let taken = Acceptance {
            owner: B2,
            ..acceptance(&bid2, "l1")
        };
        let e = b.accept(taken, &offer(4), addr).unwrap_err();
        assert!(matches!(e, ProviderError::Conflict(m) if m.contains("taken")));
    }

    #[test]
    fn entries_written_before_owners_were_kept_stay_reachable() {
        let old = r#"{"rfps":{},"leases":{"l0":{"lease":{"id":"l0","rfp_id":"r0","bid_id":"r0-b1","state":"running","reason":null,"tags":{},"node_addr":null,"created_at":"","updated_at":""},"slot":1,"machine":null,"agent":null,"identity":{}}}}"#;
        let b: Book = serde_json::from_str(old).unwrap();
        assert!(b.lease_of(B2, "l0").is_some());
    }
}
