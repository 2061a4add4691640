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
    // Written aside and moved in only if it changed: the suite's cached image inputs are
    // shared by test processes running at once (crate::cache).
    let written = crate::cache::aside(out);
    write_image(
        &written,
        BUSYBOX_IMAGE,
        layer(
            &[("bin/busybox", 0o755, bin), ("bin/probe", 0o755, probe)],
            &links,
        )?,
        &["/bin/sh"],
    )?;
    crate::cache::replace_if_changed(&written, out)
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
    let out = crate::cache::dir().join(format!("probe-{hash}/probe"));
    if out.is_file() {
        // Marks the entry as the one in use: `./x prune` keeps the newest probe build.
        let _ = std::fs::File::open(out.parent().expect("has a parent"))
            .and_then(|d| d.set_modified(std::time::SystemTime::now()));
        return Ok(out);
    }
    let go = ["/usr/local/go/bin/go", "/usr/bin/go"]
        .iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| "go".into());
    // Its own name per process: two test binaries may build it at once (the last rename wins,
    // with the same bytes).
    let tmp = crate::cache::aside(&out);
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
