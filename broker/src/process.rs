//! Child processes of the broker (control-plane components): started detached, in a process
//! group of their own, with a pidfile naming the process (pid and start time), so that a
//! broker that crashed is followed by one that adopts what is still running instead of
//! starting a second copy, and a tenant's API stays up through a broker crash.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

pub use crate::market::local::machine::{alive, start_time};

/// The process a pidfile names, if it is still that process (pid and start time).
pub fn adopt(pidfile: &Path) -> Option<(u32, u64)> {
    let text = std::fs::read_to_string(pidfile).ok()?;
    let mut parts = text.split_whitespace();
    let pid: u32 = parts.next()?.parse().ok()?;
    let started: u64 = parts.next()?.parse().ok()?;
    (start_time(pid) == Some(started)).then_some((pid, started))
}

/// SIGTERM, then SIGKILL after `grace`.
pub async fn terminate(pid: u32, grace: Duration) {
    let p = Pid::from_raw(pid as i32);
    if kill(p, Signal::SIGTERM).is_err() {
        return;
    }
    let deadline = Instant::now() + grace;
    while alive(pid) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if alive(pid) {
        let _ = kill(p, Signal::SIGKILL);
    }
}

/// Starts `program args` with its output appended to `log`, records it in `pidfile`. It is
/// not tied to the broker's life: a clean shutdown stops it, a crash leaves it for the next
/// broker to adopt ([`adopt`]).
pub fn spawn(
    program: &Path,
    args: &[std::ffi::OsString],
    log: &Path,
    pidfile: &Path,
) -> Result<tokio::process::Child> {
    if let Some(d) = log.parent() {
        std::fs::create_dir_all(d)?;
    }
    if let Some(d) = pidfile.parent() {
        std::fs::create_dir_all(d)?;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .kill_on_drop(false)
        .process_group(0);
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {}", program.display()))?;
    if let Some(pid) = child.id() {
        std::fs::write(pidfile, format!("{pid} {}\n", start_time(pid).unwrap_or(0)))
            .with_context(|| format!("writing {}", pidfile.display()))?;
    }
    Ok(child)
}

/// Whether a TCP port on `addr` can be bound now.
pub fn port_free(addr: std::net::IpAddr, port: u16) -> bool {
    std::net::TcpListener::bind((addr, port)).is_ok()
}
