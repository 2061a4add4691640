//! Container images that come with the node (the image's seed directory or seed disk): every
//! `*.tar` there, an OCI or Docker image archive, is imported into containerd's `k8s.io`
//! namespace at boot, so Pods use it without a pull (the sandbox image is one of them). What
//! was imported is remembered by name, size and modification time, so a restarted agent does
//! not import it again.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use tracing::info;

/// The archives in `dir`, sorted by name; a missing directory holds none.
pub fn archives(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(d) => d
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "tar"))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
    };
    out.sort();
    Ok(out)
}

fn fingerprint(p: &Path) -> Result<String> {
    let m = std::fs::metadata(p).with_context(|| format!("reading {}", p.display()))?;
    let mtime = m
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_secs())
        .unwrap_or(0);
    Ok(format!(
        "{} {} {mtime}",
        p.file_name().unwrap_or_default().to_string_lossy(),
        m.len()
    ))
}

/// Imports what is new in `dir`; `record` is the file remembering what was imported. Calls
/// `progress` with a line before each import. Returns how many were imported.
pub async fn import_new(
    ctr: &Path,
    socket: &Path,
    dir: &Path,
    record: &Path,
    mut progress: impl FnMut(String),
) -> Result<usize> {
    let done: Vec<String> = std::fs::read_to_string(record)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect();
    let mut imported = 0;
    let all = archives(dir)?;
    for (i, tar) in all.iter().enumerate() {
        let fp = fingerprint(tar)?;
        if done.contains(&fp) {
            continue;
        }
        let t = Instant::now();
        progress(format!(
            "importing {} ({}/{})",
            tar.display(),
            i + 1,
            all.len()
        ));
        let out = tokio::process::Command::new(ctr)
            .arg("--address")
            .arg(socket)
            .args(["-n", "k8s.io", "images", "import"])
            .arg(tar)
            .output()
            .await
            .with_context(|| format!("running {}", ctr.display()))?;
        if !out.status.success() {
            bail!(
                "importing {}: {}",
                tar.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        info!(archive = %tar.display(), secs = t.elapsed().as_secs_f64(), "image imported into containerd");
        let mut all_done = std::fs::read_to_string(record).unwrap_or_default();
        all_done.push_str(&fp);
        all_done.push('\n');
        std::fs::write(record, all_done)
            .with_context(|| format!("writing {}", record.display()))?;
        imported += 1;
    }
    Ok(imported)
}
