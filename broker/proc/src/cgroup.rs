//! A budget of memory, CPU and processes in a cgroup of its own (docs/security.md,
//! "Budgets"): the broker gives one to each cluster's control plane, the provider one to
//! each VM guest's qemu, so what a tenant grows is stopped at its budget and not at the
//! host's.
//!
//! cgroup v2 (one hierarchy, `memory.max`, `pids.max`, `cpu.max`) where the host has it;
//! v1 (the `memory`, `pids` and `cpu` hierarchies, each its own files) otherwise, as on this
//! project's test machines. What to write is [`limits`], pure; [`ClusterCgroup`] writes it.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

const CGROUP_FS: &str = "/sys/fs/cgroup";

/// A budget; `None`: no limit of that kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Budget {
    pub memory_bytes: Option<u64>,
    pub pids: Option<u64>,
    /// Thousandths of a CPU.
    pub cpu_millis: Option<u64>,
}

impl Budget {
    pub fn is_none(&self) -> bool {
        *self == Budget::default()
    }
}

/// Which cgroup interface the host has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// The CFS period the CPU budget is a share of (the kernel's default).
const CPU_PERIOD_US: u64 = 100_000;

/// The files to write, as (v1 hierarchy or "" on v2, file, value), in order.
pub fn limits(v: Version, b: &Budget) -> Vec<(&'static str, &'static str, String)> {
    let mut out = Vec::new();
    let quota = b.cpu_millis.map(|m| (m * CPU_PERIOD_US / 1000).max(1000));
    match v {
        Version::V1 => {
            if let Some(m) = b.memory_bytes {
                out.push(("memory", "memory.limit_in_bytes", m.to_string()));
            }
            if let Some(p) = b.pids {
                out.push(("pids", "pids.max", p.to_string()));
            }
            if let Some(q) = quota {
                out.push(("cpu", "cpu.cfs_period_us", CPU_PERIOD_US.to_string()));
                out.push(("cpu", "cpu.cfs_quota_us", q.to_string()));
            }
        }
        Version::V2 => {
            if let Some(m) = b.memory_bytes {
                out.push(("", "memory.max", m.to_string()));
            }
            if let Some(p) = b.pids {
                out.push(("", "pids.max", p.to_string()));
            }
            if let Some(q) = quota {
                out.push(("", "cpu.max", format!("{q} {CPU_PERIOD_US}")));
            }
        }
    }
    out
}

/// The v1 hierarchies a budget needs.
const V1_HIERARCHIES: [&str; 3] = ["memory", "pids", "cpu"];

/// A budget's cgroup: one directory on v2, one per hierarchy on v1.
#[derive(Debug, Clone)]
pub struct Cgroup {
    dirs: Vec<PathBuf>,
}

impl Cgroup {
    /// The host's cgroup interface.
    pub fn version() -> Version {
        if Path::new(CGROUP_FS).join("cgroup.controllers").exists() {
            Version::V2
        } else {
            Version::V1
        }
    }

    /// Creates (or reuses) cgroup `name` and writes `budget` into it.
    pub fn create(name: &str, budget: &Budget) -> Result<Cgroup> {
        let root = Path::new(CGROUP_FS);
        let v = Self::version();
        let dirs: Vec<PathBuf> = match v {
            Version::V2 => {
                // The controllers must be on for the root's children.
                let _ = std::fs::write(root.join("cgroup.subtree_control"), "+memory +pids +cpu");
                vec![root.join(name)]
            }
            Version::V1 => V1_HIERARCHIES
                .iter()
                .map(|h| root.join(h).join(name))
                .collect(),
        };
        for d in &dirs {
            std::fs::create_dir_all(d)
                .with_context(|| format!("creating cgroup {}", d.display()))?;
        }
        for (hierarchy, file, value) in limits(v, budget) {
            let path = match v {
                Version::V2 => root.join(name).join(file),
                Version::V1 => root.join(hierarchy).join(name).join(file),
            };
            std::fs::write(&path, &value)
                .with_context(|| format!("writing {value} to {}", path.display()))?;
        }
        Ok(Cgroup { dirs })
    }

    /// Moves process `pid` into the cgroup.
    pub fn enter(&self, pid: u32) -> Result<()> {
        for d in &self.dirs {
            let procs = d.join("cgroup.procs");
            std::fs::write(&procs, pid.to_string())
                .with_context(|| format!("writing {pid} to {}", procs.display()))?;
        }
        Ok(())
    }

    /// Its directories (one per hierarchy on v1).
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// Removes the cgroup once no process is left in it (an error otherwise, ignored: the
    /// next start reuses it).
    pub fn remove(&self) {
        for d in &self.dirs {
            let _ = std::fs::remove_dir(d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_is_written_in_each_interfaces_own_words() {
        let b = Budget {
            memory_bytes: Some(2 << 30),
            pids: Some(4096),
            cpu_millis: Some(1500),
        };
        assert_eq!(
            limits(Version::V1, &b),
            vec![
                ("memory", "memory.limit_in_bytes", "2147483648".to_string()),
                ("pids", "pids.max", "4096".to_string()),
                ("cpu", "cpu.cfs_period_us", "100000".to_string()),
                ("cpu", "cpu.cfs_quota_us", "150000".to_string()),
            ]
        );
        assert_eq!(
            limits(Version::V2, &b),
            vec![
                ("", "memory.max", "2147483648".to_string()),
                ("", "pids.max", "4096".to_string()),
                ("", "cpu.max", "150000 100000".to_string()),
            ]
        );
        assert!(limits(Version::V2, &Budget::default()).is_empty());
        assert!(Budget::default().is_none());
    }
}
