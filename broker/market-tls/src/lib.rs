//! The market protocol's transport (docs/market.md): mutual TLS in which each side pins the
//! other's public key. A provider serves only brokers whose keys its operator listed; a broker
//! talks only to the provider whose key its configuration names. Names, expiry and CAs play no
//! part: a pin is the one thing exchanged (`sha256:<hex>` of the SubjectPublicKeyInfo, the
//! format of the node identity's `ca_cert_sha256`, which `openssl` computes too).
//!
//! Each side's identity is a self-signed certificate made on first use and kept owner-only
//! ([`Identity::load_or_create`]); `socialweb-broker market-pin` and `provider-pin` print them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

/// What went wrong, naming the file or the value.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {why}")]
    File { path: String, why: String },
    #[error("pin {0:?}: must be `sha256:` and 64 hexadecimal digits")]
    Pin(String),
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
    #[error("making a key: {0}")]
    Make(#[from] rcgen::Error),
}

/// One side's certificate and key (PEM).
#[derive(Clone)]
pub struct Identity {
    pub cert_pem: String,
    key_pem: String,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("pin", &self.pin_text())
            .finish_non_exhaustive()
    }
}

fn file_err(path: &Path, why: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        path: path.display().to_string(),
        why: why.to_string(),
    }
}

impl Identity {
    /// Where an identity kept in `dir` has its certificate and its key (PEM).
    pub fn files(dir: &Path) -> (PathBuf, PathBuf) {
        (dir.join("cert.pem"), dir.join("key.pem"))
    }

    /// `<dir>/cert.pem` and `<dir>/key.pem`, made (self-signed, for `names`) when absent.
    pub fn load_or_create(dir: &Path, names: &[String]) -> Result<Identity, TlsError> {
        let (cert, key) = Identity::files(dir);
        if !(cert.exists() && key.exists()) {
            socialweb_proc::owner_only::dir(dir).map_err(|e| file_err(dir, e))?;
            let key_pair = rcgen::KeyPair::generate()?;
            let mut params = rcgen::CertificateParams::new(names.to_vec())?;
            params.not_after = rcgen::date_time_ymd(2125, 1, 1);
            let c = params.self_signed(&key_pair)?;
            socialweb_proc::owner_only::write_atomic(&key, key_pair.serialize_pem().as_bytes())
                .map_err(|e| file_err(&key, e))?;
            socialweb_proc::owner_only::write_atomic(&cert, c.pem().as_bytes())
                .map_err(|e| file_err(&cert, e))?;
        }
        let read = |p: &Path| std::fs::read_to_string(p).map_err(|e| file_err(p, e));
        Ok(Identity {
            cert_pem: read(&cert)?,
            key_pem: read(&key)?,
        })
    }

    /// The pin the other side lists.
    pub fn pin(&self) -> [u8; 32] {
        socialweb_wire::ca::pin(self.cert_pem.as_bytes()).expect("a certificate we made")
    }

    pub fn pin_text(&self) -> String {
        socialweb_wire::CaTrust::pin_text(&self.pin())
    }

    fn chain(&self) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
        let certs = CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsError::Tls(rustls::Error::General(e.to_string())))?;
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())
            .map_err(|e| TlsError::Tls(rustls::Error::General(e.to_string())))?;
        Ok((certs, key))
    }
}

/// Reads a pin as configurations spell it (`sha256:<64 hex>`).
pub fn parse_pin(s: &str) -> Result<[u8; 32], TlsError> {
    let bad = || TlsError::Pin(s.to_string());
    let hex = s.trim().strip_prefix("sha256:").ok_or_else(bad)?;
    if hex.len() != 64 {
        return Err(bad());
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(out)
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A certificate whose key is one of `pins`: the whole check.
#[derive(Debug)]
struct Pinned {
    pins: Vec<[u8; 32]>,
    algs: WebPkiSupportedAlgorithms,
}

impl Pinned {
    fn new(pins: Vec<[u8; 32]>) -> Pinned {
        Pinned {
            pins,
            algs: provider().signature_verification_algorithms,
        }
    }

    fn check(&self, cert: &CertificateDer<'_>) -> Result<(), rustls::Error> {
        let pin = socialweb_wire::ca::pin_der(cert).map_err(rustls::Error::General)?;
        if self.pins.contains(&pin) {
            Ok(())
        } else {
            Err(rustls::Error::General(format!(
                "the peer's key {} is not pinned here",
                socialweb_wire::CaTrust::pin_text(&pin)
            )))
        }
    }
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.check(end_entity)
            .map(|()| ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}

impl ClientCertVerifier for Pinned {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.check(end_entity)
            .map(|()| ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}

/// A provider's server side: its identity, and only clients whose keys are `brokers`.
pub fn server_config(
    id: &Identity,
    brokers: Vec<[u8; 32]>,
) -> Result<rustls::ServerConfig, TlsError> {
    let (chain, key) = id.chain()?;
    let mut c = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(Arc::new(Pinned::new(brokers)))
        .with_single_cert(chain, key)?;
    c.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(c)
}

/// A broker's client side: its identity, and only the server whose key is `provider_pin`.
pub fn client_config(
    id: &Identity,
    provider_pin: [u8; 32],
) -> Result<rustls::ClientConfig, TlsError> {
    let (chain, key) = id.chain()?;
    Ok(rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Pinned::new(vec![provider_pin])))
        .with_client_auth_cert(chain, key)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_is_made_once_owner_only_and_its_pin_reads_back() {
        let dir = std::env::temp_dir().join(format!("sw-market-tls-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let a = Identity::load_or_create(&dir, &["198.51.100.11".into()]).unwrap();
        let b = Identity::load_or_create(&dir, &[]).unwrap();
        assert_eq!(a.pin(), b.pin(), "made once, loaded after");
        assert_eq!(parse_pin(&a.pin_text()).unwrap(), a.pin());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.join("key.pem"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        for bad in ["", "sha256:", "ab".repeat(32).as_str(), "sha256:zz"] {
            assert!(parse_pin(bad).is_err(), "{bad:?}");
        }
        assert!(format!("{a:?}").contains("sha256:") && !format!("{a:?}").contains("PRIVATE"));
        server_config(&a, vec![b.pin()]).unwrap();
        client_config(&a, b.pin()).unwrap();
        let _ = std::fs::remove_dir_all(dir);
    }
}
