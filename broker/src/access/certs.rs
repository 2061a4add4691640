//! Client certificates for a DID: the lifetime rules, and issuing one from a cluster's users
//! CA. The users CA is not the cluster CA the apiserver trusts: a user certificate is good
//! only at the front, which checks its record on every request, so revocation holds even
//! though kube-apiserver reads no CRL (kubernetes#18982).

use std::time::{Duration, SystemTime};

use anyhow::Result;
use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyUsagePurpose, SerialNumber};

use crate::pki::{Pki, offset};

/// The shortest lifetime a user may ask for.
pub const MIN_LIFETIME: Duration = Duration::from_secs(60);
/// The longest, short of no expiry.
pub const MAX_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// What a user gets who names no lifetime.
pub const DEFAULT_LIFETIME: Duration = Duration::from_secs(3600);

/// How long a certificate is good for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifetime {
    For(Duration),
    /// No expiry: good until revoked.
    Never,
}

/// Why a lifetime is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LifetimeError {
    #[error(
        "lifetimeSeconds: {0} s is under the minimum of 60 s (ask for 60 to 86400, or noExpiry)"
    )]
    TooShort(u64),
    #[error(
        "lifetimeSeconds: {0} s is over the maximum of 86400 s (24 h); ask for noExpiry for a certificate that never expires"
    )]
    TooLong(u64),
    #[error("lifetimeSeconds and noExpiry: give one, not both")]
    Both,
}

impl Lifetime {
    /// From the API's fields: `lifetimeSeconds`, `noExpiry`.
    pub fn from_request(seconds: Option<u64>, no_expiry: bool) -> Result<Lifetime, LifetimeError> {
        match (seconds, no_expiry) {
            (Some(_), true) => Err(LifetimeError::Both),
            (None, true) => Ok(Lifetime::Never),
            (None, false) => Ok(Lifetime::For(DEFAULT_LIFETIME)),
            (Some(s), false) if s < MIN_LIFETIME.as_secs() => Err(LifetimeError::TooShort(s)),
            (Some(s), false) if s > MAX_LIFETIME.as_secs() => Err(LifetimeError::TooLong(s)),
            (Some(s), false) => Ok(Lifetime::For(Duration::from_secs(s))),
        }
    }
}

/// A certificate issued, with its key: handed to the user once, never kept.
#[derive(Debug, Clone)]
pub struct Issued {
    /// Lowercase hex.
    pub serial: String,
    pub cert_pem: String,
    pub key_pem: String,
    /// Unix milliseconds; `None`: no expiry.
    pub not_after: Option<i64>,
}

/// The users CA of a cluster: `<cluster dir>/users/ca.{crt,key}`, made on first use.
pub fn users_ca(cluster_dir: &std::path::Path, cluster: &str) -> Result<Pki> {
    // Two callers making the CA at once would each write one; the second would orphan every
    // certificate the first signed.
    static MAKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = MAKING.lock().unwrap_or_else(|e| e.into_inner());
    Pki::open_or_create(
        &cluster_dir.join("users"),
        &format!("socialweb users of {cluster}"),
    )
}

/// The users CA of the cluster in `cluster_dir`, which must exist.
pub fn open_users_ca(cluster_dir: &std::path::Path) -> Result<Pki> {
    let dir = cluster_dir.join("users");
    anyhow::ensure!(
        dir.join("ca.key").exists(),
        "the cluster has no users CA at {} (deleted?)",
        dir.display()
    );
    Pki::open_or_create(&dir, "unused")
}

