//! The front: the one way in from outside (docs/api.md). A TLS listener that serves the
//! gateway API under `/xrpc/` and every tenant cluster under
//! `/clusters/root:<accountHash>:<cluster>:clusters/...` (or, without that prefix, the
//! cluster the client certificate belongs to). A cluster request needs a client
//! certificate the cluster's users CA issued and whose record stands ([`admit`]); it is then
//! forwarded as that user ([`proxy`]). A connection whose certificate is revoked or expires
//! is closed at once, its watches and exec streams with it.
//!
//! - [`tls`]: the serving certificate and the client-certificate handshake.
//! - [`admit`]: the per-request decision.
//! - [`proxy`]: forwarding, with Upgrades.

pub mod admit;
pub mod proxy;
pub mod tls;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use axum::body::Body;
use http::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use tracing::{debug, info};

use crate::access::records::Records;
use admit::Admitted;
use proxy::{Refusal, Upstream, status};
use socialweb_broker_core::names;

/// A cluster as the front knows it.
#[derive(Debug, Clone)]
pub struct Mount {
    pub cluster: String,
    /// The owner's account hash (`None`: an operator's cluster, reachable by no path).
    pub account_hash: Option<String>,
    /// The users CA (DER).
    pub users_ca: Vec<u8>,
    /// `None` while the control plane is not up.
    pub upstream: Option<Upstream>,
}

/// What the front serves from: the mounted clusters, and the certificate records it reads
/// (the access service writes them).
#[derive(Debug)]
pub struct Front {
    records: Arc<Records>,
    mounts: RwLock<HashMap<String, Arc<Mount>>>,
    /// `https://host:port` users reach the front at.
    pub public_url: String,
}

impl Front {
    pub fn new(records: Arc<Records>, public_url: String) -> Front {
        Front {
            records,
            mounts: RwLock::new(HashMap::new()),
            public_url,
        }
    }

    /// Adds or replaces a cluster.
    pub fn mount(&self, m: Mount) {
        self.mounts
            .write()
            .expect("lock")
            .insert(m.cluster.clone(), Arc::new(m));
    }

    /// Forgets a cluster (the access service forgets its certificates, which cuts their
    /// connections).
    pub fn unmount(&self, cluster: &str) {
        self.mounts.write().expect("lock").remove(cluster);
    }

    fn get(&self, cluster: &str) -> Option<Arc<Mount>> {
        self.mounts.read().expect("lock").get(cluster).cloned()
    }
}

/// One TLS connection: its client certificate and what it was admitted to.
#[derive(Debug)]
struct Conn {
    leaf: Option<Vec<u8>>,
    admitted: Mutex<Option<Admitted>>,
    /// Cancelled when the connection ends or is cut: ends its upgraded tunnels.
    cut: CancellationToken,
    /// Its upgraded tunnels, which outlive the HTTP connection they came from.
    tunnels: tokio_util::task::TaskTracker,
}

/// Serves `front` and `api` on `listen` until `stop`.
pub async fn serve(
    listen: SocketAddr,
    tls: rustls::ServerConfig,
    front: Arc<Front>,
    api: axum::Router,
    stop: CancellationToken,
) -> Result<SocketAddr> {
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("front.listen: binding {listen}"))?;
    let bound = listener.local_addr()?;
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    info!(%bound, url = %front.public_url, "front listening");
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                r = listener.accept() => match r { Ok(x) => x, Err(_) => continue },
                _ = stop.cancelled() => return,
            };
            let _ = tcp.set_nodelay(true);
            let (acceptor, front, api, stop) =
                (acceptor.clone(), front.clone(), api.clone(), stop.clone());
            tokio::spawn(async move {
                let tls = match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp))
                    .await
                {
                    Ok(Ok(t)) => t,
                    Ok(Err(e)) => {
                        debug!(%peer, "TLS handshake: {e}");
                        return;
                    }
                    Err(_) => return,
                };
                let leaf = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .map(|c| c.to_vec());
                let conn = Arc::new(Conn {
                    leaf,
                    admitted: Mutex::new(None),
                    cut: CancellationToken::new(),
                    tunnels: tokio_util::task::TaskTracker::new(),
                });
                let svc = {
                    let (front, conn) = (front.clone(), conn.clone());
                    hyper::service::service_fn(move |req| {
                        let (front, conn, api) = (front.clone(), conn.clone(), api.clone());
                        async move {
                            Ok::<_, std::convert::Infallible>(handle(&front, &conn, api, req).await)
                        }
                    })
                };
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                let served = builder.serve_connection_with_upgrades(TokioIo::new(tls), svc);
                tokio::select! {
                    r = served => debug!(%peer, "connection ended or upgraded: {r:?}"),
                    why = watch_cut(&front, &conn) => {
                        debug!(%peer, "connection cut: {why}");
                        conn.cut.cancel();
                        return;
                    }
                    _ = stop.cancelled() => { conn.cut.cancel(); return; }
                }
                // An upgraded connection lives on as tunnels, still under watch.
                conn.tunnels.close();
                tokio::select! {
                    _ = conn.tunnels.wait() => {}
                    why = watch_cut(&front, &conn) => debug!(%peer, "tunnel cut: {why}"),
                    _ = stop.cancelled() => {}
                }
                conn.cut.cancel();
            });
        }
    });
    Ok(bound)
}

