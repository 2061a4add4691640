//! The identity document parser on arbitrary bytes: a document or an error naming a field;
//! and the PEM certificate reader behind `ca_cert` and the cluster-info CA.
#![no_main]

use libfuzzer_sys::fuzz_target;
use socialweb_wire::NodeIdentity;

fuzz_target!(|data: &[u8]| {
    let _ = socialweb_wire::ca::certificates(data);
    match NodeIdentity::from_json(data) {
        Ok(id) => assert_eq!(NodeIdentity::from_json(id.to_json().to_string().as_bytes()).unwrap(), id),
        Err(e) => assert!(!e.field.is_empty()),
    }
});
