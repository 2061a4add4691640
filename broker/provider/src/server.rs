//! The local provider's HTTP surface: the market protocol, version 1 (docs/market.md), on
//! one of two transports: mutual TLS with pinned keys on a TCP address (a provider machine,
//! whose clients are the brokers its operator listed), or a Unix socket only its owner can
//! open (the broker's embedded provider; its one client is the broker process). The market
//! protocol is never served as plain HTTP on a TCP port; what is ([`Listen::Health`], a
//! provider machine's `metrics.listen`, loopback by default) is `/healthz`, `/readyz` and
//! `/metrics`, which touch no lease.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use tokio_util::sync::CancellationToken;

use super::{Client, Provider, ProviderError};
use socialweb_market::{Accept, ErrorBody, ErrorDetail, LeaseList, PREFIX, RfpRequest};

impl IntoResponse for ProviderError {
    fn into_response(self) -> Response {
        let (status, code) = match &self {
            ProviderError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            ProviderError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            ProviderError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            ProviderError::ImageNotHeld(_) => (StatusCode::UNPROCESSABLE_ENTITY, "image_not_held"),
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

async fn post_rfp(
    State(p): State<Provider>,
    Extension(client): Extension<Client>,
    body: axum::body::Bytes,
) -> Response {
    if let Some(r) = misbehave("POST /rfps").await {
        return r;
    }
    let req: RfpRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return ProviderError::BadRequest(format!("RFP: {e}")).into_response(),
    };
    match p.rfp(&client, req) {
        Ok(r) => (StatusCode::CREATED, Json(r)).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn get_rfp(
    State(p): State<Provider>,
    Extension(client): Extension<Client>,
    Path(id): Path<String>,
) -> Response {
    if let Some(r) = misbehave("GET /rfps").await {
        return r;
    }
    match p.get_rfp(&client, &id) {
        Some(r) => Json(r).into_response(),
        None => ProviderError::NotFound(format!("no RFP {id}")).into_response(),
    }
}

async fn accept(
    State(p): State<Provider>,
    Extension(client): Extension<Client>,
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
    match p.accept(&client, &bid, a) {
        Ok(l) => (StatusCode::CREATED, Json(l)).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn get_offer(State(p): State<Provider>) -> Response {
    if let Some(r) = misbehave("GET /offer").await {
        return r;
    }
    Json(p.offer_view()).into_response()
}

#[derive(Debug, serde::Deserialize)]
struct LeaseQuery {
    tag: Option<String>,
}

async fn list_leases(
    State(p): State<Provider>,
    Extension(client): Extension<Client>,
    Query(q): Query<LeaseQuery>,
) -> Response {
    let tag = q.tag.as_deref().and_then(|t| t.split_once('='));
    Json(LeaseList {
        leases: p.leases(&client, tag),
    })
    .into_response()
}

async fn get_lease(
    State(p): State<Provider>,
    Extension(client): Extension<Client>,
    Path(id): Path<String>,
) -> Response {
    if let Some(r) = misbehave("GET /leases").await {
        return r;
    }
    match p.lease(&client, &id) {
        Some(l) => Json(l).into_response(),
        None => ProviderError::NotFound(format!("no lease {id}")).into_response(),
    }
}

async fn release(
    State(p): State<Provider>,
    Extension(client): Extension<Client>,
    Path(id): Path<String>,
) -> Response {
    // Destroying a machine blocks (it waits for processes to die).
    match tokio::task::spawn_blocking(move || p.release(&client, &id).ok_or(id)).await {
        Ok(Ok(l)) => Json(l).into_response(),
        Ok(Err(id)) => ProviderError::NotFound(format!("no lease {id}")).into_response(),
        Err(e) => ProviderError::Internal(e.to_string()).into_response(),
    }
}

/// Where and how the provider serves.
#[derive(Debug, Clone)]
pub enum Listen {
    /// TCP, mutual TLS (`socialweb_market_tls::server_config`).
    Tls {
        addr: SocketAddr,
        tls: std::sync::Arc<rustls::ServerConfig>,
    },
    /// A Unix socket, mode 0600 in an owner-only directory.
    Unix(std::path::PathBuf),
    /// Plain HTTP on `addr`, for monitoring only: `/healthz` ([`Provider::alive`]),
    /// `/readyz` ([`Provider::ready`]), each plain text answered 200 or 503, and `/metrics`
    /// (`socialweb_provider_ready`, `_capacity`, `_leases{state}`).
    Health(SocketAddr),
}

fn router(p: Provider) -> Router {
    Router::new()
        .route(&format!("{PREFIX}/rfps"), post(post_rfp))
        .route(&format!("{PREFIX}/rfps/{{id}}"), get(get_rfp))
        .route(&format!("{PREFIX}/bids/{{id}}/accept"), post(accept))
        .route(&format!("{PREFIX}/leases"), get(list_leases))
        .route(&format!("{PREFIX}/offer"), get(get_offer))
        .route(
            &format!("{PREFIX}/leases/{{id}}"),
            get(get_lease).delete(release),
        )
        .layer(axum::extract::DefaultBodyLimit::max(256 * 1024))
        .with_state(p)
}

/// Serves `p` as `listen` says until `stop`; returns where (the bound address or the socket).
pub async fn serve(p: Provider, listen: Listen, stop: CancellationToken) -> Result<String> {
    match listen {
        Listen::Unix(path) => serve_unix(router(p), &path, stop).await,
        Listen::Tls { addr, tls } => serve_tls(router(p), addr, tls, stop).await,
        Listen::Health(addr) => serve_health(health_router(p), addr, stop).await,
    }
}

fn check_answer(what: &str, r: Result<String, String>) -> Response {
    match r {
        Ok(line) => (
            StatusCode::OK,
            format!("[+] provider: {line}\n{what}: ok\n"),
        )
            .into_response(),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("[-] provider: {why}\n{what}: failed\n"),
        )
            .into_response(),
    }
}

/// The provider's series, in Prometheus' text format.
fn metrics_text(p: &Provider) -> String {
    let mut out = String::new();
    let ready = i64::from(p.ready().is_ok());
    out.push_str("# HELP socialweb_provider_ready 1 when /readyz answers 200\n");
    out.push_str(&format!(
        "# TYPE socialweb_provider_ready gauge\nsocialweb_provider_ready {ready}\n"
    ));
    out.push_str("# HELP socialweb_provider_capacity Nodes it runs at most\n");
    out.push_str(&format!(
        "# TYPE socialweb_provider_capacity gauge\nsocialweb_provider_capacity {}\n",
        p.inner.cfg.capacity
    ));
    out.push_str("# HELP socialweb_provider_leases Leases it holds, by state\n");
    out.push_str("# TYPE socialweb_provider_leases gauge\n");
    let mut by: std::collections::BTreeMap<String, u64> =
        ["booting", "running", "failed", "released"]
            .into_iter()
            .map(|s| (s.to_string(), 0))
            .collect();
    p.inner.ledger.read(|b| {
        for e in b.leases.values() {
            let state = serde_json::to_value(e.lease.state).ok();
            if let Some(s) = state.as_ref().and_then(|v| v.as_str()) {
                *by.entry(s.to_string()).or_default() += 1;
            }
        }
    });
    for (state, n) in by {
        out.push_str(&format!(
            "socialweb_provider_leases{{state=\"{state}\"}} {n}\n"
        ));
    }
    out
}

fn health_router(p: Provider) -> Router {
    Router::new()
        .route(
            "/healthz",
            get(|State(p): State<Provider>| async move { check_answer("healthz", p.alive()) }),
        )
        .route(
            "/readyz",
            get(|State(p): State<Provider>| async move { check_answer("readyz", p.ready()) }),
        )
        .route(
            "/metrics",
            get(|State(p): State<Provider>| async move {
                (
                    [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
                    metrics_text(&p),
                )
            }),
        )
        .with_state(p)
}

async fn serve_health(app: Router, addr: SocketAddr, stop: CancellationToken) -> Result<String> {
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| {
        format!("metrics.listen: binding {addr} (the provider's /healthz, /readyz, /metrics)")
    })?;
    let bound = listener.local_addr()?;
    tracing::info!(%bound, "local provider: /healthz, /readyz and /metrics");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
    });
    Ok(bound.to_string())
}

async fn serve_unix(
    app: Router,
    path: &std::path::Path,
    stop: CancellationToken,
) -> Result<String> {
    // Its state's run directory, tightened if an older version left it open.
    if let Some(dir) = path.parent() {
        socialweb_proc::owner_only::dir(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
    }
    let listener = socialweb_proc::owner_only::unix_listener(path)
        .with_context(|| format!("local provider: binding {}", path.display()))?;
    tracing::info!(socket = %path.display(), "local provider serving the market protocol");
    // The socket is owner-only: its one client is the broker that embeds this provider.
    let app = app.layer(Extension(Client::local()));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
    });
    Ok(path.display().to_string())
}

/// At most this many connections at once, a handshake within 10 s, headers within 10 s: the
/// market port faces the internet.
const MAX_CONNECTIONS: usize = 256;

async fn serve_tls(
    app: Router,
    addr: SocketAddr,
    tls: std::sync::Arc<rustls::ServerConfig>,
    stop: CancellationToken,
) -> Result<String> {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use tower::ServiceExt;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("local provider: binding {addr}"))?;
    let bound = listener.local_addr()?;
    tracing::info!(%bound, "local provider serving the market protocol (mutual TLS)");
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!("local provider: accept: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                _ = stop.cancelled() => return,
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                continue;
            };
            let (acceptor, app) = (acceptor.clone(), app.clone());
            tokio::spawn(async move {
                let _slot = slot;
                let tls = match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp))
                    .await
                {
                    Ok(Ok(t)) => t,
                    Ok(Err(e)) => {
                        tracing::info!(%peer, "local provider: refused a TLS client: {e}");
                        return;
                    }
                    Err(_) => return,
                };
                // The client is the key it proved in the handshake (one the operator pinned).
                let Some(client) = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .and_then(|c| socialweb_wire::ca::pin_der(c).ok())
                    .map(|pin| Client::pinned(&pin))
                else {
                    tracing::info!(%peer, "local provider: a TLS client without a certificate");
                    return;
                };
                let svc =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let mut req = req.map(axum::body::Body::new);
                        req.extensions_mut().insert(client.clone());
                        app.clone().oneshot(req)
                    });
                let mut b = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                b.http1()
                    .timer(TokioTimer::new())
                    .header_read_timeout(Duration::from_secs(10));
                let _ = b.serve_connection(TokioIo::new(tls), svc).await;
            });
        }
    });
    Ok(bound.to_string())
}
