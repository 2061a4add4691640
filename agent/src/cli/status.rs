//! `socialweb-agent status`.

use std::fmt::Write;

use super::serde_name;
use crate::status::AgentStatus;

/// The bring-up's steps, then the children.
pub fn text(s: &AgentStatus) -> String {
    let mut out = String::new();
    let ready = if s.ready { "ready" } else { "not ready" };
    let _ = writeln!(out, "node {} of cluster {}: {ready}", s.node, s.cluster);
    let _ = writeln!(
        out,
        "{:<16} {:<9} {:<21} {:>4}  DETAIL / LAST ERROR",
        "STEP", "STATE", "SINCE", "TRY"
    );
    for st in &s.steps {
        let detail = match (&st.last_error, &st.detail) {
            (Some(e), _) => format!("error: {e}"),
            (None, Some(d)) => d.clone(),
            (None, None) => "-".into(),
        };
        let state = serde_name(&st.state);
        let _ = writeln!(
            out,
            "{:<16} {:<9} {:<21} {:>4}  {detail}",
            st.name, state, st.since, st.attempts
        );
    }
    if s.children.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "\n{:<12} {:>8} {:<8} {:<21} {:>8}  LAST EXIT",
        "CHILD", "PID", "STATE", "SINCE", "RESTARTS"
    );
    for ch in &s.children {
        let pid = ch.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into());
        let state = if ch.running { "running" } else { "stopped" };
        let _ = writeln!(
            out,
            "{:<12} {:>8} {:<8} {:<21} {:>8}  {}",
            ch.name,
            pid,
            state,
            ch.since,
            ch.restarts,
            ch.last_exit.as_deref().unwrap_or("-")
        );
    }
    out
}
