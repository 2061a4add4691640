//! The front's TLS: its serving certificate (the operator's, or one from a CA the broker
//! makes), and a client-certificate check that only proves the client holds the key of the
//! certificate it presents. Which CA issued it, whether it expired, and whether its record
//! stands are decided per request by [`super::admit`], which can answer with a message that
//! says which, where a failed handshake could only send an alert.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

use super::cert::ServingCert;
use crate::pki::{Lifetimes, Pki};
use tokio_util::sync::CancellationToken;

/// Accepts any client certificate whose key signs the handshake; none is fine too.
#[derive(Debug)]
pub struct PossessionOnly {
    provider: Arc<CryptoProvider>,
}

impl ClientCertVerifier for PossessionOnly {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        // The API is reached with tokens, not certificates; the front refuses a request
        // without one with a message.
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Where [`serving`] keeps the front CA it makes in `dir` (what kubeconfigs carry).
pub fn self_made_ca(dir: &Path) -> std::path::PathBuf {
    Pki::ca_cert_path(dir)
}

/// The serving certificate: the configured files (reloaded when they change:
/// [`ServingCert::watch`]), or one the broker issues from its own front CA in `dir`
/// (returned, for kubeconfigs to carry).
pub fn serving(
    cert: Option<&Path>,
    key: Option<&Path>,
    dir: &Path,
    names: &[String],
    life: Lifetimes,
) -> Result<(Arc<ServingCert>, Option<String>)> {
    let (cert_path, key_path, ca) = match (cert, key) {
        (Some(c), Some(k)) => (c.to_path_buf(), k.to_path_buf(), None),
        _ => {
            let (pki, pair) = own_serving(dir, names, life)?;
            (pair.cert, pair.key, Some(pki.ca_pem().to_string()))
        }
    };
    let serving = ServingCert::from_files(&cert_path, &key_path)?;
    Ok((Arc::new(serving), ca))
}

/// The front's own CA in `dir` and its serving certificate, issued again when a name was
/// added since (`front.names`, `advertise_addr`) or when it is due (`life.renew_before`).
fn own_serving(dir: &Path, names: &[String], life: Lifetimes) -> Result<(Pki, crate::pki::Pair)> {
    let pki = Pki::open_with(dir, "socialweb front CA", life)?;
    let pair = pki.server_covering("front", names)?;
    Ok((pki, pair))
}

/// Keeps the front's own serving certificate renewed while the broker runs: a look every
/// quarter of `renew_before` (at most hourly) issues it again when due -- the serving
/// certificate's watch serves the new files from the next handshake -- and tells `metrics`
/// when the front's certificates end.
pub fn keep_own_renewed(
    dir: std::path::PathBuf,
    names: Vec<String>,
    life: Lifetimes,
    metrics: crate::metrics::Certificates,
    stop: CancellationToken,
) {
    let every = (life.renew_before / 4).clamp(
        std::time::Duration::from_secs(1),
        std::time::Duration::from_secs(3600),
    );
    tokio::spawn(async move {
        loop {
            match own_serving(&dir, &names, life) {
                Ok(_) => metrics.seen("front", crate::pki::earliest(std::slice::from_ref(&dir))),
                Err(e) => tracing::warn!("renewing the front's certificate: {e:#}"),
            }
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stop.cancelled() => return,
            }
        }
    });
}

/// A certificate chain and its key from PEM files; errors name the key they come from.
pub fn read_pair(
    cert: &Path,
    key: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let pem = std::fs::read(cert)
        .with_context(|| format!("front.tls_cert: reading {}", cert.display()))?;
    let chain = socialweb_wire::ca::certificates(&pem)
        .map_err(|e| anyhow::anyhow!("front.tls_cert: {}: {e}", cert.display()))?
        .into_iter()
        .map(|c| CertificateDer::from(c.der))
        .collect();
    let key_pem =
        std::fs::read(key).with_context(|| format!("front.tls_key: reading {}", key.display()))?;
    let key =
        rustls_pki_key(&key_pem).with_context(|| format!("front.tls_key: {}", key.display()))?;
    Ok((chain, key))
}

/// A PEM private key (PKCS#8, SEC1 or PKCS#1).
pub fn rustls_pki_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    PrivateKeyDer::from_pem_slice(pem).context("no PEM private key")
}

/// The relay's server configuration: the front's certificate, no client authentication
/// (relay clients prove their endpoint id inside the relay protocol), HTTP/1.1 (a WebSocket
/// per client).
pub fn relay_config(serving: Arc<ServingCert>) -> Result<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(serving))
}

/// The front's server configuration: TLS 1.2 and 1.3, HTTP/2 and HTTP/1.1 (kubectl speaks
/// HTTP/2 for requests and HTTP/1.1 for Upgrades).
pub fn server_config(serving: Arc<ServingCert>) -> Result<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(Arc::new(PossessionOnly { provider }))
        .with_cert_resolver(serving);
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}
