//! What `check-config` checks beyond the values [`super::Config::load`] validates: that the
//! files and programs a configuration names are there, and what a provider machine's file
//! lacks or gives in vain. Each finding names the key and says what would fail.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{Config, DatastoreKind, MachineKind, ProviderFile};

/// Who the configuration is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `socialweb-broker run` (and its embedded provider, when `[market]` names none).
    Broker,
    /// `socialweb-broker provider` on a provider machine.
    Provider,
}

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// Something will fail: the command at start, or every node.
    Error,
    /// Worth a look; nothing fails because of it alone.
    Warning,
}

/// One thing `check-config` found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub level: Level,
    /// The configuration key it is about (`kube_dir`, `front.tls_cert`).
    pub key: String,
    pub problem: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let level = match self.level {
            Level::Error => "error",
            Level::Warning => "warning",
        };
        write!(f, "{level}: {}: {}", self.key, self.problem)
    }
}

struct Findings(Vec<Finding>);

impl Findings {
    fn error(&mut self, key: &str, problem: String) {
        self.0.push(Finding {
            level: Level::Error,
            key: key.to_string(),
            problem,
        });
    }

    fn warning(&mut self, key: &str, problem: String) {
        self.0.push(Finding {
            level: Level::Warning,
            key: key.to_string(),
            problem,
        });
    }
}

