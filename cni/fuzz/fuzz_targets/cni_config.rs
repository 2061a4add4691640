//! CNI stdin and environment on arbitrary bytes: a configuration or an error with a code.
#![no_main]

use libfuzzer_sys::fuzz_target;
use socialweb_cni::config;
use socialweb_cni::spec::{Env, Verb};

fuzz_target!(|data: &[u8]| {
    for verb in [Verb::Add, Verb::Del, Verb::Check, Verb::Status, Verb::Gc] {
        if let Err(e) = config::parse(data, verb) {
            assert!(!e.msg.is_empty());
        }
    }
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(4, '\n');
    let vars: Vec<(String, String)> = ["CNI_COMMAND", "CNI_CONTAINERID", "CNI_IFNAME", "CNI_ARGS"]
        .iter()
        .map(|k| (k.to_string(), parts.next().unwrap_or("").to_string()))
        .collect();
    let _ = Env::from_lookup(|k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()));
});
