//! One certificate authority per cluster, and the files Kubernetes components want:
//! certificates, keys and kubeconfigs. Keys are written owner-only (0600, in a 0700
//! directory). A cluster's CA is created once and loaded on every later start, so a broker
//! restart keeps every credential it issued valid.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A CA and the directory its files are written to.
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

/// Writes a file with `mode`, atomically (`socialweb_proc::owner_only`'s one way).
pub fn write_private(path: &Path, contents: &[u8], mode: u32) -> Result<()> {
    socialweb_proc::owner_only::write_atomic_mode(path, contents, mode)
        .with_context(|| format!("writing {}", path.display()))
}

fn private_dir(dir: &Path) -> Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))
}

fn ca_params(common_name: &str) -> Result<CertificateParams> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    // rcgen's default validity (1975 to 4096): a cluster's CA lives as long as the cluster;
    // rotating it means a new cluster.
    Ok(params)
}

impl Pki {
    /// Creates a fresh CA named `common_name` in `dir` (`ca.crt`, `ca.key`), replacing any.
    pub fn new(dir: &Path) -> Result<Pki> {
        Self::create(dir, "socialweb-test-ca")
    }

    fn create(dir: &Path, common_name: &str) -> Result<Pki> {
        private_dir(dir)?;
        let key = KeyPair::generate()?;
        let params = ca_params(common_name)?;
        let cert = params.self_signed(&key)?;
        let ca_pem = cert.pem();
        write_private(&dir.join("ca.key"), key.serialize_pem().as_bytes(), 0o600)?;
        write_private(&dir.join("ca.crt"), ca_pem.as_bytes(), 0o644)?;
        Ok(Pki {
            dir: dir.to_path_buf(),
            ca: Issuer::new(params, key),
            ca_pem,
        })
    }

    /// The certificate of the CA kept in `dir` (PEM).
    pub fn ca_cert_path(dir: &Path) -> PathBuf {
        dir.join("ca.crt")
    }

    /// Loads the CA in `dir`, or creates one named `common_name` if there is none.
    pub fn open_or_create(dir: &Path, common_name: &str) -> Result<Pki> {
        let (crt, key) = (Pki::ca_cert_path(dir), dir.join("ca.key"));
        if !(crt.exists() && key.exists()) {
            return Self::create(dir, common_name);
        }
        let ca_pem =
            std::fs::read_to_string(&crt).with_context(|| format!("reading {}", crt.display()))?;
        let key_pem =
            std::fs::read_to_string(&key).with_context(|| format!("reading {}", key.display()))?;
        let key = KeyPair::from_pem(&key_pem).with_context(|| format!("{}", key.display()))?;
        let ca =
            Issuer::from_ca_cert_pem(&ca_pem, key).with_context(|| format!("{}", crt.display()))?;
        Ok(Pki {
            dir: dir.to_path_buf(),
            ca,
            ca_pem,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
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

    /// Signs `params` with a fresh key and hands both back without writing anything: for
    /// certificates whose keys the broker must not keep (users' client certificates).
    pub fn sign(&self, params: CertificateParams) -> Result<(String, String)> {
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.ca)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    fn issue(&self, name: &str, params: CertificateParams) -> Result<Pair> {
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.ca)?;
        let pair = Pair {
            cert: self.dir.join(format!("{name}.crt")),
            key: self.dir.join(format!("{name}.key")),
        };
        write_private(&pair.key, key.serialize_pem().as_bytes(), 0o600)?;
        write_private(&pair.cert, cert.pem().as_bytes(), 0o644)?;
        Ok(pair)
    }

    /// The pair `name`, issued by `make` unless both files exist already.
    fn ensure(&self, name: &str, make: impl FnOnce() -> Result<CertificateParams>) -> Result<Pair> {
        let pair = Pair {
            cert: self.dir.join(format!("{name}.crt")),
            key: self.dir.join(format!("{name}.key")),
        };
        if pair.cert.exists() && pair.key.exists() {
            return Ok(pair);
        }
        self.issue(name, make()?)
    }

    /// A client certificate for user `cn` in `groups` (Kubernetes reads CN as the user and O
    /// as the groups); kept if it exists.
    pub fn client(&self, name: &str, cn: &str, groups: &[&str]) -> Result<Pair> {
        self.ensure(name, || {
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
            Ok(p)
        })
    }

    /// A serving certificate for the given names and addresses; kept if it exists.
    pub fn server(&self, name: &str, sans: &[String]) -> Result<Pair> {
        self.ensure(name, || {
            serving(name, sans, vec![ExtendedKeyUsagePurpose::ServerAuth])
        })
    }

    /// A serving certificate for `sans`, issued again when the one kept lacks any of them (a
    /// name or address added to the configuration since it was issued: `front.names`,
    /// `advertise_addr`), so that clients checking the new name are not refused.
    pub fn server_covering(&self, name: &str, sans: &[String]) -> Result<Pair> {
        let pair = self.server(name, sans)?;
        let missing = uncovered(&pair.cert, sans)?;
        if missing.is_empty() {
            return Ok(pair);
        }
        tracing::info!(cert = %pair.cert.display(), ?missing, "issued again for names it lacked");
        self.issue(
            name,
            serving(name, sans, vec![ExtendedKeyUsagePurpose::ServerAuth])?,
        )
    }

    /// A certificate that both serves and authenticates as a client (etcd's peer port,
    /// where a member is both); kept if it exists.
    pub fn peer(&self, name: &str, sans: &[String]) -> Result<Pair> {
        self.ensure(name, || {
            serving(
                name,
                sans,
                vec![
                    ExtendedKeyUsagePurpose::ServerAuth,
                    ExtendedKeyUsagePurpose::ClientAuth,
                ],
            )
        })
    }

    /// A bare key pair (the service-account signing key) and its public half (`<name>.pub`);
    /// kept if it exists.
    pub fn key(&self, name: &str) -> Result<PathBuf> {
        let path = self.dir.join(format!("{name}.key"));
        let public = self.dir.join(format!("{name}.pub"));
        if path.exists() && public.exists() {
            return Ok(path);
        }
        let key = KeyPair::generate()?;
        write_private(&path, key.serialize_pem().as_bytes(), 0o600)?;
        write_private(&public, key.public_key_pem().as_bytes(), 0o644)?;
        Ok(path)
    }

    /// A kubeconfig for `server` authenticating with `pair` (paths, not data: it sits beside
    /// them). Owner-only: it names a key.
    pub fn kubeconfig(&self, name: &str, server: &str, pair: &Pair) -> Result<PathBuf> {
        let path = self.dir.join(format!("{name}.kubeconfig"));
        let kc = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "cluster", "cluster": {
                "server": server, "certificate-authority": self.ca_cert()}}],
            "users": [{"name": name, "user": {
                "client-certificate": pair.cert, "client-key": pair.key}}],
            "contexts": [{"name": "default", "context": {"cluster": "cluster", "user": name}}],
            "current-context": "default",
        });
        write_private(&path, serde_json::to_string_pretty(&kc)?.as_bytes(), 0o600)?;
        Ok(path)
    }
}

