//! Holding a request until its cluster's apiserver can take it (docs/hibernation.md): a
//! cluster being created, started with the broker, or hibernating has no apiserver yet, and
//! a request for it is held -- not refused -- while it comes up, then forwarded as if
//! nothing happened. A hibernating cluster is asked to wake; every request that arrives
//! meanwhile asks too, and the asks collapse into one wake. Only a wake that fails, or one
//! that takes longer than [`HOLD`], is answered: 503 with the reason and a `Retry-After`; so
//! is, at once, a request for a cluster this host cannot serve now (its life failed, the
//! store out of reach).

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

/// Where a request for a cluster goes.
#[derive(Debug)]
pub(super) enum Target {
    /// Its apiserver on this host.
    Here(Box<Upstream>),
    /// Host `.0` of the fleet runs it: to its link.
    Host(String),
}

/// A request come in at a fleet host's link ([`super::link`]) is for the cluster only if
/// this host runs it: otherwise it is answered at once as not here (the host that sent it
/// looks again where the cluster is), a start here is waited for.
pub(super) fn not_here(cluster: &str, why: &str) -> Response<Body> {
    let mut r = unavailable(&format!("cluster {cluster} is not run here: {why}"));
    r.headers_mut().insert(
        super::proxy::NOT_HERE,
        HeaderValue::from_str(why).unwrap_or(HeaderValue::from_static("not here")),
    );
    r
}

/// Where `cluster`'s requests go once it is up here or runs at another host (waking it if
/// it hibernates), or the answer to give. `at_link`: the request came from another host's
/// front, so only this host's apiserver will do.
pub(super) async fn target(
    front: &Front,
    cluster: &str,
    at_link: bool,
) -> Result<Target, Response<Body>> {
    // Subscribed before the first look: a change after it is never missed.
    let mut changes = front.changes.subscribe();
    let deadline = tokio::time::Instant::now() + HOLD;
    // The mount a wake was asked from: a failure told by a later one is this wake's.
    let mut asked_at: Option<Arc<Mount>> = None;
    let mut no_host = false;
    loop {
        let Some(m) = front.get(cluster) else {
            return Err(status(
                StatusCode::NOT_FOUND,
                "NotFound",
                &format!("cluster {cluster} is gone"),
            ));
        };
        match &m.state {
            MountState::Up(up) => return Ok(Target::Here(up.clone())),
            MountState::Starting => {}
            MountState::Elsewhere(_)
            | MountState::Hibernating
            | MountState::WakeFailed(_)
            | MountState::Unavailable(_)
                if at_link =>
            {
                return Err(not_here(cluster, "another host runs it, or none does"));
            }
            MountState::Unavailable(why) => {
                return Err(unavailable(&format!(
                    "cluster {cluster} cannot be served from this host now: {why}"
                )));
            }
            MountState::Elsewhere(Some(host)) => return Ok(Target::Host(host.clone())),
            MountState::Elsewhere(None) => no_host = true,
            MountState::WakeFailed(why)
                if asked_at.as_ref().is_some_and(|a| !Arc::ptr_eq(a, &m)) =>
            {
                return Err(unavailable(&format!(
                    "cluster {cluster} could not be woken: {why}"
                )));
            }
            MountState::Hibernating | MountState::WakeFailed(_) => {
                // A request already waiting for a wake it asked for waits on; a new one is
                // refused while the disk is low.
                if asked_at.is_none()
                    && let Some(why) = front.wake_refused()
                {
                    return Err(unavailable(&format!("cluster {cluster}: {why}")));
                }
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
            return Err(unavailable(&if no_host {
                format!(
                    "no host of the fleet takes cluster {cluster} now (each is drained or at \
                     fleet.max_awake); try again shortly"
                )
            } else {
                format!(
                    "cluster {cluster} is still starting after {}s; try again shortly",
                    HOLD.as_secs()
                )
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn front_with(state: MountState) -> Front {
        let front = Front::new(
            Arc::new(crate::access::records::Records::new(Vec::new())),
            "https://front.example:8443".into(),
            crate::metrics::Metrics::default(),
        );
        front.mount(Mount {
            cluster: "c".into(),
            account_hash: None,
            users: Default::default(),
            state,
        });
        front
    }

    /// A cluster this host cannot serve (its life failed: the store out of reach) is
    /// answered at once, 503 with why and a `Retry-After`, not held for [`HOLD`]; a request
    /// from another host's link is told it is not here.
    #[tokio::test(start_paused = true)]
    async fn a_cluster_this_host_cannot_serve_is_refused_at_once_with_why() {
        let front = front_with(MountState::Unavailable(
            "the store: connection refused (this host tries again in 4s)".into(),
        ));
        let t = tokio::time::Instant::now();
        let Err(r) = target(&front, "c", false).await else {
            panic!("served");
        };
        assert_eq!(t.elapsed(), Duration::ZERO, "not held");
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[http::header::RETRY_AFTER], "5");
        let body = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
        let body = String::from_utf8_lossy(&body);
        assert!(body.contains("connection refused"), "{body}");
        let Err(r) = target(&front, "c", true).await else {
            panic!("served at the link");
        };
        assert!(r.headers().contains_key(super::super::proxy::NOT_HERE));
        // A start is still waited for.
        let front = front_with(MountState::Starting);
        let held = tokio::time::timeout(Duration::from_secs(30), target(&front, "c", false)).await;
        assert!(held.is_err(), "a starting cluster's request is held");
    }
}
