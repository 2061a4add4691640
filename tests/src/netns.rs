//! Named network namespaces that belong to one test run and disappear with it.
//!
//! A namespace is created with `ip netns add` so that it has a name other tools understand
//! (`ip -n`, `ip netns exec`, `dig` run through `ip netns exec`), and removed when its handle
//! is dropped, which also happens while a panicking test unwinds. Every name starts with
//! [`PREFIX`] followed by the creating process id, so a later run can tell leftovers of a
//! killed run (their process is gone) from namespaces of a run still in progress, and sweep
//! only the former.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Once;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::sched::{CloneFlags, setns};

use crate::process::{Spawned, run_checked};
use crate::root::require_root;

pub use crate::runs::{PREFIX, owner_pid};

/// Where `ip netns` keeps its bind mounts.
pub const NETNS_DIR: &str = "/run/netns";

static SEQ: AtomicU32 = AtomicU32::new(0);
static SWEEP: Once = Once::new();

/// A name no namespace of any run has: [`PREFIX`], this process's id, a sequence number and
/// `role` (for people reading `ip netns list`), so parallel tests and parallel runs never
/// collide and a later run can sweep it once this process is gone. The first call in a
/// process sweeps leftovers of dead runs.
pub fn unique_name(role: &str) -> String {
    require_root();
    SWEEP.call_once(|| {
        if let Err(e) = sweep() {
            eprintln!("testbed: sweeping leftovers failed: {e:#}");
        }
        crate::tmp::sweep();
        crate::runs::sweep_cgroups();
    });
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let role: String = role
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(16)
        .collect();
    format!("{PREFIX}{}-{seq}-{role}", std::process::id())
}

/// A network namespace owned by this process. Dropping it kills every process inside and
/// deletes it (and with it every interface it holds).
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates a namespace named by [`unique_name`].
    pub fn new(role: &str) -> Result<Netns> {
        let name = unique_name(role);
        run_checked(Command::new("ip").args(["netns", "add", &name]))
            .with_context(|| format!("creating network namespace {name}"))?;
        let ns = Netns { name };
        // Loopback is down in a fresh namespace; nearly every test wants it.
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Takes ownership of a namespace another program created under a name from
    /// [`unique_name`] (the local provider's node networks): it goes when the handle does.
    pub fn adopt(name: &str) -> Result<Netns> {
        if !Path::new(NETNS_DIR).join(name).exists() {
            bail!("no network namespace {name} to adopt");
        }
        Ok(Netns {
            name: name.to_string(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The bind-mounted namespace file, for `setns` or for tools that take a path
    /// (a CNI plugin's `CNI_NETNS`).
    pub fn path(&self) -> PathBuf {
        Path::new(NETNS_DIR).join(&self.name)
    }

    /// Runs `ip -n <ns> <args>` and fails with its stderr when it fails.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let out = run_checked(Command::new("ip").arg("-n").arg(&self.name).args(args))
            .with_context(|| format!("ip -n {} {}", self.name, args.join(" ")))?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// A command that will run inside this namespace (through `ip netns exec`, which also
    /// bind-mounts `/etc/netns/<name>/*` over `/etc`, so a per-namespace resolv.conf works).
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }

    /// A command that runs `program` in the namespace's network only, in the caller's mount
    /// namespace: `ip netns exec` remounts `/sys`, which drops the cgroup hierarchies under
    /// `/sys/fs/cgroup` that a machine maker (the local provider) must hand on to its nodes.
    pub fn command_keeping_mounts(&self, program: &str) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", self.path().display()))
            .arg("--")
            .arg(program);
        c
    }

    /// Runs a program inside the namespace to completion and returns its output, whatever its
    /// exit status.
    pub fn output(&self, program: &str, args: &[&str]) -> Result<Output> {
        self.command(program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {program} in {}", self.name))
    }

    /// Runs a program inside the namespace and fails, with its stderr, unless it exits 0.
    pub fn exec(&self, program: &str, args: &[&str]) -> Result<String> {
        let out = run_checked(self.command(program).args(args))
            .with_context(|| format!("{program} {} in {}", args.join(" "), self.name))?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs a program inside the namespace with `input` on its stdin and fails, with its
    /// stderr, unless it exits 0 (`nft -f -`, `wg pubkey`).
    pub fn exec_with_stdin(&self, program: &str, args: &[&str], input: &[u8]) -> Result<String> {
        use std::io::Write;
        let mut child = self
            .command(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {program} in {}", self.name))?;
        // Dropped at the end of the statement: the program sees end of input.
        child
            .stdin
            .take()
            .context("piped stdin")?
            .write_all(input)?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "{program} {} in {} exited with {}: {}",
                args.join(" "),
                self.name,
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Starts a long-running program inside the namespace; it is killed when the returned
    /// handle is dropped, and in any case when the namespace is.
    pub fn spawn(&self, program: &str, args: &[&str]) -> Result<Spawned> {
        let mut cmd = self.command(program);
        cmd.args(args);
        Spawned::start(cmd, &format!("{program} in {}", self.name))
    }

    /// Runs a closure on a thread that has entered this namespace. Sockets the closure opens
    /// live in the namespace. A panic inside the closure is resumed on the caller's thread.
    pub fn run<F, R>(&self, f: F) -> Result<R>
    where
        F: FnOnce() -> R + Send,
        R: Send,
    {
        let file = File::open(self.path()).with_context(|| format!("opening {:?}", self.path()))?;
        std::thread::scope(|s| {
            let handle = s.spawn(move || {
                setns(&file, CloneFlags::CLONE_NEWNET)
                    .map(|()| f())
                    .map_err(|e| anyhow::anyhow!("setns into {}: {e}", self.name))
            });
            match handle.join() {
                Ok(r) => r,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// Process ids currently inside the namespace.
    pub fn pids(&self) -> Vec<i32> {
        pids_in(&self.name)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(e) = remove(&self.name) {
            eprintln!("testbed: removing namespace {}: {e:#}", self.name);
        }
    }
}

fn pids_in(name: &str) -> Vec<i32> {
    Command::new("ip")
        .args(["netns", "pids", name])
        .stderr(Stdio::null())
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Kills whatever runs inside the namespace, then deletes it.
pub fn remove(name: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let pids = pids_in(name);
        if pids.is_empty() {
            break;
        }
        for pid in &pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        if Instant::now() > deadline {
            bail!("processes {pids:?} survive SIGKILL in {name}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    run_checked(Command::new("ip").args(["netns", "del", name]))?;
    Ok(())
}

/// Names of every harness namespace that exists now, from any run.
pub fn list() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(NETNS_DIR) else {
        return Vec::new();
    };
    let mut names: Vec<String> = dir
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(PREFIX))
        .collect();
    names.sort();
    names
}

/// Removes harness namespaces whose creating process is gone (a run that was killed before its
/// handles were dropped). Namespaces of live runs are left alone, so runs can overlap.
/// Returns the names removed.
pub fn sweep() -> Result<Vec<String>> {
    let mut removed = Vec::new();
    for name in list() {
        let alive = owner_pid(&name)
            .map(|pid| Path::new(&format!("/proc/{pid}")).exists())
            .unwrap_or(false);
        if !alive {
            remove(&name).with_context(|| format!("sweeping {name}"))?;
            removed.push(name);
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn owner_pid_is_read_back_from_the_name() {
        assert_eq!(owner_pid("swt-4242-7-node-a"), Some(4242));
        assert_eq!(owner_pid("swt-x-7-node"), None);
        assert_eq!(owner_pid("other-4242"), None);
    }
}
