//! A machine on this host, for the local provider and the tests: what a rented guest is to
//! its node, made of namespaces. Given a network namespace, it adds a private mount
//! namespace (a fresh `/run`, its own `/var/lib` and `/var/log` on disk, a copy-on-write
//! `/etc`, `/sys` for the network namespace) held open by a `sleep`, and a cgroup root (v1
//! hierarchies, or the unified one) the kubelet manages. Processes enter it with
//! [`Machine::command`]. Destroying it kills everything in it: the cgroup tree (containers),
//! then every process left in its mount namespace (shims), then the holder.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use socialweb_proc::{alive, start_time};

const CGROUP_FS: &str = "/sys/fs/cgroup";

/// Where a machine made from a node image sees the image's seed disk (the agent's
/// `--seed-disk`; a VM has it at `socialweb_wire::seeds::DEFAULT_DISK`).
pub const IMAGE_SEED_DISK: &str = "/run/socialweb-seeds.img";

/// What survives a restart of whoever made the machine: enough to find it and destroy it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineRecord {
    /// The scratch directory: `var-lib`, `var-log`, `etc-up`, the identity, logs.
    pub dir: PathBuf,
    /// The network namespace file the machine lives in.
    pub netns: PathBuf,
    /// The holder's pid and kernel start time (a pid alone could be reused).
    pub holder_pid: u32,
    pub holder_started: u64,
    /// The cgroup root's name (under every hierarchy).
    pub cgroup: String,
}

/// A running machine.
#[derive(Debug)]
pub struct Machine {
    pub record: MachineRecord,
}

/// The controllers' directories a cgroup root is made under: every v1 hierarchy, or the
/// unified hierarchy alone on a v2 host.
fn controllers() -> Vec<PathBuf> {
    let root = Path::new(CGROUP_FS);
    if root.join("cgroup.controllers").exists() {
        return vec![root.to_path_buf()];
    }
    std::fs::read_dir(root)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.join("cgroup.procs").exists() && !p.ends_with("unified"))
                .collect()
        })
        .unwrap_or_default()
}

