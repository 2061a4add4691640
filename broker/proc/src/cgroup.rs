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

/// Where a budget's cgroup is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Parent {
    /// Under the hierarchy's root (a daemon started by hand, or by a unit without
    /// `Delegate=yes`).
    #[default]
    Root,
    /// Under the cgroup this process was started in: the subtree systemd delegates to a unit
    /// with `Delegate=yes`, so that the unit's limits, accounting and `systemctl stop` reach
    /// what it starts. On v2 this process first moves to a leaf of its own (`supervisor`):
    /// a cgroup whose children have controllers holds no process itself.
    Own,
}

/// The leaf this process moves to under its own cgroup on v2 ([`Parent::Own`]).
const SUPERVISOR_LEAF: &str = "supervisor";

/// This process's cgroup in `hierarchy` (v1: `memory`, `pids`, `cpu`; v2: any), as
/// `/proc/self/cgroup` says it (`text`): `/` for the root. v1 lines name their controllers
/// (`4:memory:/system.slice/x.service`, `1:cpu,cpuacct:/...`), v2's one line none (`0::/...`).
pub fn own_path(v: Version, text: &str, hierarchy: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let ours = match v {
            Version::V2 => controllers.is_empty(),
            Version::V1 => controllers.split(',').any(|c| c == hierarchy),
        };
        ours.then(|| path.to_string())
    })
}

/// The directories a budget's cgroups are made in, one per hierarchy (v1) or one (v2), for
/// `parent`; on v2 under [`Parent::Own`], this process moved to its leaf once, first.
fn bases(v: Version, parent: Parent) -> Result<Vec<PathBuf>> {
    let root = Path::new(CGROUP_FS);
    if parent == Parent::Root {
        return Ok(match v {
            Version::V2 => vec![root.to_path_buf()],
            Version::V1 => V1_HIERARCHIES.iter().map(|h| root.join(h)).collect(),
        });
    }
    static OWN: std::sync::OnceLock<std::result::Result<Vec<PathBuf>, String>> =
        std::sync::OnceLock::new();
    OWN.get_or_init(|| own_bases(v).map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

/// [`bases`] under [`Parent::Own`], read once: what the process was started in.
fn own_bases(v: Version) -> Result<Vec<PathBuf>> {
    let root = Path::new(CGROUP_FS);
    let text = std::fs::read_to_string("/proc/self/cgroup").context("reading /proc/self/cgroup")?;
    let under = |h: &str, rel: &str| root.join(h).join(rel.trim_start_matches('/'));
    match v {
        Version::V1 => V1_HIERARCHIES
            .iter()
            .map(|h| {
                own_path(v, &text, h)
                    .map(|p| under(h, &p))
                    .with_context(|| format!("no {h} cgroup in /proc/self/cgroup"))
            })
            .collect(),
        Version::V2 => {
            let own = under(
                "",
                &own_path(v, &text, "").context("no v2 line in /proc/self/cgroup")?,
            );
            if own != root {
                let leaf = own.join(SUPERVISOR_LEAF);
                std::fs::create_dir_all(&leaf)
                    .with_context(|| format!("creating cgroup {}", leaf.display()))?;
                std::fs::write(leaf.join("cgroup.procs"), std::process::id().to_string())
                    .with_context(|| format!("moving this process into {}", leaf.display()))?;
            }
            Ok(vec![own])
        }
    }
}

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

    /// Creates (or reuses) cgroup `name` under the hierarchies' roots and writes `budget`
    /// into it.
    pub fn create(name: &str, budget: &Budget) -> Result<Cgroup> {
        Self::create_under(Parent::Root, name, budget)
    }

    /// Creates (or reuses) cgroup `name` under `parent` and writes `budget` into it.
    pub fn create_under(parent: Parent, name: &str, budget: &Budget) -> Result<Cgroup> {
        let v = Self::version();
        let bases = bases(v, parent)?;
        if v == Version::V2 {
            // The controllers must be on for the parent's children.
            let _ = std::fs::write(
                bases[0].join("cgroup.subtree_control"),
                "+memory +pids +cpu",
            );
        }
        let dirs: Vec<PathBuf> = bases.iter().map(|b| b.join(name)).collect();
        for d in &dirs {
            std::fs::create_dir_all(d)
                .with_context(|| format!("creating cgroup {}", d.display()))?;
        }
        for (hierarchy, file, value) in limits(v, budget) {
            let dir = match v {
                Version::V2 => &dirs[0],
                Version::V1 => {
                    let i = V1_HIERARCHIES
                        .iter()
                        .position(|h| *h == hierarchy)
                        .expect("a v1 limit names a hierarchy a budget has");
                    &dirs[i]
                }
            };
            let path = dir.join(file);
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
    fn its_own_cgroup_is_read_from_each_hierarchys_line() {
        let v1 = "12:pids:/system.slice/socialweb-broker.service\n\
                  4:memory:/system.slice/socialweb-broker.service\n\
                  2:cpu,cpuacct:/system.slice/socialweb-broker.service\n\
                  1:name=systemd:/system.slice/socialweb-broker.service\n\
                  0::/system.slice/socialweb-broker.service\n";
        for h in V1_HIERARCHIES {
            assert_eq!(
                own_path(Version::V1, v1, h).as_deref(),
                Some("/system.slice/socialweb-broker.service"),
                "{h}"
            );
        }
        assert_eq!(
            own_path(Version::V1, v1, "cpuacct").as_deref(),
            Some("/system.slice/socialweb-broker.service")
        );
        assert_eq!(own_path(Version::V1, "4:memory:/\n", "pids"), None);
        assert_eq!(
            own_path(
                Version::V2,
                "0::/system.slice/socialweb-broker.service\n",
                ""
            )
            .as_deref(),
            Some("/system.slice/socialweb-broker.service")
        );
        assert_eq!(own_path(Version::V2, "0::/\n", "").as_deref(), Some("/"));
        // A path with a colon stays whole.
        assert_eq!(
            own_path(Version::V2, "0::/a:b\n", "").as_deref(),
            Some("/a:b")
        );
        assert_eq!(own_path(Version::V2, "", ""), None);
    }

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
