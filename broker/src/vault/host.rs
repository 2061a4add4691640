//! The fleet's own authorities, kept in the store like a cluster's CAs (`fleet.enabled`):
//!
//! - the front's CA ([`FRONT`]): every host's front serves a certificate it signed, so the
//!   kubeconfig one host hands out is good at the front of any other;
//! - the fleet CA ([`FLEET`]): the hosts' link certificates (`crate::front::link`), each
//!   both a server's and a client's, so that a link admits the fleet's hosts and no one else;
//! - the key towards providers ([`MARKET`]): providers list one pin for the fleet, and any
//!   host may list and release the leases another rented.
//!
//! The first host to seal an authority's files wins; every other host takes that one.

use std::path::Path;

use std::time::SystemTime;

use anyhow::{Context, Result};
use socialweb_broker_core::millis;

use super::Vault;
use crate::pki::Pki;

/// The store's name for the front's CA (no cluster can be named so: names start with a
/// letter).
pub const FRONT: &str = "_front";
/// The store's name for the fleet CA.
pub const FLEET: &str = "_fleet";
/// The store's name for the fleet's key towards providers.
pub const MARKET: &str = "_market";

/// Where an authority's pair is kept: one row, so that two hosts sealing at once cannot
/// leave the store with one's certificate and the other's key.
const PAIR: &str = "ca.pair";

#[derive(serde::Serialize, serde::Deserialize)]
struct Pair {
    crt: String,
    key: String,
}

impl Vault {
    /// Makes the authority `name` in `dir` the fleet's one: the store's when it has one
    /// (whatever this host's CA had signed is removed, to be issued again), else this host's,
    /// made now when missing, sealed in.
    pub async fn authority(&self, name: &str, dir: &Path, common_name: &str) -> Result<()> {
        let (crt, key) = (dir.join("ca.crt"), dir.join("ca.key"));
        let what = format!("the fleet's {common_name} ({name} in the store)");
        let replaced = self
            .pair(name, &crt, &key, &what, || {
                Pki::open_or_create(dir, common_name).map(|_| ())
            })
            .await?;
        if replaced {
            super::forget_signed(dir)?;
        }
        Ok(())
    }

    /// Makes the files `crt` and `key` (a certificate and its key, which `make` makes when
    /// missing) the fleet's one pair `name`: the store's when it has one, else this host's,
    /// sealed in. Whether this host's files were replaced.
    pub async fn pair(
        &self,
        name: &str,
        crt: &Path,
        key: &Path,
        what: &str,
        make: impl FnOnce() -> Result<()>,
    ) -> Result<bool> {
        let place = format!("{name}/{PAIR}");
        let row = match self
            .store
            .sealed_file(name, PAIR)
            .await
            .context(what.to_string())?
        {
            Some(row) => row,
            None => {
                make().with_context(|| what.to_string())?;
                let mine = serde_json::to_vec(&Pair {
                    crt: std::fs::read_to_string(crt)?,
                    key: std::fs::read_to_string(key)?,
                })?;
                let text = self.key.seal(&place, &mine);
                self.store
                    .insert_sealed_file(name, PAIR, self.key.id(), &text, millis(SystemTime::now()))
                    .await
                    .context(what.to_string())?;
                // Another host may have sealed its own first: the store has the one that won.
                self.store
                    .sealed_file(name, PAIR)
                    .await
                    .context(what.to_string())?
                    .with_context(|| format!("{what} vanished from the store"))?
            }
        };
        let (key_id, text) = row;
        let plain = self
            .key
            .open(&place, &key_id, &text)
            .context(what.to_string())?;
        let kept: Pair = serde_json::from_slice(&plain).context(what.to_string())?;
        let same = |p: &Path, want: &str| std::fs::read_to_string(p).is_ok_and(|h| h == want);
        if same(crt, &kept.crt) && same(key, &kept.key) {
            return Ok(false);
        }
        super::write(crt, kept.crt.as_bytes())?;
        super::write(key, kept.key.as_bytes())?;
        tracing::info!(pair = name, "took {what} from the store");
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vault::tests::scratch;

    #[tokio::test]
    async fn every_host_ends_with_the_first_hosts_authority() {
        let d = scratch("host-authority");
        let store =
            crate::store::Store::open(&format!("sqlite://{}?mode=rwc", d.join("b.db").display()))
                .await
                .unwrap();
        let key = crate::vault::SealKey::from_hex(&crate::vault::SealKey::generate(), "k").unwrap();
        let v = Vault::new(store, key);
        let (one, two) = (d.join("one"), d.join("two"));
        v.authority(FLEET, &one, "fleet").await.unwrap();
        // Host two had made its own CA and signed with it before it joined.
        let own = Pki::open_or_create(&two, "fleet").unwrap();
        own.peer("link", &["192.0.2.2".to_string()]).unwrap();
        v.authority(FLEET, &two, "fleet").await.unwrap();
        let ca = |d: &Path| std::fs::read(d.join("ca.crt")).unwrap();
        assert_eq!(ca(&one), ca(&two), "both hold the first host's CA");
        assert!(
            !two.join("link.crt").exists(),
            "what host two's own CA signed is gone, to be issued again"
        );
        // The front's CA is another authority.
        v.authority(FRONT, &d.join("front"), "front").await.unwrap();
        assert_ne!(ca(&one), ca(&d.join("front")));
        let _ = std::fs::remove_dir_all(d);
    }
}
