//! The Debian packages an operator installs (`./x package`, docs/quickstart.md):
//!
//! - `socialweb-broker`: the one binary (broker and provider), both units, the default
//!   configurations, the monitoring rules and dashboard; made by `cargo-deb` from
//!   `[package.metadata.deb]` in `broker/Cargo.toml`.
//! - `socialweb-kubernetes`: the pinned Kubernetes multicall binary and pause, kine, and
//!   `kubectl` (a link to the multicall binary beside it), where the broker's defaults look
//!   (`kube_dir`, `clusters.kine_binary`).
//! - `socialweb-node-image`: the node image a provider boots its VMs from
//!   (`/usr/lib/socialweb/node-image`), built from `image-builder/node.toml` with this build's
//!   agent and CNI plugin, seeding a busybox image (`socialweb.local/busybox:1`) so that a
//!   first job runs without a registry.
//!
//! The two payloads that are not Rust crates are laid out in a staging tree and built with
//! `dpkg-deb`, Debian's own packager. The binaries are the running program's profile: release
//! from `./x package`, debug in the suite (the packages' layout is the same).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::cni::workspace_bin;
use crate::k8s::{binaries, kine};
use crate::nodeimage::{self, Spec};
use crate::process::run_checked;

/// Where the packages put what the broker's defaults name.
pub const KUBE_DIR: &str = "usr/lib/socialweb/kubernetes";
pub const KINE_DIR: &str = "usr/lib/socialweb/kine";
pub const NODE_IMAGE_DIR: &str = "usr/lib/socialweb/node-image";

/// The built packages.
#[derive(Debug, Clone)]
pub struct Packages {
    pub broker: PathBuf,
    pub kubernetes: PathBuf,
    pub node_image: PathBuf,
}

