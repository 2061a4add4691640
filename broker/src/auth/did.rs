//! A DID's ATProto signing key. `did:key` carries its key; `did:web` and `did:plc` name a
//! document that lists it as the verification method `#atproto` (a `Multikey` with
//! `publicKeyMultibase`). Documents are fetched over HTTPS only and kept for a minute; a
//! signature that fails against a kept key fetches the document again (the key may have
//! rotated).

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

/// The longest DID accepted.
const MAX_DID: usize = 512;

/// Whether `host` is a DNS name with at least two labels, none all digits at the end (so
/// no IPv4 literal in any spelling), every label 1-63 of letters, digits and inner hyphens.
fn dns_name(host: &str) -> bool {
    let labels: Vec<&str> = host.split('.').collect();
    host.len() <= 253
        && labels.len() >= 2
        && labels.iter().all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
        && !labels.last().is_some_and(|t| ends_in_a_number(t))
}

/// Whether a URL parser reads a host whose last label is `label` as an IPv4 address (the
/// WHATWG URL standard's "ends in a number": decimal, or `0x` and hex digits), so that
/// `127.0.0.0x1` is refused as the address it is.
fn ends_in_a_number(label: &str) -> bool {
    let hex = label
        .strip_prefix("0x")
        .or_else(|| label.strip_prefix("0X"));
    match hex {
        Some(h) => h.bytes().all(|b| b.is_ascii_hexdigit()),
        None => label.bytes().all(|b| b.is_ascii_digit()),
    }
}

/// Where a `did:web`'s document is: `did:web:host%3Aport:a:b` is
/// `https://host:port/a/b/did.json`, and a bare host has it at `/.well-known/did.json`.
/// Only a DNS name is accepted as the host (never an address literal), an optional port,
/// and path segments of unreserved characters: no `?`, `#`, `/`, `%` escapes or `..`.
pub fn did_web_url(did: &str) -> Result<url::Url, String> {
    let bad = |why: &str| format!("{}: not a valid did:web ({why})", shown(did));
    if did.len() > MAX_DID {
        return Err(bad("over 512 bytes"));
    }
    let rest = did
        .strip_prefix("did:web:")
        .ok_or_else(|| format!("{}: not a did:web", shown(did)))?;
    let mut parts = rest.split(':');
    let authority = parts.next().unwrap_or_default();
    let (host, port) = match authority
        .split_once("%3A")
        .or_else(|| authority.split_once("%3a"))
    {
        Some((h, p)) => {
            let port: u16 = p
                .parse()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| bad("the port is not 1-65535"))?;
            (h, Some(port))
        }
        None => (authority, None),
    };
    if !dns_name(host) {
        return Err(bad(
            "the host must be a DNS name of two labels or more, not an address",
        ));
    }
    let path: Vec<&str> = parts.collect();
    let segment_ok = |s: &&str| {
        !s.is_empty()
            && s.len() <= 100
            && *s != "."
            && *s != ".."
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b))
    };
    if path.len() > 8 || !path.iter().all(segment_ok) {
        return Err(bad(
            "each path segment is 1-100 of A-Z a-z 0-9 - . _ ~, at most 8",
        ));
    }
    let authority = match port {
        Some(p) => format!("{host}:{p}"),
        None => host.to_string(),
    };
    let u = if path.is_empty() {
        format!("https://{authority}/.well-known/did.json")
    } else {
        format!("https://{authority}/{}/did.json", path.join("/"))
    };
    let u = url::Url::parse(&u).map_err(|_| bad("not a URL"))?;
    // The parser is the judge of what the host is: a name here, whatever the checks above
    // missed, or nothing is fetched.
    match u.host() {
        Some(url::Host::Domain(_)) => Ok(u),
        _ => Err(bad("the host must be a DNS name, not an address")),
    }
}

/// Whether `did` is a `did:plc`: 24 of a-z and 2-7.
pub fn valid_plc(did: &str) -> bool {
    did.strip_prefix("did:plc:").is_some_and(|id| {
        id.len() == 24
            && id
                .bytes()
                .all(|b| b.is_ascii_lowercase() || (b'2'..=b'7').contains(&b))
    })
}

