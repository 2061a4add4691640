//! A cluster's CA material kept in the store, sealed under the operator's key
//! (`store.key_file`), so that the store is its one home and a host's disk holds copies:
//! a host with an empty disk, the store and the key serves the cluster with the same CAs,
//! and the store without the key cannot sign for it. Without a key, the files stay where
//! they are made and this does nothing (the single-host default).
//!
//! Only what cannot be made again is kept: each authority's certificate and key and the
//! service-account signing key. Everything a CA signs for the control plane is issued again
//! from it when missing.

use std::path::Path;
use std::time::SystemTime;

use anyhow::{Context, Result};
use socialweb_broker_core::millis;

use crate::store::Store;

pub mod host;
pub mod rekey;
pub mod seal;

pub use seal::SealKey;

/// The directories (relative to a cluster's) holding an authority's `ca.crt` and `ca.key`:
/// the cluster's CA and the service-account key beside it, the front-proxy CA, etcd's CA,
/// the users CA (`control_plane::runner`, `access::certs`).
pub const AUTHORITIES: &[&str] = &["pki", "pki/front-proxy", "pki/etcd", "users"];

/// The files kept, relative to a cluster's directory, in the groups that only work
/// together (each authority's certificate and key, the service-account key pair): a group is
/// sealed whole or not at all, and taken from the store whole.
pub fn groups() -> Vec<[String; 2]> {
    let mut groups: Vec<[String; 2]> = AUTHORITIES.iter().map(|d| authority(d)).collect();
    groups.push(["pki/sa.key".to_string(), "pki/sa.pub".to_string()]);
    groups
}

/// The group of the authority in `dir` (one of [`AUTHORITIES`]): its certificate and key.
fn authority(dir: &str) -> [String; 2] {
    [format!("{dir}/ca.crt"), format!("{dir}/ca.key")]
}

/// Every file kept, relative to a cluster's directory.
pub fn kept() -> Vec<String> {
    groups().into_iter().flatten().collect()
}

/// What one sync did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Synced {
    /// Files written from the store (missing or different on this disk).
    pub restored: Vec<String>,
    /// Files sealed into the store (made on this host, not there yet).
    pub sealed: Vec<String>,
}

/// The store and the key.
#[derive(Debug, Clone)]
pub struct Vault {
    store: Store,
    key: SealKey,
}

impl Vault {
    pub fn new(store: Store, key: SealKey) -> Vault {
        Vault { store, key }
    }

    /// Makes cluster `cluster`'s files in `dir` and its rows in the store agree, group by
    /// group ([`groups`]): a group in the store wins over the files (the store is the home; a
    /// file differing from it was made by a host that lost a race or a disk that outlived the
    /// cluster), and a group made here and not in the store is sealed in, whole. Where a file
    /// changed, whatever its authority had signed on this disk is removed, to be issued again
    /// from the CA the store holds.
    pub async fn sync(&self, cluster: &str, dir: &Path) -> Result<Synced> {
        let mut done = Synced::default();
        for group in groups() {
            self.sync_group(cluster, dir, &group, &mut done).await?;
        }
        for rel in &done.restored {
            let authority = Path::new(rel).parent().unwrap_or(Path::new(""));
            forget_signed(&dir.join(authority))?;
        }
        Ok(done)
    }

    /// A new cluster's users CA in `dir`, sealed, for its creation
    /// (`Store::create_cluster_sealed`): the cluster's row never exists without it, so a host
    /// of the fleet that follows the cluster never waits for a creator that died.
    pub fn seal_users_ca(&self, cluster: &str, dir: &Path) -> Result<Vec<Sealed>> {
        let group = authority("users");
        let mut plain = Vec::new();
        for rel in &group {
            let path = dir.join(rel);
            plain
                .push(std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?);
        }
        Ok(self.seal(cluster, &group, &plain))
    }

    /// `group`'s files, `plain`, sealed under the key.
    fn seal(&self, cluster: &str, group: &[String; 2], plain: &[Vec<u8>]) -> Vec<Sealed> {
        group
            .iter()
            .zip(plain)
            .map(|(rel, bytes)| Sealed {
                path: rel.clone(),
                key_id: self.key.id().to_string(),
                text: self.key.seal(&format!("{cluster}/{rel}"), bytes),
            })
            .collect()
    }

