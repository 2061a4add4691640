//! A DID's ATProto signing key. `did:key` carries its key; `did:web` and `did:plc` name a
//! document that lists it as the verification method `#atproto` (a `Multikey` with
//! `publicKeyMultibase`). Documents are fetched over HTTPS only and kept for a minute; a
//! signature that fails against a kept key fetches the document again (the key may have
//! rotated).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use atrium_crypto::Algorithm;
use serde::Deserialize;

/// A DID's signing key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    pub alg: Algorithm,
    /// SEC1 public key bytes.
    pub public: Vec<u8>,
}

/// The part of a DID before any `#fragment` (ATProto's `iss` may name a service of a DID).
pub fn base(did: &str) -> &str {
    did.split('#').next().unwrap_or(did)
}

/// A `did:key`'s key.
pub fn did_key(did: &str) -> Result<Key, String> {
    let (alg, public) =
        atrium_crypto::did::parse_did_key(did).map_err(|e| format!("{did}: {e}"))?;
    Ok(Key { alg, public })
}

/// Where a `did:web`'s document is: `did:web:host%3Aport:a:b` is
/// `https://host:port/a/b/did.json`, and a bare host has it at `/.well-known/did.json`.
pub fn did_web_url(did: &str) -> Result<url::Url, String> {
    let rest = did
        .strip_prefix("did:web:")
        .ok_or_else(|| format!("{did}: not a did:web"))?;
    let mut parts = rest.split(':');
    let host = parts
        .next()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| format!("{did}: no host"))?
        .replace("%3A", ":")
        .replace("%3a", ":");
    let path: Vec<&str> = parts.collect();
    let u = if path.is_empty() {
        format!("https://{host}/.well-known/did.json")
    } else {
        format!("https://{host}/{}/did.json", path.join("/"))
    };
    let url = url::Url::parse(&u).map_err(|e| format!("{did}: {e}"))?;
    if url.host_str().is_none() || url.path().contains("..") {
        return Err(format!("{did}: not a valid did:web"));
    }
    Ok(url)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Document {
    id: String,
    #[serde(default)]
    verification_method: Vec<Method>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Method {
    id: String,
    #[serde(rename = "type")]
    kind: String,
    public_key_multibase: Option<String>,
}

/// The `#atproto` key of the document of `did`.
pub fn key_from_document(did: &str, doc: &[u8]) -> Result<Key, String> {
    let d: Document =
        serde_json::from_slice(doc).map_err(|e| format!("{did}: its DID document: {e}"))?;
    if d.id != did {
        return Err(format!(
            "{did}: the DID document is for {:?}, not for this DID",
            d.id
        ));
    }
    let m = d
        .verification_method
        .iter()
        .find(|m| m.id == "#atproto" || m.id == format!("{did}#atproto"))
        .ok_or_else(|| format!("{did}: the DID document has no #atproto verification method"))?;
    if m.kind != "Multikey" {
        return Err(format!(
            "{did}: #atproto is a {:?}; a Multikey is expected",
            m.kind
        ));
    }
    let mb = m
        .public_key_multibase
        .as_deref()
        .ok_or_else(|| format!("{did}: #atproto has no publicKeyMultibase"))?;
    let (alg, public) =
        atrium_crypto::did::parse_multikey(mb).map_err(|e| format!("{did}: #atproto: {e}"))?;
    Ok(Key { alg, public })
}

/// Resolves DIDs to keys, keeping documents for [`KEEP`].
#[derive(Debug)]
pub struct Resolver {
    http: reqwest::Client,
    plc_directory: String,
    kept: Mutex<HashMap<String, (Instant, Key)>>,
}

/// How long a fetched document's key is used without fetching it again.
pub const KEEP: Duration = Duration::from_secs(60);
/// The largest DID document read.
const MAX_DOCUMENT: usize = 64 * 1024;

impl Resolver {
    /// `extra_roots`: PEM CA certificates trusted for `did:web` besides the system's (a test,
    /// or a private deployment).
    pub fn new(plc_directory: &str, extra_roots: &[Vec<u8>]) -> anyhow::Result<Resolver> {
        let mut roots = Vec::new();
        for pem in extra_roots {
            roots.extend(reqwest::Certificate::from_pem_bundle(pem)?);
        }
        let http = reqwest::Client::builder()
            .https_only(true)
            .tls_certs_merge(roots)
            .timeout(Duration::from_secs(5))
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(Resolver {
            http,
            plc_directory: plc_directory.trim_end_matches('/').to_string(),
            kept: Mutex::new(HashMap::new()),
        })
    }

    /// The key of `did`; `fresh` fetches its document even when one is kept.
    pub async fn key(&self, did: &str, fresh: bool) -> Result<Key, String> {
        if did.starts_with("did:key:") {
            return did_key(did);
        }
        if !fresh
            && let Some((at, k)) = self.kept.lock().expect("lock").get(did)
            && at.elapsed() < KEEP
        {
            return Ok(k.clone());
        }
        let url = if did.starts_with("did:web:") {
            did_web_url(did)?
        } else if did.starts_with("did:plc:") {
            url::Url::parse(&format!("{}/{did}", self.plc_directory))
                .map_err(|e| format!("{did}: {e}"))?
        } else {
            return Err(format!(
                "{did}: only did:key, did:web and did:plc are accepted"
            ));
        };
        let resp = self
            .http
            .get(url.clone())
            .send()
            .await
            .map_err(|e| format!("{did}: fetching {url}: {e}"))?;
        if !resp.status().is_success() {
            return Err(format!("{did}: {url} answered {}", resp.status()));
        }
        let body = resp
            .bytes()
            .await
            .map_err(|e| format!("{did}: reading {url}: {e}"))?;
        if body.len() > MAX_DOCUMENT {
            return Err(format!("{did}: the DID document is over 64 KiB"));
        }
        let key = key_from_document(did, &body)?;
        self.kept
            .lock()
            .expect("lock")
            .insert(did.to_string(), (Instant::now(), key.clone()));
        Ok(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn did_web_names_map_to_their_document_urls() {
        assert_eq!(
            did_web_url("did:web:example.com").unwrap().as_str(),
            "https://example.com/.well-known/did.json"
        );
        assert_eq!(
            did_web_url("did:web:localhost%3A8443:u:alice")
                .unwrap()
                .as_str(),
            "https://localhost:8443/u/alice/did.json"
        );
        assert!(did_web_url("did:web:").is_err());
        assert!(did_web_url("did:key:z").is_err());
    }

    #[test]
    fn a_document_gives_its_atproto_multikey_and_nothing_else() {
        use atrium_crypto::keypair::{Did, P256Keypair};
        let kp = P256Keypair::import(&[7u8; 32]).unwrap();
        let did_key = kp.did();
        let multibase = did_key.strip_prefix("did:key:").unwrap();
        let doc = |id: &str, vm: &str, kind: &str| {
            serde_json::json!({"id": id, "verificationMethod": [
                {"id": vm, "type": kind, "controller": id, "publicKeyMultibase": multibase}]})
            .to_string()
        };
        let did = "did:web:example.com";
        let k = key_from_document(did, doc(did, "#atproto", "Multikey").as_bytes()).unwrap();
        assert_eq!(k, super::did_key(&did_key).unwrap());
        let k2 = key_from_document(
            did,
            doc(did, &format!("{did}#atproto"), "Multikey").as_bytes(),
        )
        .unwrap();
        assert_eq!(k, k2);
        let e = key_from_document(
            did,
            doc("did:web:evil.com", "#atproto", "Multikey").as_bytes(),
        )
        .unwrap_err();
        assert!(e.contains("is for \"did:web:evil.com\""), "{e}");
        let e = key_from_document(did, doc(did, "#other", "Multikey").as_bytes()).unwrap_err();
        assert!(e.contains("no #atproto"), "{e}");
        let e = key_from_document(did, b"{").unwrap_err();
        assert!(e.contains("DID document"), "{e}");
    }
}