impl Packages {
    pub fn all(&self) -> [&Path; 3] {
        [&self.broker, &self.kubernetes, &self.node_image]
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the repository")
        .to_path_buf()
}

/// The workspace's version, which the broker's package carries.
pub fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// Builds the three packages into `out` (made if missing; packages of another version left).
/// `progress` hears what is being done.
pub fn build(out: &Path, progress: &mut dyn FnMut(&str)) -> Result<Packages> {
    std::fs::create_dir_all(out).with_context(|| format!("making {}", out.display()))?;
    progress("the broker's package (cargo-deb)");
    let broker = broker_deb(out)?;
    progress("the Kubernetes package (the pinned build and kine; dpkg-deb)");
    let kubernetes = kubernetes_deb(out)?;
    progress("the node image (socialweb-image-builder; cached by its fingerprint)");
    let image = node_image()?;
    progress("the node image's package (dpkg-deb)");
    let node_image = node_image_deb(&image, out)?;
    Ok(Packages {
        broker,
        kubernetes,
        node_image,
    })
}

/// `cargo deb` on the binary this profile already built (`--no-build`).
fn broker_deb(out: &Path) -> Result<PathBuf> {
    let bin = workspace_bin("socialweb-broker");
    let profile = if cfg!(debug_assertions) {
        "dev"
    } else {
        "release"
    };
    let mut cargo = Command::new("cargo");
    cargo
        .current_dir(repo())
        .args(["deb", "-p", "socialweb-broker", "--no-build", "--fast"])
        .args(["--profile", profile, "--output"])
        .arg(out);
    if let Some(target) = bin.parent().and_then(Path::parent) {
        cargo.env("CARGO_TARGET_DIR", target);
    }
    let done = run_checked(&mut cargo).context(
        "cargo deb (the cargo-deb packager; ./x package installs it: cargo install cargo-deb)",
    )?;
    let path = String::from_utf8_lossy(&done.stdout).trim().to_string();
    let path = PathBuf::from(path.lines().last().unwrap_or_default());
    if !path.is_file() {
        bail!("cargo deb said it wrote {path:?}, which is not a file");
    }
    Ok(path)
}

/// A staging tree for `dpkg-deb --build`, emptied first.
fn stage(out: &Path, name: &str) -> Result<PathBuf> {
    let root = out.join(format!(".stage-{name}"));
    if root.exists() {
        std::fs::remove_dir_all(&root)?;
    }
    std::fs::create_dir_all(root.join("DEBIAN"))?;
    Ok(root)
}

fn control(root: &Path, fields: &[(&str, &str)], description: &str) -> Result<()> {
    let mut text = String::new();
    for (k, v) in fields {
        text.push_str(&format!("{k}: {v}\n"));
    }
    text.push_str("Maintainer: socialweb <socialweb@example.org>\nArchitecture: amd64\n");
    text.push_str(&format!("Description: {description}\n"));
    std::fs::write(root.join("DEBIAN/control"), text)?;
    Ok(())
}

/// Copies `src` into the staging tree at `dest` with `mode`.
fn put(root: &Path, src: &Path, dest: &str, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let to = root.join(dest);
    std::fs::create_dir_all(to.parent().context("a file in a directory")?)?;
    std::fs::copy(src, &to).with_context(|| format!("copying {} to {dest}", src.display()))?;
    std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// `dpkg-deb --build` of the staging tree to `<out>/<name>_<version>_amd64.deb`, then the tree
/// is removed. gzip at its fastest: the payloads are large and mostly compressed binaries.
fn dpkg_deb(root: &Path, out: &Path, name: &str, version: &str) -> Result<PathBuf> {
    let deb = out.join(format!("{name}_{version}_amd64.deb"));
    run_checked(
        Command::new("dpkg-deb")
            .args(["--root-owner-group", "-Zgzip", "-z1", "--build"])
            .arg(root)
            .arg(&deb),
    )
    .with_context(|| format!("dpkg-deb --build {name}"))?;
    std::fs::remove_dir_all(root)?;
    Ok(deb)
}

/// The version of a cached build from its directory's name (`kube-v1.34.4-<hash>`).
fn version_of(dir: &Path, prefix: &str) -> Result<String> {
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    name.strip_prefix(prefix)
        .and_then(|v| v.rsplit_once('-'))
        .map(|(v, _)| v.to_string())
        .with_context(|| {
            format!(
                "no version in {} (expected {prefix}<version>-<hash>)",
                dir.display()
            )
        })
}

fn kubernetes_deb(out: &Path) -> Result<PathBuf> {
    let kube = binaries()?;
    let kine = kine()?;
    let kube_version = version_of(&kube.dir, "kube-v")?;
    let kine_version = version_of(kine.parent().context("kine's directory")?, "kine-v")?;
    let root = stage(out, "kubernetes")?;
    put(&root, &kube.kube(), &format!("{KUBE_DIR}/kube"), 0o755)?;
    put(&root, &kube.pause(), &format!("{KUBE_DIR}/pause"), 0o755)?;
    put(&root, &kine, &format!("{KINE_DIR}/kine"), 0o755)?;
    // kubectl beside it, not in /usr/bin: a user's own kubectl stays theirs.
    std::os::unix::fs::symlink("kube", root.join(KUBE_DIR).join("kubectl"))?;
    let version = format!("{kube_version}+kine{kine_version}-1");
    control(
        &root,
        &[
            ("Package", "socialweb-kubernetes"),
            ("Version", &version),
            ("Section", "admin"),
            ("Priority", "optional"),
        ],
        &format!(
            "the Kubernetes socialweb runs (v{kube_version}) and kine (v{kine_version})\n \
             One multicall binary (apiserver, controller-manager, scheduler, kubelet, kube-proxy,\n \
             kubectl, etcd) and pause, built from upstream's Go modules, in {KUBE_DIR} (kubectl a\n \
             link there); kine in {KINE_DIR}."
        ),
    )?;
    dpkg_deb(&root, out, "socialweb-kubernetes", &version)
}

/// The package's node image: the reference config with the busybox seed, cached like the
/// suite's by its fingerprint.
fn node_image() -> Result<PathBuf> {
    let _held = crate::cache::lock("nodeimage-package")?;
    let inputs = nodeimage::cache_dir().join("nodeimage-package-inputs");
    std::fs::create_dir_all(&inputs)?;
    crate::images::write_busybox(&inputs.join("busybox.tar"))?;
    let spec = Spec {
        images: vec![inputs.join("busybox.tar")],
        ..Spec::default()
    };
    let out = nodeimage::cache_dir().join(if cfg!(debug_assertions) {
        "nodeimage-package-debug"
    } else {
        "nodeimage-package"
    });
    nodeimage::build(&spec, &inputs, &out, false)?;
    Ok(out)
}

fn node_image_deb(image: &Path, out: &Path) -> Result<PathBuf> {
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(image.join("nodeimage.json"))?)?;
    let fingerprint = manifest["fingerprint"]
        .as_str()
        .context("nodeimage.json has no fingerprint")?;
    let short = &fingerprint.trim_start_matches("sha256:")[..16];
    let root = stage(out, "node-image")?;
    let dir = root.join(NODE_IMAGE_DIR);
    std::fs::create_dir_all(&dir)?;
    for entry in std::fs::read_dir(image)? {
        let entry = entry?;
        // Linked, not copied, where the cache is on the same filesystem: the root
        // filesystem alone is a GiB (dpkg-deb only reads it).
        let to = dir.join(entry.file_name());
        if std::fs::hard_link(entry.path(), &to).is_err() {
            std::fs::copy(entry.path(), &to)
                .with_context(|| format!("copying {}", entry.path().display()))?;
        }
    }
    let version = format!("{}+{short}-1", version());
    control(
        &root,
        &[
            ("Package", "socialweb-node-image"),
            ("Version", &version),
            ("Section", "admin"),
            ("Priority", "optional"),
        ],
        &format!(
            "the node image socialweb's VM nodes boot ({fingerprint})\n \
             A kernel, an initrd, a root filesystem with socialweb-agent, containerd and the\n \
             kubelet, and a seed disk, in {NODE_IMAGE_DIR}: what a provider machine's\n \
             local_provider.image names."
        ),
    )?;
    dpkg_deb(&root, out, "socialweb-node-image", &version)
}
