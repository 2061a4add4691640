//! Processes that outlive who started them. A pid alone can be reused once its process is
//! gone; a pid with its kernel start time cannot, so that pair is what the broker (its
//! control-plane components) and the provider (its machines and their agents) write down
//! and, after a restart, adopt only if it still names the same process. And their state
//! on disk, owner-only ([`owner_only`]) and removed where it may be gone already
//! ([`gone`]); and the byte plumbing of the tunnel's streams that
//! the agent and the broker share ([`stream`]).

pub mod cgroup;
pub mod gone;
pub mod log;
pub mod owner_only;
pub mod stream;

use std::path::Path;

/// Kernel start time of `pid` (clock ticks since boot), to tell a process from a later one
/// with the same pid.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_start_time(&stat)
}

/// The start time field of a `/proc/<pid>/stat` line. The command name (field 2) is in
/// parentheses and may hold spaces and parentheses itself, so fields are counted from the
/// last `)`.
pub fn parse_start_time(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

/// Whether `pid` runs (and is not a zombie).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rfind(')')
                .and_then(|i| s[i + 1..].split_whitespace().next().map(|st| st != "Z"))
        })
        .unwrap_or(false)
}

/// Stops `pid` with SIGTERM, then SIGKILL if it still runs after `grace` (the broker's
/// control-plane components and the agent's children alike).
pub async fn terminate(pid: u32, grace: std::time::Duration) {
    use nix::sys::signal::{Signal, kill};
    let p = nix::unistd::Pid::from_raw(pid as i32);
    if kill(p, Signal::SIGTERM).is_err() {
        return;
    }
    let deadline = std::time::Instant::now() + grace;
    while alive(pid) && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    if alive(pid) {
        let _ = kill(p, Signal::SIGKILL);
    }
}

/// Whether `(pid, started)` still names a running process.
pub fn same(pid: u32, started: u64) -> bool {
    alive(pid) && start_time(pid) == Some(started)
}

/// The text a pidfile holds for `pid`: `<pid> <start time>`.
pub fn pidfile_text(pid: u32) -> String {
    format!("{pid} {}\n", start_time(pid).unwrap_or(0))
}

/// The process a pidfile names, if it is still that process (pid and start time).
pub fn adopt(pidfile: &Path) -> Option<(u32, u64)> {
    let text = std::fs::read_to_string(pidfile).ok()?;
    let mut parts = text.split_whitespace();
    let pid: u32 = parts.next()?.parse().ok()?;
    let started: u64 = parts.next()?.parse().ok()?;
    (start_time(pid) == Some(started)).then_some((pid, started))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_name_with_spaces_and_parentheses_does_not_shift_the_fields() {
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 123456 1000 10";
        assert_eq!(parse_start_time(stat), Some(123456));
        assert_eq!(parse_start_time("garbage"), None);
    }

    #[test]
    fn this_process_is_itself_and_a_pidfile_naming_it_is_adopted() {
        let me = std::process::id();
        let started = start_time(me).expect("our own start time");
        assert!(same(me, started));
        assert!(
            !same(me, started + 1),
            "a later process with our pid is not us"
        );
        let dir = std::env::temp_dir().join(format!("sw-proc-{me}"));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("x.pid");
        std::fs::write(&f, pidfile_text(me)).unwrap();
        assert_eq!(adopt(&f), Some((me, started)));
        std::fs::write(&f, format!("{me} {}\n", started + 1)).unwrap();
        assert_eq!(adopt(&f), None);
        let _ = std::fs::remove_dir_all(dir);
    }
}
