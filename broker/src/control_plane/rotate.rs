//! `cluster rotate-ca` for the cluster's own authorities (its CA, the front-proxy CA,
//! etcd's): asked by a marker in its `pki/`, carried out at the next start of its control
//! plane, before anything is issued -- every authority and everything it signed is removed
//! and made again. Only the service-account key stays (ServiceAccount tokens outlive a CA
//! rotation, as in kubeadm's).
//!
//! With nodes ([`Rotation::Overlap`]) the old cluster CA's certificate is kept trusted beside
//! the new one until every node has moved: the new CA signs from the start, the apiserver
//! serves its certificate with the new CA cross-signed by the old one (so a node that trusts
//! only the old CA still verifies it), the old CA's key is deleted once that cross
//! certificate is made, and the bundle [new, old] is what the apiserver, the kubelets and
//! Pods accept and what `cluster-info` publishes. Each node adopts the bundle, has its
//! kubelet's certificates issued by the new CA and says so on its Node (the agent's
//! `join::rotation`); once every Node has, the period asks for the retirement ([`retire`]):
//! at the next start the old CA's certificate and the cross certificate go.
//!
//! Crash-safe by order: the old CA is copied aside before anything is removed, and the marker
//! goes last, so a start cut short removes again what it made (nothing has used it yet).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// What stays: the service-account key pair, and the marker until the end.
const KEEP: &[&str] = &["sa.key", "sa.pub", MARKER];
const MARKER: &str = "rotate-ca";
/// Asks for the old cluster CA's retirement at the next start.
const RETIRE: &str = "retire-ca";
/// The old cluster CA while nodes move (`ca.crt`; `ca.key` until the cross certificate is
/// made).
const PREVIOUS: &str = "previous";
/// The new cluster CA's certificate signed by the old CA's key.
const CROSS: &str = "ca-cross.crt";
const OVERLAP: &[u8] = b"overlap: the old CA trusted until every node has moved\n";

/// How a rotation treats the old cluster CA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rotation {
    /// Gone at once: nothing outside the control plane trusts it (no node).
    AtOnce,
    /// Trusted beside the new one until every node has moved.
    Overlap,
}

fn marker(cluster_dir: &Path) -> PathBuf {
    cluster_dir.join("pki").join(MARKER)
}

fn previous(cluster_dir: &Path) -> PathBuf {
    cluster_dir.join("pki").join(PREVIOUS)
}

/// Asks for the rotation at the next start.
pub fn ask(cluster_dir: &Path, how: Rotation) -> Result<()> {
    let path = marker(cluster_dir);
    let text: &[u8] = match how {
        Rotation::AtOnce => b"asked by `cluster rotate-ca`\n",
        Rotation::Overlap => OVERLAP,
    };
    crate::pki::write_private(&path, text, 0o600)
}

/// Whether a rotation waits for the next start.
pub fn asked(cluster_dir: &Path) -> bool {
    marker(cluster_dir).exists()
}

/// The old cluster CA's certificate (PEM) while nodes move to the new one.
pub fn overlapping(cluster_dir: &Path) -> Option<String> {
    std::fs::read_to_string(previous(cluster_dir).join("ca.crt")).ok()
}

/// Asks for the old cluster CA's retirement at the next start (every node has moved).
pub fn retire(cluster_dir: &Path) -> Result<()> {
    let path = cluster_dir.join("pki").join(RETIRE);
    crate::pki::write_private(&path, b"every node has moved\n", 0o600)
}

/// Whether the old cluster CA's retirement waits for the next start.
pub fn retiring(cluster_dir: &Path) -> bool {
    cluster_dir.join("pki").join(RETIRE).exists()
}