/// Whether `p` is a file someone may execute.
fn executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `p` itself when it has a directory part, else the first executable of that name on `PATH`.
fn program(p: &Path) -> Option<PathBuf> {
    if p.components().count() > 1 {
        return executable(p).then(|| p.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join(p))
        .find(|c| executable(c))
}

/// What `check-config` finds in `cfg` (already loaded and validated) for `role`; `file` is
/// the file it came from, read again for the keys a provider machine does not read.
pub fn run(cfg: &Config, file: Option<&Path>, role: Role) -> Vec<Finding> {
    let mut f = Findings(Vec::new());
    match role {
        Role::Broker => {
            broker(cfg, &mut f);
            if cfg.providers().is_empty() {
                provider_files(cfg, role, &mut f);
            }
        }
        Role::Provider => {
            provider_machine(cfg, &mut f);
            provider_files(cfg, role, &mut f);
            if let Some(text) = file.and_then(|p| std::fs::read_to_string(p).ok()) {
                let schema = schemars::schema_for!(ProviderFile).to_value();
                let read: Vec<&str> = schema["properties"]
                    .as_object()
                    .map(|p| p.keys().map(String::as_str).collect())
                    .unwrap_or_default();
                for key in not_read_by_a_provider(&text) {
                    f.warning(
                        &key,
                        format!(
                            "`socialweb-broker provider` does not read it; a provider machine \
                             reads only {} (docs/config.md)",
                            words(&read)
                        ),
                    );
                }
            }
        }
    }
    f.0
}

/// `a, b and c`.
fn words(items: &[&str]) -> String {
    match items {
        [] => String::new(),
        [one] => one.to_string(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// The top-level keys of a file that a provider machine does not read ([`ProviderFile`]'s
/// are all it reads).
pub fn not_read_by_a_provider(text: &str) -> Vec<String> {
    let Ok(t) = toml::from_str::<toml::Table>(text) else {
        return Vec::new();
    };
    let schema = schemars::schema_for!(ProviderFile).to_value();
    t.keys()
        .filter(|k| schema["properties"].get(k.as_str()).is_none())
        .cloned()
        .collect()
}

/// What `socialweb-broker run` needs on its host.
fn broker(cfg: &Config, f: &mut Findings) {
    const START: &str = "`socialweb-broker run` stops at start";
    kube_dir(cfg, START, f);
    let kine = &cfg.clusters.kine_binary;
    if !executable(kine) {
        let problem = format!(
            "{} is not an executable file (image-builder/kine/build.sh builds it)",
            kine.display()
        );
        match cfg.clusters.datastore {
            DatastoreKind::Kine | DatastoreKind::Postgres => f.error(
                "clusters.kine_binary",
                format!(
                    "{problem}: {START}, as clusters.datastore is {}",
                    cfg.clusters.datastore.as_str()
                ),
            ),
            DatastoreKind::Etcd => f.warning(
                "clusters.kine_binary",
                format!("{problem}: `cluster create --datastore kine` would fail"),
            ),
        }
    }
    if let Some(p) = &cfg.store.key_file
        && let Err(e) = crate::vault::SealKey::load(p)
    {
        f.error("store.key_file", format!("{e}: {START}"));
    }
    for (i, p) in cfg.store.previous_key_files.iter().enumerate() {
        if let Err(e) = crate::vault::SealKey::load(p) {
            f.error(
                &format!("store.previous_key_files[{i}]"),
                format!("{e}: {START}"),
            );
        }
    }
    let front = &cfg.front;
    for (key, file) in [
        ("front.tls_cert", &front.tls_cert),
        ("front.tls_key", &front.tls_key),
    ] {
        if let Some(p) = file
            && std::fs::File::open(p).is_err()
        {
            f.error(key, format!("{} cannot be read: {START}", p.display()));
        }
    }
    for (i, p) in front.did_web_roots.iter().enumerate() {
        if std::fs::File::open(p).is_err() {
            f.error(
                &format!("front.did_web_roots[{i}]"),
                format!("{} cannot be read: {START}", p.display()),
            );
        }
    }
    if let Some(dir) = sqlite_dir(&cfg.store_url())
        && !dir.is_dir()
        && dir != cfg.state_dir
    {
        f.error(
            "store.url",
            format!(
                "the database's directory {} does not exist: {START}",
                dir.display()
            ),
        );
    }
    let lp = &cfg.local_provider;
    let defaults = ProviderFile::default().local_provider;
    if !lp.brokers.is_empty() || lp.listen != defaults.listen {
        f.warning(
            "local_provider.brokers",
            "only `socialweb-broker provider` reads local_provider.listen and \
             local_provider.brokers; the embedded provider listens on no port (check a \
             provider machine's file with --provider)"
                .into(),
        );
    }
}

/// The directory of an SQLite store's file (`sqlite://<path>?...`), if the store is one.
fn sqlite_dir(url: &str) -> Option<PathBuf> {
    let rest = url
        .strip_prefix("sqlite://")
        .or(url.strip_prefix("sqlite:"))?;
    let path = rest.split('?').next().unwrap_or(rest);
    (!path.is_empty() && !path.starts_with(':'))
        .then(|| Path::new(path).parent().map(Path::to_path_buf))
        .flatten()
}

/// `kube_dir` holds `kube` and `pause`; `what` is what fails without them.
fn kube_dir(cfg: &Config, what: &str, f: &mut Findings) {
    if !cfg.kube_dir.is_dir() {
        f.error(
            "kube_dir",
            format!(
                "{} is not a directory: {what} (it holds the Kubernetes we ship, `kube` and \
                 `pause`; image-builder/kubernetes/build.sh prints where it is)",
                cfg.kube_dir.display()
            ),
        );
        return;
    }
    for name in ["kube", "pause"] {
        let p = cfg.kube_dir.join(name);
        if !executable(&p) {
            f.error(
                "kube_dir",
                format!("{} is missing or not executable: {what}", p.display()),
            );
        }
    }
}

/// What only a provider machine needs: brokers to serve, an address they reach.
fn provider_machine(cfg: &Config, f: &mut Findings) {
    let lp = &cfg.local_provider;
    if lp.brokers.is_empty() {
        f.error(
            "local_provider.brokers",
            "empty: `socialweb-broker provider` refuses to start; list the keys of the \
             brokers it serves (`socialweb-broker market-pin` prints each on its broker's \
             host)"
                .into(),
        );
    }
    if lp.listen.ip().is_loopback() {
        f.warning(
            "local_provider.listen",
            format!(
                "{} is loopback: no broker on another machine reaches it",
                lp.listen
            ),
        );
    }
}

/// The files and programs the local provider makes nodes from.
fn provider_files(cfg: &Config, role: Role, f: &mut Findings) {
    let who = match role {
        Role::Broker => "the embedded provider",
        Role::Provider => "`socialweb-broker provider`",
    };
    let lp = &cfg.local_provider;
    let nodes = format!("every node {who} makes would fail to boot");
    if let Some(image) = &lp.image {
        let manifest = image.join("nodeimage.json");
        if !manifest.is_file() {
            f.error(
                "local_provider.image",
                format!(
                    "{} is missing: {who} stops at start (socialweb-image-builder build --out \
                     makes a node image directory)",
                    manifest.display()
                ),
            );
        }
    } else if lp.machine == MachineKind::Namespace {
        if !executable(&lp.agent) {
            f.error(
                "local_provider.agent",
                format!("{} is not an executable file: {nodes}", lp.agent.display()),
            );
        }
        for plugin in ["socialweb-cni", "loopback", "portmap"] {
            let p = lp.cni_bin_dir.join(plugin);
            if !executable(&p) {
                f.error(
                    "local_provider.cni_bin_dir",
                    format!("{} is missing or not executable: {nodes}", p.display()),
                );
            }
        }
        if role == Role::Provider {
            // A broker's own check of kube_dir covers its embedded provider.
            kube_dir(cfg, &nodes, f);
        }
    }
    for (i, p) in lp.seed_images.iter().enumerate() {
        if !p.is_file() {
            f.error(
                &format!("local_provider.seed_images[{i}]"),
                format!("{} is not a file: {nodes}", p.display()),
            );
        }
    }
    if lp.machine == MachineKind::Vm {
        vm_programs(cfg, who, f);
    }
}

/// qemu, qemu-img and, when asked for, KVM.
fn vm_programs(cfg: &Config, who: &str, f: &mut Findings) {
    let vm = &cfg.local_provider.vm;
    for (key, p) in [
        ("local_provider.vm.qemu", &vm.qemu),
        ("local_provider.vm.qemu_img", &vm.qemu_img),
    ] {
        if program(p).is_none() {
            f.error(
                key,
                format!(
                    "{} is not an executable (nor found on PATH): {who} boots no guest",
                    p.display()
                ),
            );
        }
    }
    let kvm = Path::new("/dev/kvm").exists();
    match vm.accel {
        socialweb_provider::AccelChoice::Kvm if !kvm => f.error(
            "local_provider.vm.accel",
            format!("kvm, but this machine has no /dev/kvm: {who} boots no guest"),
        ),
        socialweb_provider::AccelChoice::Auto if !kvm => f.warning(
            "local_provider.vm.accel",
            "auto, and this machine has no /dev/kvm: guests run under TCG and bid as \
             namespace isolation (unless local_provider.vm.tcg_as_vm)"
                .into(),
        ),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{Config, DatastoreKind, check};

    #[test]
    fn check_config_names_missing_files_by_key_and_a_providers_missing_brokers() {
        let dir = std::env::temp_dir().join(format!("sw-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut c = Config {
            kube_dir: dir.clone(),
            ..Config::default()
        };
        c.clusters.kine_binary = dir.join("kine");
        c.local_provider.agent = dir.join("agent");
        c.local_provider.cni_bin_dir = dir.join("cni");
        c.front.tls_cert = Some(dir.join("front.crt"));
        c.front.tls_key = Some(dir.join("front.key"));
        let found = check::run(&c, None, check::Role::Broker);
        let errors = |found: &[check::Finding]| -> Vec<String> {
            found
                .iter()
                .filter(|f| f.level == check::Level::Error)
                .map(|f| f.key.clone())
                .collect()
        };
        let e = errors(&found);
        for key in [
            "kube_dir",
            "clusters.kine_binary",
            "front.tls_cert",
            "front.tls_key",
            "local_provider.agent",
            "local_provider.cni_bin_dir",
        ] {
            assert!(e.iter().any(|k| k == key), "{key}: {found:?}");
        }
        assert!(
            found.iter().all(|f| !f.key.contains("brokers")),
            "{found:?}"
        );
        c.clusters.datastore = DatastoreKind::Etcd;
        let found = check::run(&c, None, check::Role::Broker);
        assert!(!errors(&found).contains(&"clusters.kine_binary".to_string()));
        let file = dir.join("provider.toml");
        std::fs::write(&file, "state_dir = \"/x\"\n[front]\nnames = []\n[scale]\n").unwrap();
        let found = check::run(&c, Some(&file), check::Role::Provider);
        let e = errors(&found);
        assert!(
            e.contains(&"local_provider.brokers".to_string()),
            "{found:?}"
        );
        assert!(e.contains(&"kube_dir".to_string()), "{found:?}");
        let shown: Vec<String> = found.iter().map(ToString::to_string).collect();
        assert!(
            shown.contains(&"warning: front: `socialweb-broker provider` does not read it; a provider machine reads only kube_dir, local_provider, metrics, node and state_dir (docs/config.md)".to_string()),
            "{shown:?}"
        );
        assert_eq!(
            check::not_read_by_a_provider(&std::fs::read_to_string(&file).unwrap()),
            ["front", "scale"]
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
