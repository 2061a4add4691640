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

/// Adds `fp` to the record of what was imported (after the import, so a crash between the
/// two imports again rather than never).
fn mark_imported(record: &Path, fp: &str) -> Result<()> {
    let mut all_done = std::fs::read_to_string(record).unwrap_or_default();
    all_done.push_str(fp);
    all_done.push('\n');
    std::fs::write(record, all_done).with_context(|| format!("writing {}", record.display()))
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
        mark_imported(record, &fp)?;
        imported += 1;
    }
    Ok(imported)
}

/// Imports what is new on the seed disk `disk` (`socialweb_wire::seeds`: a tar stream of
/// image archives behind a manifest, written by `socialweb-image-builder`). Each archive is
/// piped into `ctr images import -` as it is read, so an archive of any size goes through
/// without a copy. A missing disk holds nothing. Blocking: run it on a blocking thread.
/// Returns how many archives it imported and how many the disk holds.
pub fn import_disk(
    ctr: &Path,
    socket: &Path,
    disk: &Path,
    record: &Path,
    mut progress: impl FnMut(String),
) -> Result<(usize, usize)> {
    use socialweb_wire::seeds::{MANIFEST, SeedManifest};
    use std::io::Read;
    let file = match std::fs::File::open(disk) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((0, 0)),
        Err(e) => {
            return Err(e).with_context(|| format!("opening the seed disk {}", disk.display()));
        }
    };
    let mut archive = tar::Archive::new(std::io::BufReader::with_capacity(1 << 20, file));
    let mut entries = archive
        .entries()
        .with_context(|| format!("reading the seed disk {}", disk.display()))?;
    let mut first = entries
        .next()
        .with_context(|| format!("the seed disk {} is empty", disk.display()))?
        .with_context(|| format!("reading the seed disk {}", disk.display()))?;
    if first.path()?.to_string_lossy() != MANIFEST {
        bail!(
            "the seed disk {} does not start with {MANIFEST}: not a seed disk",
            disk.display()
        );
    }
    let mut text = Vec::new();
    first.read_to_end(&mut text)?;
    drop(first);
    let manifest = SeedManifest::from_json(&text)
        .with_context(|| format!("the seed disk {}", disk.display()))?;
    let done = std::fs::read_to_string(record).unwrap_or_default();
    let mut imported = 0;
    for (i, entry) in entries.enumerate() {
        let mut entry =
            entry.with_context(|| format!("reading the seed disk {}", disk.display()))?;
        let name = entry.path()?.to_string_lossy().into_owned();
        let Some(want) = manifest.images.get(i).filter(|w| w.name == name) else {
            bail!(
                "the seed disk {} holds {name} where its manifest lists {:?}",
                disk.display(),
                manifest.images.get(i).map(|w| &w.name)
            );
        };
        let fp = format!("disk {} {} {}", manifest.id, want.name, want.sha256);
        if done.lines().any(|l| l == fp) {
            continue;
        }
        let t = Instant::now();
        progress(format!(
            "importing {name} ({} MiB) from the seed disk ({}/{})",
            want.bytes >> 20,
            i + 1,
            manifest.images.len()
        ));
        let copied = pipe_into_ctr(ctr, socket, &mut entry)
            .with_context(|| format!("importing {name} from the seed disk {}", disk.display()))?;
        if copied != want.bytes {
            bail!(
                "the seed disk {}: {name} has {copied} bytes, its manifest says {}",
                disk.display(),
                want.bytes
            );
        }
        info!(archive = %name, bytes = copied, secs = t.elapsed().as_secs_f64(), "seed disk image imported into containerd");
        mark_imported(record, &fp)?;
        imported += 1;
    }
    Ok((imported, manifest.images.len()))
}

/// Streams one archive into `ctr images import -`; returns the bytes piped.
fn pipe_into_ctr(ctr: &Path, socket: &Path, archive: &mut impl std::io::Read) -> Result<u64> {
    let mut child = std::process::Command::new(ctr)
        .arg("--address")
        .arg(socket)
        .args(["-n", "k8s.io", "images", "import", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("running {}", ctr.display()))?;
    let mut stdin = child.stdin.take().context("ctr's stdin")?;
    let copied = std::io::copy(archive, &mut stdin);
    drop(stdin);
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("{}", String::from_utf8_lossy(&out.stderr).trim());
    }
    copied.context("piping it into ctr")
}
