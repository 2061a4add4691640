//! Container images built on this machine, so that no pull ever leaves it: `pause` (the pod
//! sandbox) and `busybox` (for test pods, with `/bin/probe` from `tests/images/probe` for what
//! busybox cannot do: name lookups and HTTPS), written as OCI image-layout tarballs that
//! `ctr images import` takes.

use std::path::Path;

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
pub use socialweb_oci::{PAUSE_IMAGE, layer, write_image, write_pause};
/// Reference of the image test pods run.
pub const BUSYBOX_IMAGE: &str = "socialweb.local/busybox:1";

/// busybox applets test pods use, linked to /bin/busybox in the image.
const APPLETS: &[&str] = &[
    "sh", "echo", "cat", "sleep", "ls", "wget", "nc", "nslookup", "ping", "hostname", "ip",
    "ifconfig", "route", "env", "true", "false", "printf", "head", "tail", "grep", "seq", "date",
    "httpd", "mkdir", "sed", "awk", "tr",
];

/// The busybox image, from Debian's busybox-static, with `/bin/probe`.
pub fn write_busybox(out: &Path) -> Result<()> {
    let bin = std::fs::read("/bin/busybox")
        .context("reading /bin/busybox (Debian package busybox-static; ./x installs it)")?;
    let probe = std::fs::read(probe_binary()?)?;
    let links: Vec<(String, &str)> = APPLETS
        .iter()
        .map(|a| (format!("bin/{a}"), "busybox"))
        .collect();
    write_image(
        out,
        BUSYBOX_IMAGE,
        layer(
            &[("bin/busybox", 0o755, bin), ("bin/probe", 0o755, probe)],
            &links,
        )?,
        &["/bin/sh"],
    )
}

/// The `probe` binary (tests/images/probe, static Go), built once into the cache directory
/// the Kubernetes build uses, keyed by a hash of its source.
pub fn probe_binary() -> Result<std::path::PathBuf> {
    static BUILT: std::sync::OnceLock<Result<std::path::PathBuf, String>> =
        std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| build_probe().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

fn build_probe() -> Result<std::path::PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("images/probe");
    let mut h = Sha256::new();
    for f in ["go.mod", "main.go"] {
        h.update(std::fs::read(src.join(f)).with_context(|| format!("reading {f}"))?);
    }
    let hash: String = h
        .finalize()
        .iter()
        .take(6)
        .map(|b| format!("{b:02x}"))
        .collect();
    let cache = std::env::var_os("SOCIALWEB_CACHE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(&std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                .join(".cache/socialweb")
        });
    let out = cache.join(format!("probe-{hash}/probe"));
    if out.is_file() {
        return Ok(out);
    }
    let go = ["/usr/local/go/bin/go", "/usr/bin/go"]
        .iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| "go".into());
    let tmp = out.with_extension("tmp");
    std::fs::create_dir_all(out.parent().expect("has a parent"))?;
    let status = std::process::Command::new(&go)
        .current_dir(&src)
        .env("CGO_ENABLED", "0")
        .env("GOFLAGS", "-mod=mod")
        .env("GOTOOLCHAIN", "local")
        .args(["build", "-trimpath", "-ldflags=-s -w", "-o"])
        .arg(&tmp)
        .arg(".")
        .status()
        .with_context(|| {
            format!(
                "running {} (the Go toolchain builds tests/images/probe)",
                go.display()
            )
        })?;
    if !status.success() {
        anyhow::bail!("building tests/images/probe failed ({status})");
    }
    std::fs::rename(&tmp, &out)?;
    Ok(out)
}

