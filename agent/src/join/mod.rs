//! The join: from the identity document alone, a bare machine becomes a Kubernetes node.
//! containerd, the kubelet (TLS-bootstrapped with the identity's token) and kube-proxy are the
//! agent's children; every step is idempotent, so an agent restarted on a half-set-up node
//! converges instead of starting anything twice.
//!
//! - [`config`]: the files written for containerd, the kubelet and kube-proxy (pure).
//! - [`trust`]: the control plane's CA (given, or pinned and fetched) and the token check.
//! - [`sysctl`], [`images`], [`proxy_mode`]: the edges those steps touch.
//!
//! [`Machine`] holds what differs between machines but not between nodes of a cluster: where
//! the binaries and directories are. Its defaults are the node image's layout; the tests
//! override what their machines (network namespaces on one host) need.

pub mod config;
pub mod images;
pub mod proxy_mode;
pub mod rotation;
pub mod sysctl;
pub mod trust;

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use socialweb_wire::NodeIdentity;

/// The sandbox (pause) image containerd is configured with; the node image seeds it.
pub const DEFAULT_SANDBOX_IMAGE: &str = "socialweb.local/pause:3.10";

/// Where things are on this machine (defaults: the node image's layout). The tests override
/// what their machines (network namespaces on one host) need.
#[derive(Debug, Clone, PartialEq, clap::Args)]
#[command(next_help_heading = "Machine")]
pub struct Machine {
    /// Persistent state: the CA, the bootstrap kubeconfig, generated configurations.
    #[arg(
        long,
        default_value = "/var/lib/socialweb",
        env = "SOCIALWEB_STATE_DIR"
    )]
    pub state_dir: PathBuf,
    /// State of this boot: pidfiles, the readiness file `ready`, resolv.conf.
    #[arg(long, default_value = "/run/socialweb", env = "SOCIALWEB_RUN_DIR")]
    pub run_dir: PathBuf,
    /// containerd's binary.
    #[arg(long, default_value = "/usr/bin/containerd")]
    pub containerd: PathBuf,
    /// containerd's `ctr` (imports the seed images).
    #[arg(long, default_value = "/usr/bin/ctr")]
    pub ctr: PathBuf,
    /// The kubelet's binary (our Kubernetes build; a link to its multicall `kube` works).
    #[arg(long, default_value = "/usr/local/bin/kubelet")]
    pub kubelet: PathBuf,
    /// kube-proxy's binary (likewise).
    #[arg(long, default_value = "/usr/local/bin/kube-proxy")]
    pub kube_proxy: PathBuf,
    /// Where containerd finds CNI plugins (socialweb-cni, loopback, portmap).
    #[arg(long, default_value = "/usr/lib/cni")]
    pub cni_bin_dir: PathBuf,
    /// Where the agent writes the CNI configuration and containerd reads it.
    #[arg(long, default_value = "/etc/cni/net.d")]
    pub cni_conf_dir: PathBuf,
    #[arg(skip = PathBuf::from("/var/lib/containerd"))]
    pub containerd_root: PathBuf,
    #[arg(skip = PathBuf::from("/run/containerd"))]
    pub containerd_state: PathBuf,
    #[arg(skip = PathBuf::from("/var/lib/kubelet"))]
    pub kubelet_dir: PathBuf,
    /// Container image archives (*.tar, OCI or Docker) imported into containerd at boot.
    #[arg(long, default_value = "/var/lib/socialweb/images")]
    pub seed_images: PathBuf,
    /// The seed disk: a block device (or file) holding image archives of any size behind a
    /// manifest, written by socialweb-image-builder; imported at boot when it exists.
    #[arg(long, default_value = socialweb_wire::seeds::DEFAULT_DISK)]
    pub seed_disk: PathBuf,
    /// The pod sandbox image (must be among the seed images: nothing is pulled for it).
    #[arg(long, default_value = DEFAULT_SANDBOX_IMAGE)]
    pub sandbox_image: String,
    /// The kubelet's cgroup root (a machine shared with other nodes gives each its own).
    #[arg(long, default_value = "/")]
    pub cgroup_root: String,
    /// Write containerd's, the kubelet's and kube-proxy's output to DIR/<name>.log instead of
    /// the agent's own stderr (the journal under systemd).
    #[arg(long = "child-log-dir", value_name = "DIR")]
    pub log_dir: Option<PathBuf>,
    /// JSON merged over the generated kubelet configuration (RFC 7386 merge patch), e.g.
    /// '{"maxPods": 30}'.
    #[arg(long, value_parser = parse_json_object)]
    pub kubelet_config_patch: Option<serde_json::Value>,
}

fn parse_json_object(s: &str) -> Result<serde_json::Value, String> {
    match serde_json::from_str::<serde_json::Value>(s) {
        Ok(v @ serde_json::Value::Object(_)) => Ok(v),
        Ok(_) => Err("must be a JSON object".into()),
        Err(e) => Err(format!("not JSON: {e}")),
    }
}

impl Default for Machine {
    fn default() -> Machine {
        Machine {
            state_dir: "/var/lib/socialweb".into(),
            run_dir: "/run/socialweb".into(),
            containerd: "/usr/bin/containerd".into(),
            ctr: "/usr/bin/ctr".into(),
            kubelet: "/usr/local/bin/kubelet".into(),
            kube_proxy: "/usr/local/bin/kube-proxy".into(),
            cni_bin_dir: "/usr/lib/cni".into(),
            cni_conf_dir: "/etc/cni/net.d".into(),
            containerd_root: "/var/lib/containerd".into(),
            containerd_state: "/run/containerd".into(),
            kubelet_dir: "/var/lib/kubelet".into(),
            seed_images: "/var/lib/socialweb/images".into(),
            seed_disk: socialweb_wire::seeds::DEFAULT_DISK.into(),
            sandbox_image: DEFAULT_SANDBOX_IMAGE.into(),
            cgroup_root: "/".into(),
            log_dir: None,
            kubelet_config_patch: None,
        }
    }
}