/// Fails unless the cgroup hierarchies are mounted under `/sys/fs/cgroup`: every machine
/// gets a cgroup root there, and a provider started where `/sys` was remounted without them
/// (`ip netns exec` does that) would make machines whose kubelet cannot start.
pub fn check_cgroups() -> Result<()> {
    if controllers().is_empty() {
        bail!(
            "no cgroup hierarchy is mounted under {CGROUP_FS}: the local provider gives each \
             machine a cgroup root there (start it in the host's mount namespace; \
             `ip netns exec` remounts /sys without them, `nsenter --net` does not)"
        );
    }
    Ok(())
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

/// The sub-cgroup of a machine's root its own processes live in (the holder, the agent and
/// what it starts), beside the kubelet's `kubepods`: killing the root kills them all.
pub const SYSTEM: &str = "system";

/// Creates cgroup root `name`, and its [`SYSTEM`] child, under every hierarchy.
pub fn create_cgroup(name: &str) -> Result<()> {
    for c in controllers() {
        for dir in [c.join(name), c.join(name).join(SYSTEM)] {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            // A new cpuset starts with no CPUs and no memory nodes: inherit the parent's.
            for f in ["cpuset.cpus", "cpuset.mems"] {
                if let Ok(v) = std::fs::read_to_string(c.join(f)) {
                    let _ = std::fs::write(dir.join(f), v.trim());
                }
            }
        }
    }
    Ok(())
}

/// A shell prefix that moves the shell into `<name>/system` under every hierarchy before it
/// execs what follows (so nothing forks outside it).
fn enter_cgroup_script(name: &str) -> String {
    controllers()
        .iter()
        .map(|c| format!("echo $$ > {}/{name}/{SYSTEM}/cgroup.procs; ", c.display()))
        .collect()
}

/// Kills every process in cgroup root `name` and removes it, deepest first.
pub fn destroy_cgroup(name: &str) {
    let dirs: Vec<PathBuf> = controllers().into_iter().map(|c| c.join(name)).collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pids: Vec<i32> = dirs.iter().flat_map(|d| procs_below(d)).collect();
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
    for d in &dirs {
        remove_tree(d);
    }
}

/// Cgroup roots whose name starts with `prefix`, for sweeping.
pub fn cgroups_with_prefix(prefix: &str) -> Vec<String> {
    let mut names: Vec<String> = controllers()
        .iter()
        .flat_map(|c| subdirs(c))
        .filter_map(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .filter(|n| n.starts_with(prefix))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Kills every process whose mount namespace is that of `pid`, except `pid` itself.
pub fn kill_mount_namespace(pid: u32) {
    let Ok(target) = std::fs::metadata(format!("/proc/{pid}/ns/mnt")).map(|m| m.ino()) else {
        return;
    };
    for _ in 0..100 {
        let mut found = false;
        for p in std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok()?.file_name().to_string_lossy().parse::<i32>().ok())
        {
            if p as u32 == pid {
                continue;
            }
            if std::fs::metadata(format!("/proc/{p}/ns/mnt"))
                .map(|m| m.ino())
                .ok()
                == Some(target)
            {
                found = true;
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        if !found {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The `sleep` descendant of `pid`, if there is one yet.
fn sleeping_child(pid: u32) -> Option<u32> {
    let mut stack = vec![pid];
    while let Some(p) = stack.pop() {
        if std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "sleep") {
            return Some(p);
        }
        let children =
            std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")).unwrap_or_default();
        stack.extend(
            children
                .split_whitespace()
                .filter_map(|c| c.parse::<u32>().ok()),
        );
    }
    None
}

/// The `sleep` descendant of `pid` (nsenter, unshare and sh exec one another), the process
/// that holds a machine's mount namespace.
pub fn find_sleep_child(pid: u32) -> Result<u32> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(p) = sleeping_child(pid) {
            return Ok(p);
        }
        if Instant::now() > deadline {
            bail!("no sleep process below {pid}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Machine {
    /// Builds a machine in network namespace `netns`, with scratch directory `dir` and
    /// cgroup root `cgroup`. The holder runs detached: the machine outlives its maker until
    /// [`Machine::destroy`].
    pub fn create(netns: &Path, dir: &Path, cgroup: &str) -> Result<Machine> {
        for sub in ["var-lib", "var-log", "etc-up", "etc-work"] {
            std::fs::create_dir_all(dir.join(sub))
                .with_context(|| format!("creating {}", dir.join(sub).display()))?;
        }
        let ready = dir.join("holder.ready");
        let _ = std::fs::remove_file(&ready);
        // /sys is remounted so that it shows this network namespace's devices, with the
        // cgroup hierarchies carried over (the kubelet and runc need them). /var/lib and
        // /var/log are disk, not tmpfs: cAdvisor cannot tell tmpfs mounts apart. /etc is an
        // overlay on the host's: the node writes /etc/cni/net.d and the like privately.
        let script = format!(
            "set -e; {enter}mount -t tmpfs tmpfs /run; mkdir -p /run/netns /run/.cgroup; \
             mount --rbind /sys/fs/cgroup /run/.cgroup; mount -t sysfs sysfs /sys; \
             mount --rbind /run/.cgroup /sys/fs/cgroup; umount -l /run/.cgroup; \
             mount --bind {d}/var-lib /var/lib; mount --bind {d}/var-log /var/log; \
             mount -t overlay overlay -o lowerdir=/etc,upperdir={d}/etc-up,workdir={d}/etc-work /etc; \
             touch {ready}; exec sleep 2147483647",
            enter = enter_cgroup_script(cgroup),
            d = dir.display(),
            ready = ready.display()
        );
        Self::start_holder(netns, dir, cgroup, &script, false)
    }

    /// Starts the holder running `script` (which ends in `exec sleep`) and waits for it: for
    /// `dir/holder.ready`, or with `pivoted` (the script cannot reach `dir` once it has
    /// changed root) for its `sleep`.
    fn start_holder(
        netns: &Path,
        dir: &Path,
        cgroup: &str,
        script: &str,
        pivoted: bool,
    ) -> Result<Machine> {
        let ready = dir.join("holder.ready");
        // A leftover of a machine that had this cgroup (a crash before its record was
        // written) dies here.
        destroy_cgroup(cgroup);
        create_cgroup(cgroup)?;
        let log = std::fs::File::create(dir.join("holder.log"))?;
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", netns.display()))
            .args([
                "--",
                "setsid",
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
            ])
            .arg(script)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let mut child = cmd
            .spawn()
            .context("starting the machine's holder (nsenter, unshare)")?;
        let deadline = Instant::now() + Duration::from_secs(10);
        let holder_pid = loop {
            // (setsid may fork and its parent exit 0: only a failure counts.)
            let exited = matches!(child.try_wait(), Ok(Some(st)) if !st.success());
            if !pivoted && ready.exists() {
                break find_sleep_child(child.id())?;
            }
            if pivoted && let Some(pid) = sleeping_child(child.id()) {
                break pid;
            }
            if exited || Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                destroy_cgroup(cgroup);
                bail!(
                    "the machine's mount namespace did not come up: {}",
                    std::fs::read_to_string(dir.join("holder.log"))
                        .unwrap_or_default()
                        .trim()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        // The holder is detached from us (setsid); reap the nsenter we started in the
        // background if it ever exits, so no zombie is left.
        std::thread::spawn(move || {
            let mut child = child;
            let _ = child.wait();
        });
        Ok(Machine {
            record: MachineRecord {
                dir: dir.to_path_buf(),
                netns: netns.to_path_buf(),
                holder_pid,
                holder_started: start_time(holder_pid).unwrap_or(0),
                cgroup: cgroup.to_string(),
            },
        })
    }

    /// Builds a machine that runs a node image (`docs/image.md`) instead of the host's
    /// files: `rootfs.ext4` mounted read-only (a loop device) under a writable overlay whose
    /// upper layer is in `dir`, made the mount namespace's root (`pivot_root`), so that
    /// [`Machine::command`] and [`Machine::daemon`] run the image's own programs. What a VM
    /// has of its own comes from the host as the other machines have it: `/proc`, `/sys` for
    /// the network namespace with the cgroup hierarchies, `/dev`, a fresh `/run`. containerd's
    /// and the kubelet's directories and `/var/log` are bound to disk in `dir` (overlayfs
    /// cannot be containerd's snapshot directory, and the tests read the logs); `dir/identity`
    /// is the identity disk at `/etc/socialweb`, `dir/seeds` more seed archives at
    /// `/var/lib/socialweb/images`, and the image's seed disk is at [`IMAGE_SEED_DISK`].
    pub fn create_from_image(
        netns: &Path,
        dir: &Path,
        cgroup: &str,
        image: &Path,
    ) -> Result<Machine> {
        let rootfs = image.join("rootfs.ext4");
        let seeds = image.join("seeds.img");
        for f in [&rootfs, &seeds] {
            if !f.is_file() {
                bail!("the node image {} has no {}", image.display(), f.display());
            }
        }
        for sub in [
            "lower",
            "upper",
            "work",
            "root",
            "var-log",
            "containerd",
            "kubelet",
            "identity",
            "seeds",
        ] {
            std::fs::create_dir_all(dir.join(sub))
                .with_context(|| format!("creating {}", dir.join(sub).display()))?;
        }
        let d = dir.display();
        let script = format!(
            "set -e; {enter}mount -o ro,loop {rootfs} {d}/lower; \
             mount -t overlay overlay -o lowerdir={d}/lower,upperdir={d}/upper,workdir={d}/work {d}/root; \
             r={d}/root; mount -t tmpfs tmpfs $r/run; mount -t proc proc $r/proc; \
             mount -t sysfs sysfs $r/sys; mount --rbind /sys/fs/cgroup $r/sys/fs/cgroup; \
             mount --rbind /dev $r/dev; mount --bind {d}/var-log $r/var/log; \
             mkdir -p $r/var/lib/containerd $r/var/lib/kubelet $r/etc/socialweb $r/var/lib/socialweb/images; \
             mount --bind {d}/containerd $r/var/lib/containerd; mount --bind {d}/kubelet $r/var/lib/kubelet; \
             mount --bind {d}/identity $r/etc/socialweb; mount --bind {d}/seeds $r/var/lib/socialweb/images; \
             touch $r{disk}; mount --bind -o ro {seeds} $r{disk}; \
             cd $r; pivot_root . .; umount -l .; cd /; exec sleep 2147483647",
            enter = enter_cgroup_script(cgroup),
            rootfs = rootfs.display(),
            seeds = seeds.display(),
            disk = IMAGE_SEED_DISK,
        );
        Self::start_holder(netns, dir, cgroup, &script, true)
    }

    /// The machine a record describes, if its holder still runs.
    pub fn adopt(record: MachineRecord) -> Option<Machine> {
        (alive(record.holder_pid) && start_time(record.holder_pid) == Some(record.holder_started))
            .then_some(Machine { record })
    }

    /// A command run inside the machine's mount and network namespaces (not its cgroup:
    /// for one-off tools).
    pub fn command(&self, program: &Path) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--mount=/proc/{}/ns/mnt", self.record.holder_pid))
            .arg(format!("--net=/proc/{}/ns/net", self.record.holder_pid))
            .arg("--")
            .arg(program);
        cmd
    }

    /// A long-running command of the machine's own (its agent): inside its namespaces and
    /// its cgroup, in a session of its own, so it outlives whoever started it and dies with
    /// the machine.
    pub fn daemon(&self, program: &Path) -> Command {
        let mut cmd = self.command(Path::new("sh"));
        cmd.arg("-c")
            .arg(format!(
                "{}exec setsid \"$0\" \"$@\"",
                enter_cgroup_script(&self.record.cgroup)
            ))
            .arg(program);
        cmd
    }

    /// The scratch directory (host path).
    pub fn dir(&self) -> &Path {
        &self.record.dir
    }

    /// Where the machine's `/var/lib/<rel>` is on the host.
    pub fn var_lib(&self, rel: &str) -> PathBuf {
        self.record.dir.join("var-lib").join(rel)
    }

    /// Where the machine's `/var/log/<rel>` is on the host.
    pub fn var_log(&self, rel: &str) -> PathBuf {
        self.record.dir.join("var-log").join(rel)
    }

    /// Where the machine's `/etc/<rel>` is on the host, once written there.
    pub fn etc(&self, rel: &str) -> PathBuf {
        self.record.dir.join("etc-up").join(rel)
    }

    /// Pids of the processes named `comm` in this machine (its mount namespace).
    pub fn pids_of(&self, comm: &str) -> Vec<u32> {
        let Ok(target) =
            std::fs::metadata(format!("/proc/{}/ns/mnt", self.record.holder_pid)).map(|m| m.ino())
        else {
            return Vec::new();
        };
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok()?.file_name().to_string_lossy().parse::<u32>().ok())
            .filter(|p| {
                std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == comm)
                    && std::fs::metadata(format!("/proc/{p}/ns/mnt"))
                        .is_ok_and(|m| m.ino() == target)
                    && alive(*p)
            })
            .collect()
    }

    /// Kills everything in the machine: its containers (the cgroup tree), every process in
    /// its mount namespace, the holder. The scratch directory stays (the caller's).
    pub fn destroy(&self) {
        destroy_cgroup(&self.record.cgroup);
        if alive(self.record.holder_pid)
            && start_time(self.record.holder_pid) == Some(self.record.holder_started)
        {
            kill_mount_namespace(self.record.holder_pid);
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.record.holder_pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Writes a file only its owner may read (an identity document holds the join token and the
/// mesh key).
pub fn write_secret(path: &Path, contents: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    f.write_all(contents)
        .with_context(|| format!("writing {}", path.display()))
}