/// The images the upstream conformance suite (`./x conformance`) runs, under the names its
/// `test/utils/image/manifest.go` gives them, with their entrypoint and command. They share one
/// layer: a Debian root filesystem (image-builder/conformance/rootfs.sh) with `/agnhost` added.
/// nginx and httpd are stood in for by agnhost's `netexec` on port 80: the tests that run them
/// (EndpointSlice) only need a Running pod that declares ports.
pub const CONFORMANCE_IMAGES: &[(&str, &[&str], &[&str])] = &[
    (
        "registry.k8s.io/e2e-test-images/agnhost:2.56",
        &["/agnhost"],
        &["pause"],
    ),
    (
        "registry.k8s.io/e2e-test-images/jessie-dnsutils:1.7",
        &[],
        &["/bin/sh"],
    ),
    (
        "registry.k8s.io/e2e-test-images/busybox:1.37.0-1",
        &[],
        &["sh"],
    ),
    (
        "registry.k8s.io/e2e-test-images/nginx:1.14-4",
        &["/agnhost", "netexec", "--http-port=80"],
        &[],
    ),
    (
        "registry.k8s.io/e2e-test-images/nginx:1.15-4",
        &["/agnhost", "netexec", "--http-port=80"],
        &[],
    ),
    (
        "registry.k8s.io/e2e-test-images/httpd:2.4.38-4",
        &["/agnhost", "netexec", "--http-port=80"],
        &[],
    ),
    (
        "registry.k8s.io/e2e-test-images/httpd:2.4.39-4",
        &["/agnhost", "netexec", "--http-port=80"],
        &[],
    ),
];

/// The pause image under the name the suite gives it (`imageutils.GetPauseImageName`).
pub const CONFORMANCE_PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10.1";

/// Writes the conformance images into `out` (one OCI image-layout archive holding every name
/// of [`CONFORMANCE_IMAGES`], which `ctr images import` imports as as many images sharing one
/// layer), from a root filesystem tarball and the `agnhost` binary (with `localhost.crt` and
/// `localhost.key` beside it); `work` is scratch space.
pub fn write_conformance_images(
    out: &Path,
    rootfs_tar: &Path,
    agnhost: &Path,
    work: &Path,
) -> Result<()> {
    // The layer: the root filesystem with /agnhost (and the agnhost-2 link) appended.
    let layer_path = work.join("layer.tar");
    std::fs::copy(rootfs_tar, &layer_path)
        .with_context(|| format!("copying {}", rootfs_tar.display()))?;
    let add = work.join("add");
    std::fs::create_dir_all(&add)?;
    std::fs::copy(agnhost, add.join("agnhost"))?;
    // agnhost porter's TLS ports read these from the working directory, /, as upstream.
    let dir = agnhost.parent().unwrap_or(Path::new("."));
    for f in ["localhost.crt", "localhost.key"] {
        std::fs::copy(dir.join(f), add.join(f))
            .with_context(|| format!("copying {} from {}", f, dir.display()))?;
    }
    let _ = std::fs::remove_file(add.join("agnhost-2"));
    std::os::unix::fs::symlink("agnhost", add.join("agnhost-2"))?;
    std::fs::create_dir_all(add.join("uploads"))?;
    let status = std::process::Command::new("tar")
        .args([
            "--numeric-owner",
            "--owner=0",
            "--group=0",
            "--mtime=@0",
            "-rf",
        ])
        .arg(&layer_path)
        .arg("-C")
        .arg(&add)
        .args([
            "agnhost",
            "agnhost-2",
            "uploads",
            "localhost.crt",
            "localhost.key",
        ])
        .status()?;
    anyhow::ensure!(status.success(), "tar -r onto the layer failed ({status})");
    let images: Vec<socialweb_oci::Image<'_>> = CONFORMANCE_IMAGES
        .iter()
        .map(|(reference, entrypoint, cmd)| socialweb_oci::Image {
            reference,
            entrypoint,
            cmd,
            env: &["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        })
        .collect();
    let file = std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
    socialweb_oci::write_layout(
        std::io::BufWriter::new(file),
        &socialweb_oci::Layer::File(layer_path.clone()),
        &images,
    )?
    .into_inner()
    .map_err(|e| e.into_error())?;
    std::fs::remove_file(&layer_path)?;
    Ok(())
}

/// The pause image under the suite's name ([`CONFORMANCE_PAUSE_IMAGE`]).
pub fn write_conformance_pause(out: &Path, pause_binary: &Path) -> Result<()> {
    socialweb_oci::write_pause_as(out, pause_binary, CONFORMANCE_PAUSE_IMAGE)
}
