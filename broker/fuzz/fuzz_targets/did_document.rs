//! DID documents and DIDs on arbitrary bytes, as a stranger's server or token gives them:
//! the document's #atproto key or an error that repeats nothing of the document; a did:web's
//! URL only for a DNS name and plain path segments.
#![no_main]

use libfuzzer_sys::fuzz_target;
use socialweb_broker::auth::did;

fuzz_target!(|data: &[u8]| {
    let d = "did:web:users.example.test";
    if let Err(e) = did::key_from_document(d, data) {
        assert!(e.starts_with(d), "{e}");
    }
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(u) = did::did_web_url(text) {
        assert_eq!(u.scheme(), "https");
        assert!(u.host_str().is_some_and(|h| h.parse::<std::net::IpAddr>().is_err()));
        // A segment may hold dots ("..0" is a name); never a dot segment itself.
        assert!(u.path_segments().is_some_and(|mut s| s.all(|s| s != "." && s != "..")));
        assert!(u.query().is_none() && u.fragment().is_none());
    }
    let _ = did::valid_plc(text);
    let _ = did::shown(text);
});
