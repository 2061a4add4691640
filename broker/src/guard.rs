//! The guard: the authorization webhook a cluster's apiserver asks first (docs/security.md).
//! It listens on loopback HTTPS (a serving certificate of the cluster CA, which the
//! apiserver's webhook kubeconfig trusts), reads a SubjectAccessReview, and answers with
//! the core's rules (`socialweb_broker_core::guard`): denied, or no opinion. The
//! apiserver's match conditions send it only what those rules would refuse, and deny those
//! requests when the guard cannot be asked.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::post;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use socialweb_broker_core::guard::{Request, refuse};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use tracing::{debug, info};

/// The answer to a SubjectAccessReview (`authorization.k8s.io/v1`).
pub fn review(sar: &Value) -> Value {
    let attr = &sar["spec"]["resourceAttributes"];
    let s = |k: &str| attr[k].as_str().unwrap_or("");
    let groups: Vec<String> = sar["spec"]["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|g| g.as_str().map(str::to_string))
        .collect();
    let req = Request {
        verb: s("verb"),
        group: s("group"),
        resource: s("resource"),
        subresource: s("subresource"),
        name: s("name"),
        namespace: s("namespace"),
        user: sar["spec"]["user"].as_str().unwrap_or(""),
        groups: &groups,
    };
    let status = match refuse(&req) {
        Some(why) if attr.is_object() => {
            info!(user = %sar["spec"]["user"].as_str().unwrap_or(""), verb = req.verb,
                  resource = req.resource, name = req.name, namespace = req.namespace,
                  "guard: refused: {why}");
            json!({"allowed": false, "denied": true, "reason": why})
        }
        _ => json!({"allowed": false}),
    };
    json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "status": status})
}

/// Serves the guard on `addr` with `cert`/`key` (PEM files) until `stop`.
pub async fn serve(
    addr: SocketAddr,
    cert: &std::path::Path,
    key: &std::path::Path,
    stop: CancellationToken,
) -> Result<()> {
    let chain = socialweb_wire::ca::certificates(&std::fs::read(cert)?)
        .map_err(anyhow::Error::msg)?
        .into_iter()
        .map(|c| rustls::pki_types::CertificateDer::from(c.der))
        .collect();
    let key = crate::front::tls::rustls_pki_key(&std::fs::read(key)?)
        .with_context(|| format!("reading {}", key.display()))?;
    let tls = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    let tcp = TcpListener::bind(addr)
        .await
        .with_context(|| format!("the guard: binding {addr}"))?;
    let app = Router::new()
        .fallback(post(|axum::Json(sar): axum::Json<Value>| async move {
            axum::Json(review(&sar))
        }))
        .layer(DefaultBodyLimit::max(64 * 1024));
    tokio::spawn(async move {
        loop {
            let (stream, _) = tokio::select! {
                r = tcp.accept() => match r {
                    Ok(x) => x,
                    Err(_) => { tokio::time::sleep(Duration::from_millis(100)).await; continue }
                },
                _ = stop.cancelled() => return,
            };
            let (acceptor, app) = (acceptor.clone(), app.clone());
            tokio::spawn(async move {
                let Ok(Ok(tls)) =
                    tokio::time::timeout(Duration::from_secs(5), acceptor.accept(stream)).await
                else {
                    return;
                };
                let svc =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        app.clone().oneshot(req.map(axum::body::Body::new))
                    });
                let r = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
                debug!("guard connection: {r:?}");
            });
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guard_denies_deleting_the_policy_and_has_no_opinion_on_the_rest() {
        let sar = |verb: &str, resource: &str, name: &str| {
            json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                   "spec": {"user": "did:key:zMallory", "groups": ["socialweb.computer:cluster-owners"],
                            "resourceAttributes": {"verb": verb, "group": "admissionregistration.k8s.io",
                                                   "resource": resource, "name": name}}})
        };
        let r = review(&sar(
            "delete",
            "validatingadmissionpolicies",
            "socialweb-node-isolation",
        ));
        assert_eq!(
            (
                r["status"]["allowed"].clone(),
                r["status"]["denied"].clone()
            ),
            (json!(false), json!(true))
        );
        let r = review(&sar(
            "get",
            "validatingadmissionpolicies",
            "socialweb-node-isolation",
        ));
        assert_eq!(
            r["status"],
            json!({"allowed": false}),
            "no opinion: RBAC decides"
        );
        let r = review(
            &json!({"spec": {"nonResourceAttributes": {"path": "/healthz", "verb": "get"}}}),
        );
        assert_eq!(r["status"], json!({"allowed": false}));
    }
}
