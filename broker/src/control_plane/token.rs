//! Bootstrap tokens: the credential a node's identity carries to join (kubelet TLS
//! bootstrapping). A token is a Secret `bootstrap-token-<id>` in `kube-system`; the apiserver
//! authenticates `<id>.<secret>` against it as `system:bootstrap:<id>` in
//! [`super::BOOTSTRAP_GROUP`].

use rand::Rng;
use socialweb_wire::BootstrapToken;

const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

fn random(n: usize) -> String {
    let mut rng = rand::rng();
    (0..n)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// A fresh random token (6 + 16 characters of `[a-z0-9]`, about 82 bits of secret).
pub fn new_bootstrap_token() -> BootstrapToken {
    BootstrapToken {
        id: random(6),
        secret: random(16),
    }
}

/// The Secret that makes `token` valid, until `expiration` (RFC 3339) when given; the
/// controller-manager's token cleaner deletes it then.
pub fn bootstrap_token_secret(
    token: &BootstrapToken,
    description: &str,
    expiration: Option<&str>,
) -> serde_json::Value {
    let mut data = serde_json::json!({
        "description": description,
        "token-id": token.id,
        "token-secret": token.secret,
        "usage-bootstrap-authentication": "true",
        "auth-extra-groups": super::BOOTSTRAP_GROUP,
    });
    if let Some(e) = expiration {
        data["expiration"] = e.into();
    }
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "bootstrap.kubernetes.io/token",
        "metadata": {"name": format!("bootstrap-token-{}", token.id), "namespace": "kube-system",
                     "labels": {"app.kubernetes.io/managed-by": "socialweb"}},
        "stringData": data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_have_the_bootstrap_shape_and_differ() {
        let a = new_bootstrap_token();
        let b = new_bootstrap_token();
        assert!(BootstrapToken::parse(&a.expose()).is_ok());
        assert_ne!(a, b);
        let s = bootstrap_token_secret(&a, "node-1", Some("2030-01-01T00:00:00Z"));
        assert_eq!(s["metadata"]["name"], format!("bootstrap-token-{}", a.id));
        assert_eq!(
            s["stringData"]["auth-extra-groups"],
            super::super::BOOTSTRAP_GROUP
        );
        assert_eq!(s["stringData"]["expiration"], "2030-01-01T00:00:00Z");
    }
}
