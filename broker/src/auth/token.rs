//! Service-auth tokens: JWTs signed with a DID's ATProto key. The JWT structure and the
//! signature check run through `jwt-compact`; the curves, key encodings and ATProto's
//! low-S rule through `atrium-crypto` (an [`Algorithm`] below joins the two).

use std::borrow::Cow;
use std::num::NonZeroUsize;
use std::time::{SystemTime, UNIX_EPOCH};

use atrium_crypto::keypair::{Did, Export, P256Keypair, Secp256k1Keypair};
use jwt_compact::{AlgorithmExt, AlgorithmSignature, Claims, Header, UntrustedToken};
use serde::{Deserialize, Serialize};

use super::AuthError;
use super::did::{Key, Resolver, base};

/// The longest a token may still be good for when it arrives.
pub const MAX_TOKEN_SECS: i64 = 3600;
/// How far ahead of ours a caller's clock may be.
pub const CLOCK_SKEW_SECS: i64 = 30;

/// The claims beyond the registered time claims.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceClaims {
    pub iss: String,
    pub aud: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lxm: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jti: Option<String>,
}

/// ES256 or ES256K, verified by `atrium-crypto` (low-S only, as ATProto requires).
#[derive(Clone, Copy)]
pub struct Es(pub atrium_crypto::Algorithm);

/// A raw 64-byte `r || s` signature.
#[derive(Debug, Clone)]
pub struct RawSignature(Vec<u8>);

impl AlgorithmSignature for RawSignature {
    const LENGTH: Option<NonZeroUsize> = NonZeroUsize::new(64);

    fn try_from_slice(slice: &[u8]) -> anyhow::Result<Self> {
        Ok(RawSignature(slice.to_vec()))
    }

    fn as_bytes(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.0)
    }
}

/// A DID key that signs (the user side: the CLI).
pub enum SigningKey {
    P256(P256Keypair),
    K256(Secp256k1Keypair),
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SigningKey({})", self.did())
    }
}

impl std::fmt::Debug for Es {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name_str())
    }
}

impl Es {
    fn name_str(&self) -> String {
        match self.0 {
            atrium_crypto::Algorithm::P256 => "ES256".into(),
            atrium_crypto::Algorithm::Secp256k1 => "ES256K".into(),
        }
    }
}

impl jwt_compact::Algorithm for Es {
    type SigningKey = SigningKey;
    type VerifyingKey = Vec<u8>;
    type Signature = RawSignature;

    fn name(&self) -> Cow<'static, str> {
        Cow::Owned(self.name_str())
    }

    fn sign(&self, key: &SigningKey, message: &[u8]) -> RawSignature {
        RawSignature(key.sign(message))
    }

    fn verify_signature(&self, sig: &RawSignature, key: &Vec<u8>, message: &[u8]) -> bool {
        atrium_crypto::verify::Verifier::default()
            .verify(self.0, key, message, &sig.0)
            .is_ok()
    }
}

/// Multicodec prefixes (unsigned varints) of private keys in multibase, as ATProto tools
/// (`goat key generate`) write them.
const P256_PRIV: [u8; 2] = [0x86, 0x26];
const K256_PRIV: [u8; 2] = [0x81, 0x26];

impl SigningKey {
    /// A new random key.
    pub fn generate(alg: atrium_crypto::Algorithm) -> SigningKey {
        loop {
            let bytes: [u8; 32] = rand::random();
            let k = match alg {
                atrium_crypto::Algorithm::P256 => P256Keypair::import(&bytes).map(SigningKey::P256),
                atrium_crypto::Algorithm::Secp256k1 => {
                    Secp256k1Keypair::import(&bytes).map(SigningKey::K256)
                }
            };
            // A random scalar out of range is astronomically rare; draw again.
            if let Ok(k) = k {
                return k;
            }
        }
    }

    pub fn alg(&self) -> atrium_crypto::Algorithm {
        match self {
            SigningKey::P256(_) => atrium_crypto::Algorithm::P256,
            SigningKey::K256(_) => atrium_crypto::Algorithm::Secp256k1,
        }
    }

    /// The `did:key` of this key.
    pub fn did(&self) -> String {
        match self {
            SigningKey::P256(k) => k.did(),
            SigningKey::K256(k) => k.did(),
        }
    }

    fn sign(&self, msg: &[u8]) -> Vec<u8> {
        match self {
            SigningKey::P256(k) => k.sign(msg),
            SigningKey::K256(k) => k.sign(msg),
        }
        .expect("ECDSA signing with a valid key")
    }

    /// The private key as multibase (base58btc) with its multicodec prefix.
    pub fn to_multibase(&self) -> String {
        let (prefix, bytes) = match self {
            SigningKey::P256(k) => (P256_PRIV, k.export()),
            SigningKey::K256(k) => (K256_PRIV, k.export()),
        };
        let mut v = prefix.to_vec();
        v.extend_from_slice(&bytes);
        multibase::encode(multibase::Base::Base58Btc, v)
    }

