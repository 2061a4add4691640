//! The gateway API (docs/api.md): HTTP+JSON in the XRPC style, at `/xrpc/<method>` on the
//! front's listener. Queries are GETs with query parameters, procedures POSTs with a JSON
//! body; every method but `describeServer` needs a service-auth token whose `lxm` is that
//! method ([`crate::auth`]). A caller sees and touches only the clusters their DID owns.
//!
//! - this file: routing, authentication, errors.
//! - [`methods`]: each method's input turned into a [`Command`], and its [`Reply`] into the
//!   method's JSON. The API knows the command vocabulary, never what carries it out.
//! - [`limits`]: request rates per source address and per DID.
//! - [`client`]: the user side, for `socialweb-broker api ...`.

pub mod client;
pub mod limits;
pub mod methods;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use serde_json::Value;

use crate::auth::AuthError;
use crate::auth::did::Resolver;
use crate::command::{Caller, Command, Reply, ServiceError};
use crate::services::Services;
use crate::store::Store;

/// The methods, by NSID.
pub const DESCRIBE_SERVER: &str = "computer.socialweb.describeServer";
pub const CREATE_CLUSTER: &str = "computer.socialweb.createCluster";
pub const LIST_CLUSTERS: &str = "computer.socialweb.listClusters";
pub const DELETE_CLUSTER: &str = "computer.socialweb.deleteCluster";
pub const GET_KUBECONFIG: &str = "computer.socialweb.getKubeconfig";
pub const LIST_CERTIFICATES: &str = "computer.socialweb.listCertificates";
pub const REVOKE_CERTIFICATE: &str = "computer.socialweb.revokeCertificate";

/// Every method with whether it is a query (GET) or a procedure (POST).
pub const METHODS: &[(&str, bool)] = &[
    (DESCRIBE_SERVER, true),
    (CREATE_CLUSTER, false),
    (LIST_CLUSTERS, true),
    (DELETE_CLUSTER, false),
    (GET_KUBECONFIG, false),
    (LIST_CERTIFICATES, true),
    (REVOKE_CERTIFICATE, false),
];

/// An XRPC error: `{"error": <name>, "message": <what to fix>}`.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub error: &'static str,
    pub message: String,
    /// `Retry-After`, for a rate limit.
    pub retry_after: Option<std::time::Duration>,
}

impl ApiError {
    pub fn new(status: StatusCode, error: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            error,
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "InvalidRequest", message)
    }
}

impl From<limits::Exceeded> for ApiError {
    fn from(e: limits::Exceeded) -> ApiError {
        let secs = e.retry_after.as_secs().max(1);
        ApiError {
            retry_after: Some(std::time::Duration::from_secs(secs)),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "RateLimitExceeded",
                format!("too many {}; try again in {secs} s", e.what),
            )
        }
    }
}

pub use crate::front::Peer;

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> ApiError {
        let (status, error) = match &e {
            ServiceError::Invalid(_) => (StatusCode::BAD_REQUEST, "InvalidRequest"),
            ServiceError::NotFound(_) => (StatusCode::NOT_FOUND, "NotFound"),
            ServiceError::Conflict(_) => (StatusCode::CONFLICT, "Conflict"),
            ServiceError::Forbidden(_) => (StatusCode::FORBIDDEN, "Forbidden"),
            ServiceError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "InternalServerError"),
            ServiceError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "Unavailable"),
        };
        ApiError::new(status, error, e.public())
    }
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> ApiError {
        let error = match e {
            AuthError::Missing => "AuthMissing",
            AuthError::Expired(_) => "ExpiredToken",
            _ => "InvalidToken",
        };
        ApiError::new(StatusCode::UNAUTHORIZED, error, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (
            self.status,
            axum::Json(serde_json::json!({"error": self.error, "message": self.message})),
        )
            .into_response();
        if let Some(d) = self.retry_after {
            r.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, d.as_secs().into());
        }
        r
    }
}

/// What the API serves from: the services, and what it needs to authenticate callers.
#[derive(Debug)]
pub struct Gateway {
    pub services: Services,
    /// This broker's DID: the `aud` every token must name.
    pub service_did: String,
    /// The front's URL, for `describeServer`.
    pub public_url: String,
    pub resolver: Resolver,
    /// Where spent nonces are kept.
    pub store: Store,
    pub rates: limits::Rates,
    /// Calls counted by method and status class, and timed.
    pub metrics: crate::metrics::Metrics,
}