/// Returns once the connection's admitted certificate stops being good: revoked (at once:
/// the records' signal), expired (checked every half second), or its cluster gone.
async fn watch_cut(front: &Front, conn: &Conn) -> String {
    let mut changes = front.records.subscribe();
    loop {
        let admitted = conn.admitted.lock().expect("lock").clone();
        if let Some(a) = admitted {
            match front.records.get(&a.serial) {
                None => return format!("certificate {} no longer recorded", a.serial),
                Some(r) => {
                    if let Err(e) = admit::still_good(&r, SystemTime::now()) {
                        return e;
                    }
                }
            }
        }
        tokio::select! {
            r = changes.changed() => if r.is_err() { std::future::pending::<()>().await },
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}

fn unauthorized(m: &str) -> Refusal {
    Refusal(StatusCode::UNAUTHORIZED, "Unauthorized", m.to_string())
}

/// The cluster a request is for -- the one its path mounts, or else the one its certificate
/// is for -- and the path the apiserver sees; or the answer that refuses it.
fn which_mount(front: &Front, leaf: &[u8], path: &str) -> Result<(Arc<Mount>, String), Refusal> {
    if let Some((hash, cluster, tail)) = names::split_mount(path) {
        return match front.get(cluster) {
            Some(m) if m.account_hash.as_deref() == Some(hash) => Ok((m, tail.to_string())),
            _ => Err(Refusal(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("no cluster is mounted at root:{hash}:{cluster}:clusters"),
            )),
        };
    }
    let serial = admit::read(leaf).map_err(|e| unauthorized(&e))?.serial;
    let r = front.records.get(&serial).ok_or_else(|| {
        unauthorized(&format!(
            "the client certificate {serial} has no record at this broker"
        ))
    })?;
    let m = front.get(&r.cluster).ok_or_else(|| {
        Refusal(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("no cluster {}", r.cluster),
        )
    })?;
    Ok((m, path.to_string()))
}

/// Who the connection's certificate is at `mount`: admitted once per connection and
/// cluster; afterwards only its record is looked at.
fn who(front: &Front, conn: &Conn, leaf: &[u8], mount: &Mount) -> Result<Admitted, Refusal> {
    let cluster = mount.cluster.as_str();
    let known = conn
        .admitted
        .lock()
        .expect("lock")
        .clone()
        .filter(|a| a.cluster == *cluster);
    if let Some(a) = known {
        let r = front
            .records
            .get(&a.serial)
            .ok_or_else(|| unauthorized("the client certificate's record is gone"))?;
        admit::still_good(&r, SystemTime::now()).map_err(|e| unauthorized(&e))?;
        return Ok(a);
    }
    let a = admit::admit(
        leaf,
        cluster,
        &mount.users_ca,
        &front.records,
        SystemTime::now(),
    )
    .map_err(|e| unauthorized(&e))?;
    *conn.admitted.lock().expect("lock") = Some(a.clone());
    Ok(a)
}

async fn handle(
    front: &Front,
    conn: &Conn,
    api: axum::Router,
    req: Request<hyper::body::Incoming>,
) -> Response<Body> {
    let path = req.uri().path().to_string();
    if path.starts_with("/xrpc/") {
        return api
            .oneshot(req.map(Body::new))
            .await
            .unwrap_or_else(|e| match e {});
    }
    let Some(leaf) = &conn.leaf else {
        return unauthorized(
            "a client certificate is required: use the kubeconfig getKubeconfig returns",
        )
        .answer();
    };
    let (mount, tail) = match which_mount(front, leaf, &path) {
        Ok(x) => x,
        Err(refused) => return refused.answer(),
    };
    let who = match who(front, conn, leaf, &mount) {
        Ok(a) => a,
        Err(refused) => return refused.answer(),
    };
    let Some(up) = &mount.upstream else {
        return status(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            &format!(
                "cluster {} is starting; try again in a few seconds",
                mount.cluster
            ),
        );
    };
    proxy::forward(up, req, &tail, &who.did, &conn.tunnels, conn.cut.clone()).await
}
