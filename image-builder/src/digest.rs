//! SHA-256 of files and trees, streamed (inputs of several GiB), with progress.

use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

use crate::progress::Task;

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `sha256:<hex>` of a file.
pub fn file(path: &Path, task: Option<&Task>) -> Result<String> {
    let mut f = std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        if let Some(t) = task {
            t.inc(n as u64);
        }
    }
    Ok(format!("sha256:{}", hex(&h.finalize())))
}

/// Every entry below `root`, sorted by path, not following symlinks.
pub fn walk(root: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let e = e?;
            let p = e.path();
            if e.file_type()?.is_dir() {
                stack.push(p.clone());
            }
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

/// `sha256:<hex>` of a directory tree: every path, its type, mode, owner, size and content
/// (or link target); timestamps left out (the image sets its own).
pub fn tree(root: &Path) -> Result<String> {
    let mut h = Sha256::new();
    for p in walk(root)? {
        let m = std::fs::symlink_metadata(&p)?;
        let rel = p.strip_prefix(root).expect("below root");
        h.update(format!(
            "{}\0{:o}\0{}:{}\0{}\0",
            rel.display(),
            m.permissions().mode(),
            m.uid(),
            m.gid(),
            m.len()
        ));
        if m.file_type().is_symlink() {
            h.update(std::fs::read_link(&p)?.as_os_str().as_encoded_bytes());
        } else if m.is_file() {
            h.update(file(&p, None)?);
        } else if !m.is_dir() {
            h.update(m.rdev().to_string());
        }
        h.update(b"\n");
    }
    Ok(format!("sha256:{}", hex(&h.finalize())))
}
