//! The kubeconfig a user gets: the cluster's URL at the front, the front's CA when the
//! broker made its serving certificate itself, and the client certificate and key inline
//! (`*-data`), so the file is all a runner needs. JSON, which every kubeconfig reader takes
//! (it is YAML too).

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use super::certs::Issued;

/// A kubeconfig for `cluster` at `server`, authenticating with `cert`.
pub fn render(cluster: &str, server: &str, front_ca_pem: Option<&str>, cert: &Issued) -> String {
    let mut c = serde_json::json!({"server": server});
    if let Some(ca) = front_ca_pem {
        c["certificate-authority-data"] = STANDARD.encode(ca).into();
    }
    let kc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster, "cluster": c}],
        "users": [{"name": cluster, "user": {
            "client-certificate-data": STANDARD.encode(&cert.cert_pem),
            "client-key-data": STANDARD.encode(&cert.key_pem),
        }}],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": cluster}}],
        "current-context": cluster,
        "preferences": {},
    });
    let mut s = serde_json::to_string_pretty(&kc).expect("JSON");
    s.push('\n');
    s
}
