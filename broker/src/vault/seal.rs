//! The operator's key and what it seals: AES-256-GCM with a fresh random nonce per sealing,
//! the sealed bytes bound to where they belong (the cluster and the file) as associated data,
//! so that a row copied to another cluster or file does not open. Pure: no store, no disk
//! but the key file's one read.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use sha2::Digest as _;

/// What sealed text starts with: the format's version, so that a later one can be told.
const PREFIX: &str = "v1:";
const NONCE_LEN: usize = 12;

/// Why a key could not be read.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "{path} is readable by others (mode {mode:o}): a key that seals CA keys must be \
         owner-only (chmod 600)"
    )]
    Open { path: String, mode: u32 },
    #[error("{0} must hold 64 hexadecimal characters (32 bytes; `socialweb-broker store-key`)")]
    Format(String),
}

/// Why sealed text did not open.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    #[error("not sealed text of this version (it should start with {PREFIX:?})")]
    Format,
    #[error(
        "sealed under key {sealed_with}, and this host's key is {ours} (a previous key goes in \
         store.previous_key_files until `socialweb-broker store-rekey` has re-sealed everything)"
    )]
    OtherKey { sealed_with: String, ours: String },
    #[error("does not open under key {0}: altered, or sealed for another place")]
    Altered(String),
}

/// The key sealing clusters' CA material in the store (`store.key_file`), and the keys it
/// replaces (`store.previous_key_files`): what they sealed still opens, and nothing new is
/// sealed under them.
#[derive(Clone)]
pub struct SealKey {
    cipher: Aes256Gcm,
    id: String,
    previous: Vec<(String, Aes256Gcm)>,
}

