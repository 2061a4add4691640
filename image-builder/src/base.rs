//! The base root filesystem: a directory, a tarball, or a minimal Debian made with
//! `debootstrap`. debootstrap is not reproducible (it installs whatever the mirror has that
//! day), so its result is cached as a tarball keyed by its inputs and from then on is an
//! input like any other: the image's fingerprint covers the tarball's digest, and the same
//! tarball gives the same image. Publish the tarball with the image to rebuild it elsewhere.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use crate::config::{Base, Debootstrap};
use crate::digest::hex;
use crate::progress::Progress;

/// A base ready to stage.
#[derive(Debug, Clone)]
pub enum Ready {
    Dir(PathBuf),
    Tarball(PathBuf),
}

/// Removes a directory when dropped (a failed or interrupted step leaves nothing behind).
#[derive(Debug)]
pub struct TempDir(pub PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Where a debootstrap base is cached: `<cache>/debootstrap-<suite>-<digest of the inputs>.tar`.
pub fn debootstrap_cache(d: &Debootstrap, cache: &Path) -> PathBuf {
    let mut packages = d.packages.clone();
    packages.sort();
    let mut h = Sha256::new();
    h.update(format!(
        "{}\n{}\n{}\n{}\namd64\n",
        d.suite,
        d.mirror,
        d.variant,
        packages.join(",")
    ));
    let digest = hex(&h.finalize());
    cache.join(format!("debootstrap-{}-{}.tar", d.suite, &digest[..12]))
}

pub fn prepare(base: &Base, cache: &Path, progress: &Progress) -> Result<Ready> {
    match base {
        Base::Dir(d) => Ok(Ready::Dir(d.clone())),
        Base::Tarball(t) => Ok(Ready::Tarball(t.clone())),
        Base::Debootstrap(d) => {
            let out = debootstrap_cache(d, cache);
            // Two builds at once (test binaries run in parallel, or an operator's beside
            // them) would both debootstrap and the later rename would swap the tarball under
            // the other's image: the second waits for the first and finds it built.
            let _held = lock_beside(&out)?;
            if out.exists() {
                // Marks the base as in use: `./x prune` keeps the newest base of each suite.
                let _ = std::fs::File::open(&out)
                    .and_then(|f| f.set_modified(std::time::SystemTime::now()));
            } else {
                debootstrap(d, &out, progress)?;
            }
            Ok(Ready::Tarball(out))
        }
    }
}

/// An exclusive `flock(2)` on a dot-file beside `out` (`./x prune` sweeps dot-files a day
/// old, and never takes one for a cache entry), held until the file is dropped.
fn lock_beside(out: &Path) -> Result<std::fs::File> {
    let dir = out.parent().expect("a cache file has a directory");
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating the cache {}", dir.display()))?;
    let name = out
        .file_name()
        .expect("a cache file has a name")
        .to_string_lossy();
    let path = dir.join(format!(".{name}.lock"));
    let file =
        std::fs::File::create(&path).with_context(|| format!("opening {}", path.display()))?;
    file.lock()
        .with_context(|| format!("locking {}", path.display()))?;
    Ok(file)
}

fn debootstrap(d: &Debootstrap, out: &Path, progress: &Progress) -> Result<()> {
    let dir = out.parent().expect("a cache file has a directory");
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating the cache {}", dir.display()))?;
    let tmp = TempDir(dir.join(format!(".debootstrap-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&tmp.0);
    let root = tmp.0.join("root");
    std::fs::create_dir_all(&root)?;
    let task = progress.task(&format!("debootstrap {}", d.suite), None);
    let mut cmd = Command::new("debootstrap");
    cmd.arg(format!("--variant={}", d.variant));
    if !d.packages.is_empty() {
        cmd.arg(format!("--include={}", d.packages.join(",")));
    }
    cmd.arg(&d.suite)
        .arg(&root)
        .arg(&d.mirror)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| {
        anyhow::anyhow!(
            "base.debootstrap: running debootstrap: {e} (install Debian's debootstrap package)"
        )
    })?;
    let stderr = child.stderr.take().expect("piped");
    let err_lines = std::thread::spawn(move || {
        std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });
    let mut last = Vec::new();
    for line in std::io::BufReader::new(child.stdout.take().expect("piped"))
        .lines()
        .map_while(Result::ok)
    {
        task.message(line.clone());
        last.push(line);
        if last.len() > 20 {
            last.remove(0);
        }
    }
    let status = child.wait()?;
    let errs = err_lines.join().unwrap_or_default();
    if !status.success() {
        last.extend(errs);
        bail!(
            "base.debootstrap: debootstrap {} from {} failed ({status}):\n{}",
            d.suite,
            d.mirror,
            last.join("\n")
        );
    }
    // What apt downloaded is not part of a system.
    for sub in ["var/cache/apt/archives", "var/lib/apt/lists"] {
        let p = root.join(sub);
        for e in std::fs::read_dir(&p).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_file()) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    task.message("packing the base into the cache");
    let partial = tmp.0.join("base.tar");
    let st = Command::new("tar")
        .args([
            "--sort=name",
            "--numeric-owner",
            "--xattrs",
            "--xattrs-include=*",
            "-C",
        ])
        .arg(&root)
        .arg("-cf")
        .arg(&partial)
        .arg(".")
        .status()
        .context("running tar")?;
    if !st.success() {
        bail!("packing the debootstrap base with tar failed ({st})");
    }
    std::fs::rename(&partial, out).with_context(|| format!("writing {}", out.display()))?;
    task.finish(&format!(": {}", out.display()));
    Ok(())
}