    /// Reads [`Self::to_multibase`]'s form.
    pub fn from_multibase(s: &str) -> Result<SigningKey, String> {
        let (_, bytes) = multibase::decode(s.trim()).map_err(|e| format!("not multibase: {e}"))?;
        let bad = |e: atrium_crypto::Error| format!("not a valid private key: {e}");
        match bytes.get(..2) {
            Some(p) if p == P256_PRIV => P256Keypair::import(&bytes[2..])
                .map(SigningKey::P256)
                .map_err(bad),
            Some(p) if p == K256_PRIV => Secp256k1Keypair::import(&bytes[2..])
                .map(SigningKey::K256)
                .map_err(bad),
            _ => Err(
                "not a P-256 or secp256k1 private key (multicodec p256-priv or secp256k1-priv)"
                    .into(),
            ),
        }
    }
}

fn unix(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn at(secs: i64) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp(secs, 0).unwrap_or_default()
}

/// Signs a token for `method` at `aud`, good for `secs` from `now`, with a fresh nonce.
pub fn sign(
    key: &SigningKey,
    iss: &str,
    aud: &str,
    method: &str,
    secs: i64,
    now: SystemTime,
) -> String {
    let mut claims = Claims::new(ServiceClaims {
        iss: iss.to_string(),
        aud: aud.to_string(),
        lxm: Some(method.to_string()),
        jti: Some(crate::access::certs::hex(&rand::random::<[u8; 16]>())),
    });
    claims.issued_at = Some(at(unix(now)));
    claims.expiration = Some(at(unix(now) + secs));
    Es(key.alg())
        .token(&Header::empty().with_token_type("JWT"), &claims, key)
        .expect("serializing claims")
}

/// What a verified token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The caller's DID (`iss` without a fragment).
    pub did: String,
    /// The token's nonce, qualified by the issuer: `<iss> <jti>`.
    pub nonce: String,
    /// Unix seconds.
    pub exp: i64,
}

/// What a token says, its form and claims checked, its signature not yet (that needs the
/// issuer's key, which costs a DID resolution: nothing is resolved for a token this refuses).
pub struct Inspected<'a> {
    untrusted: UntrustedToken<'a>,
    alg: atrium_crypto::Algorithm,
    /// The caller's DID (`iss` without a fragment).
    pub did: String,
    pub jti: String,
    pub exp: i64,
}

/// Checks `token`'s form and its claims against `aud` and `method` at `now`.
pub fn inspect<'a>(
    token: &'a str,
    aud: &str,
    method: &str,
    now: SystemTime,
) -> Result<Inspected<'a>, AuthError> {
    let untrusted = UntrustedToken::new(token).map_err(|e| AuthError::Malformed(e.to_string()))?;
    let alg = match untrusted.algorithm() {
        "ES256" => atrium_crypto::Algorithm::P256,
        "ES256K" => atrium_crypto::Algorithm::Secp256k1,
        other => return Err(AuthError::Algorithm(shorten(other))),
    };
    let claims = untrusted
        .deserialize_claims_unchecked::<ServiceClaims>()
        .map_err(|e| AuthError::Malformed(format!("its claims: {e}")))?;
    let c = &claims.custom;
    if c.aud != aud {
        return Err(AuthError::Audience {
            got: shorten(&c.aud),
            want: aud.to_string(),
        });
    }
    let lxm = c.lxm.as_deref().ok_or(AuthError::MissingClaim("lxm"))?;
    if lxm != method {
        return Err(AuthError::Method {
            got: shorten(lxm),
            want: method.to_string(),
        });
    }
    let now = unix(now);
    let exp = claims
        .expiration
        .ok_or(AuthError::MissingClaim("exp"))?
        .timestamp();
    if exp <= now {
        return Err(AuthError::Expired(exp));
    }
    if exp > now + MAX_TOKEN_SECS {
        return Err(AuthError::TooLong {
            exp,
            max: MAX_TOKEN_SECS,
        });
    }
    if let Some(iat) = claims.issued_at.map(|t| t.timestamp())
        && iat > now + CLOCK_SKEW_SECS
    {
        return Err(AuthError::FromTheFuture(iat));
    }
    let jti = c.jti.clone().ok_or(AuthError::MissingClaim("jti"))?;
    if jti.is_empty() || jti.len() > 128 {
        return Err(AuthError::Malformed("jti: 1-128 bytes".into()));
    }
    let did = base(&c.iss).to_string();
    if did.len() > 512 {
        return Err(AuthError::Malformed("iss: over 512 bytes".into()));
    }
    Ok(Inspected {
        untrusted,
        alg,
        did,
        jti,
        exp,
    })
}

