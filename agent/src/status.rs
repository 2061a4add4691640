//! The agent's bring-up as `socialweb-agent status` shows it: each step, its state, since when,
//! how many attempts, its last error; one log line per state change; and the readiness file
//! the node image's init waits for.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use socialweb_wire::guest::Event;

use crate::backoff::Backoff;
use crate::supervise::{ChildStatus, timestamp};

/// Where a step is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepState {
    /// Not started: an earlier step is not done yet.
    Pending,
    /// Being attempted (or waiting for something it needs, said in `detail`).
    Running,
    /// The last attempt failed; it is tried again after a delay.
    Retrying,
    Done,
}

/// One step.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Step {
    pub name: String,
    pub state: StepState,
    /// When the step entered its state, RFC 3339.
    pub since: String,
    pub attempts: u32,
    /// What the step did or is waiting for.
    pub detail: Option<String>,
    pub last_error: Option<String>,
}

/// The whole picture `status` prints.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AgentStatus {
    pub node: String,
    pub cluster: String,
    pub ready: bool,
    pub steps: Vec<Step>,
    pub children: Vec<ChildStatus>,
    /// The tunnel to the broker, when the identity names one.
    #[serde(default)]
    pub tunnel: Option<crate::tunnel::TunnelStatus>,
}

/// Steps of this agent, in bring-up order.
#[derive(Debug)]
pub struct Steps {
    steps: Mutex<Vec<Step>>,
    ready_file: Option<PathBuf>,
}

impl Steps {
    pub fn new(names: &[&'static str], ready_file: Option<PathBuf>) -> Steps {
        let now = timestamp(SystemTime::now());
        if let Some(f) = &ready_file {
            // A file left by an agent that was killed says nothing about this one.
            let _ = std::fs::remove_file(f);
        }
        Steps {
            steps: Mutex::new(
                names
                    .iter()
                    .map(|&name| Step {
                        name: name.to_string(),
                        state: StepState::Pending,
                        since: now.clone(),
                        attempts: 0,
                        detail: None,
                        last_error: None,
                    })
                    .collect(),
            ),
            ready_file,
        }
    }

    fn update(&self, name: &str, f: impl FnOnce(&mut Step)) {
        let mut steps = self.steps.lock().expect("lock");
        let Some(step) = steps.iter_mut().find(|s| s.name == name) else {
            return;
        };
        let before = step.state;
        f(step);
        if step.state != before {
            step.since = timestamp(SystemTime::now());
        }
        let all_done = steps.iter().all(|s| s.state == StepState::Done);
        drop(steps);
        if let Some(file) = &self.ready_file {
            if all_done && !file.exists() {
                if let Some(dir) = file.parent() {
                    let _ = std::fs::create_dir_all(dir);
                }
                match std::fs::write(file, format!("{}\n", timestamp(SystemTime::now()))) {
                    Ok(()) => info!(file = %file.display(), "every step done: node ready"),
                    Err(e) => warn!("writing the readiness file {}: {e}", file.display()),
                }
                crate::guest_port::report(&Event::Ready);
            } else if !all_done && file.exists() {
                let _ = std::fs::remove_file(file);
                warn!(file = %file.display(), "a step is no longer done: readiness file removed");
                crate::guest_port::report(&Event::NotReady(name.to_string()));
            }
        }
    }

    /// The step is being attempted.
    pub fn running(&self, name: &str, detail: Option<String>) {
        self.update(name, |s| {
            if s.state != StepState::Running {
                info!(step = name, "{name}: running{}", suffix(&detail));
            }
            s.state = StepState::Running;
            s.attempts += 1;
            if detail.is_some() {
                s.detail = detail;
            }
        });
    }

    /// Says what a running step is waiting for, without a log line per call.
    pub fn detail(&self, name: &str, detail: String) {
        self.update(name, |s| s.detail = Some(detail));
    }

    pub fn done(&self, name: &str, detail: Option<String>) {
        self.update(name, |s| {
            if s.state != StepState::Done {
                info!(step = name, "{name}: done{}", suffix(&detail));
            }
            s.state = StepState::Done;
            s.detail = detail;
            s.last_error = None;
        });
    }

    /// The step failed; it is retried after `retry_in`.
    pub fn failed(&self, name: &str, error: String, retry_in: Duration) {
        self.update(name, |s| {
            // One line per state change, and one more when the error itself changes.
            if s.state != StepState::Retrying || s.last_error.as_deref() != Some(&error) {
                warn!(step = name, "{name}: {error}; retrying in {retry_in:?}");
            }
            s.state = StepState::Retrying;
            s.last_error = Some(error);
        });
    }

    /// A done step that no longer holds (the pod network lost, say).
    pub fn regressed(&self, name: &str, error: String) {
        self.update(name, |s| {
            warn!(step = name, "{name}: no longer done: {error}");
            s.state = StepState::Retrying;
            s.last_error = Some(error);
        });
    }

    pub fn snapshot(&self) -> Vec<Step> {
        self.steps.lock().expect("lock").clone()
    }

    pub fn all_done(&self) -> bool {
        self.snapshot().iter().all(|s| s.state == StepState::Done)
    }

    /// Removes the readiness file (on shutdown).
    pub fn clear_ready(&self) {
        if let Some(f) = &self.ready_file {
            let _ = std::fs::remove_file(f);
        }
    }

    /// Runs `attempt` until it succeeds, recording every attempt; waits `backoff` between
    /// failures. Returns the value of the first success.
    pub async fn until_done<T, F, Fut>(
        &self,
        name: &'static str,
        mut backoff: Backoff,
        mut attempt: F,
    ) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<(T, Option<String>)>>,
    {
        loop {
            self.running(name, None);
            match attempt().await {
                Ok((v, detail)) => {
                    self.done(name, detail);
                    return v;
                }
                Err(e) => {
                    let delay = backoff.next_delay();
                    self.failed(name, format!("{e:#}"), delay);
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }
}

fn suffix(detail: &Option<String>) -> String {
    detail
        .as_ref()
        .map(|d| format!(": {d}"))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readiness_file_follows_the_steps() {
        let dir = std::env::temp_dir().join(format!("sw-status-{}", std::process::id()));
        let file = dir.join("ready");
        let steps = Steps::new(&["a", "b"], Some(file.clone()));
        steps.done("a", None);
        assert!(!file.exists());
        steps.failed("b", "nope".into(), Duration::from_secs(1));
        assert_eq!(steps.snapshot()[1].state, StepState::Retrying);
        steps.done("b", Some("fine".into()));
        assert!(file.exists());
        assert_eq!(steps.snapshot()[1].last_error, None);
        steps.regressed("a", "lost".into());
        assert!(!file.exists());
        let _ = std::fs::remove_dir_all(dir);
    }
}