/// The params of a certificate for `sans` named `name`, with the extended usages `ext`.
fn serving(
    name: &str,
    sans: &[String],
    ext: Vec<ExtendedKeyUsagePurpose>,
) -> Result<CertificateParams> {
    let mut p = CertificateParams::new(sans.to_vec())?;
    p.distinguished_name.push(DnType::CommonName, name);
    p.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    p.extended_key_usages = ext;
    Ok(p)
}

/// The names and addresses of `sans` the certificate in `cert` does not carry.
fn uncovered(cert: &Path, sans: &[String]) -> Result<Vec<String>> {
    use x509_parser::extensions::GeneralName;
    let pem = std::fs::read(cert).with_context(|| format!("reading {}", cert.display()))?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem)
        .map_err(|e| anyhow::anyhow!("{}: not PEM: {e}", cert.display()))?;
    let parsed = pem
        .parse_x509()
        .map_err(|e| anyhow::anyhow!("{}: not a certificate: {e}", cert.display()))?;
    let mut have = std::collections::BTreeSet::new();
    if let Ok(Some(san)) = parsed.subject_alternative_name() {
        for n in &san.value.general_names {
            match n {
                GeneralName::DNSName(d) => {
                    have.insert(d.to_string());
                }
                GeneralName::IPAddress(b) => {
                    let ip = match b.len() {
                        4 => <[u8; 4]>::try_from(*b).map(std::net::IpAddr::from).ok(),
                        16 => <[u8; 16]>::try_from(*b).map(std::net::IpAddr::from).ok(),
                        _ => None,
                    };
                    have.extend(ip.map(|ip| ip.to_string()));
                }
                _ => {}
            }
        }
    }
    let norm = |s: &String| match s.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.to_string(),
        Err(_) => s.clone(),
    };
    Ok(sans
        .iter()
        .filter(|s| !have.contains(&norm(s)))
        .cloned()
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_is_created_once_and_loaded_after() {
        let dir = std::env::temp_dir().join(format!("sw-pki-{}", std::process::id()));
        let a = Pki::open_or_create(&dir, "c1").unwrap();
        let client = a.client("admin", "admin", &["system:masters"]).unwrap();
        let b = Pki::open_or_create(&dir, "c1").unwrap();
        assert_eq!(a.ca_pem(), b.ca_pem());
        let again = b.client("admin", "admin", &["system:masters"]).unwrap();
        assert_eq!(
            std::fs::read(&client.cert).unwrap(),
            std::fs::read(&again.cert).unwrap()
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.join("ca.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // A certificate the loaded CA issues verifies against the created one.
        let fresh = b.server("x", &["localhost".into()]).unwrap();
        let certs = socialweb_wire::ca::certificates(&std::fs::read(fresh.cert).unwrap()).unwrap();
        assert_eq!(certs.len(), 1);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_serving_certificate_is_issued_again_only_for_a_name_it_lacks() {
        let dir = std::env::temp_dir().join(format!("sw-pki-sans-{}", std::process::id()));
        let pki = Pki::open_or_create(&dir, "front").unwrap();
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let first = pki.server("front", &names(&["10.200.0.1"])).unwrap();
        let before = std::fs::read(&first.cert).unwrap();
        let kept = pki
            .server_covering("front", &names(&["10.200.0.1"]))
            .unwrap();
        assert_eq!(
            std::fs::read(&kept.cert).unwrap(),
            before,
            "nothing lacked: kept"
        );
        let wider = names(&["10.200.0.1", "203.0.113.1", "broker.example"]);
        assert_eq!(
            uncovered(&kept.cert, &wider).unwrap(),
            ["203.0.113.1", "broker.example"]
        );
        let again = pki.server_covering("front", &wider).unwrap();
        assert_ne!(std::fs::read(&again.cert).unwrap(), before, "issued again");
        assert!(uncovered(&again.cert, &wider).unwrap().is_empty());
        let _ = std::fs::remove_dir_all(dir);
    }
}
