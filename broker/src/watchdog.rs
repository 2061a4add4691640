//! The lease watchdog (issue 61, docs/operations.md, "A fleet's failure modes"): a process of
//! its own beside a fleet host's broker that kills a cluster's control plane when the
//! broker's lease deadline for it has passed. The broker kills its control plane itself when
//! it cannot renew in time (`cluster::ownership`), but only while it runs: a broker that is
//! frozen (SIGSTOP, a host under swap, a debugger) renews nothing and kills nothing, while
//! its apiserver, controller-manager and scheduler go on beside the ones the next owner
//! starts. The watchdog is not scheduled by the broker's runtime and is not in its process
//! group, so it acts while the broker cannot.
//!
//! The contract is one file per owned cluster, `<cluster>/run/lease-deadline`: the deadline
//! on the host's monotonic clock (`CLOCK_MONOTONIC`, ms, shared by every process of the host
//! and never stepped), which the owner rewrites after every renewal and removes once its
//! control plane is down. Past it, the watchdog SIGKILLs the process group of every component
//! its pidfiles name (checked by start time) -- before another host may claim the lease,
//! since the deadline is the owner's `fence_after`, shorter than the lease's TTL.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tracing::{info, warn};

/// The deadline's file in a cluster's directory.
pub const DEADLINE_FILE: &str = "run/lease-deadline";

/// How often the watchdog looks.
const EVERY: Duration = Duration::from_millis(200);

/// The host's monotonic clock now, in ms.
fn monotonic_ms() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC");
    u64::try_from(t.tv_sec()).unwrap_or(0) * 1000
        + u64::try_from(t.tv_nsec()).unwrap_or(0) / 1_000_000
}

/// Writes `deadline` (this process's monotonic instant) to `file`, atomically.
pub fn write_deadline(file: &Path, deadline: tokio::time::Instant) -> Result<()> {
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    let at = monotonic_ms() + u64::try_from(left.as_millis()).unwrap_or(u64::MAX / 2);
    if let Some(d) = file.parent() {
        std::fs::create_dir_all(d)?;
    }
    socialweb_proc::owner_only::write_atomic_mode(file, format!("{at}\n").as_bytes(), 0o600)
        .with_context(|| format!("writing {}", file.display()))
}

/// Removes `file`: its cluster's control plane is down, nothing to watch.
pub fn clear(file: &Path) {
    if let Err(e) = std::fs::remove_file(file)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        warn!("removing {}: {e}", file.display());
    }
}

/// Whether a deadline file's `text` says the deadline has passed at `now` (monotonic ms).
/// A file that does not parse has passed: a control plane nobody can say is covered by a
/// live lease must not run.
pub fn overdue(text: &str, now: u64) -> bool {
    text.trim().parse::<u64>().map_or(true, |at| now > at)
}

/// Runs the watchdog over `clusters` (the state directory's `clusters/`) until its parent,
/// the broker, is gone.
pub fn run(clusters: &Path) -> Result<()> {
    let parent = nix::unistd::getppid();
    info!(clusters = %clusters.display(), "the lease watchdog watches this host's control planes");
    // The clusters already killed for a deadline: told once, killed again if they come back.
    let mut fired: std::collections::HashSet<PathBuf> = Default::default();
    while nix::unistd::getppid() == parent {
        let now = monotonic_ms();
        let dirs = std::fs::read_dir(clusters).map(|d| d.flatten().map(|e| e.path()).collect());
        for dir in dirs.unwrap_or_else(|_| Vec::new()) {
            let Ok(text) = std::fs::read_to_string(dir.join(DEADLINE_FILE)) else {
                fired.remove(&dir);
                continue;
            };
            if !overdue(&text, now) {
                fired.remove(&dir);
                continue;
            }
            let killed = kill_components(&dir);
            if !killed.is_empty() || fired.insert(dir.clone()) {
                warn!(cluster_dir = %dir.display(), ?killed,
                      "the broker's lease deadline passed without a renewal (the broker frozen?): its control plane is killed");
            }
        }
        std::thread::sleep(EVERY);
    }
    info!("the broker is gone: the lease watchdog stops");
    Ok(())
}

/// SIGKILLs the process group of each component a pidfile in `dir` names; the names of
/// those killed.
fn kill_components(dir: &Path) -> Vec<&'static str> {
    let mut killed = Vec::new();
    for name in crate::control_plane::runner::COMPONENTS {
        let pidfile = dir.join("run").join(format!("{name}.pid"));
        if let Some((pid, _)) = crate::process::adopt(&pidfile) {
            let pid = Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX));
            match killpg(pid, Signal::SIGKILL) {
                Ok(()) => killed.push(name),
                Err(e) => warn!(component = name, %pid, "killing: {e}"),
            }
        }
    }
    killed
}

/// Starts the watchdog for `clusters` beside this broker: the same program, tied to this
/// process's life (util-linux's setpriv sets the parent-death signal), in a process group of
/// its own.
pub fn spawn(clusters: &Path) -> Result<tokio::process::Child> {
    let exe = std::env::current_exe().context("the broker's own program")?;
    tokio::process::Command::new("setpriv")
        .arg("--pdeathsig")
        .arg("KILL")
        .arg("--")
        .arg(exe)
        .arg("lease-watchdog")
        .arg("--clusters")
        .arg(clusters)
        .env_remove("NOTIFY_SOCKET")
        .stdin(std::process::Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .context("starting the lease watchdog (setpriv, util-linux)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_passes_after_its_time_and_an_unreadable_one_at_once() {
        assert!(!overdue("1000\n", 999));
        assert!(!overdue("1000", 1000));
        assert!(overdue("1000\n", 1001));
        assert!(overdue("", 0));
        assert!(overdue("soon", 0));
        assert!(overdue("-5", 0));
    }

    #[tokio::test]
    async fn a_written_deadline_is_the_monotonic_clock_plus_what_is_left() {
        let dir = std::env::temp_dir().join(format!("sw-watchdog-{}", std::process::id()));
        let file = dir.join(DEADLINE_FILE);
        let before = monotonic_ms();
        write_deadline(&file, tokio::time::Instant::now() + Duration::from_secs(7)).unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(!overdue(&text, before + 6_900), "{text}");
        assert!(overdue(&text, monotonic_ms() + 7_001), "{text}");
        clear(&file);
        assert!(!file.exists());
        clear(&file);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
