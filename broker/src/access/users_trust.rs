//! Which users CAs the front admits a cluster's client certificates from: the one that signs
//! now and, after `cluster rotate-ca`, the one it replaced until the overlap the operator
//! gave ends. The old CA's key is gone at the rotation (nothing more is signed with it, so a
//! leaked copy of it is worth nothing once the overlap ends); its certificate stays, so that
//! a refusal can say why.
//!
//! On disk, in `<cluster dir>/users/`: `ca.crt`/`ca.key` (signing), `previous/ca.crt` and
//! `previous/until` (Unix seconds). A rotation makes the new CA in `next/` first and moves
//! it in last; [`settle`] finishes one a crash cut short (the previous CA is written before
//! anything moves, so finishing is always right).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};

use crate::pki::{Pki, write_private};

/// The users CAs of one cluster, as the front admits them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsersTrust {
    /// The signing CA's certificate (DER).
    pub current: Vec<u8>,
    /// The CA it replaced (DER) and until when it is admitted.
    pub previous: Option<(Vec<u8>, SystemTime)>,
}

impl UsersTrust {
    /// The CAs admitted at `now`, the signing one first.
    pub fn anchors(&self, now: SystemTime) -> Vec<&[u8]> {
        let mut v = vec![self.current.as_slice()];
        if let Some((der, until)) = &self.previous
            && now < *until
        {
            v.push(der.as_slice());
        }
        v
    }

    /// Whether the CA whose certificate hashes to `ca_sha256` (lowercase hex of its DER) is
    /// admitted at `now`.
    pub fn admits(&self, ca_sha256: &str, now: SystemTime) -> bool {
        self.anchors(now)
            .into_iter()
            .any(|der| super::certs::sha256_hex(der) == ca_sha256)
    }

    /// When the previous CA stopped (or stops) being admitted, if the certificate hashing to
    /// `ca_sha256` was issued by it.
    pub fn retired(&self, ca_sha256: &str) -> Option<SystemTime> {
        self.previous
            .as_ref()
            .filter(|(der, _)| super::certs::sha256_hex(der) == ca_sha256)
            .map(|(_, until)| *until)
    }
}

fn users(cluster_dir: &Path) -> PathBuf {
    cluster_dir.join("users")
}

/// The first certificate of PEM `pem`, DER.
fn der_of(pem: &[u8], what: &Path) -> Result<Vec<u8>> {
    Ok(socialweb_wire::ca::certificates(pem)
        .map_err(anyhow::Error::msg)
        .with_context(|| what.display().to_string())?
        .remove(0)
        .der)
}

