//! The gateway API's input on arbitrary bytes, as a stranger sends it: the body read as
//! JSON, then as each procedure's input (strict: unknown fields are errors), and the market
//! protocol's RFP and acceptance a provider reads. A command or an error that says what is
//! wrong; never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use socialweb_broker::api::{self, methods};

fuzz_target!(|data: &[u8]| {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else {
        let _ = serde_json::from_slice::<socialweb_market::RfpRequest>(data);
        return;
    };
    for m in [api::CREATE_CLUSTER, api::DELETE_CLUSTER, api::GET_KUBECONFIG, api::REVOKE_CERTIFICATE] {
        if let Err(e) = methods::command(m, v.clone()) {
            assert!(!e.message.is_empty());
        }
    }
    if let Ok(r) = serde_json::from_value::<socialweb_market::RfpRequest>(v.clone()) {
        let _ = r.validate();
    }
    let _ = serde_json::from_value::<socialweb_market::Accept>(v);
});
