//! `socialweb-agent run`: the agent's life on a node, as the one process the node's init
//! starts, and the place it is put together. It reads the identity (refusing a bad one),
//! builds the books every step shares, serves the control socket, runs the bring-up
//! ([`crate::bringup`]) until a signal or an error no retry can fix, then takes away what the
//! bring-up installed, newest first ([`Installed`]).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use socialweb_wire::NodeIdentity;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use crate::bringup::{self, Ctx, JOIN_STEPS, STATIC_STEPS};
use crate::config::AgentConfig;
use crate::ctl::handler::{Handler, Published};
use crate::installed::Installed;
use crate::status::Steps;
use crate::supervise::Supervisor;

/// Reads and validates the identity document.
pub fn read_identity(path: &Path) -> Result<NodeIdentity> {
    let bytes = std::fs::read(path)
        .with_context(|| format!("reading the identity document {}", path.display()))?;
    NodeIdentity::from_json(&bytes).map_err(|e| anyhow!("{}: {e}", path.display()))
}

/// Runs the agent until SIGTERM or Ctrl-C (`Ok`) or an error no retry can fix.
pub async fn run(config: AgentConfig) -> Result<()> {
    let id = read_identity(&config.identity)?;
    info!(node = %id.node, cluster = %id.cluster, "identity read");
    crate::guest_port::report_started(&id.node);
    let m = &config.machine;
    let names = if config.joins() {
        JOIN_STEPS
    } else {
        STATIC_STEPS
    };
    let cx = Arc::new(Ctx {
        steps: Arc::new(Steps::new(names, Some(m.ready_file()))),
        children: Arc::new(Supervisor::new(&m.run_dir)),
        installed: Installed::default(),
        published: Arc::new(Published::default()),
        id,
        config,
    });
    let handler = Handler {
        node: cx.id.node.clone(),
        cluster: cx.id.cluster.clone(),
        dns_enabled: cx.config.dns.listen().is_some(),
        steps: cx.steps.clone(),
        children: cx.children.clone(),
        published: cx.published.clone(),
    };
    let socket = &cx.config.ctl.socket;
    let _ctl = crate::ctl::server::serve(socket, Arc::new(handler))?;
    info!(socket = %socket.display(), "control socket ready");

    let stop = CancellationToken::new();
    let children = cx.children.clone();
    let (max, every) = (socialweb_proc::log::LOG_MAX_BYTES, Duration::from_secs(60));
    let logs_stop = stop.clone();
    tokio::spawn(async move { children.keep_logs(max, every, logs_stop).await });
    let mut term = signal(SignalKind::terminate())?;
    let result = tokio::select! {
        r = bringup::bring_up(cx.clone(), stop.clone()) => r,
        _ = tokio::signal::ctrl_c() => Ok(()),
        _ = term.recv() => Ok(()),
    };
    stop.cancel();
    if let Err(e) = &result {
        error!("{e:#}");
    }
    info!("shutting down");
    cx.steps.clear_ready();
    cx.installed.undo_all().await;
    // Every child is recorded as it starts, so none should be left; one that is (a step
    // that forgot to record) is stopped all the same.
    cx.children.stop_all(bringup::join::CHILD_GRACE).await;
    info!("stopped");
    result
}
