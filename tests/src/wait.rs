//! Waiting for what a test awaits, and the tail of a log to say why it did not come: the
//! harness's lowest helpers (re-exported as `testbed::k8s::{wait_for, tail_of}`).

use std::path::Path;

use anyhow::{Context, Result};

/// Polls `f` every 100 ms until it returns `Ok(Some(v))` or `timeout` passes; the error says
/// what was awaited and the last thing `f` said.
pub fn wait_for<T>(
    what: &str,
    timeout: std::time::Duration,
    mut f: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let deadline = std::time::Instant::now() + timeout;
    let mut last = String::from("nothing yet");
    loop {
        match f() {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last = format!("{e:#}"),
        }
        if std::time::Instant::now() > deadline {
            return Err(anyhow::anyhow!(
                "timed out after {timeout:?} waiting for {what}; last: {last}"
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// The last `lines` lines of a log file (for failure messages).
pub fn tail_of(path: &Path, lines: usize) -> String {
    tail(path, lines)
}

/// Reads a file of a component's log for an error message.
pub fn tail(path: &Path, lines: usize) -> String {
    std::fs::read_to_string(path)
        .map(|s| {
            let v: Vec<&str> = s.lines().collect();
            v[v.len().saturating_sub(lines)..].join("\n")
        })
        .with_context(|| format!("reading {}", path.display()))
        .unwrap_or_else(|e| format!("{e:#}"))
}
