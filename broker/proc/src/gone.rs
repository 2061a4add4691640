//! Removing what may already be gone: a file or a directory tree that is absent is what the
//! caller wanted, any other failure is an error naming the path (a step redone after a cut
//! short start finds half of it removed).

use std::path::Path;

use anyhow::{Context, Result};

fn absent_is_fine(r: std::io::Result<()>, path: &Path) -> Result<()> {
    match r {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", path.display()))
        }
        _ => Ok(()),
    }
}

/// Removes the file (or symlink) `path` unless it is not there.
pub fn file(path: &Path) -> Result<()> {
    absent_is_fine(std::fs::remove_file(path), path)
}

/// Removes the directory tree `path` unless it is not there.
pub fn dir(path: &Path) -> Result<()> {
    absent_is_fine(std::fs::remove_dir_all(path), path)
}