    /// One group of [`sync`](Self::sync).
    async fn sync_group(
        &self,
        cluster: &str,
        dir: &Path,
        group: &[String; 2],
        done: &mut Synced,
    ) -> Result<()> {
        let mut local = Vec::new();
        for rel in group {
            let path = dir.join(rel);
            local.push(match std::fs::read(&path) {
                Ok(b) => Some(b),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
            });
        }
        let mut rows = self.store.sealed_group(cluster, group).await?;
        if rows.iter().all(Option::is_none) {
            // Not in the store: seal this host's, if it has made the whole group.
            let Some(mine) = local.iter().cloned().collect::<Option<Vec<_>>>() else {
                return Ok(());
            };
            let sealed = self.seal(cluster, group, &mine);
            let now = millis(SystemTime::now());
            if self
                .store
                .insert_sealed_group(cluster, &as_rows(&sealed), now)
                .await?
            {
                done.sealed.extend(group.iter().cloned());
                return Ok(());
            }
            // Another host sealed its own first: take that one, whole.
            rows = self.store.sealed_group(cluster, group).await?;
        }
        let Some(rows) = rows.into_iter().collect::<Option<Vec<_>>>() else {
            anyhow::bail!(
                "cluster {cluster}'s {} is only partly in the store ({} must be kept together); \
                 the store was altered or written by an older broker: restore it from a backup",
                group[0],
                group.join(" and ")
            );
        };
        // Every file opened before any is written: a group is never half replaced.
        let mut plain = Vec::new();
        for (rel, (key_id, text)) in group.iter().zip(rows) {
            plain.push(
                self.key
                    .open(&format!("{cluster}/{rel}"), &key_id, &text)
                    .with_context(|| {
                        format!("cluster {cluster}'s {rel} in the store (store.key_file)")
                    })?,
            );
        }
        for ((rel, plain), have) in group.iter().zip(plain).zip(local) {
            if have.as_deref() != Some(&plain[..]) {
                write(&dir.join(rel), &plain)?;
                done.restored.push(rel.clone());
            }
        }
        Ok(())
    }
}

/// A kept file sealed: its path in the cluster's directory, the key's id, the sealed text.
#[derive(Debug, Clone)]
pub struct Sealed {
    pub path: String,
    pub key_id: String,
    pub text: String,
}

/// Sealed files as the store takes them (path, key id, sealed text).
pub fn as_rows(sealed: &[Sealed]) -> Vec<(&str, &str, &str)> {
    sealed
        .iter()
        .map(|f| (f.path.as_str(), f.key_id.as_str(), f.text.as_str()))
        .collect()
}

/// Writes a kept file: keys owner-only, in an owner-only directory.
fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    let parent = path.parent().context("a kept file has a directory")?;
    socialweb_proc::owner_only::dir(parent)
        .with_context(|| format!("creating {}", parent.display()))?;
    let mode = if path.extension().is_some_and(|e| e == "key") {
        0o600
    } else {
        0o644
    };
    crate::pki::write_private(path, bytes, mode)
}

