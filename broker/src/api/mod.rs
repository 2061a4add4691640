//! The gateway API (docs/api.md): HTTP+JSON in the XRPC style, at `/xrpc/<method>` on the
//! front's listener. Queries are GETs with query parameters, procedures POSTs with a JSON
//! body; every method but `describeServer` needs a service-auth token whose `lxm` is that
//! method ([`crate::auth`]). A caller sees and touches only the clusters their DID owns.
//!
//! - this file: routing, authentication, errors.
//! - [`methods`]: what each method does, on the daemon's cluster code.
//! - [`client`]: the user side, for `socialweb-broker api ...`.

pub mod client;
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
use crate::daemon::Daemon;

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
}

impl ApiError {
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            error: "InvalidRequest",
            message: message.into(),
        }
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            error: "NotFound",
            message: message.into(),
        }
    }

    pub fn conflict(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::CONFLICT,
            error: "Conflict",
            message: message.into(),
        }
    }

    pub fn internal(e: anyhow::Error) -> ApiError {
        tracing::error!("gateway API: {e:#}");
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            error: "InternalServerError",
            message: format!("{e:#}"),
        }
    }
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            error: match e {
                AuthError::Missing => "AuthMissing",
                AuthError::Expired(_) => "ExpiredToken",
                _ => "InvalidToken",
            },
            message: e.to_string(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            axum::Json(serde_json::json!({"error": self.error, "message": self.message})),
        )
            .into_response()
    }
}

/// The API's routes, for the front to serve.
pub fn router(d: Arc<Daemon>) -> Router {
    Router::new()
        .route("/xrpc/{method}", any(call))
        .layer(DefaultBodyLimit::max(64 * 1024))
        .with_state(d)
}

/// The caller's DID, from the bearer token for `method`; its nonce is spent.
async fn authenticate(d: &Daemon, headers: &HeaderMap, method: &str) -> Result<String, ApiError> {
    let token = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or(AuthError::Missing)?;
    let now = SystemTime::now();
    let v = crate::auth::token::verify(
        token.trim(),
        &d.config().service_did(),
        method,
        d.resolver(),
        now,
    )
    .await?;
    let fresh = d
        .store()
        .use_nonce(&v.nonce, v.exp * 1000, crate::store::millis(now))
        .await
        .map_err(ApiError::internal)?;
    if !fresh {
        return Err(AuthError::Replayed.into());
    }
    Ok(v.did)
}

async fn call(
    State(d): State<Arc<Daemon>>,
    Path(method): Path<String>,
    http_method: Method,
    headers: HeaderMap,
    Query(params): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    match dispatch(&d, &method, &http_method, &headers, params, &body).await {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn dispatch(
    d: &Arc<Daemon>,
    method: &str,
    http_method: &Method,
    headers: &HeaderMap,
    params: HashMap<String, String>,
    body: &[u8],
) -> Result<Value, ApiError> {
    let Some((_, query)) = METHODS.iter().find(|(m, _)| *m == method) else {
        return Err(ApiError {
            status: StatusCode::NOT_IMPLEMENTED,
            error: "MethodNotImplemented",
            message: format!(
                "no method {method:?}; the methods are {}",
                METHODS
                    .iter()
                    .map(|(m, _)| *m)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        });
    };
    let want = if *query { Method::GET } else { Method::POST };
    if *http_method != want {
        return Err(ApiError::invalid(format!(
            "{method} is a {}: call it with {want}",
            if *query { "query" } else { "procedure" }
        )));
    }
    if method == DESCRIBE_SERVER {
        return Ok(methods::describe_server(d));
    }
    let did = authenticate(d, headers, method).await?;
    let input = || -> Result<Value, ApiError> {
        if body.is_empty() {
            return Ok(Value::Object(Default::default()));
        }
        serde_json::from_slice(body)
            .map_err(|e| ApiError::invalid(format!("the body is not JSON: {e}")))
    };
    match method {
        CREATE_CLUSTER => methods::create_cluster(d, &did, input()?).await,
        LIST_CLUSTERS => methods::list_clusters(d, &did).await,
        DELETE_CLUSTER => methods::delete_cluster(d, &did, input()?).await,
        GET_KUBECONFIG => methods::get_kubeconfig(d, &did, input()?).await,
        LIST_CERTIFICATES => methods::list_certificates(d, &did, params.get("cluster")),
        REVOKE_CERTIFICATE => methods::revoke_certificate(d, &did, input()?).await,
        _ => unreachable!("every method is dispatched"),
    }
}