/// A DID as messages show it: at most 100 characters, printable ASCII only (a caller's
/// input, echoed to them and to the log).
pub fn shown(did: &str) -> String {
    let mut s: String = did
        .chars()
        .take(100)
        .map(|c| if c.is_ascii_graphic() { c } else { '?' })
        .collect();
    if did.chars().count() > 100 {
        s.push_str("...");
    }
    s
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
    // Nothing of the fetched document is repeated in an error: it is a stranger's.
    let d: Document = serde_json::from_slice(doc).map_err(|e| {
        format!(
            "{did}: its DID document is not a DID document (JSON error at line {}, column {})",
            e.line(),
            e.column()
        )
    })?;
    if d.id != did {
        return Err(format!("{did}: the DID document is for another DID"));
    }
    let m = d
        .verification_method
        .iter()
        .find(|m| m.id == "#atproto" || m.id == format!("{did}#atproto"))
        .ok_or_else(|| format!("{did}: the DID document has no #atproto verification method"))?;
    if m.kind != "Multikey" {
        return Err(format!("{did}: #atproto is not a Multikey"));
    }
    let mb = m
        .public_key_multibase
        .as_deref()
        .ok_or_else(|| format!("{did}: #atproto has no publicKeyMultibase"))?;
    let (alg, public) = atrium_crypto::did::parse_multikey(mb).map_err(|_| {
        format!("{did}: #atproto's publicKeyMultibase is not a P-256 or secp256k1 key")
    })?;
    Ok(Key { alg, public })
}

/// What the resolver keeps of a DID: its key, or why it could not be had.
#[derive(Debug, Clone)]
enum Kept {
    Key(Instant, Key),
    Failed(Instant, String),
}

/// Resolves DIDs to keys (docs/security.md): `did:web` documents only from hosts that
/// resolve to public addresses, read while streaming up to 64 KiB; at most
/// [`MAX_FETCHES`] fetches at once; keys kept for [`KEEP`], failures for [`KEEP_FAILURE`],
/// the least recently used of [`KEPT`] DIDs forgotten first.
#[derive(Debug)]
pub struct Resolver {
    /// For did:web: DNS through [`PublicOnly`].
    web: reqwest::Client,
    /// For did:plc, at the operator's directory.
    plc: reqwest::Client,
    plc_directory: String,
    kept: Mutex<lru::LruCache<String, Kept>>,
    fetches: tokio::sync::Semaphore,
}

/// How long a fetched document's key is used without fetching it again.
pub const KEEP: Duration = Duration::from_secs(60);
/// How long a failed resolution is answered from memory.
pub const KEEP_FAILURE: Duration = Duration::from_secs(10);
/// How many DIDs are kept.
pub const KEPT: usize = 4096;
/// How many documents are fetched at once.
pub const MAX_FETCHES: usize = 16;
/// The largest DID document read.
const MAX_DOCUMENT: usize = 64 * 1024;
/// A key is fetched again after a failed signature only when it is older than this.
const REFETCH_AFTER: Duration = Duration::from_secs(10);

impl Resolver {
    /// `extra_roots`: PEM CA certificates trusted for `did:web` besides the system's (a test,
    /// or a private deployment). `nameservers`: where did:web hosts are looked up (empty:
    /// the system's resolver).
    pub fn new(
        plc_directory: &str,
        extra_roots: &[Vec<u8>],
        nameservers: &[std::net::SocketAddr],
    ) -> anyhow::Result<Resolver> {
        let mut roots = Vec::new();
        for pem in extra_roots {
            roots.extend(reqwest::Certificate::from_pem_bundle(pem)?);
        }
        let builder = || {
            reqwest::Client::builder()
                .https_only(true)
                .timeout(Duration::from_secs(5))
                .connect_timeout(Duration::from_secs(3))
                .redirect(reqwest::redirect::Policy::none())
        };
        let web = builder()
            .tls_certs_merge(roots)
            .dns_resolver(std::sync::Arc::new(super::public_dns::PublicOnly::new(
                nameservers,
            )))
            .build()?;
        Ok(Resolver {
            web,
            plc: builder().build()?,
            plc_directory: plc_directory.trim_end_matches('/').to_string(),
            kept: Mutex::new(lru::LruCache::new(
                std::num::NonZeroUsize::new(KEPT).expect("KEPT > 0"),
            )),
            fetches: tokio::sync::Semaphore::new(MAX_FETCHES),
        })
    }

    /// The key of `did`; `fresh` fetches its document again when the kept one is older
    /// than [`REFETCH_AFTER`] (its key may have rotated).
    pub async fn key(&self, did: &str, fresh: bool) -> Result<Key, String> {
        if did.starts_with("did:key:") {
            return did_key(did);
        }
        let url = self.url(did)?;
        if let Some(k) = self.kept(did, fresh) {
            return k;
        }
        let Ok(_permit) =
            tokio::time::timeout(Duration::from_secs(2), self.fetches.acquire()).await
        else {
            return Err(format!(
                "{did}: the broker is resolving too many DIDs; try again"
            ));
        };
        let got = self.fetch(did, &url).await;
        let kept = match &got {
            Ok(k) => Kept::Key(Instant::now(), k.clone()),
            Err(e) => Kept::Failed(Instant::now(), e.clone()),
        };
        self.kept.lock().expect("lock").put(did.to_string(), kept);
        got
    }

