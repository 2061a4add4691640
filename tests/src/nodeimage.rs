//! The node image in the tests: the reference config's base (`image-builder/node.toml`) with
//! this build's agent and CNI plugin and the Kubernetes we ship, built by the real
//! `socialweb-image-builder`. The suite's image also seeds the `busybox` test image and carries
//! a boot report (a oneshot unit that, on a kernel command line with `socialweb.boot_report`,
//! prints the agent's status on the serial console once the agent has tried to reach its
//! control plane, then powers the VM off; a provider's VM runs on), and is cached in
//! `~/.cache/socialweb/nodeimage-test`, rebuilt whenever its fingerprint changes.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::cache::write_if_changed;
use crate::cni::workspace_bin;
use crate::k8s::binaries;

/// What goes into a test image beyond the reference config.
#[derive(Debug, Clone)]
pub struct Spec {
    pub vcpu: u32,
    pub mem_mib: u64,
    pub headroom_mib: u64,
    pub size_mib: Option<u64>,
    pub images: Vec<PathBuf>,
    /// `(source, destination in the image, mode)`.
    pub files: Vec<(PathBuf, String, u32)>,
}

impl Default for Spec {
    fn default() -> Spec {
        Spec {
            vcpu: 2,
            mem_mib: 2048,
            headroom_mib: 256,
            size_mib: None,
            images: Vec::new(),
            files: Vec::new(),
        }
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the repository")
        .to_path_buf()
}

pub fn cache_dir() -> PathBuf {
    crate::cache::dir()
}

/// The config text for `spec`: absolute paths, the reference config's `[base]`.
pub fn config_text(spec: &Spec) -> Result<String> {
    let reference = std::fs::read_to_string(repo().join("image-builder/node.toml"))?;
    let base = reference
        .find("\n[base")
        .map(|i| &reference[i + 1..])
        .context("image-builder/node.toml has no [base] section")?;
    let bins = binaries()?;
    let mut text = format!(
        "vcpu = {}\nmemMiB = {}\nrootfs_headroom_mib = {}\nkube = {:?}\npause = {:?}\n\
         agent = {:?}\ncni = {:?}\nagent_unit = {:?}\n",
        spec.vcpu,
        spec.mem_mib,
        spec.headroom_mib,
        bins.kube(),
        bins.pause(),
        workspace_bin("socialweb-agent"),
        workspace_bin("socialweb-cni"),
        repo().join("agent/deploy/socialweb-agent.service"),
    );
    if let Some(s) = spec.size_mib {
        text.push_str(&format!("rootfs_size_mib = {s}\n"));
    }
    let images: Vec<String> = spec.images.iter().map(|p| format!("{p:?}")).collect();
    text.push_str(&format!("images = [{}]\n", images.join(", ")));
    for (src, dest, mode) in &spec.files {
        text.push_str(&format!(
            "\n[[files]]\nsrc = {src:?}\ndest = {dest:?}\nmode = 0o{mode:o}\n"
        ));
    }
    text.push('\n');
    text.push_str(base);
    Ok(text)
}

/// Runs the builder; `Ok(Err(stderr))` when it refused.
pub fn builder(args: &[&str]) -> Result<std::result::Result<String, String>> {
    let out = Command::new(workspace_bin("socialweb-image-builder"))
        .args(["--progress", "lines"])
        .args(args)
        .output()
        .context("running socialweb-image-builder")?;
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    eprint!("{err}");
    Ok(if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(err)
    })
}

/// Builds `spec` into `out` (`--force`: really build); returns nodeimage.json.
pub fn build(spec: &Spec, config_dir: &Path, out: &Path, force: bool) -> Result<Value> {
    build_with(spec, config_dir, out, force, &[])
}

/// [`build`] with more arguments for `build` (`--cache DIR`).
pub fn build_with(
    spec: &Spec,
    config_dir: &Path,
    out: &Path,
    force: bool,
    extra: &[&str],
) -> Result<Value> {
    std::fs::create_dir_all(config_dir)?;
    let config = config_dir.join("image.toml");
    // Unchanged bytes stay put: another process may be hashing this config's inputs.
    write_if_changed(&config, config_text(spec)?)?;
    let mut args = vec![
        "build",
        "--json",
        "--config",
        config.to_str().context("UTF-8 path")?,
        "--out",
        out.to_str().context("UTF-8 path")?,
    ];
    if force {
        args.push("--force");
    }
    args.extend_from_slice(extra);
    match builder(&args)? {
        Ok(json) => Ok(serde_json::from_str(&json)?),
        Err(e) => bail!("socialweb-image-builder build failed: {e}"),
    }
}

