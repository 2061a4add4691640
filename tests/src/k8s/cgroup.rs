//! A cgroup root per node (cgroup v1, one directory per controller), so each kubelet manages
//! its own tree and everything in it can be killed and removed when the node goes.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

const CGROUP_FS: &str = "/sys/fs/cgroup";

/// `/sys/fs/cgroup/<controller>/<name>` for every v1 controller mounted.
#[derive(Debug)]
pub struct CgroupRoot {
    pub name: String,
    dirs: Vec<PathBuf>,
}

fn controllers() -> Vec<PathBuf> {
    std::fs::read_dir(CGROUP_FS)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path())
                // v1 hierarchies only; the unified (v2) mount is not where kubelet works here.
                .filter(|p| p.join("cgroup.procs").exists() && !p.ends_with("unified"))
                .collect()
        })
        .unwrap_or_default()
}

impl CgroupRoot {
    pub fn create(name: &str) -> Result<CgroupRoot> {
        let mut dirs = Vec::new();
        for c in controllers() {
            let dir = c.join(name);
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            // A new cpuset starts with no CPUs and no memory nodes: inherit the parent's.
            for f in ["cpuset.cpus", "cpuset.mems"] {
                if let Ok(v) = std::fs::read_to_string(c.join(f)) {
                    let _ = std::fs::write(dir.join(f), v.trim());
                }
            }
            dirs.push(dir);
        }
        Ok(CgroupRoot {
            name: name.to_string(),
            dirs,
        })
    }

    /// Kills every process in the tree and removes the tree, deepest first.
    pub fn destroy(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let pids: Vec<i32> = self.dirs.iter().flat_map(|d| procs_below(d)).collect();
            if pids.is_empty() || Instant::now() > deadline {
                break;
            }
            for pid in pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        for d in &self.dirs {
            remove_tree(d);
        }
    }
}

fn subdirs(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default()
}

fn procs_below(dir: &Path) -> Vec<i32> {
    let mut pids: Vec<i32> = std::fs::read_to_string(dir.join("cgroup.procs"))
        .map(|s| s.lines().filter_map(|l| l.parse().ok()).collect())
        .unwrap_or_default();
    for sub in subdirs(dir) {
        pids.extend(procs_below(&sub));
    }
    pids
}

fn remove_tree(dir: &Path) {
    for sub in subdirs(dir) {
        remove_tree(&sub);
    }
    let _ = std::fs::remove_dir(dir);
}

/// Names of cgroup roots left by dead runs (`swt-<pid>-...` whose pid is gone), removed.
pub fn sweep() {
    for c in controllers() {
        for d in subdirs(&c) {
            let name = d
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if let Some(pid) = crate::netns::owner_pid(&name)
                && !Path::new(&format!("/proc/{pid}")).exists()
            {
                CgroupRoot {
                    name,
                    dirs: vec![d],
                }
                .destroy();
            }
        }
    }
}
