//! Trusting the control plane before anything secret is sent to it, then checking the join
//! token.
//!
//! With `ca_cert` the identity hands the CA over directly. With `ca_cert_sha256` it pins the
//! CA's public key: the agent reads the `cluster-info` ConfigMap anonymously (TLS unverified,
//! no credentials: nothing to steal), keeps the certificate whose key matches the pin, and
//! from then on verifies the server against it -- kubeadm's token discovery. Only then does
//! the join token travel, once, in a SelfSubjectReview, so that a wrong or expired token is
//! reported by the agent in plain words before the kubelet starts retrying it.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use kube::{Client, Config};
use socialweb_wire::ca::{PinnedCert, certificates};
use socialweb_wire::{BootstrapToken, CaTrust};
use url::Url;

/// Why the control plane is not trusted (yet). No variant carries a secret.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("control plane {server} unreachable: {reason}")]
    Unreachable { server: String, reason: String },
    #[error(
        "the CA that {server} publishes does not match the identity's ca_cert_sha256: it has {found}, the identity pins {want}; refusing to send the join token"
    )]
    PinMismatch {
        server: String,
        found: String,
        want: String,
    },
    #[error(
        "{server} presented a certificate the identity's CA did not sign ({reason}); refusing to send the join token"
    )]
    NotOurCa { server: String, reason: String },
    #[error(
        "the control plane refused join token {id}.<secret> (401 Unauthorized): it is wrong, expired or deleted"
    )]
    TokenRefused { id: String },
    #[error("{0}")]
    Other(String),
}

/// Timeouts for the few requests the join makes itself.
const TIMEOUT: Duration = Duration::from_secs(10);

fn base_config(server: &Url) -> Result<Config, TrustError> {
    let uri = server
        .as_str()
        .trim_end_matches('/')
        .parse()
        .map_err(|e| TrustError::Other(format!("server_url {server}: {e}")))?;
    let mut c = Config::new(uri);
    c.connect_timeout = Some(TIMEOUT);
    c.read_timeout = Some(TIMEOUT);
    c.write_timeout = Some(TIMEOUT);
    c.reset_reader_on_write = true;
    Ok(c)
}

/// Turns a client error into what happened, in words an operator acts on.
fn classify(server: &Url, e: kube::Error) -> TrustError {
    let server = server.to_string();
    let text = error_chain(&e);
    match e {
        kube::Error::Api(s) => {
            TrustError::Other(format!("{server} answered {}: {}", s.code, s.message))
        }
        _ if text.contains("certificate")
            || text.contains("UnknownIssuer")
            || text.contains("BadSignature") =>
        {
            TrustError::NotOurCa {
                server,
                reason: text,
            }
        }
        _ => TrustError::Unreachable {
            server,
            reason: text,
        },
    }
}

/// The error and its sources, joined (hyper's top-level message is rarely the useful one).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(s) = cur {
        let t = s.to_string();
        if !parts.iter().any(|p| p.contains(&t)) {
            parts.push(t);
        }
        cur = s.source();
    }
    parts.join(": ")
}

/// The CA the node trusts, PEM: the identity's, or the pinned one read from the cluster.
pub async fn trusted_ca(server: &Url, trust: &CaTrust) -> Result<String, TrustError> {
    match trust {
        CaTrust::Pem(pem) => {
            certificates(pem.as_bytes())
                .map_err(|e| TrustError::Other(format!("identity ca_cert: {e}")))?;
            Ok(pem.clone())
        }
        CaTrust::Sha256Pin(pin) => fetch_pinned(server, pin).await.map(|c| c.pem()),
    }
}

async fn fetch_pinned(server: &Url, pin: &[u8; 32]) -> Result<PinnedCert, TrustError> {
    let mut c = base_config(server)?;
    // Anonymous and unverified on purpose: this request carries nothing secret, and what it
    // returns is trusted only if it matches the pin.
    c.accept_invalid_certs = true;
    let client = Client::try_from(c).map_err(|e| TrustError::Other(format!("{e}")))?;
    let cm = Api::<ConfigMap>::namespaced(client, "kube-public")
        .get("cluster-info")
        .await
        .map_err(|e| match e {
            kube::Error::Api(s) if s.code == 403 || s.code == 401 => TrustError::Other(format!(
                "{server} does not let anonymous clients read kube-public/cluster-info ({}); the cluster needs broker/deploy/bootstrap.yaml, or give the identity ca_cert instead of a pin",
                s.code
            )),
            kube::Error::Api(s) if s.code == 404 => TrustError::Other(format!(
                "{server} has no kube-public/cluster-info ConfigMap to read the pinned CA from"
            )),
            e => classify(server, e),
        })?;
    let certs = super::rotation::published(&cm).map_err(TrustError::Other)?;
    let found: Vec<String> = certs.iter().map(|c| CaTrust::pin_text(&c.pin)).collect();
    certs
        .into_iter()
        .find(|c| &c.pin == pin)
        .ok_or_else(|| TrustError::PinMismatch {
            server: server.to_string(),
            found: found.join(", "),
            want: CaTrust::pin_text(pin),
        })
}

/// An anonymous client of `server` that trusts `trusted` only: nothing secret goes out, and
/// what comes back is the control plane's word ([`published_cas`]).
pub fn anonymous_client(server: &Url, trusted: &[PinnedCert]) -> Result<Client, TrustError> {
    let mut c = base_config(server)?;
    c.root_cert = Some(trusted.iter().map(|c| c.der.clone()).collect());
    Client::try_from(c).map_err(|e| TrustError::Other(format!("{e}")))
}

/// The CAs the control plane publishes now (`cluster-info`, the signer first), read
/// anonymously as the join reads them, through a client of [`anonymous_client`] that
/// trusts the CAs the node trusts already (a CA rotation, `join::rotation`).
pub async fn published_cas(server: &Url, client: &Client) -> Result<Vec<PinnedCert>, TrustError> {
    let cm = Api::<ConfigMap>::namespaced(client.clone(), "kube-public")
        .get("cluster-info")
        .await
        .map_err(|e| classify(server, e))?;
    super::rotation::published(&cm).map_err(TrustError::Other)
}

/// Asks the control plane who the token is (SelfSubjectReview), verifying the server against
/// `ca_pem`. Returns the user name the token authenticates as.
pub async fn check_token(
    server: &Url,
    ca_pem: &str,
    token: &BootstrapToken,
) -> Result<String, TrustError> {
    let mut c = base_config(server)?;
    c.root_cert = Some(
        certificates(ca_pem.as_bytes())
            .map_err(|e| TrustError::Other(format!("CA: {e}")))?
            .into_iter()
            .map(|c| c.der)
            .collect(),
    );
    c.auth_info.token = Some(token.expose().into());
    let client = Client::try_from(c).map_err(|e| TrustError::Other(format!("{e}")))?;
    let review = Api::<SelfSubjectReview>::all(client)
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .map_err(|e| match e {
            kube::Error::Api(s) if s.code == 401 => TrustError::TokenRefused {
                id: token.id.clone(),
            },
            e => classify(server, e),
        })?;
    Ok(review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
        .unwrap_or_default())
}