/// A caller's value, as an error repeats it: at most 100 characters.
fn shorten(s: &str) -> String {
    super::did::shown(s)
}

impl std::fmt::Debug for Inspected<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inspected")
            .field("did", &self.did)
            .field("jti", &self.jti)
            .field("exp", &self.exp)
            .finish_non_exhaustive()
    }
}

impl Inspected<'_> {
    /// Whether `key` signed the token.
    pub fn signed_by(&self, key: &Key) -> bool {
        key.alg == self.alg
            && Es(self.alg)
                .validator::<ServiceClaims>(&key.public)
                .validate(&self.untrusted)
                .is_ok()
    }
}

/// Checks everything about `token` but replay (the caller records the nonce): its form, its
/// claims against `aud` and `method` at `now` ([`inspect`]), and then its signature against
/// the key of its issuer.
pub async fn verify(
    token: &str,
    aud: &str,
    method: &str,
    resolver: &Resolver,
    now: SystemTime,
) -> Result<Verified, AuthError> {
    let t = inspect(token, aud, method, now)?;
    let key = resolver.key(&t.did, false).await.map_err(AuthError::Did)?;
    if !t.signed_by(&key) {
        // A kept document may hold a key rotated since; look once more.
        let fresh = if t.did.starts_with("did:key:") {
            None
        } else {
            Some(resolver.key(&t.did, true).await.map_err(AuthError::Did)?)
        };
        if !fresh.as_ref().is_some_and(|k| t.signed_by(k)) {
            return Err(AuthError::Signature(t.did));
        }
    }
    Ok(Verified {
        nonce: format!("{} {}", t.did, t.jti),
        did: t.did,
        exp: t.exp,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const AUD: &str = "did:web:broker.example";
    const M: &str = "computer.socialweb.createCluster";

    fn resolver() -> Resolver {
        crate::crypto_provider();
        Resolver::new("https://plc.invalid", &[], &[]).unwrap()
    }

    async fn check(token: &str, now: SystemTime) -> Result<Verified, AuthError> {
        verify(token, AUD, M, &resolver(), now).await
    }

    #[tokio::test]
    async fn a_token_signed_by_the_did_key_for_this_audience_and_method_verifies() {
        for alg in [
            atrium_crypto::Algorithm::P256,
            atrium_crypto::Algorithm::Secp256k1,
        ] {
            let k = SigningKey::generate(alg);
            let now = SystemTime::now();
            let t = sign(&k, &k.did(), AUD, M, 60, now);
            let v = check(&t, now).await.unwrap();
            assert_eq!(v.did, k.did());
            assert!(v.nonce.starts_with(&k.did()));
            // And the private key survives its file form.
            let back = SigningKey::from_multibase(&k.to_multibase()).unwrap();
            assert_eq!(back.did(), k.did());
        }
    }

    #[tokio::test]
    async fn every_wrong_token_is_refused_with_its_reason() {
        let k = SigningKey::generate(atrium_crypto::Algorithm::P256);
        let other = SigningKey::generate(atrium_crypto::Algorithm::Secp256k1);
        let now = SystemTime::now();
        let r = |t: String| async move { check(&t, now).await.unwrap_err() };
        assert_eq!(
            r(sign(
                &k,
                &k.did(),
                AUD,
                M,
                60,
                now - Duration::from_secs(120)
            ))
            .await,
            AuthError::Expired(unix(now) - 60)
        );
        assert!(matches!(
            r(sign(&k, &k.did(), "did:web:other", M, 60, now)).await,
            AuthError::Audience { .. }
        ));
        assert!(matches!(
            r(sign(
                &k,
                &k.did(),
                AUD,
                "computer.socialweb.deleteCluster",
                60,
                now
            ))
            .await,
            AuthError::Method { .. }
        ));
        // Signed by another key than the DID's.
        assert_eq!(
            r(sign(&other, &k.did(), AUD, M, 60, now)).await,
            AuthError::Signature(k.did())
        );
        assert!(matches!(
            r(sign(&k, &k.did(), AUD, M, 7200, now)).await,
            AuthError::TooLong { .. }
        ));
        assert!(matches!(
            r(sign(
                &k,
                &k.did(),
                AUD,
                M,
                60,
                now + Duration::from_secs(300)
            ))
            .await,
            AuthError::FromTheFuture(_)
        ));
        assert!(matches!(r("a.b".into()).await, AuthError::Malformed(_)));
        // A signature flipped to its high-S twin is refused (ATProto's low-S rule).
        let t = sign(&k, &k.did(), AUD, M, 60, now);
        let (signed, sig) = t.rsplit_once('.').unwrap();
        use base64::Engine;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let mut raw = b64.decode(sig).unwrap();
        raw[40] ^= 1;
        let tampered = format!("{signed}.{}", b64.encode(raw));
        assert_eq!(r(tampered).await, AuthError::Signature(k.did()));
    }
}
