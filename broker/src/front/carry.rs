//! A fleet host's front carrying an admitted request to where its cluster runs: this
//! host's apiserver, or the owner's link ([`super::link`]). Clusters move between hosts (a
//! host drained or lost, a cluster woken elsewhere), so a request that reached no apiserver
//! -- no connection, or a link that says it does not run the cluster -- is sent again to
//! where the cluster runs then, until [`wake::HOLD`]. To be sent again its body is read
//! first, whole (an apiserver takes at most 3 MiB); a response still streams.

use std::time::Duration;

use axum::body::{Body, Bytes};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use tokio::time::Instant;
use tracing::debug;

use super::hosts::Hosts;
use super::listener::InFlight;
use super::proxy::{self, status};
use super::wake::{self, Target};
use super::{Conn, Front};

/// The largest body carried (the apiserver's own limit is 3 MiB).
const MAX_BODY: usize = 4 << 20;
/// How soon a request that reached no apiserver is sent again.
const AGAIN_AFTER: Duration = Duration::from_millis(200);

/// The request again, from its parts and body.
fn again(parts: &Parts, body: &Bytes) -> Request<Body> {
    let mut r = Request::new(Body::from(body.clone()));
    *r.method_mut() = parts.method.clone();
    *r.uri_mut() = parts.uri.clone();
    *r.version_mut() = parts.version;
    *r.headers_mut() = parts.headers.clone();
    r
}

/// Forwards `req` for `cluster` (apiserver path `tail`) as `did` to where the cluster runs,
/// sending it again while it reaches no apiserver.
#[allow(clippy::too_many_arguments)]
pub(super) async fn carry(
    front: &Front,
    hosts: &Hosts,
    conn: &Conn,
    cluster: &str,
    tail: &str,
    did: &str,
    req: Request<Body>,
    mut busy: InFlight,
) -> Response<Body> {
    let (mut parts, body) = req.into_parts();
    let mut upgrade = parts.extensions.remove::<hyper::upgrade::OnUpgrade>();
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => {
            return status(
                StatusCode::PAYLOAD_TOO_LARGE,
                "RequestEntityTooLarge",
                &format!("the request's body (at most {MAX_BODY} bytes): {e}"),
            );
        }
    };
    let deadline = Instant::now() + wake::HOLD;
    let mut why = String::new();
    loop {
        if Instant::now() >= deadline {
            return status(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                &format!("cluster {cluster} was reached at no host of the fleet: {why}"),
            );
        }
        let up = match wake::target(front, cluster, false).await {
            Err(answer) => return answer,
            Ok(Target::Here(up)) => *up,
            Ok(Target::Host(host)) if host == hosts.me => {
                why = "this host holds its lease but does not serve it yet".into();
                tokio::time::sleep(AGAIN_AFTER).await;
                continue;
            }
            Ok(Target::Host(host)) => match hosts.upstream(&host, cluster).await {
                Ok(up) => up,
                Err(e) => {
                    why = format!("{e:#}");
                    tokio::time::sleep(AGAIN_AFTER).await;
                    continue;
                }
            },
        };
        let mut attempt = again(&parts, &body);
        if let Some(u) = upgrade.take() {
            attempt.extensions_mut().insert(u);
        }
        match proxy::forward(&up, attempt, tail, did, conn, busy).await {
            Ok(answer) => return answer,
            Err(unsent) => {
                debug!(cluster, at = %up.base, why = %unsent.why, "reached no apiserver; again");
                if Instant::now() >= deadline {
                    return unsent.answer();
                }
                why = unsent.why;
                busy = unsent.busy;
                upgrade = unsent.upgrade;
                tokio::time::sleep(AGAIN_AFTER).await;
            }
        }
    }
}