/// Carries out a rotation asked for: `Ok(Some(how))` if there was one. With
/// [`Rotation::Overlap`] the old CA is in `pki/previous/` and [`cross_sign`] finishes it once
/// the new CA is made. A retirement asked for is carried out first.
pub fn apply_pending(cluster_dir: &Path) -> Result<Option<Rotation>> {
    let pki = cluster_dir.join("pki");
    if retiring(cluster_dir) && !asked(cluster_dir) {
        socialweb_proc::gone::dir(&previous(cluster_dir))?;
        for f in [CROSS, "ca-bundle.crt", "apiserver-chain.crt"] {
            socialweb_proc::gone::file(&pki.join(f))?;
        }
        socialweb_proc::gone::file(&pki.join(RETIRE))?;
    }
    if !asked(cluster_dir) {
        // A start cut short between the marker's removal and the key's.
        socialweb_proc::gone::file(&previous(cluster_dir).join("ca.key"))?;
        return Ok(None);
    }
    let how = match std::fs::read(marker(cluster_dir))? {
        t if t == OVERLAP => Rotation::Overlap,
        _ => Rotation::AtOnce,
    };
    match how {
        Rotation::Overlap => keep_previous(cluster_dir)?,
        Rotation::AtOnce => socialweb_proc::gone::dir(&previous(cluster_dir))?,
    }
    for sub in ["front-proxy", "etcd"] {
        socialweb_proc::gone::dir(&pki.join(sub))?;
    }
    for e in std::fs::read_dir(&pki).with_context(|| format!("reading {}", pki.display()))? {
        let e = e?;
        if e.file_type()?.is_file() && !KEEP.iter().any(|k| e.file_name() == *k) {
            std::fs::remove_file(e.path())
                .with_context(|| format!("removing {}", e.path().display()))?;
        }
    }
    socialweb_proc::gone::file(&pki.join(RETIRE))?;
    if how == Rotation::AtOnce {
        std::fs::remove_file(marker(cluster_dir)).context("removing the rotation's marker")?;
    }
    Ok(Some(how))
}

/// The old CA copied aside (made in `previous.new/`, renamed in), once: a start cut short
/// finds it there and does not take the CA it had made for the old one.
fn keep_previous(cluster_dir: &Path) -> Result<()> {
    let (pki, dir) = (cluster_dir.join("pki"), previous(cluster_dir));
    if dir.join("ca.key").exists() {
        return Ok(());
    }
    if dir.exists() {
        // Left by an earlier rotation's overlap: nodes are still moving.
        anyhow::bail!(
            "{} holds an earlier rotation's CA: its nodes have not all moved yet",
            dir.display()
        );
    }
    let tmp = pki.join("previous.new");
    socialweb_proc::gone::dir(&tmp)?;
    std::fs::create_dir_all(&tmp)?;
    for f in ["ca.crt", "ca.key"] {
        std::fs::copy(pki.join(f), tmp.join(f))
            .with_context(|| format!("keeping {} aside", pki.join(f).display()))?;
    }
    std::fs::rename(&tmp, &dir).with_context(|| format!("moving {} in", dir.display()))
}

/// Ends a [`Rotation::Overlap`] once the new CA (`ca`) is made: the new CA's certificate
/// signed by the old key (`ca-cross.crt`), then the marker removed, then the old key
/// deleted (a start cut short in between deletes it: [`apply_pending`]).
pub fn cross_sign(cluster_dir: &Path, ca: &crate::pki::Pki) -> Result<()> {
    let old = previous(cluster_dir);
    if !asked(cluster_dir) || !old.join("ca.key").exists() {
        return Ok(());
    }
    let read = |p: PathBuf| {
        std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))
    };
    let cross = ca.cross_signed_by(&read(old.join("ca.crt"))?, &read(old.join("ca.key"))?)?;
    let pki = cluster_dir.join("pki");
    crate::pki::write_private(&pki.join(CROSS), cross.as_bytes(), 0o644)?;
    std::fs::remove_file(marker(cluster_dir)).context("removing the rotation's marker")?;
    std::fs::remove_file(old.join("ca.key")).context("deleting the old CA's key")
}