/// The users trust of the cluster in `cluster_dir` (its users CA must exist).
pub fn read(cluster_dir: &Path) -> Result<UsersTrust> {
    settle(cluster_dir)?;
    let ca = super::certs::open_users_ca(cluster_dir)?;
    let current = der_of(ca.ca_pem().as_bytes(), &ca.ca_cert())?;
    let prev = users(cluster_dir).join("previous");
    let previous = match std::fs::read(prev.join("ca.crt")) {
        Ok(pem) => {
            let until = std::fs::read_to_string(prev.join("until"))
                .with_context(|| format!("reading {}", prev.join("until").display()))?;
            let secs: u64 = until
                .trim()
                .parse()
                .with_context(|| format!("{}: not Unix seconds", prev.join("until").display()))?;
            Some((
                der_of(&pem, &prev.join("ca.crt"))?,
                SystemTime::UNIX_EPOCH + Duration::from_secs(secs),
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("reading {}", prev.display())),
    };
    Ok(UsersTrust { current, previous })
}

/// Replaces the users CA of the cluster in `cluster_dir` (named `cluster`) with a new one;
/// the old one is admitted until `until`, and its key is deleted. Returns the new trust.
pub fn rotate(cluster_dir: &Path, cluster: &str, until: SystemTime) -> Result<UsersTrust> {
    settle(cluster_dir)?;
    let dir = users(cluster_dir);
    let old = std::fs::read(dir.join("ca.crt"))
        .with_context(|| format!("reading {}", dir.join("ca.crt").display()))?;
    let next = dir.join("next");
    let _ = std::fs::remove_dir_all(&next);
    Pki::open_or_create(&next, &format!("socialweb users of {cluster}"))?;
    let prev = dir.join("previous");
    let _ = std::fs::remove_dir_all(&prev);
    std::fs::create_dir_all(&prev).with_context(|| format!("creating {}", prev.display()))?;
    let secs = until
        .duration_since(SystemTime::UNIX_EPOCH)
        .context("an overlap ending before 1970")?
        .as_secs();
    // The certificate before `until`: `until` is what says the rotation may finish.
    write_private(&prev.join("ca.crt"), &old, 0o644)?;
    write_private(&prev.join("until"), format!("{secs}\n").as_bytes(), 0o644)?;
    settle(cluster_dir)?;
    read(cluster_dir)
}

/// Finishes a rotation a crash cut short: moves `next/`'s CA in, key last.
pub fn settle(cluster_dir: &Path) -> Result<()> {
    let dir = users(cluster_dir);
    let next = dir.join("next");
    // Only a whole new CA with the previous one recorded is moved in; a `next/` without
    // them was cut short before anything moved and is made again by the next rotation.
    let ready = next.join("ca.key").exists() && dir.join("previous/until").exists();
    if !ready {
        return Ok(());
    }
    for f in ["ca.crt", "ca.key"] {
        let from = next.join(f);
        if from.exists() {
            std::fs::rename(&from, dir.join(f))
                .with_context(|| format!("moving {} in", from.display()))?;
        }
    }
    std::fs::remove_dir_all(&next).with_context(|| format!("removing {}", next.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::certs::{Lifetime, issue, sha256_hex, users_ca};

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("users-trust-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// Whether `dir`'s `ca.key` is the key of its `ca.crt`.
    fn key_matches(dir: &Path) -> bool {
        let key = std::fs::read_to_string(dir.join("ca.key")).unwrap();
        let key = rcgen::KeyPair::from_pem(&key).unwrap();
        let pem = std::fs::read(dir.join("ca.crt")).unwrap();
        let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).unwrap();
        let cert = pem.parse_x509().unwrap();
        use rcgen::PublicKeyData;
        cert.public_key().raw == key.subject_public_key_info().as_slice()
    }

    #[test]
    fn the_previous_ca_is_admitted_until_the_overlap_ends_and_its_key_is_gone() {
        let dir = scratch("rotate");
        let before = users_ca(&dir, "c1").unwrap();
        let old = read(&dir).unwrap();
        assert_eq!(old.previous, None);
        let t0 = SystemTime::now();
        let until = t0 + Duration::from_secs(60);
        let new = rotate(&dir, "c1", until).unwrap();
        assert_ne!(new.current, old.current);
        let (prev, end) = new.previous.clone().unwrap();
        assert_eq!(prev, old.current);
        // Whole seconds on disk.
        assert!(end <= until && until.duration_since(end).unwrap() < Duration::from_secs(1));
        assert_eq!(new.anchors(t0).len(), 2);
        assert_eq!(
            new.anchors(until + Duration::from_secs(1)),
            vec![new.current.as_slice()]
        );
        let old_hash = sha256_hex(&old.current);
        assert!(new.admits(&old_hash, t0));
        assert!(!new.admits(&old_hash, until + Duration::from_secs(1)));
        assert_eq!(new.retired(&old_hash), Some(end));
        assert_eq!(new.retired(&sha256_hex(&new.current)), None);
        // Nothing signs with the old key any more; what is issued now chains to the new CA.
        assert!(!dir.join("users/previous/ca.key").exists());
        assert!(!dir.join("users/next").exists());
        assert!(key_matches(&dir.join("users")));
        let now = crate::access::certs::open_users_ca(&dir).unwrap();
        assert_ne!(now.ca_pem(), before.ca_pem());
        issue(
            &now,
            "did:plc:a",
            Lifetime::For(Duration::from_secs(60)),
            t0,
        )
        .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_rotation_cut_short_after_the_previous_ca_was_recorded_is_finished_on_read() {
        let dir = scratch("settle");
        users_ca(&dir, "c1").unwrap();
        let old = read(&dir).unwrap();
        let users = dir.join("users");
        // As a crash would leave it: the new CA made, the old recorded, the certificate
        // moved in and not the key.
        Pki::open_or_create(&users.join("next"), "n").unwrap();
        std::fs::create_dir_all(users.join("previous")).unwrap();
        std::fs::write(users.join("previous/until"), "4000000000\n").unwrap();
        std::fs::copy(users.join("ca.crt"), users.join("previous/ca.crt")).unwrap();
        std::fs::rename(users.join("next/ca.crt"), users.join("ca.crt")).unwrap();
        let t = read(&dir).unwrap();
        assert_ne!(t.current, old.current);
        assert_eq!(t.previous.unwrap().0, old.current);
        assert!(key_matches(&users));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_next_ca_without_the_previous_recorded_is_left_for_the_next_rotation() {
        let dir = scratch("half");
        users_ca(&dir, "c1").unwrap();
        let old = read(&dir).unwrap();
        Pki::open_or_create(&dir.join("users/next"), "n").unwrap();
        assert_eq!(read(&dir).unwrap(), old);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
