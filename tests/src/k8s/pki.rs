//! A throwaway certificate authority for one test cluster, and the files Kubernetes
//! components want: certificates, keys and kubeconfigs.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// The CA and the directory its files are written to.
#[derive(Debug)]
pub struct Pki {
    dir: PathBuf,
    ca: Issuer<'static, KeyPair>,
    ca_pem: String,
}

/// A certificate and key written to disk.
#[derive(Debug, Clone)]
pub struct Pair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Pki {
    /// Creates a CA in `dir` (`ca.crt`, `ca.key`).
    pub fn new(dir: &Path) -> Result<Pki> {
        std::fs::create_dir_all(dir)?;
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "socialweb-test-ca");
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key)?;
        let ca_pem = cert.pem();
        std::fs::write(dir.join("ca.crt"), &ca_pem)?;
        std::fs::write(dir.join("ca.key"), key.serialize_pem())?;
        Ok(Pki {
            dir: dir.to_path_buf(),
            ca: Issuer::new(params, key),
            ca_pem,
        })
    }

    pub fn ca_cert(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    pub fn ca_key(&self) -> PathBuf {
        self.dir.join("ca.key")
    }

    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    fn issue(&self, name: &str, params: CertificateParams) -> Result<Pair> {
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.ca)?;
        let pair = Pair {
            cert: self.dir.join(format!("{name}.crt")),
            key: self.dir.join(format!("{name}.key")),
        };
        std::fs::write(&pair.cert, cert.pem())?;
        std::fs::write(&pair.key, key.serialize_pem())?;
        Ok(pair)
    }

    /// A client certificate for user `cn` in `groups` (Kubernetes reads CN as the user and O
    /// as the groups).
    pub fn client(&self, name: &str, cn: &str, groups: &[&str]) -> Result<Pair> {
        let mut p = CertificateParams::new(Vec::<String>::new())?;
        p.distinguished_name.push(DnType::CommonName, cn);
        for g in groups {
            p.distinguished_name.push(DnType::OrganizationName, *g);
        }
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(name, p)
    }

    /// A serving certificate for the given names and addresses.
    pub fn server(&self, name: &str, sans: &[String]) -> Result<Pair> {
        let mut p = CertificateParams::new(sans.to_vec())?;
        p.distinguished_name.push(DnType::CommonName, name);
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(name, p)
    }

    /// A bare key pair (the service-account signing key).
    pub fn key(&self, name: &str) -> Result<PathBuf> {
        let key = KeyPair::generate()?;
        let path = self.dir.join(format!("{name}.key"));
        std::fs::write(&path, key.serialize_pem())?;
        let public = self.dir.join(format!("{name}.pub"));
        std::fs::write(&public, key.public_key_pem())?;
        Ok(path)
    }

    /// A kubeconfig for `server` authenticating with `pair`.
    pub fn kubeconfig(&self, name: &str, server: &str, pair: &Pair) -> Result<PathBuf> {
        let path = self.dir.join(format!("{name}.kubeconfig"));
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {server}\n    \
             certificate-authority: {ca}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    \
             user: {name}\ncurrent-context: test\nusers:\n- name: {name}\n  user:\n    \
             client-certificate: {cert}\n    client-key: {key}\n",
            ca = self.ca_cert().display(),
            cert = pair.cert.display(),
            key = pair.key.display(),
        );
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }
}
