//! Kubernetes for the tests: the Kubernetes we ship (`image-builder/kubernetes/build.sh`), a
//! control plane in a namespace configured as the broker configures tenant control planes,
//! and nodes that join by themselves: machines in node namespaces running `socialweb-agent`.

mod cgroup;
mod control_plane;
mod helpers;
mod node;
/// The cluster PKI is the broker's own.
pub use socialweb_broker::pki;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Result, bail};

/// Where the harness's waits and its log tails are (re-exported: every test waits).
pub use crate::mesh::mesh_keygen;
pub(crate) use crate::wait::tail;
pub use crate::wait::{tail_of, wait_for};
pub use control_plane::ControlPlane;
pub use helpers::{Cluster, cni_bin_dir, node_options, run_pod, wait_node_ready};
pub use node::{CaMode, KubeNode, NodeOptions, test_kubelet_patch};

/// Environment variable naming a directory with a prebuilt `kube` multicall binary and `pause`
/// (what `image-builder/kubernetes/build.sh` prints); without it the harness runs build.sh.
pub const KUBE_DIR_ENV: &str = "SOCIALWEB_KUBE_DIR";

/// Where the pinned Kubernetes build lives.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub dir: PathBuf,
}

impl Binaries {
    pub fn kube(&self) -> PathBuf {
        self.dir.join("kube")
    }

    pub fn pause(&self) -> PathBuf {
        self.dir.join("pause")
    }
}

/// The directory `env` names, or else the one `image-builder/<script>` prints (building it
/// if it is not cached).
fn built(env: &str, script: &str) -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os(env) {
        return Ok(PathBuf::from(dir));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../image-builder")
        .join(script);
    let out = std::process::Command::new(&script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!("{} failed ({})", script.display(), out.status));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// The Kubernetes build, from `SOCIALWEB_KUBE_DIR` or by running
/// `image-builder/kubernetes/build.sh`
/// (seconds when cached, minutes cold). Fails loudly if neither works.
pub fn binaries() -> Result<Binaries> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let dir = DIR.get_or_init(|| built(KUBE_DIR_ENV, "kubernetes/build.sh"));
    let dir = dir.clone().map_err(anyhow::Error::msg)?;
    let b = Binaries { dir };
    for p in [b.kube(), b.pause()] {
        if !p.is_file() {
            bail!(
                "{} is missing; unset {KUBE_DIR_ENV} or point it at image-builder/kubernetes/build.sh's output",
                p.display()
            );
        }
    }
    Ok(b)
}

/// Environment variable naming the directory of a prebuilt `kine` (what
/// `image-builder/kine/build.sh` prints); without it the harness runs build.sh.
pub const KINE_DIR_ENV: &str = "SOCIALWEB_KINE_DIR";

/// The kine build every broker's clusters keep their objects in by default, from
/// `SOCIALWEB_KINE_DIR` or by running `image-builder/kine/build.sh` (seconds when cached,
/// minutes cold). Fails loudly if neither works.
pub fn kine() -> Result<PathBuf> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let dir = DIR.get_or_init(|| built(KINE_DIR_ENV, "kine/build.sh"));
    let kine = dir.clone().map_err(anyhow::Error::msg)?.join("kine");
    if !kine.is_file() {
        bail!(
            "{} is missing; unset {KINE_DIR_ENV} or point it at image-builder/kine/build.sh's output",
            kine.display()
        );
    }
    Ok(kine)
}

/// `kubectl apply -f -` with `manifest` on stdin, in `ns`, as the user of `kubeconfig`;
/// returns what kubectl printed.
pub fn kubectl_apply(
    ns: &crate::netns::Netns,
    kubeconfig: &Path,
    manifest: &str,
) -> Result<String> {
    use std::io::Write;
    let mut child = ns
        .command(&binaries()?.kube().to_string_lossy())
        .arg("kubectl")
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(["apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(manifest.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "kubectl apply: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether a Node (as `kubectl get node -o json` prints it) reports the Ready condition True.
pub fn node_is_ready(node: &serde_json::Value) -> bool {
    node["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}
