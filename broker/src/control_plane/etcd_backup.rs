//! A cluster's etcd datastore in backups (docs/operations.md, "Backup and restore"). A
//! serving etcd is copied through its snapshot API (`kube etcd-snapshot save`, etcdctl's
//! `snapshot save`: consistent, and hash-checked when restored); a stopped one (the cluster
//! hibernates) is its data directory's files as they are. A restored backup leaves the
//! snapshot beside the cluster's directory, and the cluster's next start makes its data
//! directory from it (`kube etcd-snapshot restore`, etcdutl's), as the member it runs --
//! its peer URL is the one leased to the cluster then.

use std::path::Path;

use anyhow::{Context, Result, bail};

/// A backup's snapshot of a serving etcd, in the cluster's directory.
pub const SNAPSHOT: &str = "etcd.snapshot";
/// Where the serving etcd's client URL is written, beside its pidfile.
const ENDPOINT: &str = "run/etcd.endpoint";

/// Whether the etcd of the cluster in `dir` runs now (its pidfile names a live process).
pub fn serving(dir: &Path) -> bool {
    socialweb_proc::adopt(&dir.join("run/etcd.pid")).is_some()
}

/// Records where the etcd of the cluster in `dir` serves, before it starts.
pub fn record_endpoint(dir: &Path, url: &str) -> Result<()> {
    crate::pki::write_private(&dir.join(ENDPOINT), url.as_bytes(), 0o600)
}

/// Where the etcd of the cluster in `dir` serves: as recorded, or, for one an older broker
/// started (adopted since), its command line's `--listen-client-url`.
fn endpoint(dir: &Path) -> Result<String> {
    if let Ok(url) = std::fs::read_to_string(dir.join(ENDPOINT)) {
        return Ok(url.trim().to_string());
    }
    let (pid, _) = socialweb_proc::adopt(&dir.join("run/etcd.pid"))
        .with_context(|| format!("no etcd serves from {}", dir.display()))?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))?;
    cmdline
        .split(|b| *b == 0)
        .filter_map(|a| std::str::from_utf8(a).ok())
        .find_map(|a| a.strip_prefix("--listen-client-url="))
        .map(str::to_string)
        .with_context(|| format!("etcd (pid {pid}) names no --listen-client-url"))
}

/// A consistent snapshot of the serving etcd of the cluster in `dir`, into `to`, by `kube`;
/// as the apiserver, whose client certificate etcd admits.
pub async fn save(kube: &Path, dir: &Path, to: &Path) -> Result<()> {
    let endpoint = endpoint(dir)?;
    let pki = dir.join("pki/etcd");
    let out = tokio::process::Command::new(kube)
        .args(["etcd-snapshot", "save", "--endpoint", &endpoint])
        .arg("--cacert")
        .arg(pki.join("ca.crt"))
        .arg("--cert")
        .arg(pki.join("apiserver.crt"))
        .arg("--key")
        .arg(pki.join("apiserver.key"))
        .arg(to)
        .output()
        .await
        .with_context(|| format!("running {}", kube.display()))?;
    if !out.status.success() {
        bail!("{}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// Makes the cluster's data directory (`<dir>/etcd`) from a restored backup's snapshot, if
/// one waits there, as the member whose peer URL is `peer_url`: `Ok(true)` if it did. The
/// directory is made aside and renamed in whole, then the snapshot removed: a start cut
/// short does it again.
pub fn restore_pending(kube: &Path, dir: &Path, peer_url: &str) -> Result<bool> {
    let snapshot = dir.join(SNAPSHOT);
    if !snapshot.exists() {
        return Ok(false);
    }
    let data = dir.join("etcd");
    if !data.exists() {
        let aside = dir.join("etcd.restoring");
        let _ = std::fs::remove_dir_all(&aside);
        let out = std::process::Command::new(kube)
            .args(["etcd-snapshot", "restore", "--peer-url", peer_url])
            .arg("--data-dir")
            .arg(&aside)
            .arg(&snapshot)
            .output()
            .with_context(|| format!("running {}", kube.display()))?;
        if !out.status.success() {
            bail!(
                "restoring {}: {}",
                snapshot.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        socialweb_proc::owner_only::dir(&aside)?;
        std::fs::rename(&aside, &data)
            .with_context(|| format!("moving {} to {}", aside.display(), data.display()))?;
    }
    std::fs::remove_file(&snapshot).with_context(|| format!("removing {}", snapshot.display()))?;
    Ok(true)
}
