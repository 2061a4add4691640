//! One certificate authority per cluster, and the files Kubernetes components want:
//! certificates, keys and kubeconfigs. Keys are written owner-only (0600, in a 0700
//! directory). A cluster's CA is created once and loaded on every later start, so a broker
//! restart keeps every credential it issued valid.
//!
//! Lifetimes are kubeadm's unless the operator says otherwise ([`Lifetimes`]): a CA ten
//! years, what it signs one year, and a leaf with less than 90 days left (k3s's margin) is
//! issued again the next time it is asked for -- at a control plane's start, or when its
//! awake period renews them (docs/operations.md, "Certificates").

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// How long what a [`Pki`] makes lives, and how long before its end a leaf is issued again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetimes {
    pub ca: Duration,
    pub leaf: Duration,
    pub renew_before: Duration,
}

impl Lifetimes {
    /// kubeadm's: CAs ten years, leaves one; renewed with 90 days left, as k3s does.
    pub const KUBEADM: Lifetimes = Lifetimes {
        ca: Duration::from_secs(3650 * 24 * 3600),
        leaf: Duration::from_secs(365 * 24 * 3600),
        renew_before: Duration::from_secs(90 * 24 * 3600),
    };
}

impl Default for Lifetimes {
    fn default() -> Lifetimes {
        Lifetimes::KUBEADM
    }
}

/// Clocks a little behind ours accept what is issued now.
const SKEW: Duration = Duration::from_secs(300);

/// A CA and the directory its files are written to.
#[derive(Debug)]
pub struct Pki {
    dir: PathBuf,
    ca: Issuer<'static, KeyPair>,
    ca_pem: String,
    /// When the CA's certificate ends: no leaf outlives it.
    ca_not_after: SystemTime,
    life: Lifetimes,
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

/// `t` as rcgen's validity takes it (whole seconds).
pub(crate) fn offset(t: SystemTime) -> Result<time::OffsetDateTime> {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .context("a time before 1970")?
        .as_secs();
    Ok(time::OffsetDateTime::from_unix_timestamp(
        i64::try_from(secs).context("a time past 2262")?,
    )?)
}

fn ca_params(common_name: &str, life: &Lifetimes) -> Result<CertificateParams> {
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
    let now = SystemTime::now();
    params.not_before = offset(now - SKEW)?;
    params.not_after = offset(now + life.ca)?;
    Ok(params)
}

impl Pki {
    /// Creates a fresh CA named `common_name` in `dir` (`ca.crt`, `ca.key`), replacing any.
    pub fn new(dir: &Path) -> Result<Pki> {
        Self::create(dir, "socialweb-test-ca", Lifetimes::default())
    }

    fn create(dir: &Path, common_name: &str, life: Lifetimes) -> Result<Pki> {
        private_dir(dir)?;
        let key = KeyPair::generate()?;
        let params = ca_params(common_name, &life)?;
        let cert = params.self_signed(&key)?;
        let ca_pem = cert.pem();
        write_private(&dir.join("ca.key"), key.serialize_pem().as_bytes(), 0o600)?;
        write_private(&dir.join("ca.crt"), ca_pem.as_bytes(), 0o644)?;
        Ok(Pki {
            dir: dir.to_path_buf(),
            ca: Issuer::new(params, key),
            ca_not_after: not_after_pem(ca_pem.as_bytes())?,
            ca_pem,
            life,
        })
    }

    /// The certificate of the CA kept in `dir` (PEM).
    pub fn ca_cert_path(dir: &Path) -> PathBuf {
        dir.join("ca.crt")
    }

    /// Loads the CA in `dir`, or creates one named `common_name` if there is none; kubeadm's
    /// lifetimes.
    pub fn open_or_create(dir: &Path, common_name: &str) -> Result<Pki> {
        Self::open_with(dir, common_name, Lifetimes::default())
    }

