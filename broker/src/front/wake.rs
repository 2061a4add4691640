//! Holding a request until its cluster's apiserver can take it (docs/hibernation.md): a
//! cluster being created, started with the broker, or hibernating has no apiserver yet, and
//! a request for it is held -- not refused -- while it comes up, then forwarded as if
//! nothing happened. A hibernating cluster is asked to wake; every request that arrives
//! meanwhile asks too, and the asks collapse into one wake. Only a wake that fails, or one
//! that takes longer than [`HOLD`], is answered: 503 with the reason and a `Retry-After`.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{HeaderValue, Response, StatusCode};

use super::proxy::{Upstream, status};
use super::{Front, Mount, MountState};

/// The longest a request is held (a wake measures a few seconds; a first start with the
/// manifests applied, longer).
pub const HOLD: Duration = Duration::from_secs(90);
/// What a refused client is told to wait before it tries again.
const RETRY_AFTER_SECS: u64 = 5;

/// A 503 with `message` and a `Retry-After`.
fn unavailable(message: &str) -> Response<Body> {
    let mut r = status(
        StatusCode::SERVICE_UNAVAILABLE,
        "ServiceUnavailable",
        message,
    );
    r.headers_mut().insert(
        http::header::RETRY_AFTER,
        HeaderValue::from(RETRY_AFTER_SECS),
    );
    r
}

/// `cluster`'s apiserver once it is up (waking it if it hibernates), or the answer to give.
pub(super) async fn upstream(front: &Front, cluster: &str) -> Result<Upstream, Response<Body>> {
    // Subscribed before the first look: a change after it is never missed.
    let mut changes = front.changes.subscribe();
    let deadline = tokio::time::Instant::now() + HOLD;
    // The mount a wake was asked from: a failure told by a later one is this wake's.
    let mut asked_at: Option<Arc<Mount>> = None;
    let mut runs_on: Option<String> = None;
    loop {
        let Some(m) = front.get(cluster) else {
            return Err(status(
                StatusCode::NOT_FOUND,
                "NotFound",
                &format!("cluster {cluster} is gone"),
            ));
        };
        match &m.state {
            MountState::Up(up) => return Ok((**up).clone()),
            MountState::Starting => {}
            MountState::Elsewhere(host) => runs_on = Some(host.clone()),
            MountState::WakeFailed(why)
                if asked_at.as_ref().is_some_and(|a| !Arc::ptr_eq(a, &m)) =>
            {
                return Err(unavailable(&format!(
                    "cluster {cluster} could not be woken: {why}"
                )));
            }
            MountState::Hibernating | MountState::WakeFailed(_) => {
                if asked_at.is_none() {
                    tracing::debug!(cluster, "a request wakes the cluster");
                }
                front.wake(cluster);
                asked_at.get_or_insert(m.clone());
            }
        }
        if tokio::time::timeout_at(deadline, changes.changed())
            .await
            .is_err()
        {
            return Err(unavailable(&match runs_on {
                // Forwarding between the hosts of a fleet is not built yet (issue 40).
                Some(host) => format!(
                    "cluster {cluster} is run by broker host {host}; reach it through that host"
                ),
                None => format!(
                    "cluster {cluster} is still starting after {}s; try again shortly",
                    HOLD.as_secs()
                ),
            }));
        }
    }
}
