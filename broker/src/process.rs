//! Child processes of the broker (control-plane components): started detached, in a process
//! group of their own, with a pidfile naming the process (pid and start time, as
//! `socialweb-proc` writes them), so that a broker that crashed is followed by one that
//! adopts what is still running instead of starting a second copy, and a tenant's API stays
//! up through a broker crash.

use std::path::Path;
use std::process::Stdio;

use anyhow::{Context, Result};

pub use socialweb_proc::{adopt, alive, start_time, terminate};

/// Starts `program args` with its output appended to `log`, records it in `pidfile`. It is
/// not tied to the broker's life: a clean shutdown stops it, a crash leaves it for the next
/// broker to adopt ([`adopt`]).
pub fn spawn(
    program: &Path,
    args: &[std::ffi::OsString],
    env: &[(&str, String)],
    log: &Path,
    pidfile: &Path,
) -> Result<tokio::process::Child> {
    for d in [log.parent(), pidfile.parent()].into_iter().flatten() {
        std::fs::create_dir_all(d)?;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        // Only the broker talks to systemd (`NotifyAccess=main`; etcd would try too).
        .env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .kill_on_drop(false)
        .process_group(0);
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {}", program.display()))?;
    if let Some(pid) = child.id() {
        std::fs::write(pidfile, socialweb_proc::pidfile_text(pid))
            .with_context(|| format!("writing {}", pidfile.display()))?;
    }
    Ok(child)
}

/// A component's log moved aside past its size ([`socialweb_proc::log`], shared with the
/// provider's and the agent's children).
pub use socialweb_proc::log::{LOG_MAX_BYTES, rotate};

/// Whether a TCP port on `addr` can be bound now.
pub fn port_free(addr: std::net::IpAddr, port: u16) -> bool {
    std::net::TcpListener::bind((addr, port)).is_ok()
}
