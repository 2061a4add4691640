//! Child processes of the broker (control-plane components): started detached, in a process
//! group of their own, with a pidfile naming the process (pid and start time, as
//! `socialweb-proc` writes them), so that a broker that crashed is followed by one that
//! adopts what is still running instead of starting a second copy, and a tenant's API stays
//! up through a broker crash.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

pub use socialweb_proc::{adopt, alive, start_time};

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

/// The most a component's log holds before [`rotate`] moves it aside (and the one before
/// it, `<log>.1`, holds as much): a component's logs take at most twice this.
pub const LOG_MAX_BYTES: u64 = 16 * 1024 * 1024;

/// Moves `log` to `<log>.1` (replacing the one before) and empties it, if it holds more than
/// `max` bytes; whether it did. Copied and truncated, not renamed: the component keeps its
/// descriptor, opened with `O_APPEND` ([`spawn`]), so its next line lands at the start of the
/// emptied file. A line written between the copy and the truncation is lost, as with
/// logrotate's `copytruncate`.
pub fn rotate(log: &Path, max: u64) -> std::io::Result<bool> {
    let len = match std::fs::metadata(log) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    if len <= max {
        return Ok(false);
    }
    let mut old = log.as_os_str().to_owned();
    old.push(".1");
    std::fs::copy(log, &old)?;
    std::fs::OpenOptions::new()
        .write(true)
        .open(log)?
        .set_len(0)?;
    Ok(true)
}

/// Whether a TCP port on `addr` can be bound now.
pub fn port_free(addr: std::net::IpAddr, port: u16) -> bool {
    std::net::TcpListener::bind((addr, port)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_log_over_its_size_is_moved_aside_and_its_writer_starts_it_again() {
        let dir = std::env::temp_dir().join(format!("rotate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("apiserver.log");
        // The component's descriptor, as spawn opens it.
        let mut writer = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        writer.write_all(&[b'a'; 100]).unwrap();
        assert!(!rotate(&log, 100).unwrap(), "at the limit, kept");
        writer.write_all(b"b").unwrap();
        assert!(rotate(&log, 100).unwrap());
        assert_eq!(std::fs::metadata(&log).unwrap().len(), 0);
        assert_eq!(
            std::fs::read(dir.join("apiserver.log.1")).unwrap().len(),
            101
        );
        writer.write_all(b"next line\n").unwrap();
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            "next line\n",
            "no hole where the old bytes were"
        );
        assert!(!rotate(&dir.join("absent.log"), 1).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
