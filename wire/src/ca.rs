//! The control plane's CA as the identity names it (contract 1): a PEM certificate, or a pin
//! of one. A pin is SHA-256 over the certificate's SubjectPublicKeyInfo (DER), the value
//! kubeadm's `--discovery-token-ca-cert-hash` takes, so an operator can compute it with
//! `openssl x509 -pubkey -noout -in ca.crt | openssl pkey -pubin -outform der | sha256sum`.

use sha2::{Digest, Sha256};

/// Annotation an agent writes on its own Node once it trusts the cluster's signing CA and its
/// kubelet's certificates are that CA's: the CA's pin, `sha256:<64 hex digits>`. The broker
/// retires a rotated-out CA once every Node carries the new one's (`cluster rotate-ca`).
pub const CLUSTER_CA_ANNOTATION: &str = "socialweb.computer/cluster-ca";

/// One certificate of a PEM bundle: its DER and the pin of its public key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinnedCert {
    pub der: Vec<u8>,
    pub pin: [u8; 32],
}

impl PinnedCert {
    /// The certificate in PEM.
    pub fn pem(&self) -> String {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD.encode(&self.der);
        let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
        for chunk in b64.as_bytes().chunks(64) {
            out.push_str(std::str::from_utf8(chunk).expect("base64 is ASCII"));
            out.push('\n');
        }
        out.push_str("-----END CERTIFICATE-----\n");
        out
    }
}

/// Every certificate in a PEM bundle, with its pin. An error names what is unreadable.
pub fn certificates(pem: &[u8]) -> Result<Vec<PinnedCert>, String> {
    let mut out = Vec::new();
    for (i, block) in x509_parser::pem::Pem::iter_from_buffer(pem).enumerate() {
        let block = block.map_err(|e| format!("PEM block {i}: {e}"))?;
        if block.label != "CERTIFICATE" {
            continue;
        }
        let (_, cert) = x509_parser::parse_x509_certificate(&block.contents)
            .map_err(|e| format!("certificate {i}: {e}"))?;
        let spki = cert.tbs_certificate.subject_pki.raw;
        out.push(PinnedCert {
            pin: Sha256::digest(spki).into(),
            der: block.contents.clone(),
        });
    }
    if out.is_empty() {
        return Err("no PEM certificate found".into());
    }
    Ok(out)
}

/// The pin of a certificate given as DER.
pub fn pin_der(der: &[u8]) -> Result<[u8; 32], String> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|e| format!("certificate: {e}"))?;
    Ok(Sha256::digest(cert.tbs_certificate.subject_pki.raw).into())
}

/// Whether `ca` signed the certificate `der` (its signature checked with `ca`'s key: two CAs
/// of one cluster have the same name, so names prove nothing). Unreadable input is `false`.
pub fn issued_by(der: &[u8], ca: &PinnedCert) -> bool {
    let (Ok((_, cert)), Ok((_, ca))) = (
        x509_parser::parse_x509_certificate(der),
        x509_parser::parse_x509_certificate(&ca.der),
    ) else {
        return false;
    };
    cert.verify_signature(Some(ca.public_key())).is_ok()
}

/// The pin of the first certificate in `pem`.
pub fn pin(pem: &[u8]) -> Result<[u8; 32], String> {
    Ok(certificates(pem)?[0].pin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pin_is_the_sha256_of_the_public_key_info() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).unwrap();
        let certs = certificates(cert.pem().as_bytes()).unwrap();
        assert_eq!(certs.len(), 1);
        let want: [u8; 32] =
            Sha256::digest(rcgen::PublicKeyData::subject_public_key_info(&key)).into();
        assert_eq!(certs[0].pin, want);
        assert_eq!(certs[0].der, cert.der().to_vec());
        // Through PEM and back.
        assert_eq!(pin(certs[0].pem().as_bytes()).unwrap(), want);
    }

    /// Two CAs of one name: a leaf is issued by the one that signed it, not by its namesake.
    #[test]
    fn issued_by_checks_the_signature_not_the_name() {
        fn ca(key: &rcgen::KeyPair) -> (rcgen::Issuer<'_, &rcgen::KeyPair>, rcgen::Certificate) {
            let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            p.distinguished_name
                .push(rcgen::DnType::CommonName, "kubernetes");
            let cert = p.self_signed(key).unwrap();
            (rcgen::Issuer::new(p, key), cert)
        }
        let (old_key, new_key) = (
            rcgen::KeyPair::generate().unwrap(),
            rcgen::KeyPair::generate().unwrap(),
        );
        let ((old, old_cert), (_, new_cert)) = (ca(&old_key), ca(&new_key));
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["n".to_string()])
            .unwrap()
            .signed_by(&leaf_key, &old)
            .unwrap();
        let pinned = |c: &rcgen::Certificate| certificates(c.pem().as_bytes()).unwrap().remove(0);
        assert!(issued_by(leaf.der(), &pinned(&old_cert)));
        assert!(!issued_by(leaf.der(), &pinned(&new_cert)));
        assert!(!issued_by(b"garbage", &pinned(&old_cert)));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(certificates(b"").is_err());
        assert!(
            certificates(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
                .is_err()
        );
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..800)) {
            let _ = certificates(&bytes);
            let mut framed = b"-----BEGIN CERTIFICATE-----\n".to_vec();
            framed.extend(&bytes);
            framed.extend(b"\n-----END CERTIFICATE-----\n");
            let _ = certificates(&framed);
        }
    }
}