    /// As [`Pki::open_or_create`], with `life` for what it makes from now on (a CA loaded
    /// keeps the validity it was made with).
    pub fn open_with(dir: &Path, common_name: &str, life: Lifetimes) -> Result<Pki> {
        let (crt, key) = (Pki::ca_cert_path(dir), dir.join("ca.key"));
        if !(crt.exists() && key.exists()) {
            return Self::create(dir, common_name, life);
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
            ca_not_after: not_after(&crt)?,
            ca_pem,
            life,
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

    /// This CA's certificate signed by the CA `old_pem` (its key `old_key_pem`): a cross
    /// certificate, the same name, key and end, with which a client that trusts only the old
    /// CA verifies what this one signs (`cluster rotate-ca` while nodes move).
    pub fn cross_signed_by(&self, old_pem: &str, old_key_pem: &str) -> Result<String> {
        let name = parsed(self.ca_pem.as_bytes(), |c| {
            c.subject()
                .iter_common_name()
                .next()
                .and_then(|n| n.as_str().ok())
                .map(str::to_string)
        })?
        .context("the CA's certificate has no common name")?;
        let mut params = ca_params(&name, &self.life)?;
        params.not_after = offset(self.ca_not_after)?;
        let key = std::fs::read_to_string(self.ca_key())
            .with_context(|| format!("reading {}", self.ca_key().display()))?;
        let key = KeyPair::from_pem(&key)?;
        let old = Issuer::from_ca_cert_pem(old_pem, KeyPair::from_pem(old_key_pem)?)?;
        Ok(params.signed_by(&key, &old)?.pem())
    }

    /// When the CA's certificate ends.
    pub fn ca_not_after(&self) -> SystemTime {
        self.ca_not_after
    }

    fn issue(&self, name: &str, mut params: CertificateParams) -> Result<Pair> {
        let now = SystemTime::now();
        params.not_before = offset(now - SKEW)?;
        params.not_after = offset((now + self.life.leaf).min(self.ca_not_after))?;
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

    /// The pair `name`, issued by `make` unless both files exist already and the
    /// certificate has more than `renew_before` left.
    fn ensure(&self, name: &str, make: impl FnOnce() -> Result<CertificateParams>) -> Result<Pair> {
        let pair = Pair {
            cert: self.dir.join(format!("{name}.crt")),
            key: self.dir.join(format!("{name}.key")),
        };
        if pair.cert.exists() && pair.key.exists() {
            match renewal_due(&pair.cert, self.life.renew_before, SystemTime::now()) {
                Ok(false) => return Ok(pair),
                Ok(true) => {
                    tracing::info!(cert = %pair.cert.display(), "issued again: it ends within {}",
                                   humantime::format_duration(self.life.renew_before));
                }
                Err(e) => tracing::warn!("issued again: {e:#}"),
            }
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

/// What `f` reads of the certificate in PEM `pem`.
fn parsed<T>(
    pem: &[u8],
    f: impl FnOnce(&x509_parser::certificate::X509Certificate<'_>) -> T,
) -> Result<T> {
    let (_, pem) =
        x509_parser::pem::parse_x509_pem(pem).map_err(|e| anyhow::anyhow!("not PEM: {e}"))?;
    let cert = pem
        .parse_x509()
        .map_err(|e| anyhow::anyhow!("not a certificate: {e}"))?;
    Ok(f(&cert))
}

/// When the certificate in PEM `pem` ends.
pub fn not_after_pem(pem: &[u8]) -> Result<SystemTime> {
    let secs = parsed(pem, |c| c.validity().not_after.timestamp())?;
    Ok(SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).unwrap_or(0)))
}

/// When the certificate in file `cert` ends.
pub fn not_after(cert: &Path) -> Result<SystemTime> {
    let pem = std::fs::read(cert).with_context(|| format!("reading {}", cert.display()))?;
    not_after_pem(&pem).with_context(|| cert.display().to_string())
}

/// Whether the certificate in `cert` ends within `renew_before` of `now`.
pub fn renewal_due(cert: &Path, renew_before: Duration, now: SystemTime) -> Result<bool> {
    Ok(not_after(cert)? <= now + renew_before)
}

/// The earliest ends of the certificates in `dirs` (each directory's `*.crt`, not below):
/// its CAs' (`ca.crt`) and its leaves'. A file that does not parse is skipped and logged.
pub fn earliest(dirs: &[PathBuf]) -> Expiry {
    let mut e = Expiry::default();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for path in entries.flatten().map(|d| d.path()) {
            if path.extension().is_none_or(|x| x != "crt") {
                continue;
            }
            let end = match not_after(&path) {
                Ok(t) => t,
                Err(err) => {
                    tracing::warn!("{err:#}");
                    continue;
                }
            };
            let slot = if path.file_name().is_some_and(|n| n == "ca.crt") {
                &mut e.ca
            } else {
                &mut e.leaf
            };
            *slot = Some(slot.map_or(end, |t: SystemTime| t.min(end)));
        }
    }
    e
}

/// The earliest ends among some certificates, CAs and leaves apart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Expiry {
    pub ca: Option<SystemTime>,
    pub leaf: Option<SystemTime>,
}

impl Expiry {
    /// The earlier of each.
    pub fn min(self, other: Expiry) -> Expiry {
        let m = |a: Option<SystemTime>, b: Option<SystemTime>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Expiry {
            ca: m(self.ca, other.ca),
            leaf: m(self.leaf, other.leaf),
        }
    }
}

/// The names and addresses of `sans` the certificate in `cert` does not carry.
fn uncovered(cert: &Path, sans: &[String]) -> Result<Vec<String>> {
    let pem = std::fs::read(cert).with_context(|| format!("reading {}", cert.display()))?;
    let have = parsed(&pem, names_of).with_context(|| cert.display().to_string())?;
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

/// The DNS names and addresses a certificate's SANs carry (addresses as `IpAddr` prints them).
fn names_of(
    cert: &x509_parser::certificate::X509Certificate<'_>,
) -> std::collections::BTreeSet<String> {
    use x509_parser::extensions::GeneralName;
    let mut have = std::collections::BTreeSet::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
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
    have
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

    /// `t` within a minute of `want`.
    fn near(t: SystemTime, want: SystemTime) -> bool {
        let d = t
            .duration_since(want)
            .or_else(|_| want.duration_since(t))
            .unwrap();
        d < Duration::from_secs(60)
    }

    #[test]
    fn lifetimes_are_kept_and_a_leaf_near_its_end_is_issued_again() {
        let dir = std::env::temp_dir().join(format!("sw-pki-life-{}", std::process::id()));
        let day = Duration::from_secs(24 * 3600);
        let life = Lifetimes {
            ca: 10 * day,
            leaf: 2 * day,
            renew_before: day,
        };
        let now = SystemTime::now();
        let pki = Pki::open_with(&dir, "c", life).unwrap();
        assert!(near(pki.ca_not_after(), now + 10 * day));
        let a = pki.client("a", "a", &[]).unwrap();
        assert!(near(not_after(&a.cert).unwrap(), now + 2 * day));
        let first = std::fs::read(&a.cert).unwrap();
        // More than a day left: kept, by this Pki and by one loaded after.
        let again = Pki::open_with(&dir, "c", life).unwrap();
        assert_eq!(again.ca_pem(), pki.ca_pem());
        again.client("a", "a", &[]).unwrap();
        assert_eq!(std::fs::read(&a.cert).unwrap(), first, "kept");
        // Three days' margin: the leaf's two are within it, so it is issued again.
        let eager = Pki::open_with(
            &dir,
            "c",
            Lifetimes {
                renew_before: 3 * day,
                ..life
            },
        )
        .unwrap();
        eager.client("a", "a", &[]).unwrap();
        assert_ne!(std::fs::read(&a.cert).unwrap(), first, "issued again");
        // No leaf outlives its CA.
        let long = Pki::open_with(
            &dir,
            "c",
            Lifetimes {
                leaf: 100 * day,
                ..life
            },
        )
        .unwrap();
        let b = long.server("b", &["localhost".into()]).unwrap();
        assert_eq!(not_after(&b.cert).unwrap(), long.ca_not_after());
        let e = earliest(std::slice::from_ref(&dir));
        assert_eq!(e.ca, Some(pki.ca_not_after()));
        assert!(near(e.leaf.unwrap(), now + 2 * day), "{e:?}");
        assert!(!renewal_due(&b.cert, day, now).unwrap());
        assert!(renewal_due(&b.cert, day, now + 9 * day + Duration::from_secs(3600)).unwrap());
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