impl Gateway {
    /// Carries out a user's command.
    async fn execute(&self, did: &str, cmd: Command) -> Result<Reply, ApiError> {
        Ok(self
            .services
            .execute(&Caller::User(did.to_string()), cmd)
            .await?)
    }
}

/// The API's routes, for the front to serve.
pub fn router(g: Arc<Gateway>) -> Router {
    Router::new()
        .route("/xrpc/{method}", any(call))
        .layer(DefaultBodyLimit::max(64 * 1024))
        .with_state(g)
}

/// The caller's DID, from the bearer token for `method`; its nonce is spent.
async fn authenticate(g: &Gateway, headers: &HeaderMap, method: &str) -> Result<String, ApiError> {
    let token = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or(AuthError::Missing)?;
    let now = SystemTime::now();
    let v =
        crate::auth::token::verify(token.trim(), &g.service_did, method, &g.resolver, now).await?;
    let fresh = g
        .store
        .use_nonce(&v.nonce, v.exp * 1000)
        .await
        .map_err(|e| ApiError::from(ServiceError::internal(e)))?;
    if !fresh {
        return Err(AuthError::Replayed.into());
    }
    Ok(v.did)
}

async fn call(
    State(g): State<Arc<Gateway>>,
    Path(method): Path<String>,
    peer: Option<axum::Extension<Peer>>,
    http_method: Method,
    headers: HeaderMap,
    Query(params): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    let t = std::time::Instant::now();
    let resp = answer(&g, &method, peer, &http_method, &headers, params, &body).await;
    // The label is one of the methods, or `other`: bounded whatever callers send.
    let known = METHODS.iter().find(|(m, _)| *m == method).map(|(m, _)| *m);
    g.metrics.api_request(
        known.unwrap_or("other"),
        resp.status().as_u16(),
        t.elapsed(),
    );
    resp
}

async fn answer(
    g: &Gateway,
    method: &str,
    peer: Option<axum::Extension<Peer>>,
    http_method: &Method,
    headers: &HeaderMap,
    params: HashMap<String, String>,
    body: &[u8],
) -> Response {
    // Before anything costs: the token's DID is resolved and its signature checked next.
    if let Some(axum::Extension(Peer(addr))) = peer
        && let Err(e) = g.rates.source(addr.ip())
    {
        return ApiError::from(e).into_response();
    }
    match dispatch(g, method, http_method, headers, params, body).await {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn dispatch(
    g: &Gateway,
    method: &str,
    http_method: &Method,
    headers: &HeaderMap,
    params: HashMap<String, String>,
    body: &[u8],
) -> Result<Value, ApiError> {
    let Some((_, query)) = METHODS.iter().find(|(m, _)| *m == method) else {
        return Err(ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "MethodNotImplemented",
            format!(
                "no method {:?}; the methods are {}",
                method.chars().take(100).collect::<String>(),
                METHODS
                    .iter()
                    .map(|(m, _)| *m)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    };
    let want = if *query { Method::GET } else { Method::POST };
    if *http_method != want {
        return Err(ApiError::invalid(format!(
            "{method} is a {}: call it with {want}",
            if *query { "query" } else { "procedure" }
        )));
    }
    if method == DESCRIBE_SERVER {
        return Ok(methods::describe_server(g));
    }
    let did = authenticate(g, headers, method).await?;
    g.rates.did(&did)?;
    if method == CREATE_CLUSTER {
        g.rates.create(&did)?;
    }
    let input = || -> Result<Value, ApiError> {
        if body.is_empty() {
            return Ok(Value::Object(Default::default()));
        }
        serde_json::from_slice(body)
            .map_err(|e| ApiError::invalid(format!("the body is not JSON: {e}")))
    };
    let cmd = match method {
        LIST_CLUSTERS => Command::ListClusters,
        LIST_CERTIFICATES => Command::ListCertificates {
            cluster: params.get("cluster").cloned(),
        },
        _ => methods::command(method, input()?)?,
    };
    let reply = g.execute(&did, cmd).await?;
    Ok(methods::answer(g, &did, reply))
}
