//! The serving certificate of the front and the relay, reloaded when its files change: an
//! operator's certificate renewed in place (certbot, an ACME client, a secret mount) is
//! served from the next handshake after the broker sees the new files, without a restart.
//! The broker looks every [`RELOAD_EVERY`]; a pair that does not load (half written, a key
//! that does not match) is logged and the one in service stays.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, bail};
use arc_swap::ArcSwap;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// How often the certificate's files are looked at.
pub const RELOAD_EVERY: Duration = Duration::from_secs(10);

/// What the files looked like when last loaded: a change in either is a reload.
type Stamp = [(Option<SystemTime>, u64); 2];

/// The certificate in service, and the files it came from (none: the broker's own, which
/// nothing else writes).
#[derive(Debug)]
pub struct ServingCert {
    current: ArcSwap<CertifiedKey>,
    files: Option<(PathBuf, PathBuf)>,
    seen: Mutex<Stamp>,
}

impl ServingCert {
    /// A certificate that never changes.
    pub fn fixed(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<ServingCert> {
        Ok(ServingCert {
            current: ArcSwap::from_pointee(certified(chain, key)?),
            files: None,
            seen: Mutex::new(Default::default()),
        })
    }

    /// The certificate in `cert` and its key in `key` (PEM), reloaded by [`ServingCert::watch`].
    pub fn from_files(cert: &Path, key: &Path) -> Result<ServingCert> {
        let seen = stamp(cert, key);
        let (chain, k) = super::tls::read_pair(cert, key)?;
        Ok(ServingCert {
            current: ArcSwap::from_pointee(certified(chain, k)?),
            files: Some((cert.to_path_buf(), key.to_path_buf())),
            seen: Mutex::new(seen),
        })
    }

    /// The chain in service now, leaf first.
    pub fn chain(&self) -> Vec<CertificateDer<'static>> {
        self.current.load().cert.clone()
    }

    /// Loads the files again if they changed since the last look; whether it did. An error
    /// leaves the certificate in service (and the files are tried again once they change).
    pub fn reload_if_changed(&self) -> Result<bool> {
        let Some((cert, key)) = &self.files else {
            return Ok(false);
        };
        let now = stamp(cert, key);
        {
            let mut seen = self.seen.lock().expect("lock");
            if *seen == now {
                return Ok(false);
            }
            *seen = now;
        }
        let (chain, k) = super::tls::read_pair(cert, key)?;
        self.current.store(Arc::new(certified(chain, k)?));
        Ok(true)
    }

    /// Looks at the files every [`RELOAD_EVERY`] until `stop`.
    pub fn watch(self: &Arc<Self>, stop: CancellationToken) {
        let Some((cert, _)) = self.files.clone() else {
            return;
        };
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(RELOAD_EVERY) => {}
                    _ = stop.cancelled() => return,
                }
                match me.reload_if_changed() {
                    Ok(true) => {
                        info!(cert = %cert.display(), "front.tls_cert reloaded: served from the next handshake")
                    }
                    Ok(false) => {}
                    Err(e) => warn!(
                        "front.tls_cert changed but does not load; still serving the previous one: {e:#}"
                    ),
                }
            }
        });
    }
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// A chain and its key as rustls signs with them, refusing a key that is not the leaf's.
fn certified(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<CertifiedKey> {
    if chain.is_empty() {
        bail!("front.tls_cert holds no certificate");
    }
    let provider = rustls::crypto::ring::default_provider();
    let ck = CertifiedKey::from_der(chain, key, &provider)
        .context("front.tls_key does not go with front.tls_cert's first certificate")?;
    Ok(ck)
}

fn stamp(cert: &Path, key: &Path) -> Stamp {
    [cert, key].map(|p| match std::fs::metadata(p) {
        Ok(m) => (m.modified().ok(), m.len()),
        Err(_) => (None, 0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A certificate and key for `name`, from a CA of its own, as PEM files in `dir`.
    fn pair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let pki = crate::pki::Pki::open_or_create(&dir.join(name), name).unwrap();
        let p = pki.server("front", &["127.0.0.1".to_string()]).unwrap();
        (p.cert, p.key)
    }

    /// The leaf a TLS client is served by `server` at `addr`.
    async fn served(addr: std::net::SocketAddr) -> Vec<u8> {
        #[derive(Debug)]
        struct Any(Arc<rustls::crypto::CryptoProvider>);
        impl rustls::client::danger::ServerCertVerifier for Any {
            fn verify_server_cert(
                &self,
                _: &CertificateDer<'_>,
                _: &[CertificateDer<'_>],
                _: &rustls::pki_types::ServerName<'_>,
                _: &[u8],
                _: rustls::pki_types::UnixTime,
            ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
                Ok(rustls::client::danger::ServerCertVerified::assertion())
            }
            fn verify_tls12_signature(
                &self,
                m: &[u8],
                c: &CertificateDer<'_>,
                d: &rustls::DigitallySignedStruct,
            ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error>
            {
                rustls::crypto::verify_tls12_signature(
                    m,
                    c,
                    d,
                    &self.0.signature_verification_algorithms,
                )
            }
            fn verify_tls13_signature(
                &self,
                m: &[u8],
                c: &CertificateDer<'_>,
                d: &rustls::DigitallySignedStruct,
            ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error>
            {
                rustls::crypto::verify_tls13_signature(
                    m,
                    c,
                    d,
                    &self.0.signature_verification_algorithms,
                )
            }
            fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
                self.0.signature_verification_algorithms.supported_schemes()
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Any(provider)))
            .with_no_client_auth();
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .unwrap();
        tls.write_all(b"x").await.unwrap();
        let mut b = [0u8; 1];
        tls.read_exact(&mut b).await.unwrap();
        let (_, conn) = tls.get_ref();
        conn.peer_certificates().unwrap()[0].to_vec()
    }

    #[tokio::test]
    async fn a_renewed_certificate_is_served_from_the_next_handshake_and_a_broken_one_is_not() {
        let dir = std::env::temp_dir().join(format!("serving-cert-{}", std::process::id()));
        let (cert_a, key_a) = pair(&dir, "a");
        let (cert_b, key_b) = pair(&dir, "b");
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::copy(&cert_a, &cert).unwrap();
        std::fs::copy(&key_a, &key).unwrap();
        let serving = Arc::new(ServingCert::from_files(&cert, &key).unwrap());
        let config = super::super::tls::server_config(serving.clone()).unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    if let Ok(mut tls) = acceptor.accept(tcp).await {
                        let mut b = [0u8; 1];
                        let _ = tls.read_exact(&mut b).await;
                        let _ = tls.write_all(&b).await;
                    }
                });
            }
        });
        let leaf = |p: &Path| {
            let pem = std::fs::read(p).unwrap();
            socialweb_wire::ca::certificates(&pem)
                .unwrap()
                .remove(0)
                .der
        };
        assert_eq!(served(addr).await, leaf(&cert_a));
        assert!(!serving.reload_if_changed().unwrap(), "nothing changed");

        // Half a renewal: the new certificate with the old key is refused, the old one stays.
        std::fs::copy(&cert_b, &cert).unwrap();
        let e = serving.reload_if_changed().unwrap_err();
        assert!(format!("{e:#}").contains("front.tls_key"), "{e:#}");
        assert_eq!(served(addr).await, leaf(&cert_a));

        std::fs::copy(&key_b, &key).unwrap();
        assert!(serving.reload_if_changed().unwrap());
        assert_eq!(served(addr).await, leaf(&cert_b));
        assert_eq!(serving.chain()[0].to_vec(), leaf(&cert_b));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
