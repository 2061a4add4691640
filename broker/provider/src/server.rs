//! The local provider's HTTP surface: the market protocol, version 1 (docs/market.md). It
//! listens on loopback only; the broker on the same host is its one client.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use tokio_util::sync::CancellationToken;

use super::{Provider, ProviderError};
use socialweb_market::{Accept, ErrorBody, ErrorDetail, LeaseList, PREFIX, RfpRequest};

impl IntoResponse for ProviderError {
    fn into_response(self) -> Response {
        let (status, code) = match &self {
            ProviderError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            ProviderError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            ProviderError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            ProviderError::Expired(_) => (StatusCode::GONE, "expired"),
            ProviderError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        (
            status,
            Json(ErrorBody {
                error: ErrorDetail {
                    code: code.into(),
                    message: self.to_string(),
                },
            }),
        )
            .into_response()
    }
}

/// A failpoint that makes the provider misbehave the ways real ones do: no answer for a
/// minute, or an answer that is not JSON.
async fn misbehave(call: &str) -> Option<Response> {
    let hang = (|| {
        fail::fail_point!("provider::hang", |_| true);
        false
    })();
    if hang {
        tracing::warn!("local provider: failpoint provider::hang on {call}");
        tokio::time::sleep(Duration::from_secs(60)).await;
    }
    let garbage = (|| {
        fail::fail_point!("provider::garbage", |_| true);
        false
    })();
    garbage.then(|| {
        tracing::warn!("local provider: failpoint provider::garbage on {call}");
        (StatusCode::OK, "<html>502 Bad Gateway</html>").into_response()
    })
}

async fn post_rfp(State(p): State<Provider>, body: axum::body::Bytes) -> Response {
    if let Some(r) = misbehave("POST /rfps").await {
        return r;
    }
    let req: RfpRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return ProviderError::BadRequest(format!("RFP: {e}")).into_response(),
    };
    match p.rfp(req) {
        Ok(r) => (StatusCode::CREATED, Json(r)).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn get_rfp(State(p): State<Provider>, Path(id): Path<String>) -> Response {
    if let Some(r) = misbehave("GET /rfps").await {
        return r;
    }
    match p.get_rfp(&id) {
        Some(r) => Json(r).into_response(),
        None => ProviderError::NotFound(format!("no RFP {id}")).into_response(),
    }
}

async fn accept(
    State(p): State<Provider>,
    Path(bid): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    if let Some(r) = misbehave("POST /bids/accept").await {
        return r;
    }
    let a: Accept = match serde_json::from_slice(&body) {
        Ok(a) => a,
        Err(e) => return ProviderError::BadRequest(format!("acceptance: {e}")).into_response(),
    };
    match p.accept(&bid, a) {
        Ok(l) => (StatusCode::CREATED, Json(l)).into_response(),
        Err(e) => e.into_response(),
    }
}

#[derive(Debug, serde::Deserialize)]
struct LeaseQuery {
    tag: Option<String>,
}

async fn list_leases(State(p): State<Provider>, Query(q): Query<LeaseQuery>) -> Response {
    let tag = q.tag.as_deref().and_then(|t| t.split_once('='));
    Json(LeaseList {
        leases: p.leases(tag),
    })
    .into_response()
}

async fn get_lease(State(p): State<Provider>, Path(id): Path<String>) -> Response {
    if let Some(r) = misbehave("GET /leases").await {
        return r;
    }
    match p.lease(&id) {
        Some(l) => Json(l).into_response(),
        None => ProviderError::NotFound(format!("no lease {id}")).into_response(),
    }
}

async fn release(State(p): State<Provider>, Path(id): Path<String>) -> Response {
    // Destroying a machine blocks (it waits for processes to die).
    match tokio::task::spawn_blocking(move || p.release(&id).ok_or(id)).await {
        Ok(Ok(l)) => Json(l).into_response(),
        Ok(Err(id)) => ProviderError::NotFound(format!("no lease {id}")).into_response(),
        Err(e) => ProviderError::Internal(e.to_string()).into_response(),
    }
}

/// Serves `p` on `addr` until `stop`; returns the bound address.
pub async fn serve(p: Provider, addr: SocketAddr, stop: CancellationToken) -> Result<SocketAddr> {
    let app = Router::new()
        .route(&format!("{PREFIX}/rfps"), post(post_rfp))
        .route(&format!("{PREFIX}/rfps/{{id}}"), get(get_rfp))
        .route(&format!("{PREFIX}/bids/{{id}}/accept"), post(accept))
        .route(&format!("{PREFIX}/leases"), get(list_leases))
        .route(
            &format!("{PREFIX}/leases/{{id}}"),
            get(get_lease).delete(release),
        )
        .with_state(p);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("local provider: binding {addr}"))?;
    let bound = listener.local_addr()?;
    tracing::info!(%bound, "local provider serving the market protocol");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
    });
    Ok(bound)
}