    /// Where `did`'s document is, or why it is not a DID this broker resolves.
    fn url(&self, did: &str) -> Result<url::Url, String> {
        if did.starts_with("did:web:") {
            did_web_url(did)
        } else if valid_plc(did) {
            url::Url::parse(&format!("{}/{did}", self.plc_directory))
                .map_err(|e| format!("{did}: {e}"))
        } else if did.starts_with("did:plc:") {
            Err(format!(
                "{}: not a valid did:plc (24 of a-z, 2-7)",
                shown(did)
            ))
        } else {
            Err(format!(
                "{}: only did:key, did:web and did:plc are accepted",
                shown(did)
            ))
        }
    }

    /// The answer kept for `did`, if it is to be used.
    fn kept(&self, did: &str, fresh: bool) -> Option<Result<Key, String>> {
        let mut kept = self.kept.lock().expect("lock");
        match kept.get(did)? {
            Kept::Key(at, k)
                if at.elapsed() < KEEP && !(fresh && at.elapsed() >= REFETCH_AFTER) =>
            {
                Some(Ok(k.clone()))
            }
            Kept::Failed(at, e) if at.elapsed() < KEEP_FAILURE => Some(Err(e.clone())),
            _ => None,
        }
    }

    async fn fetch(&self, did: &str, url: &url::Url) -> Result<Key, String> {
        let http = if did.starts_with("did:web:") {
            &self.web
        } else {
            &self.plc
        };
        let mut resp = http.get(url.clone()).send().await.map_err(|e| {
            // reqwest's own words name the URL (ours, from the DID) and the cause.
            format!("{did}: fetching {url}: {}", error_chain(&e))
        })?;
        if !resp.status().is_success() {
            return Err(format!("{did}: {url} answered {}", resp.status().as_u16()));
        }
        if resp
            .content_length()
            .is_some_and(|n| n > MAX_DOCUMENT as u64)
        {
            return Err(format!("{did}: the DID document is over 64 KiB"));
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| format!("{did}: reading {url}: {}", error_chain(&e)))?
        {
            if body.len() + chunk.len() > MAX_DOCUMENT {
                return Err(format!("{did}: the DID document is over 64 KiB"));
            }
            body.extend_from_slice(&chunk);
        }
        key_from_document(did, &body)
    }
}

/// An error with its causes, as one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
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
            did_web_url("did:web:alice.example%3A8443:u:alice")
                .unwrap()
                .as_str(),
            "https://alice.example:8443/u/alice/did.json"
        );
        assert!(did_web_url("did:web:").is_err());
        assert!(did_web_url("did:key:z").is_err());
    }

    #[test]
    fn a_did_web_names_a_dns_host_and_plain_segments_only() {
        for bad in [
            "did:web:127.0.0.1",
            "did:web:127.0.0.1%3A8443",
            "did:web:2130706433",
            "did:web:0x7f.1",
            "did:web:127.0.0.0x1",
            "did:web:60.000.0X00d00",
            "did:web:a.0x",
            "did:web:[::1]",
            "did:web:%5B%3A%3A1%5D",
            "did:web:localhost",
            "did:web:localhost%3A8443",
            "did:web:example.com%3A0",
            "did:web:example.com%3A99999",
            "did:web:example.com:a?b",
            "did:web:example.com:a#b",
            "did:web:example.com:..",
            "did:web:example.com:a%2Fb",
            "did:web:example.com:a/b",
            "did:web:-bad.com",
            "did:web:exa mple.com",
            "did:web:user@example.com",
        ] {
            assert!(did_web_url(bad).is_err(), "{bad} was accepted");
        }
        assert!(did_web_url(&format!("did:web:example.com{}", ":a".repeat(9))).is_err());
        assert!(did_web_url(&format!("did:web:{}.com", "a".repeat(600))).is_err());
        assert_eq!(
            did_web_url("did:web:bob.example.test%3A8443:u:bob_1")
                .unwrap()
                .as_str(),
            "https://bob.example.test:8443/u/bob_1/did.json"
        );
        assert!(valid_plc("did:plc:ewvi7nxzyoun6zhxrhs64oiz"));
        assert!(!valid_plc("did:plc:ewvi7nxzyoun6zhxrhs64oi/"));
        assert!(!valid_plc("did:plc:../../admin"));
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
        assert!(e.contains("for another DID") && !e.contains("evil"), "{e}");
        let e = key_from_document(did, doc(did, "#other", "Multikey").as_bytes()).unwrap_err();
        assert!(e.contains("no #atproto"), "{e}");
        let e = key_from_document(did, b"{").unwrap_err();
        assert!(e.contains("DID document"), "{e}");
    }
}
