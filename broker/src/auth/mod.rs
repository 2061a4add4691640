//! Who calls the gateway API: ATProto-style service-auth tokens (docs/api.md). A caller
//! signs a short JWT with their DID's key (`iss` the DID, `aud` this broker's DID, `lxm` the
//! method, `exp`, `jti` a nonce); the broker resolves the DID's key and checks all of it.
//!
//! - [`did`]: a DID's ATProto signing key: `did:key` offline, `did:web` and `did:plc` from
//!   their documents over HTTPS.
//! - [`public_dns`]: did:web hosts resolved to public addresses only.
//! - [`token`]: the JWT, through `jwt-compact`, with the curves and low-S rule of
//!   `atrium-crypto`.

pub mod did;
pub mod public_dns;
pub mod token;

/// Why a caller is refused; each names what was wrong, for the caller to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("no token: send `Authorization: Bearer <service-auth JWT>`")]
    Missing,
    #[error("the token is not a JWT: {0}")]
    Malformed(String),
    #[error(
        "alg {0:?} is not accepted; ATProto service auth uses ES256 (P-256) or ES256K (secp256k1)"
    )]
    Algorithm(String),
    #[error("{0}: missing from the token")]
    MissingClaim(&'static str),
    #[error("aud: the token is for {got:?}, and this broker is {want:?}")]
    Audience { got: String, want: String },
    #[error("lxm: the token is for method {got:?}, and this call is {want:?}")]
    Method { got: String, want: String },
    #[error("exp: the token expired at {0} (Unix seconds)")]
    Expired(i64),
    #[error(
        "exp: the token is good until {exp}, more than {max} s from now; ask for a shorter-lived token"
    )]
    TooLong { exp: i64, max: i64 },
    #[error("iat: the token is issued at {0}, in the future")]
    FromTheFuture(i64),
    #[error("jti: the token was used already (a replay); sign a new one for every call")]
    Replayed,
    #[error("iss: {0}")]
    Did(String),
    #[error("the signature does not verify against the key of {0}")]
    Signature(String),
}
