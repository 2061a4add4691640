//! What a guest writes on its status port, as the provider reads it (`socialweb_wire::guest`):
//! any bytes give events or nothing, never a panic; an event written back reads the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use socialweb_wire::guest::{events, line, parse};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for e in events(&text) {
        assert_eq!(parse(&line(&e)), Some(e));
    }
});
