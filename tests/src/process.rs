//! Child processes that do not outlive the test that started them.

use std::io::Read;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// Runs a command to completion; an exit status other than 0 is an error carrying stderr.
pub fn run_checked(cmd: &mut Command) -> Result<Output> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("starting {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!(
            "{:?} exited with {}: {}",
            cmd,
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out)
}

/// A running child, killed (SIGKILL) and reaped when dropped.
#[derive(Debug)]
pub struct Spawned {
    child: Option<Child>,
    what: String,
}

impl Spawned {
    /// Starts `cmd` with stdout and stderr captured (read them with [`Spawned::finish`]).
    pub fn start(mut cmd: Command, what: &str) -> Result<Spawned> {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {what}"))?;
        Ok(Spawned {
            child: Some(child),
            what: what.to_string(),
        })
    }

    /// Starts `cmd` with stdout and stderr appended to `log` (for chatty, long-running
    /// programs, whose pipes nobody would drain).
    pub fn start_logged(mut cmd: Command, what: &str, log: &std::path::Path) -> Result<Spawned> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("starting {what}"))?;
        Ok(Spawned {
            child: Some(child),
            what: what.to_string(),
        })
    }

    /// A placeholder that runs nothing (for fields filled in later).
    pub fn none(what: &str) -> Spawned {
        Spawned {
            child: None,
            what: what.to_string(),
        }
    }

    /// Takes charge of a child started elsewhere.
    pub fn from_child(child: Child, what: &str) -> Spawned {
        Spawned {
            child: Some(child),
            what: what.to_string(),
        }
    }

    pub fn id(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// The exit status if the process has exited, `None` while it runs.
    pub fn try_status(&mut self) -> Result<Option<std::process::ExitStatus>> {
        match self.child.as_mut() {
            Some(c) => Ok(c.try_wait()?),
            None => bail!("{} was never started", self.what),
        }
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// Waits up to `timeout` for the process to exit by itself and returns its output;
    /// kills it if it does not.
    pub fn finish(mut self, timeout: Duration) -> Result<Output> {
        let mut child = self.child.take().expect("child present until finished");
        let deadline = Instant::now() + timeout;
        while child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let out = child.wait_with_output()?;
                bail!(
                    "{} did not exit within {timeout:?}; stderr: {}",
                    self.what,
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(child.wait_with_output()?)
    }

    /// Asks the process to stop (SIGTERM) and waits up to `timeout` for it to exit; kills it
    /// and fails if it does not. The handle stays, empty.
    pub fn stop(&mut self, timeout: Duration) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            bail!("{} was never started", self.what);
        };
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + timeout;
        while child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("{} did not stop within {timeout:?} of SIGTERM", self.what);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Kills the process (SIGKILL) and reaps it; the handle stays, empty.
    pub fn kill_now(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the process and returns what it wrote to stderr (for diagnostics).
    pub fn kill(mut self) -> String {
        self.kill_inner()
    }

    fn kill_inner(&mut self) -> String {
        let Some(mut child) = self.child.take() else {
            return String::new();
        };
        let _ = child.kill();
        let _ = child.wait();
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        err
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        self.kill_inner();
    }
}
