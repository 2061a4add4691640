//! The node's long-running children -- containerd, the kubelet, kube-proxy -- kept running by
//! the agent: restarted with backoff when they exit, stopped in reverse start order on
//! shutdown.
//!
//! A child must never be started twice. Each one's pid and kernel start time are written to
//! `<run dir>/<name>.pid`; an agent starting after a crash stops the previous incarnation's
//! child before it starts its own (a second containerd would fail on its lock, a second
//! kubelet would fight the first). Children also get SIGTERM from the kernel when the agent
//! dies (`PR_SET_PDEATHSIG`), so after a SIGKILL there is usually nothing left to stop.
//! Each child runs in its own process group, so a Ctrl-C meant for the agent reaches the
//! agent only, which then stops the children in order.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result};
use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use socialweb_proc::{start_time, terminate};

use crate::backoff::Backoff;

/// What to run.
#[derive(Debug, Clone)]
pub struct ChildSpec {
    /// Short name: `containerd`, `kubelet`, `kube-proxy`; names the pidfile and the log.
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// Where its stdout and stderr go: a file (appended), or the agent's own stderr (the
    /// journal, under systemd).
    pub log: Option<PathBuf>,
}

/// A child as `status` shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChildStatus {
    pub name: String,
    pub pid: Option<u32>,
    pub running: bool,
    /// When the current process started (or the last one stopped), RFC 3339.
    pub since: String,
    pub restarts: u32,
    pub last_exit: Option<String>,
}

#[derive(Debug)]
struct Child {
    spec: ChildSpec,
    state: Mutex<ChildStatus>,
    stop: CancellationToken,
    finished: std::sync::atomic::AtomicBool,
}

/// The agent's children.
#[derive(Debug)]
pub struct Supervisor {
    run_dir: PathBuf,
    children: Mutex<Vec<Arc<Child>>>,
}

