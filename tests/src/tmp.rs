//! Scratch directories that belong to one test and are removed with it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, Result};

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A directory under the system temp dir, named `swt-<pid>-<seq>-<role>` like the harness's
/// namespaces, removed (recursively) on drop.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub fn new(role: &str) -> Result<TempDir> {
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("swt-{}-{seq}-{role}", std::process::id()));
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(TempDir { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Set to keep scratch directories (component logs, configs) after a test, for debugging.
pub const KEEP_ENV: &str = "SOCIALWEB_KEEP_TMP";

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::env::var_os(KEEP_ENV).is_some() {
            eprintln!(
                "testbed: keeping {} ({KEEP_ENV} is set)",
                self.path.display()
            );
            return;
        }
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Removes scratch directories of runs whose process is gone (unless they are being kept).
pub fn sweep() {
    if std::env::var_os(KEEP_ENV).is_some() {
        return;
    }
    let Ok(dir) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in dir.filter_map(|e| e.ok()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        if crate::runs::of_a_dead_run(&name) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}