const BOOT_REPORT_UNIT: &str = "[Unit]
Description=The boot check's report: the agent's status on the serial console
After=socialweb-agent.service
# Only for the boot check: a node the provider boots from the same image runs on.
ConditionKernelCommandLine=socialweb.boot_report

[Service]
Type=oneshot
ExecStart=/usr/local/lib/socialweb-boot-report
";

const BOOT_REPORT: &str = r#"#!/bin/sh
# Waits until the agent has tried to reach its control plane (the trust step retries), then
# prints the unit's state and the agent's status on the serial console and powers off.
out=/dev/ttyS0
i=0
while [ $i -lt 150 ]; do
  socialweb-agent status 2>/dev/null | grep -q '^trust *retrying' && break
  sleep 1; i=$((i+1))
done
{
  echo "=== socialweb-boot-report begin"
  echo "uptime $(cut -d' ' -f1 /proc/uptime)"
  systemctl show socialweb-agent -p ActiveState -p SubState -p MainPID -p NRestarts
  socialweb-agent status
  echo "=== json"
  socialweb-agent status --json | tr -d '\n'
  echo
  echo "=== journal"
  journalctl -b -u socialweb-agent --no-pager -o cat | tail -n 40
  echo "=== socialweb-boot-report end"
} > $out 2>&1
systemctl poweroff --no-block
"#;

/// The suite's image (busybox seeded, the boot report), built once per fingerprint.
pub fn test_image() -> Result<PathBuf> {
    // Test binaries run two at a time: one builds, the other waits and finds it built.
    let _held = crate::cache::lock("nodeimage-test")?;
    let inputs = cache_dir().join("nodeimage-test-inputs");
    std::fs::create_dir_all(&inputs)?;
    crate::images::write_busybox(&inputs.join("busybox.tar"))?;
    write_if_changed(&inputs.join("boot-report.service"), BOOT_REPORT_UNIT)?;
    write_if_changed(&inputs.join("boot-report"), BOOT_REPORT)?;
    write_if_changed(
        &inputs.join("boot-report.conf"),
        "[Unit]\nWants=socialweb-boot-report.service\n",
    )?;
    let spec = test_spec(&inputs);
    let out = cache_dir().join("nodeimage-test");
    build(&spec, &inputs, &out, false)?;
    Ok(out)
}

/// The suite image's spec, its inputs in `inputs`.
pub fn test_spec(inputs: &Path) -> Spec {
    Spec {
        images: vec![inputs.join("busybox.tar")],
        files: vec![
            (
                inputs.join("boot-report.service"),
                "/etc/systemd/system/socialweb-boot-report.service".into(),
                0o644,
            ),
            (
                inputs.join("boot-report"),
                "/usr/local/lib/socialweb-boot-report".into(),
                0o755,
            ),
            (
                inputs.join("boot-report.conf"),
                "/etc/systemd/system/multi-user.target.d/boot-report.conf".into(),
                0o644,
            ),
        ],
        ..Spec::default()
    }
}

/// Whether two files hold the same bytes (and where they first differ).
pub fn same_bytes(a: &Path, b: &Path) -> Result<std::result::Result<(), String>> {
    use std::io::Read;
    let (mut fa, mut fb) = (std::fs::File::open(a)?, std::fs::File::open(b)?);
    let (la, lb) = (fa.metadata()?.len(), fb.metadata()?.len());
    if la != lb {
        return Ok(Err(format!("{la} bytes against {lb}")));
    }
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    let mut off = 0u64;
    loop {
        let n = fa.read(&mut ba)?;
        if n == 0 {
            return Ok(Ok(()));
        }
        fb.read_exact(&mut bb[..n])?;
        if ba[..n] != bb[..n] {
            let i = ba[..n]
                .iter()
                .zip(&bb[..n])
                .position(|(x, y)| x != y)
                .unwrap_or(0);
            return Ok(Err(format!("first difference at byte {}", off + i as u64)));
        }
        off += n as u64;
    }
}