/// Signs a client certificate for `did`: CommonName the DID, Organization the owners' group,
/// client authentication only, a random 128-bit serial.
pub fn issue(ca: &Pki, did: &str, lifetime: Lifetime, now: SystemTime) -> Result<Issued> {
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    p.distinguished_name.push(DnType::CommonName, did);
    p.distinguished_name
        .push(DnType::OrganizationName, super::OWNERS_GROUP);
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let mut serial: [u8; 16] = rand::random();
    // Positive and without a leading zero byte, so that its hex is the same however it is
    // read back (DER drops a leading zero; a set top bit would add one).
    serial[0] = (serial[0] & 0x7f) | 0x10;
    p.serial_number = Some(SerialNumber::from_slice(&serial));
    // A minute of slack for clocks behind ours.
    p.not_before = offset(now - Duration::from_secs(60))?;
    let not_after = match lifetime {
        Lifetime::For(d) => Some(now + d),
        Lifetime::Never => None,
    };
    p.not_after = match not_after {
        Some(t) => offset(t)?,
        // RFC 5280 4.1.2.5: 99991231235959Z means "no well-defined expiration date".
        None => rcgen::date_time_ymd(9999, 12, 31) + time::Duration::seconds(86399),
    };
    let (cert_pem, key_pem) = ca.sign(p)?;
    Ok(Issued {
        serial: hex(&serial),
        cert_pem,
        key_pem,
        not_after: not_after.map(socialweb_broker_core::millis),
    })
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The SHA-256 of `bytes`, lowercase hex (a CA certificate's fingerprint, from its DER).
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex(&sha2::Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file under `dir` named like a key or a CA, relative.
    fn authority_files(dir: &std::path::Path) -> Vec<String> {
        let mut found = Vec::new();
        let mut todo = vec![dir.to_path_buf()];
        while let Some(d) = todo.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    todo.push(p);
                } else {
                    found.push(p.strip_prefix(dir).unwrap().display().to_string());
                }
            }
        }
        found.sort();
        found
    }

    /// What `crate::vault` keeps is every file the real makers make: a cluster's
    /// authorities (the control plane's) and its users CA (this module's).
    #[test]
    fn the_vault_keeps_every_authority_a_cluster_makes() {
        use crate::vault::tests::{scratch, spec};
        let dir = scratch("made");
        spec("c1", dir.join("c1")).ensure_authorities().unwrap();
        users_ca(&dir.join("c1"), "c1").unwrap();
        let mut kept = crate::vault::kept();
        kept.sort();
        assert_eq!(authority_files(&dir.join("c1")), kept);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn lifetimes_outside_60_s_to_24_h_are_refused_with_the_field_named() {
        assert_eq!(
            Lifetime::from_request(Some(60), false),
            Ok(Lifetime::For(Duration::from_secs(60)))
        );
        assert_eq!(
            Lifetime::from_request(Some(86400), false),
            Ok(Lifetime::For(MAX_LIFETIME))
        );
        let short = Lifetime::from_request(Some(59), false).unwrap_err();
        assert_eq!(short, LifetimeError::TooShort(59));
        assert!(short.to_string().starts_with("lifetimeSeconds: 59 s"));
        assert_eq!(
            Lifetime::from_request(Some(86401), false),
            Err(LifetimeError::TooLong(86401))
        );
        assert_eq!(Lifetime::from_request(None, true), Ok(Lifetime::Never));
        assert_eq!(
            Lifetime::from_request(Some(60), true),
            Err(LifetimeError::Both)
        );
        assert_eq!(
            Lifetime::from_request(None, false),
            Ok(Lifetime::For(DEFAULT_LIFETIME))
        );
    }

    #[test]
    fn a_certificate_names_the_did_and_the_owners_group_and_its_serial_reads_back() {
        let dir = std::env::temp_dir().join(format!("sw-users-{}", std::process::id()));
        let ca = users_ca(&dir, "c1").unwrap();
        let now = SystemTime::now();
        let one = issue(&ca, "did:key:zAlice", Lifetime::For(MIN_LIFETIME), now).unwrap();
        let der = socialweb_wire::ca::certificates(one.cert_pem.as_bytes()).unwrap();
        let (_, x) = x509_parser::parse_x509_certificate(&der[0].der).unwrap();
        let cn = x.subject().iter_common_name().next().unwrap();
        assert_eq!(cn.as_str().unwrap(), "did:key:zAlice");
        let o = x.subject().iter_organization().next().unwrap();
        assert_eq!(o.as_str().unwrap(), super::super::OWNERS_GROUP);
        assert_eq!(hex(x.raw_serial()), one.serial);
        assert_eq!(
            x.validity().not_after.timestamp() * 1000,
            one.not_after.unwrap() / 1000 * 1000
        );
        let never = issue(&ca, "did:key:zAlice", Lifetime::Never, now).unwrap();
        assert!(never.not_after.is_none());
        let der = socialweb_wire::ca::certificates(never.cert_pem.as_bytes()).unwrap();
        let (_, x) = x509_parser::parse_x509_certificate(&der[0].der).unwrap();
        assert_eq!(x.validity().not_after.to_datetime().year(), 9999);
        assert_ne!(one.serial, never.serial);
        let _ = std::fs::remove_dir_all(dir);
    }
}
