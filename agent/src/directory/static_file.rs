//! The static directory: a JSON file (`{"nodes": [...]}`, the same on every node), polled for
//! changes. A file that stops parsing keeps the last good directory in force and says why.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use tokio::sync::watch;
use tracing::{info, warn};

use socialweb_mesh_core::directory::{NodeEntry, StaticFile};

pub fn read(path: &Path) -> Result<Vec<NodeEntry>> {
    let text = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let file: StaticFile = serde_json::from_slice(&text)
        .with_context(|| format!("{} is not a peer directory", path.display()))?;
    Ok(file.nodes)
}

/// Reads `path` now (failing if it cannot) and then every `every`, publishing changes.
pub fn watch(path: PathBuf, every: Duration) -> Result<watch::Receiver<Vec<NodeEntry>>> {
    let first = read(&path)?;
    let (tx, rx) = watch::channel(first);
    tokio::spawn(async move {
        let mut seen: Option<SystemTime> = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
        loop {
            tokio::time::sleep(every).await;
            let modified = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
            if modified == seen {
                continue;
            }
            seen = modified;
            match read(&path) {
                Ok(nodes) => {
                    info!(path = %path.display(), nodes = nodes.len(), "peer directory changed");
                    if tx.send(nodes).is_err() {
                        return;
                    }
                }
                Err(e) => warn!("{e:#}; keeping the previous directory"),
            }
        }
    });
    Ok(rx)
}