/// RFC 3339 in UTC, seconds precision.
pub fn timestamp(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

impl Supervisor {
    pub fn new(run_dir: &Path) -> Supervisor {
        Supervisor {
            run_dir: run_dir.to_path_buf(),
            children: Mutex::new(Vec::new()),
        }
    }

    fn pidfile(&self, name: &str) -> PathBuf {
        self.run_dir.join(format!("{name}.pid"))
    }

    /// Stops what a previous agent left running under `name` (pidfile, start time checked),
    /// and returns its pid if there was one.
    pub async fn stop_stale(&self, name: &str) -> Option<u32> {
        let path = self.pidfile(name);
        let text = std::fs::read_to_string(&path).ok()?;
        let _ = std::fs::remove_file(&path);
        let mut parts = text.split_whitespace();
        let pid: u32 = parts.next()?.parse().ok()?;
        let started: u64 = parts.next()?.parse().ok()?;
        if start_time(pid) != Some(started) {
            return None;
        }
        warn!(
            child = name,
            pid, "a previous agent's {name} still runs; stopping it before starting ours"
        );
        terminate(pid, Duration::from_secs(10)).await;
        Some(pid)
    }

    /// Whether `name` is already supervised.
    pub fn has(&self, name: &str) -> bool {
        self.children
            .lock()
            .expect("lock")
            .iter()
            .any(|c| c.spec.name == name)
    }

    /// Starts `spec` and keeps it running until [`Supervisor::stop_all`]. Starting a name that
    /// is already supervised does nothing (a step retried after its child started).
    pub async fn start(&self, spec: ChildSpec) -> Result<()> {
        if self.has(&spec.name) {
            return Ok(());
        }
        std::fs::create_dir_all(&self.run_dir)
            .with_context(|| format!("creating {}", self.run_dir.display()))?;
        self.stop_stale(&spec.name).await;
        let child = Arc::new(Child {
            state: Mutex::new(ChildStatus {
                name: spec.name.clone(),
                pid: None,
                running: false,
                since: timestamp(SystemTime::now()),
                restarts: 0,
                last_exit: None,
            }),
            spec,
            stop: CancellationToken::new(),
            finished: std::sync::atomic::AtomicBool::new(false),
        });
        // The first spawn happens here, so that a missing binary is this call's error.
        let pidfile = self.pidfile(&child.spec.name);
        let first = spawn(&child.spec, &pidfile)?;
        self.children.lock().expect("lock").push(child.clone());
        tokio::spawn(keep_running(child, first, pidfile));
        Ok(())
    }

    /// Every child's state, in start order.
    pub fn status(&self) -> Vec<ChildStatus> {
        self.children
            .lock()
            .expect("lock")
            .iter()
            .map(|c| c.state.lock().expect("lock").clone())
            .collect()
    }

    /// The pid of a running child.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.status()
            .into_iter()
            .find(|c| c.name == name && c.running)
            .and_then(|c| c.pid)
    }

    /// Stops one child (SIGTERM, SIGKILL after `grace`) and forgets it.
    pub async fn stop(&self, name: &str, grace: Duration) {
        let child = {
            let mut children = self.children.lock().expect("lock");
            let i = children.iter().position(|c| c.spec.name == name);
            i.map(|i| children.remove(i))
        };
        if let Some(c) = child {
            stop_child(&c, grace).await;
        }
    }

    /// Stops `name` and starts it again with the same command line (it reads files it read
    /// at its start: a new CA bundle, a new certificate). `Ok(false)` if it is not supervised.
    pub async fn restart(&self, name: &str, grace: Duration) -> Result<bool> {
        let spec = {
            let children = self.children.lock().expect("lock");
            children
                .iter()
                .find(|c| c.spec.name == name)
                .map(|c| c.spec.clone())
        };
        let Some(spec) = spec else {
            return Ok(false);
        };
        info!(child = name, "restarting {name}");
        self.stop(name, grace).await;
        self.start(spec).await?;
        Ok(true)
    }

    /// Every `every` until `stop`: each child's log (`--child-log-dir`) moved aside to
    /// `<log>.1` once over `max` bytes ([`socialweb_proc::log::rotate`]).
    pub async fn keep_logs(&self, max: u64, every: Duration, stop: CancellationToken) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stop.cancelled() => return,
            }
            let logs: Vec<PathBuf> = {
                let children = self.children.lock().expect("lock");
                children.iter().filter_map(|c| c.spec.log.clone()).collect()
            };
            for log in logs {
                match socialweb_proc::log::rotate(&log, max) {
                    Ok(true) => info!(log = %log.display(), "moved to .1 at {} MiB", max >> 20),
                    Ok(false) => {}
                    Err(e) => warn!("rotating {}: {e}", log.display()),
                }
            }
        }
    }

    /// Stops every child, the last started first.
    pub async fn stop_all(&self, grace: Duration) {
        let children: Vec<Arc<Child>> = std::mem::take(&mut *self.children.lock().expect("lock"));
        for c in children.iter().rev() {
            stop_child(c, grace).await;
        }
    }
}

async fn stop_child(c: &Child, grace: Duration) {
    let pid = c.state.lock().expect("lock").pid;
    c.stop.cancel();
    if let Some(pid) = pid {
        info!(child = %c.spec.name, pid, "stopping {}", c.spec.name);
        terminate(pid, grace).await;
    }
    // Wait for the keeper to reap it and remove its pidfile.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !c.finished.load(std::sync::atomic::Ordering::SeqCst) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn spawn(spec: &ChildSpec, pidfile: &Path) -> Result<tokio::process::Child> {
    let mut cmd = tokio::process::Command::new(&spec.program);
    cmd.args(&spec.args)
        .stdin(Stdio::null())
        .kill_on_drop(false)
        .process_group(0);
    match &spec.log {
        Some(path) => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
            }
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("opening {}", path.display()))?;
            cmd.stdout(file.try_clone()?).stderr(file);
        }
        None => {
            cmd.stdout(Stdio::inherit()).stderr(Stdio::inherit());
        }
    }
    // SAFETY: the closure runs in the child between fork and exec and only calls prctl(2),
    // which is async-signal-safe. The signal fires when the thread that forked exits; the
    // agent forks from its runtime's worker threads, which live as long as the agent.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(std::io::Error::from)
        });
    }
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {} ({})", spec.name, spec.program.display()))?;
    if let Some(pid) = child.id() {
        let started = start_time(pid).unwrap_or(0);
        std::fs::write(pidfile, format!("{pid} {started}\n"))
            .with_context(|| format!("writing {}", pidfile.display()))?;
        info!(child = %spec.name, pid, "{} started", spec.name);
    }
    Ok(child)
}

