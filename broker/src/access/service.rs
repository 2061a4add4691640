//! The access service: everything about a user's way into their cluster -- the users CA, a
//! kubeconfig with a new client certificate, the certificates a DID holds, revocation. It
//! is the only writer of the certificate records (the store first, then the front's
//! in-memory view), whichever door the command came through.

use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use anyhow::Result;
use socialweb_broker_core::names::{account_hash, mount_path, mount_prefix};
use socialweb_broker_core::{CertRecord, millis};

use super::certs::{self, Lifetime};
use super::kubeconfig;
use super::records::Records;
use super::users_trust;
use crate::command::{IssuedKubeconfig, ServiceError};
use crate::store::Store;

/// Where kubeconfigs point: the front's URL, and its self-made CA if it has one.
#[derive(Debug, Clone)]
pub struct FrontAddress {
    pub public_url: String,
    pub ca_pem: Option<String>,
}

/// The access service.
#[derive(Debug)]
pub struct Access {
    store: Store,
    records: Arc<Records>,
    front: FrontAddress,
}

impl Access {
    pub fn new(store: Store, records: Arc<Records>, front: FrontAddress) -> Access {
        Access {
            store,
            records,
            front,
        }
    }

    /// Makes the users CA of a new cluster, in its directory `dir`.
    pub fn create_users_ca(&self, dir: &Path, cluster: &str) -> Result<()> {
        certs::users_ca(dir, cluster).map(|_| ())
    }

    /// The users CAs of the cluster in `dir` the front admits ([`users_trust`]).
    pub fn users_trust(&self, dir: &Path) -> Result<users_trust::UsersTrust> {
        users_trust::read(dir)
    }

    /// The cluster's URL at the front for its owner `did`.
    pub fn server(&self, did: &str, cluster: &str) -> String {
        format!("{}{}", self.front.public_url, mount_prefix(did, cluster))
    }

    /// A kubeconfig for `did` on `cluster`, whose directory is `dir` (the caller holds the
    /// cluster's lock and has checked that it is `did`'s and active). The users CA is only
    /// opened, never made here: a cluster being deleted has none to sign with.
    pub async fn kubeconfig(
        &self,
        did: &str,
        cluster: &str,
        dir: &Path,
        lifetime: Lifetime,
    ) -> Result<IssuedKubeconfig, ServiceError> {
        let ca = certs::open_users_ca(dir).map_err(ServiceError::internal)?;
        let ca_der = self
            .users_trust(dir)
            .map_err(ServiceError::internal)?
            .current;
        let now = SystemTime::now();
        let issued = certs::issue(&ca, did, lifetime, now).map_err(ServiceError::internal)?;
        let record = CertRecord {
            serial: issued.serial.clone(),
            cluster: cluster.to_string(),
            did: did.to_string(),
            not_after: issued.not_after,
            created_at: millis(now),
            revoked_at: None,
            ca_sha256: Some(certs::sha256_hex(&ca_der)),
        };
        // Recorded before it is handed out: a certificate the store does not know is never
        // admitted, so a crash here loses nothing but this answer.
        self.store
            .insert_certificate(&record)
            .await
            .map_err(ServiceError::internal)?;
        self.records.insert(record);
        let server = self.server(did, cluster);
        Ok(IssuedKubeconfig {
            kubeconfig: kubeconfig::render(cluster, &server, self.front.ca_pem.as_deref(), &issued),
            serial: issued.serial,
            not_after: issued.not_after,
            server,
            account_hash: account_hash(did),
            mount_path: mount_path(did, cluster),
        })
    }

    /// The certificates of `did` (of one cluster), oldest first.
    pub fn certificates(&self, did: &str, cluster: Option<&str>) -> Vec<CertRecord> {
        self.records.of(did, cluster)
    }

    /// Revokes one of `did`'s certificates: the front cuts its connections at once.
    pub async fn revoke(&self, did: &str, serial: &str) -> Result<CertRecord, ServiceError> {
        let serial = serial.trim().to_ascii_lowercase().replace(':', "");
        let not_yours =
            || ServiceError::NotFound(format!("serial: you have no certificate {serial}"));
        match self.records.get(&serial) {
            Some(r) if r.did == did => {}
            _ => return Err(not_yours()),
        }
        let r = self
            .store
            .revoke_certificate(&serial, millis(SystemTime::now()))
            .await
            .map_err(ServiceError::internal)?
            .ok_or_else(not_yours)?;
        self.records.revoked(r.clone());
        Ok(r)
    }

    /// Forgets the records of certificates expired before `before` (Unix ms): the store
    /// has purged them.
    pub fn purge_expired(&self, before: i64) {
        self.records.purge_expired(before);
    }

    /// Forgets a deleted cluster's certificates; their connections are cut.
    pub fn forget_cluster(&self, cluster: &str) {
        self.records.forget_cluster(cluster);
    }
}