/// Removes what an authority in `dir` signed (its certificates, their keys, kubeconfigs
/// naming them), keeping the files the vault keeps; subdirectories are other authorities.
fn forget_signed(dir: &Path) -> Result<()> {
    let keep = ["ca.crt", "ca.key", "sa.key", "sa.pub"];
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for e in entries {
        let e = e?;
        let name = e.file_name();
        if e.file_type()?.is_file() && !keep.iter().any(|k| name == *k) {
            std::fs::remove_file(e.path())
                .with_context(|| format!("removing {}", e.path().display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::control_plane::runner::{Datastore, Ports, Spec};

    pub(crate) fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("vault-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// A cluster's spec, for `ensure_authorities` alone (nothing is started).
    pub(crate) fn spec(cluster: &str, dir: PathBuf) -> Spec {
        Spec {
            cluster: cluster.to_string(),
            dir,
            kube: PathBuf::from("/nonexistent"),
            ports: Ports {
                api: 1,
                etcd_client: 2,
                etcd_peer: 3,
                controller_manager: 4,
                scheduler: 5,
                guard: 6,
            },
            isolated: false,
            datastore: Datastore::Etcd,
            gogc: 100,
            budget: Default::default(),
            cgroup_parent: Default::default(),
            datastore_quota: None,
            metrics: Default::default(),
            tied: false,
            certificates: Default::default(),
        }
    }

    /// A cluster directory as a host makes it: its authorities and a users CA
    /// (`access::certs`'s tests check that `kept` names every file the real makers make).
    fn made(cluster: &str, dir: PathBuf) {
        spec(cluster, dir.clone()).ensure_authorities().unwrap();
        crate::pki::Pki::open_or_create(&dir.join("users"), "users").unwrap();
    }

    async fn store(dir: &Path) -> Store {
        Store::open(&format!("sqlite://{}?mode=rwc", dir.join("b.db").display()))
            .await
            .unwrap()
    }

    fn key() -> SealKey {
        SealKey::from_hex(&SealKey::generate(), "k").unwrap()
    }

    #[tokio::test]
    async fn a_host_with_an_empty_disk_gets_the_same_authorities_and_the_store_no_plain_key() {
        let dir = scratch("empty");
        let (store, key) = (store(&dir).await, key());
        let vault = Vault::new(store.clone(), key.clone());
        made("c1", dir.join("a"));
        let first = vault.sync("c1", &dir.join("a")).await.unwrap();
        assert_eq!(first.sealed.len(), kept().len());
        assert!(first.restored.is_empty());
        for rel in kept() {
            let (id, text) = store.sealed_file("c1", &rel).await.unwrap().unwrap();
            assert_eq!(id, key.id());
            assert!(!text.contains("PRIVATE KEY") && !text.contains("CERTIFICATE"));
        }
        // Another host: nothing on its disk, the same store and key.
        let second = vault.sync("c1", &dir.join("b")).await.unwrap();
        assert_eq!(second.restored.len(), kept().len());
        for rel in kept() {
            assert_eq!(
                std::fs::read(dir.join("a").join(&rel)).unwrap(),
                std::fs::read(dir.join("b").join(&rel)).unwrap(),
                "{rel}"
            );
        }
        let mode = std::fs::metadata(dir.join("b/pki/ca.key"))
            .unwrap()
            .permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        // In step: a second sync changes nothing.
        assert_eq!(
            vault.sync("c1", &dir.join("b")).await.unwrap(),
            Synced::default()
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn the_store_wins_over_a_ca_made_on_another_disk_and_what_it_signed_goes() {
        let dir = scratch("race");
        let vault = Vault::new(store(&dir).await, key());
        made("c1", dir.join("a"));
        vault.sync("c1", &dir.join("a")).await.unwrap();
        // Host b made its own CA and signed with it before it synced (a lost race).
        made("c1", dir.join("b"));
        let own = crate::pki::Pki::open_or_create(&dir.join("b/pki"), "x").unwrap();
        own.server("apiserver", &["127.0.0.1".into()]).unwrap();
        let synced = vault.sync("c1", &dir.join("b")).await.unwrap();
        assert!(synced.sealed.is_empty(), "{synced:?}");
        assert_eq!(synced.restored.len(), kept().len());
        assert!(!dir.join("b/pki/apiserver.crt").exists());
        assert_eq!(
            std::fs::read(dir.join("a/pki/ca.key")).unwrap(),
            std::fs::read(dir.join("b/pki/ca.key")).unwrap()
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A cluster's row and its users CA reach the store in one transaction: a host that
    /// follows the cluster from its row restores the creator's users CA at once, even if
    /// the creator never synced (died right after the create); a create refused because
    /// the name exists seals nothing.
    #[tokio::test]
    async fn a_new_clusters_row_comes_with_its_users_ca() {
        let dir = scratch("row");
        let store = store(&dir).await;
        let vault = Vault::new(store.clone(), key());
        crate::pki::Pki::open_or_create(&dir.join("a/users"), "users").unwrap();
        let sealed = vault.seal_users_ca("c1", &dir.join("a")).unwrap();
        let new = crate::store::NewCluster {
            name: "c1",
            owner: None,
            dir: "a",
            limits: None,
            hibernate_after_secs: None,
            datastore: "etcd",
        };
        let now = SystemTime::now();
        store
            .create_cluster_sealed(&new, now, &as_rows(&sealed))
            .await
            .unwrap();
        assert_eq!(store.sealed_files("c1").await.unwrap(), 2);
        let synced = vault.sync("c1", &dir.join("b")).await.unwrap();
        assert_eq!(synced.restored, ["users/ca.crt", "users/ca.key"]);
        for rel in ["users/ca.crt", "users/ca.key"] {
            assert_eq!(
                std::fs::read(dir.join("a").join(rel)).unwrap(),
                std::fs::read(dir.join("b").join(rel)).unwrap(),
                "{rel}"
            );
        }
        crate::pki::Pki::open_or_create(&dir.join("c/users"), "users").unwrap();
        let other = vault.seal_users_ca("c1", &dir.join("c")).unwrap();
        let e = store
            .create_cluster_sealed(&new, now, &as_rows(&other))
            .await
            .unwrap_err();
        assert!(e.downcast_ref::<crate::store::Exists>().is_some(), "{e:#}");
        let users = ["users/ca.crt".to_string(), "users/ca.key".to_string()];
        let kept = store.sealed_group("c1", &users).await.unwrap();
        assert_eq!(
            kept[1].as_ref().map(|(_, t)| t.as_str()),
            Some(sealed[1].text.as_str()),
            "the first cluster's users CA stays"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Two hosts that each made a cluster's authorities and sync at once (a fleet: the
    /// creator, and a host that starts following the cluster as it appears) end with the
    /// same files, and each group is one host's whole: never one's certificate beside the
    /// other's key (CI, 2026-12-05: a front-proxy CA mixed this way made every request
    /// through the front a 401).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_hosts_syncing_at_once_never_mix_a_certificate_with_the_other_hosts_key() {
        let dir = scratch("mixed");
        let path = dir.join("b.db");
        Store::open(&format!("sqlite://{}?mode=rwc", path.display()))
            .await
            .unwrap();
        let key = key();
        for round in 0..64 {
            let cluster = format!("c{round}");
            let (a, b) = (dir.join(format!("{round}a")), dir.join(format!("{round}b")));
            made(&cluster, a.clone());
            made(&cluster, b.clone());
            let origin = |d: &Path| -> Vec<Vec<u8>> {
                kept()
                    .iter()
                    .map(|r| std::fs::read(d.join(r)).unwrap())
                    .collect()
            };
            let (was_a, was_b) = (origin(&a), origin(&b));
            // Each host its own pool, as two broker processes have.
            let host = |d: PathBuf, cluster: String| {
                let (url, key) = (format!("sqlite://{}", path.display()), key.clone());
                tokio::spawn(async move {
                    let v = Vault::new(Store::open(&url).await.unwrap(), key);
                    v.sync(&cluster, &d).await.unwrap()
                })
            };
            let (sa, sb) = tokio::join!(host(a.clone(), cluster.clone()), host(b.clone(), cluster));
            let (sa, sb) = (sa.unwrap(), sb.unwrap());
            let (now_a, now_b) = (origin(&a), origin(&b));
            assert_eq!(
                now_a, now_b,
                "round {round}: both hosts hold the same files"
            );
            let mut i = 0;
            for group in groups() {
                let n = group.len();
                let files = &now_a[i..i + n];
                assert!(
                    files == &was_a[i..i + n] || files == &was_b[i..i + n],
                    "round {round}: {group:?} mixes the two hosts' files ({sa:?}, {sb:?})"
                );
                i += n;
            }
            let sealed = sa.sealed.len() + sb.sealed.len();
            assert_eq!(sealed, kept().len(), "round {round}: each file sealed once");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_host_with_another_key_is_refused_naming_both_keys_and_keeps_its_files() {
        let dir = scratch("other");
        let store = store(&dir).await;
        let (ours, theirs) = (key(), key());
        made("c1", dir.join("a"));
        Vault::new(store.clone(), ours.clone())
            .sync("c1", &dir.join("a"))
            .await
            .unwrap();
        let e = Vault::new(store.clone(), theirs.clone())
            .sync("c1", &dir.join("b"))
            .await
            .unwrap_err();
        let e = format!("{e:#}");
        assert!(
            e.contains("store.key_file") && e.contains(ours.id()) && e.contains(theirs.id()),
            "{e}"
        );
        assert!(!dir.join("b/pki/ca.key").exists());
        // A row moved to another cluster does not open there.
        let (id, text) = store
            .sealed_file("c1", "pki/ca.key")
            .await
            .unwrap()
            .unwrap();
        store
            .insert_sealed_file("c2", "pki/ca.key", &id, &text, 0)
            .await
            .unwrap();
        let e = Vault::new(store, ours)
            .sync("c2", &dir.join("c"))
            .await
            .unwrap_err();
        assert!(format!("{e:#}").contains("altered"), "{e:#}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