impl std::fmt::Debug for SealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealKey")
            .field("id", &self.id)
            .field(
                "previous",
                &self.previous.iter().map(|(id, _)| id).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl SealKey {
    /// A key from its 64 hexadecimal characters (surrounding whitespace ignored).
    pub fn from_hex(text: &str, named: &str) -> Result<SealKey, KeyError> {
        let text = text.trim();
        let bytes: Vec<u8> = (text.len() == 64 && text.is_ascii())
            .then(|| {
                (0..32)
                    .map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok())
                    .collect::<Option<Vec<u8>>>()
            })
            .flatten()
            .ok_or_else(|| KeyError::Format(named.to_string()))?;
        // Names the key without revealing it: the store records it beside each sealing, so
        // that a host with another key says so instead of "altered".
        let mut h = sha2::Sha256::new();
        h.update(b"socialweb seal key id\0");
        h.update(&bytes);
        let id = h.finalize()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let cipher = Aes256Gcm::new_from_slice(&bytes).expect("32 bytes");
        Ok(SealKey {
            cipher,
            id,
            previous: Vec::new(),
        })
    }

    /// This key, still opening what `previous` sealed (a rotation under way).
    pub fn with_previous(mut self, previous: impl IntoIterator<Item = SealKey>) -> SealKey {
        for p in previous {
            if p.id != self.id && !self.previous.iter().any(|(id, _)| *id == p.id) {
                self.previous.push((p.id, p.cipher));
            }
        }
        self
    }

    /// The ids of the previous keys it still opens with.
    pub fn previous_ids(&self) -> impl Iterator<Item = &str> {
        self.previous.iter().map(|(id, _)| id.as_str())
    }

    /// Reads the key file at `path`, which must be owner-only.
    pub fn load(path: &Path) -> Result<SealKey, KeyError> {
        let shown = path.display().to_string();
        let read = |source| KeyError::Read {
            path: shown.clone(),
            source,
        };
        let mode = std::fs::metadata(path).map_err(read)?.permissions().mode();
        if mode & 0o077 != 0 {
            return Err(KeyError::Open {
                path: shown,
                mode: mode & 0o777,
            });
        }
        let text = std::fs::read_to_string(path).map_err(read)?;
        SealKey::from_hex(&text, &shown)
    }

    /// A new random key, as the file holds it.
    pub fn generate() -> String {
        let bytes: [u8; 32] = rand::random();
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The key's public name (16 hexadecimal characters).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// `plain` sealed for `place` (what it is and whose: it must be given again to open).
    pub fn seal(&self, place: &str, plain: &[u8]) -> String {
        let nonce: [u8; NONCE_LEN] = rand::random();
        let sealed = self
            .cipher
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: plain,
                    aad: place.as_bytes(),
                },
            )
            .expect("AES-GCM seals any message under 64 GiB");
        let mut out = nonce.to_vec();
        out.extend_from_slice(&sealed);
        format!("{PREFIX}{}", STANDARD.encode(out))
    }

    /// Opens `text` sealed for `place` under the key named `sealed_with`.
    pub fn open(&self, place: &str, sealed_with: &str, text: &str) -> Result<Vec<u8>, OpenError> {
        let cipher = if sealed_with == self.id {
            &self.cipher
        } else if let Some((_, c)) = self.previous.iter().find(|(id, _)| id == sealed_with) {
            c
        } else {
            return Err(OpenError::OtherKey {
                sealed_with: sealed_with.to_string(),
                ours: self.id.clone(),
            });
        };
        let raw = text
            .strip_prefix(PREFIX)
            .and_then(|b| STANDARD.decode(b).ok())
            .filter(|r| r.len() >= NONCE_LEN)
            .ok_or(OpenError::Format)?;
        let (nonce, sealed) = raw.split_at(NONCE_LEN);
        cipher
            .decrypt(
                Nonce::from_slice(nonce),
                Payload {
                    msg: sealed,
                    aad: place.as_bytes(),
                },
            )
            .map_err(|_| OpenError::Altered(sealed_with.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> SealKey {
        SealKey::from_hex(&SealKey::generate(), "test").unwrap()
    }

    #[test]
    fn what_is_sealed_opens_for_its_place_and_nowhere_else() {
        let k = key();
        let text = k.seal("c1/pki/ca.key", b"secret");
        assert!(!text.contains("secret"));
        assert_eq!(k.open("c1/pki/ca.key", k.id(), &text).unwrap(), b"secret");
        assert_eq!(
            k.open("c2/pki/ca.key", k.id(), &text),
            Err(OpenError::Altered(k.id().to_string()))
        );
        // A fresh nonce each time: the same secret sealed twice reads differently.
        assert_ne!(text, k.seal("c1/pki/ca.key", b"secret"));
    }

    #[test]
    fn another_key_is_named_not_taken_for_tampering() {
        let (a, b) = (key(), key());
        let text = a.seal("p", b"x");
        assert_eq!(
            b.open("p", a.id(), &text),
            Err(OpenError::OtherKey {
                sealed_with: a.id().to_string(),
                ours: b.id().to_string()
            })
        );
        // A row claiming our key but sealed under another still fails.
        assert_eq!(
            b.open("p", b.id(), &text),
            Err(OpenError::Altered(b.id().to_string()))
        );
    }

    #[test]
    fn a_previous_key_still_opens_and_never_seals() {
        let (old, new, stranger) = (key(), key(), key());
        let by_old = old.seal("c/pki/ca.key", b"ca");
        let ring = new.clone().with_previous([old.clone(), new.clone()]);
        assert_eq!(
            ring.previous_ids().collect::<Vec<_>>(),
            [old.id()],
            "itself and twice: once"
        );
        assert_eq!(ring.open("c/pki/ca.key", old.id(), &by_old).unwrap(), b"ca");
        let by_ring = ring.seal("c/pki/ca.key", b"ca");
        assert_eq!(
            new.open("c/pki/ca.key", new.id(), &by_ring).unwrap(),
            b"ca",
            "sealed under the new key"
        );
        assert!(old.open("c/pki/ca.key", new.id(), &by_ring).is_err());
        // Altered under a previous key names that key.
        assert_eq!(
            ring.open("c/pki/other", old.id(), &by_old),
            Err(OpenError::Altered(old.id().to_string()))
        );
        let e = ring
            .open("p", stranger.id(), &stranger.seal("p", b"x"))
            .unwrap_err();
        assert!(e.to_string().contains("store.previous_key_files"), "{e}");
    }

    #[test]
    fn bad_sealed_text_is_an_error_not_a_panic() {
        let k = key();
        let good = k.seal("p", b"payload");
        let mut inputs = vec![
            String::new(),
            "v1:".into(),
            "v1:!!!".into(),
            "v0:AAAA".into(),
            format!("v1:{}", STANDARD.encode([0u8; 11])),
        ];
        // Every truncation and every single flipped character of a good sealing.
        inputs.extend((0..good.len()).map(|i| good[..i].to_string()));
        for i in PREFIX.len()..good.len() {
            let mut b = good.clone().into_bytes();
            b[i] = if b[i] == b'A' { b'B' } else { b'A' };
            inputs.push(String::from_utf8(b).unwrap());
        }
        for t in inputs {
            assert!(k.open("p", k.id(), &t).is_err(), "{t:?} opened");
        }
    }

    #[test]
    fn a_key_file_must_be_owner_only_and_well_formed() {
        let dir = std::env::temp_dir().join(format!("seal-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("key");
        std::fs::write(&path, format!("{}\n", SealKey::generate())).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = SealKey::load(&path).unwrap_err().to_string();
        assert!(e.contains("owner-only") && e.contains("644"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let k = SealKey::load(&path).unwrap();
        assert_eq!(k.id().len(), 16);
        assert_eq!(
            SealKey::load(&path).unwrap().id(),
            k.id(),
            "same file, same id"
        );
        std::fs::write(&path, "00ff").unwrap();
        let e = SealKey::load(&path).unwrap_err().to_string();
        assert!(e.contains("64 hexadecimal"), "{e}");
        assert!(SealKey::from_hex(&"g".repeat(64), "k").is_err());
        assert!(SealKey::from_hex(&"é".repeat(32), "k").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
