//! The certificate records the front checks on every request, held in memory (the daemon is
//! their only writer: it writes the store first, then here). A revocation bumps a
//! generation that every open connection watches, so a revoked certificate's connections
//! are cut at once, watches and exec streams included.

use std::collections::HashMap;
use std::sync::RwLock;

use tokio::sync::watch;

use socialweb_broker_core::CertRecord;

#[derive(Debug)]
pub struct Records {
    by_serial: RwLock<HashMap<String, CertRecord>>,
    revocations: watch::Sender<u64>,
}

impl Records {
    pub fn new(all: Vec<CertRecord>) -> Records {
        Records {
            by_serial: RwLock::new(all.into_iter().map(|c| (c.serial.clone(), c)).collect()),
            revocations: watch::channel(0).0,
        }
    }

    pub fn get(&self, serial: &str) -> Option<CertRecord> {
        self.by_serial.read().expect("lock").get(serial).cloned()
    }

    pub fn insert(&self, c: CertRecord) {
        self.by_serial
            .write()
            .expect("lock")
            .insert(c.serial.clone(), c);
    }

    /// Puts the store's view of a revoked record here and tells every connection.
    pub fn revoked(&self, c: CertRecord) {
        self.insert(c);
        self.revocations.send_modify(|g| *g += 1);
    }

    /// Takes in records as the store has them now (a fleet's other hosts issue and revoke
    /// too); a revocation not seen before is told to every connection.
    pub fn merge(&self, from_store: Vec<CertRecord>) {
        let mut newly_revoked = false;
        {
            let mut all = self.by_serial.write().expect("lock");
            for c in from_store {
                let known = all.get(&c.serial);
                newly_revoked |=
                    c.revoked_at.is_some() && known.is_none_or(|k| k.revoked_at.is_none());
                all.insert(c.serial.clone(), c);
            }
        }
        if newly_revoked {
            self.revocations.send_modify(|g| *g += 1);
        }
    }

    /// Forgets a cluster's records (the cluster is gone).
    pub fn forget_cluster(&self, cluster: &str) {
        self.by_serial
            .write()
            .expect("lock")
            .retain(|_, c| c.cluster != cluster);
        self.revocations.send_modify(|g| *g += 1);
    }

    /// Forgets the records of certificates that expired before `before` (Unix ms).
    pub fn purge_expired(&self, before: i64) {
        self.by_serial
            .write()
            .expect("lock")
            .retain(|_, c| c.not_after.is_none_or(|na| na >= before));
        self.revocations.send_modify(|g| *g += 1);
    }

    /// Changes whenever a certificate may have stopped being good.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.revocations.subscribe()
    }

    /// The records of `did` (of one cluster with `Some`), oldest first.
    pub fn of(&self, did: &str, cluster: Option<&str>) -> Vec<CertRecord> {
        let mut v: Vec<CertRecord> = self
            .by_serial
            .read()
            .expect("lock")
            .values()
            .filter(|c| c.did == did && cluster.is_none_or(|k| c.cluster == k))
            .cloned()
            .collect();
        v.sort_by(|a, b| (a.created_at, &a.serial).cmp(&(b.created_at, &b.serial)));
        v
    }
}
