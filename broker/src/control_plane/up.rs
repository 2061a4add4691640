//! Bringing a tenant control plane up until Pods can be created: its components started and
//! ready, the configuration nodes need to join applied (and whatever else the caller adds),
//! and the default ServiceAccount made (else the first `kubectl apply` of a Pod is refused).
//! Cancellation stops it at any point, with the components stopped.

use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::ServiceAccount;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::runner::{self, Running, Spec};

/// How long the components may take to be ready.
const READY_WITHIN: Duration = Duration::from_secs(180);
/// How long the controller-manager may take to make the default ServiceAccount.
const SERVICE_ACCOUNT_WITHIN: Duration = Duration::from_secs(60);

/// A control plane that is up.
pub struct Up {
    pub running: Running,
    /// The cluster's admin client.
    pub client: kube::Client,
}

impl std::fmt::Debug for Up {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Up")
            .field("running", &self.running)
            .finish_non_exhaustive()
    }
}

/// What a bring-up says as it goes.
pub trait Progress: Sync {
    fn step(&self, detail: &str);
    /// The apiserver answers (the other components may still be starting): requests held
    /// at the front can go on.
    fn apiserver_ready(&self, _files: &runner::Files) {}
    /// Whether the bring-up was cut short because this host lost the cluster (a fleet's
    /// lease): the components are then killed, not stopped with grace.
    fn fenced(&self) -> bool {
        false
    }
}

/// Ends a bring-up cut short: a fenced one at once, any other with grace.
async fn end(cp: Running, progress: &dyn Progress) {
    if progress.fenced() {
        cp.kill().await;
    } else {
        cp.stop().await;
    }
}

/// Brings `spec`'s control plane up with the `files` its [`Spec::prepare`] made, applying
/// the join configuration and `extra` manifests. `None` when `stop` was cancelled on the way
/// (the components are stopped again).
pub async fn bring_up(
    spec: Spec,
    files: super::runner::Files,
    extra: &[String],
    progress: &dyn Progress,
    stop: &CancellationToken,
) -> Result<Option<Up>> {
    let kube = spec.kube.clone();
    if let Some((server, database)) = spec.datastore.postgres() {
        let server = server.with_context(|| {
            format!(
                "cluster {} keeps its objects in PostgreSQL (database {database}), and \
                 clusters.postgres_url is not set",
                spec.cluster
            )
        })?;
        progress.step("its database");
        server.ensure(database).await?;
    }
    let mut cp = Running::start(spec, files)?;
    progress.step("control plane starting");
    let mut api = cp.api_ready.clone();
    tokio::select! {
        r = async { matches!(tokio::time::timeout(READY_WITHIN, api.wait_for(|r| *r)).await, Ok(Ok(_))) } => {
            if !r {
                let health = cp.health.borrow().clone();
                cp.stop().await;
                anyhow::bail!("the apiserver was not ready after {READY_WITHIN:?}: {health:?}");
            }
        }
        _ = stop.cancelled() => { end(cp, progress).await; return Ok(None); }
    }
    progress.apiserver_ready(&cp.files);
    tokio::select! {
        r = cp.ready(READY_WITHIN) => if let Err(e) = r { cp.stop().await; return Err(e); },
        _ = stop.cancelled() => { end(cp, progress).await; return Ok(None); }
    }
    let files = cp.files.clone();
    // What nodes need to join, and what the agent and kube-proxy read (docs/join.md).
    let mut manifests = vec![
        super::BOOTSTRAP_MANIFEST.to_string(),
        super::cluster_info(&files.node_url, &files.ca_pem).to_string(),
        super::AGENT_RBAC.to_string(),
    ];
    manifests.extend(extra.iter().cloned());
    for m in &manifests {
        if !apply_until_done(&kube, &files.admin_kubeconfig, m, stop).await {
            end(cp, progress).await;
            return Ok(None);
        }
    }
    let client = match crate::tenant::client(&files.admin_kubeconfig).await {
        Ok(c) => c,
        Err(e) => {
            cp.stop().await;
            return Err(e);
        }
    };
    if !default_service_account(&client, progress, stop).await {
        end(cp, progress).await;
        return Ok(None);
    }
    Ok(Some(Up {
        running: cp,
        client,
    }))
}

/// Applies `manifest`, retrying with backoff; `false` when stopped first.
async fn apply_until_done(
    kube: &std::path::Path,
    kubeconfig: &std::path::Path,
    manifest: &str,
    stop: &CancellationToken,
) -> bool {
    let mut delay = Duration::from_millis(500);
    loop {
        match runner::apply(kube, kubeconfig, manifest).await {
            Ok(()) => return true,
            Err(e) if !stop.is_cancelled() => {
                warn!("applying the join configuration: {e:#}; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(10));
            }
            Err(_) => return false,
        }
    }
}

/// Waits (a while, not forever) for the controller-manager's default ServiceAccount; `false`
/// when stopped first.
async fn default_service_account(
    client: &kube::Client,
    progress: &dyn Progress,
    stop: &CancellationToken,
) -> bool {
    let sas: kube::Api<ServiceAccount> = kube::Api::namespaced(client.clone(), "default");
    let deadline = tokio::time::Instant::now() + SERVICE_ACCOUNT_WITHIN;
    while !matches!(sas.get_opt("default").await, Ok(Some(_)))
        && tokio::time::Instant::now() < deadline
    {
        progress.step("waiting for the default ServiceAccount");
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            _ = stop.cancelled() => return false,
        }
    }
    true
}