/// Waits for the child; restarts it with backoff until stopped.
async fn keep_running(c: Arc<Child>, first: tokio::process::Child, pidfile: PathBuf) {
    let name = c.spec.name.clone();
    let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
    let mut p = first;
    'life: loop {
        let started = Instant::now();
        {
            let mut s = c.state.lock().expect("lock");
            s.pid = p.id();
            s.running = true;
            s.since = timestamp(SystemTime::now());
        }
        let status = tokio::select! {
            st = p.wait() => st,
            _ = c.stop.cancelled() => p.wait().await,
        };
        let what = match status {
            Ok(s) => s.to_string(),
            Err(e) => format!("wait failed: {e}"),
        };
        {
            let mut s = c.state.lock().expect("lock");
            s.running = false;
            s.since = timestamp(SystemTime::now());
            s.last_exit = Some(what.clone());
        }
        if c.stop.is_cancelled() {
            info!(child = %name, "{name} stopped ({what})");
            break;
        }
        // A child that ran for a while before it died starts over with a short delay.
        if started.elapsed() > Duration::from_secs(60) {
            backoff.reset();
        }
        loop {
            let delay = backoff.next_delay();
            warn!(child = %name, "{name} exited ({what}); restarting in {delay:?}");
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = c.stop.cancelled() => break 'life,
            }
            match spawn(&c.spec, &pidfile) {
                Ok(next) => {
                    c.state.lock().expect("lock").restarts += 1;
                    p = next;
                    break;
                }
                Err(e) => {
                    warn!(child = %name, "restarting {name}: {e:#}");
                    c.state.lock().expect("lock").last_exit =
                        Some(format!("{what}; restarting failed: {e:#}"));
                }
            }
        }
    }
    let _ = std::fs::remove_file(&pidfile);
    c.finished.store(true, std::sync::atomic::Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_reads_past_a_command_name_with_spaces() {
        let me = std::process::id();
        assert!(start_time(me).is_some());
        assert!(socialweb_proc::alive(me));
    }

    #[tokio::test]
    async fn a_childs_log_past_its_size_is_moved_aside_while_it_writes_on() {
        let dir = std::env::temp_dir().join(format!("sw-keep-logs-{}", std::process::id()));
        let log = dir.join("logs/chatty.log");
        let children = Arc::new(Supervisor::new(&dir));
        // 200 bytes now, then one line a second after the rotation.
        let script = "head -c 200 /dev/zero; while true; do sleep 0.2; echo after; done";
        let spec = ChildSpec {
            name: "chatty".into(),
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            log: Some(log.clone()),
        };
        children.start(spec).await.unwrap();
        let stop = CancellationToken::new();
        let keeper = children.clone();
        let s = stop.clone();
        tokio::spawn(async move { keeper.keep_logs(100, Duration::from_millis(50), s).await });
        let aside = dir.join("logs/chatty.log.1");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !(aside.exists()
            && std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains("after"))
        {
            assert!(Instant::now() < deadline, "no rotation within 10 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(std::fs::metadata(&aside).unwrap().len() >= 200);
        assert!(
            std::fs::metadata(&log).unwrap().len() < 100,
            "emptied, then written on"
        );
        stop.cancel();
        children.stop_all(Duration::from_secs(2)).await;
        let _ = std::fs::remove_dir_all(dir);
    }
}