/// The cross certificate while nodes move (PEM).
pub fn cross(cluster_dir: &Path) -> Option<String> {
    std::fs::read_to_string(cluster_dir.join("pki").join(CROSS)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::Pki;

    #[test]
    fn every_authority_and_what_it_signed_goes_but_the_service_account_key() {
        let dir = std::env::temp_dir().join(format!("rotate-ca-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let pki = Pki::open_or_create(&dir.join("pki"), "c").unwrap();
        pki.key("sa").unwrap();
        pki.client("admin", "a", &[]).unwrap();
        Pki::open_or_create(&dir.join("pki/front-proxy"), "f").unwrap();
        Pki::open_or_create(&dir.join("pki/etcd"), "e").unwrap();
        let sa = std::fs::read(dir.join("pki/sa.key")).unwrap();
        assert_eq!(apply_pending(&dir).unwrap(), None, "nothing asked");
        assert!(dir.join("pki/ca.key").exists());
        ask(&dir, Rotation::AtOnce).unwrap();
        assert!(asked(&dir));
        assert_eq!(apply_pending(&dir).unwrap(), Some(Rotation::AtOnce));
        let mut left: Vec<String> = std::fs::read_dir(dir.join("pki"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["sa.key", "sa.pub"]);
        assert_eq!(std::fs::read(dir.join("pki/sa.key")).unwrap(), sa);
        assert!(!asked(&dir));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// With nodes: the old CA kept aside and trusted, the new one cross-signed by it, the old
    /// key deleted; a start cut short before the cross certificate redoes it; the retirement
    /// removes what the overlap kept.
    #[test]
    fn an_overlap_keeps_the_old_ca_trusted_until_it_is_retired() {
        use socialweb_wire::ca::{certificates, issued_by};
        let dir = std::env::temp_dir().join(format!("rotate-ca-overlap-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let old = Pki::open_or_create(&dir.join("pki"), "c").unwrap();
        let old_pem = old.ca_pem().to_string();
        ask(&dir, Rotation::Overlap).unwrap();
        assert_eq!(apply_pending(&dir).unwrap(), Some(Rotation::Overlap));
        // Cut short here: the old CA is still the one kept aside.
        assert_eq!(apply_pending(&dir).unwrap(), Some(Rotation::Overlap));
        assert_eq!(overlapping(&dir).as_deref(), Some(old_pem.as_str()));
        let new = Pki::open_or_create(&dir.join("pki"), "c").unwrap();
        assert_ne!(new.ca_pem(), old_pem);
        cross_sign(&dir, &new).unwrap();
        assert!(!asked(&dir) && !dir.join("pki/previous/ca.key").exists());
        let one = |pem: &str| certificates(pem.as_bytes()).unwrap().remove(0);
        let cross = one(&cross(&dir).unwrap());
        assert!(
            issued_by(&cross.der, &one(&old_pem)),
            "the old CA signed the cross"
        );
        assert_eq!(cross.pin, one(new.ca_pem()).pin, "the new CA's key");
        let leaf = new.client("admin", "a", &[]).unwrap();
        let leaf = one(&std::fs::read_to_string(leaf.cert).unwrap());
        assert!(
            issued_by(&leaf.der, &cross),
            "verifies through the cross certificate"
        );
        // Nothing more until the retirement.
        assert_eq!(apply_pending(&dir).unwrap(), None);
        assert!(overlapping(&dir).is_some() && cross_cert_exists(&dir));
        retire(&dir).unwrap();
        assert_eq!(apply_pending(&dir).unwrap(), None);
        assert!(overlapping(&dir).is_none() && !cross_cert_exists(&dir) && !retiring(&dir));
        assert!(dir.join("pki/ca.key").exists(), "the new CA stays");
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn cross_cert_exists(dir: &Path) -> bool {
        cross(dir).is_some()
    }
}
