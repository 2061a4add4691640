//! A fleet host's link (`fleet.link_port`): where the other hosts' fronts carry the requests
//! they admitted for the clusters this host runs ([`super::carry`]). Mutual TLS under the
//! fleet CA (`crate::vault::host`): only the fleet's hosts get in, and what a host says of
//! the user (`X-Remote-User`, as the apiserver's request-header authentication takes it
//! from the front) is trusted as the front's own admission is. A request is
//! `/link/<cluster><apiserver path>`; it is forwarded like one of this host's front,
//! Upgrades included, or answered at once [`super::proxy::NOT_HERE`] when this host does
//! not run the cluster (the sending host then looks again where it runs).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use axum::body::Body;
use http::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::CertificateDer;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use super::hosts::LinkTls;
use super::proxy::{self, status};
use super::{Conn, Front, listener, wake};

/// The link's server configuration: this host's link certificate; a client certificate the
/// fleet CA issued is required; HTTP/2 and HTTP/1.1 (Upgrades).
pub fn server_config(tls: &LinkTls) -> Result<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in socialweb_wire::ca::certificates(&tls.ca).map_err(anyhow::Error::msg)? {
        roots.add(CertificateDer::from(c.der))?;
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .context("the fleet CA")?;
    let chain = socialweb_wire::ca::certificates(&tls.cert)
        .map_err(anyhow::Error::msg)?
        .into_iter()
        .map(|c| CertificateDer::from(c.der))
        .collect();
    let key = super::tls::rustls_pki_key(&tls.key)?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .context("this host's link certificate")?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}

/// Serves the link on `listen` until `stop`.
pub async fn serve(
    listen: SocketAddr,
    tls: rustls::ServerConfig,
    limits: listener::Limits,
    front: Arc<Front>,
    stop: CancellationToken,
) -> Result<SocketAddr> {
    let tcp = TcpListener::bind(listen)
        .await
        .with_context(|| format!("fleet.link_port: binding {listen}"))?;
    let bound = tcp.local_addr()?;
    info!(%bound, "fleet link listening");
    let counts = Arc::new(listener::Counts::default());
    let s = stop.clone();
    let serve_one = move |tls, peer, slot| {
        let (front, stop) = (front.clone(), s.clone());
        async move { connection(front, tls, peer, slot, limits, stop).await }
    };
    tokio::spawn(listener::accept_loop(
        tcp,
        TlsAcceptor::from(Arc::new(tls)),
        limits,
        counts,
        stop,
        serve_one,
    ));
    Ok(bound)
}

/// One host's connection: its requests, then its upgraded tunnels, until they end or `stop`.
/// (The host that sent them watches its user's certificate and cuts its side.)
async fn connection(
    front: Arc<Front>,
    tls: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    peer: SocketAddr,
    slot: listener::Slot,
    limits: listener::Limits,
    stop: CancellationToken,
) {
    let conn = Arc::new(Conn {
        peer,
        leaf: None,
        admitted: Mutex::new(None),
        on_admit: tokio::sync::Notify::new(),
        activity: slot.activity.clone(),
        cut: CancellationToken::new(),
        tunnels: tokio_util::task::TaskTracker::new(),
    });
    let svc = {
        let (front, conn) = (front.clone(), conn.clone());
        hyper::service::service_fn(move |req| {
            let (front, conn) = (front.clone(), conn.clone());
            async move {
                let in_flight = conn.activity.start();
                let resp = handle(&front, &conn, req.map(Body::new)).await;
                Ok::<_, std::convert::Infallible>(listener::tracked(resp, in_flight))
            }
        })
    };
    let builder = listener::builder(&limits);
    tokio::select! {
        r = builder.serve_connection_with_upgrades(TokioIo::new(tls), svc) => {
            debug!(%peer, "link connection ended or upgraded: {r:?}");
        }
        _ = stop.cancelled() => { conn.cut.cancel(); return; }
    }
    conn.tunnels.close();
    tokio::select! {
        _ = conn.tunnels.wait() => {}
        _ = stop.cancelled() => {}
    }
    conn.cut.cancel();
    drop(slot);
}

/// `/link/<cluster><tail>`: the cluster and the apiserver's path.
fn split(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix("/link/")?;
    let (cluster, tail) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    socialweb_broker_core::names::valid_cluster_name(cluster).ok()?;
    Some((cluster, tail))
}

async fn handle(front: &Front, conn: &Conn, req: Request<Body>) -> Response<Body> {
    let path = req.uri().path().to_string();
    let Some((cluster, tail)) = split(&path) else {
        return status(StatusCode::NOT_FOUND, "NotFound", "not a link path");
    };
    let Some(did) = req
        .headers()
        .get("x-remote-user")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
    else {
        return status(StatusCode::BAD_REQUEST, "BadRequest", "no X-Remote-User");
    };
    let busy = front.activity(cluster).start();
    let up = match wake::target(front, cluster, true).await {
        Ok(wake::Target::Here(up)) => up,
        Ok(wake::Target::Host(host)) => {
            return wake::not_here(cluster, &format!("host {host} runs it"));
        }
        Err(answer) => return answer,
    };
    match proxy::forward(&up, req, tail, &did, conn, busy).await {
        Ok(answer) => answer,
        // Its apiserver took no connection (stopping: the cluster moves): the sending
        // host tries again where the cluster runs next.
        Err(unsent) => wake::not_here(cluster, &unsent.why),
    }
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn a_link_path_is_a_cluster_and_its_apiserver_path() {
        assert_eq!(split("/link/ci/api/v1/pods"), Some(("ci", "/api/v1/pods")));
        assert_eq!(split("/link/ci"), Some(("ci", "/")));
        assert_eq!(split("/link/../etc"), None);
        assert_eq!(split("/link/_front/x"), None);
        assert_eq!(split("/clusters/ci"), None);
    }
}