impl Machine {
    pub fn containerd_socket(&self) -> PathBuf {
        self.containerd_state.join("containerd.sock")
    }
    pub fn containerd_config(&self) -> PathBuf {
        self.state_dir.join("containerd.toml")
    }
    pub fn ca_file(&self) -> PathBuf {
        self.state_dir.join("ca.crt")
    }
    pub fn bootstrap_kubeconfig(&self) -> PathBuf {
        self.state_dir.join("bootstrap-kubeconfig")
    }
    pub fn kubelet_config_file(&self) -> PathBuf {
        self.state_dir.join("kubelet.yaml")
    }
    pub fn kube_proxy_config_file(&self) -> PathBuf {
        self.state_dir.join("kube-proxy.yaml")
    }
    pub fn images_record(&self) -> PathBuf {
        self.state_dir.join("images-imported")
    }
    /// The kubeconfig the kubelet writes once its certificate is issued; the agent and
    /// kube-proxy use it too.
    pub fn kubelet_kubeconfig(&self) -> PathBuf {
        self.kubelet_dir.join("kubeconfig")
    }
    pub fn kubelet_cert_dir(&self) -> PathBuf {
        self.kubelet_dir.join("pki")
    }
    pub fn resolv_conf(&self) -> PathBuf {
        self.run_dir.join("resolv.conf")
    }
    pub fn ready_file(&self) -> PathBuf {
        self.run_dir.join("ready")
    }
    /// A child's log file, if children log to files.
    pub fn log(&self, name: &str) -> Option<PathBuf> {
        self.log_dir.as_ref().map(|d| d.join(format!("{name}.log")))
    }
}

/// Writes `contents` atomically (a reader never sees half a file) with `mode`.
pub fn write_file(path: &Path, contents: &[u8], mode: u32) -> Result<()> {
    use std::io::Write;
    let dir = path.parent().context("a file path has a directory")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = dir.join(format!(
        ".{}.tmp",
        path.file_name().unwrap_or_default().to_string_lossy()
    ));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(contents)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))
}

/// Writes a JSON value as a file Kubernetes reads as YAML.
pub fn write_json(path: &Path, v: &serde_json::Value, mode: u32) -> Result<()> {
    let mut text = serde_json::to_vec_pretty(v)?;
    text.push(b'\n');
    write_file(path, &text, mode)
}

/// Waits until something accepts connections on a Unix socket.
pub async fn wait_socket(path: &Path, timeout: Duration) -> Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match tokio::net::UnixStream::connect(path).await {
            Ok(_) => return Ok(()),
            Err(e) if tokio::time::Instant::now() > deadline => {
                bail!(
                    "nothing listens on {} after {timeout:?}: {e}",
                    path.display()
                )
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Whether the kubelet already holds credentials for this cluster: its kubeconfig exists and
/// names `ca_pem` as the CA. A kubeconfig for another CA (the cluster was recreated, the
/// machine reused) is removed with the kubelet's certificates, so the kubelet bootstraps
/// again.
pub fn kubelet_joined(m: &Machine, ca_pem: &str) -> Result<bool> {
    let path = m.kubelet_kubeconfig();
    let Ok(kc) = kube::config::Kubeconfig::read_from(&path) else {
        return Ok(false);
    };
    let their_ca = kc
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref())
        .and_then(|c| {
            c.certificate_authority_data
                .as_ref()
                .and_then(|d| {
                    use base64::Engine;
                    base64::engine::general_purpose::STANDARD
                        .decode(d.trim())
                        .ok()
                })
                .or_else(|| {
                    c.certificate_authority
                        .as_ref()
                        .and_then(|f| std::fs::read(f).ok())
                })
        });
    let same = match (
        their_ca,
        socialweb_wire::ca::certificates(ca_pem.as_bytes()),
    ) {
        (Some(theirs), Ok(ours)) => socialweb_wire::ca::certificates(&theirs)
            .map(|t| t.iter().any(|c| ours.iter().any(|o| o.pin == c.pin)))
            .unwrap_or(false),
        _ => false,
    };
    if !same {
        tracing::warn!(
            "the kubelet's kubeconfig {} is for another CA; removing it and its certificates to join again",
            path.display()
        );
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_dir_all(m.kubelet_cert_dir());
    }
    Ok(same)
}

/// The identity's upstream resolvers, else the machine's resolv.conf (minus `except`, the
/// node-local DNS address itself).
pub fn upstreams(id: &NodeIdentity, except: std::net::IpAddr) -> Vec<std::net::SocketAddr> {
    if !id.upstream_resolvers.is_empty() {
        return id.upstream_resolvers.clone();
    }
    std::fs::read_to_string("/etc/resolv.conf")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|a| socialweb_wire::identity::parse_resolver(a.trim()))
        .filter(|a| a.ip() != except)
        .collect()
}

#[cfg(test)]
mod sandbox_tests {
    #[test]
    fn the_sandbox_image_is_the_one_the_image_writer_makes() {
        assert_eq!(super::DEFAULT_SANDBOX_IMAGE, socialweb_oci::PAUSE_IMAGE);
    }
}
