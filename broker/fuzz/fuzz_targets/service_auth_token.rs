//! Service-auth tokens on arbitrary text: the form and claims checks that run before any DID
//! is resolved, then, for a token they pass, the signature check against a did:key. An
//! error naming what is wrong, or a token; never a panic, and nothing passes unsigned.
#![no_main]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use libfuzzer_sys::fuzz_target;
use socialweb_broker::auth::did;
use socialweb_broker::auth::token::inspect;

const AUD: &str = "did:web:gateway.example";
const METHOD: &str = "computer.socialweb.listClusters";

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let _ = SystemTime::now();
    match inspect(text, AUD, METHOD, now) {
        Ok(t) => {
            assert!(t.exp > 1_800_000_000);
            if t.did.starts_with("did:key:")
                && let Ok(k) = did::did_key(&t.did)
            {
                let _ = t.signed_by(&k);
            }
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
