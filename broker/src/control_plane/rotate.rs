//! `cluster rotate-ca` for the cluster's own authorities (its CA, the front-proxy CA,
//! etcd's): asked by a marker in its `pki/`, carried out at the next start of its control
//! plane, before anything is issued -- every authority and everything it signed is removed
//! and made again. Only the service-account key stays (ServiceAccount tokens outlive a CA
//! rotation, as in kubeadm's). The command asks only while no node trusts the old CA
//! (`cluster::rotate`), so nothing outside the control plane holds it.
//!
//! Crash-safe by order: the marker goes last, so a start cut short removes again what it
//! made (nothing has used it yet).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// What stays: the service-account key pair, and the marker until the end.
const KEEP: &[&str] = &["sa.key", "sa.pub", MARKER];
const MARKER: &str = "rotate-ca";

fn marker(cluster_dir: &Path) -> PathBuf {
    cluster_dir.join("pki").join(MARKER)
}

/// Asks for the rotation at the next start.
pub fn ask(cluster_dir: &Path) -> Result<()> {
    let path = marker(cluster_dir);
    crate::pki::write_private(&path, b"asked by `cluster rotate-ca`\n", 0o600)
}

/// Whether a rotation waits for the next start.
pub fn asked(cluster_dir: &Path) -> bool {
    marker(cluster_dir).exists()
}

/// Carries out a rotation asked for: `Ok(true)` if there was one.
pub fn apply_pending(cluster_dir: &Path) -> Result<bool> {
    if !asked(cluster_dir) {
        return Ok(false);
    }
    let pki = cluster_dir.join("pki");
    for sub in ["front-proxy", "etcd"] {
        let d = pki.join(sub);
        match std::fs::remove_dir_all(&d) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", d.display())),
        }
    }
    for e in std::fs::read_dir(&pki).with_context(|| format!("reading {}", pki.display()))? {
        let e = e?;
        if e.file_type()?.is_file() && !KEEP.iter().any(|k| e.file_name() == *k) {
            std::fs::remove_file(e.path())
                .with_context(|| format!("removing {}", e.path().display()))?;
        }
    }
    std::fs::remove_file(marker(cluster_dir)).context("removing the rotation's marker")?;
    Ok(true)
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
        assert!(!apply_pending(&dir).unwrap(), "nothing asked");
        assert!(dir.join("pki/ca.key").exists());
        ask(&dir).unwrap();
        assert!(asked(&dir));
        assert!(apply_pending(&dir).unwrap());
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
}
