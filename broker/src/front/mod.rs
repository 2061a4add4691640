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
//! - [`wake`]: holding a request while its cluster starts or wakes from hibernation.
//! - [`carry`], [`hosts`], [`link`]: in a fleet, carrying a request to the host that runs
//!   its cluster, over that host's link.

pub mod admit;
pub mod body;
pub mod carry;
pub mod cert;
pub mod hosts;
pub mod link;
pub mod listener;
pub mod proxy;
pub mod streams;
pub mod tls;
pub mod wake;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use axum::body::Body;
use http::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use tracing::{debug, info};

use crate::access::records::Records;
use admit::Admitted;
use proxy::{Refusal, Upstream};
use socialweb_broker_core::names;

/// A cluster as the front knows it.
#[derive(Debug, Clone)]
pub struct Mount {
    pub cluster: String,
    /// The owner's account hash (`None`: an operator's cluster, reachable by no path).
    pub account_hash: Option<String>,
    /// The users CAs it admits client certificates from (`cluster rotate-ca` adds the
    /// previous one for an overlap).
    pub users: crate::access::users_trust::UsersTrust,
    pub state: MountState,
}

/// Where a mounted cluster's control plane is, as its requests see it.
#[derive(Debug, Clone)]
pub enum MountState {
    /// Being brought up (created, woken, or the broker starting): requests wait for it.
    Starting,
    Up(Box<Upstream>),
    /// Stopped while idle (docs/hibernation.md): a request wakes it and waits.
    Hibernating,
    /// Its last wake failed, with why: the requests that waited for that wake are answered
    /// 503 with it; a later request tries again.
    WakeFailed(String),
    /// Another broker host of the fleet runs it (named): requests go to that host's link
    /// ([`link`]). `None`: no host does yet, and this one takes no more (drained, or at
    /// `fleet.max_awake`); requests wait as for a start.
    Elsewhere(Option<String>),
    /// This host cannot run it or say who does, with why (its life failed; a fleet host
    /// tries again, and meanwhile another host may run it): requests are answered 503 at
    /// once with why and a `Retry-After`, not held for a start that is not coming.
    Unavailable(String),
}

/// What the front serves from: the mounted clusters, and the certificate records it reads
/// (the access service writes them).
#[derive(Debug)]
pub struct Front {
    records: Arc<Records>,
    mounts: RwLock<HashMap<String, Arc<Mount>>>,
    /// Its connections now (the listener's bounds).
    pub counts: Arc<listener::Counts>,
    /// `https://host:port` users reach the front at.
    pub public_url: String,
    /// Bumped on every mount and unmount: what held requests wait on.
    changes: tokio::sync::watch::Sender<u64>,
    /// Per cluster: the requests in flight at it (hibernation waits for none), and the
    /// signal that wakes it (many requests, one wake: a `Notify` keeps one permit).
    clusters: Mutex<HashMap<String, PerCluster>>,
    /// Requests counted by door, status class and cluster.
    metrics: crate::metrics::Metrics,
    /// In a fleet: the other hosts, whose links carry requests for the clusters they run.
    hosts: std::sync::OnceLock<Arc<hosts::Hosts>>,
    /// The long-lived requests each certificate holds (`front.max_streams_per_certificate`).
    streams: Arc<streams::Streams>,
    /// The disk guard (`[disk]`): no wake while the state directory's filesystem is low.
    disk: Option<Arc<crate::disk::DiskGuard>>,
}

#[derive(Debug, Clone, Default)]
struct PerCluster {
    activity: Arc<listener::Activity>,
    wake: Arc<tokio::sync::Notify>,
}

impl Front {
    pub fn new(
        records: Arc<Records>,
        public_url: String,
        metrics: crate::metrics::Metrics,
    ) -> Front {
        Front {
            records,
            mounts: RwLock::new(HashMap::new()),
            counts: Arc::new(listener::Counts::default()),
            public_url,
            changes: tokio::sync::watch::Sender::new(0),
            clusters: Mutex::new(HashMap::new()),
            metrics,
            hosts: std::sync::OnceLock::new(),
            streams: streams::Streams::new(crate::config::DEFAULT_MAX_STREAMS_PER_CERTIFICATE),
            disk: None,
        }
    }

    /// This front wakes no hibernating cluster while `disk` says the state directory's
    /// filesystem is low: the request is answered 503 with why.
    pub fn with_disk_guard(mut self, disk: Arc<crate::disk::DiskGuard>) -> Front {
        self.disk = Some(disk);
        self
    }

    /// Why a wake must wait for disk space (`None`: it may go on).
    pub fn wake_refused(&self) -> Option<String> {
        self.disk.as_ref()?.refuse("not woken")
    }

    /// This front, with at most `max` long-lived requests per certificate.
    pub fn with_max_streams_per_certificate(mut self, max: usize) -> Front {
        self.streams = streams::Streams::new(max);
        self
    }

    /// Makes this front a fleet host's: requests for clusters other hosts run go to their
    /// links.
    pub fn join_fleet(&self, hosts: Arc<hosts::Hosts>) {
        let _ = self.hosts.set(hosts);
    }

    /// Adds or replaces a cluster.
    pub fn mount(&self, m: Mount) {
        self.mounts
            .write()
            .expect("lock")
            .insert(m.cluster.clone(), Arc::new(m));
        self.changes.send_modify(|n| *n += 1);
    }

    /// Sets a mounted cluster's state (nothing when it is not mounted).
    pub fn set_state(&self, cluster: &str, state: MountState) {
        let old = self.get(cluster);
        if let Some(old) = old {
            self.mount(Mount {
                state,
                ..(*old).clone()
            });
        }
    }

    /// Sets a mounted cluster's users CAs (`cluster rotate-ca`; nothing when not mounted).
    pub fn set_users_trust(&self, cluster: &str, users: crate::access::users_trust::UsersTrust) {
        if let Some(old) = self.get(cluster) {
            self.mount(Mount {
                users,
                ..(*old).clone()
            });
        }
    }

    /// Forgets a cluster (the access service forgets its certificates, which cuts their
    /// connections).
    pub fn unmount(&self, cluster: &str) {
        self.mounts.write().expect("lock").remove(cluster);
        self.clusters.lock().expect("lock").remove(cluster);
        self.metrics.forget_cluster(cluster);
        self.changes.send_modify(|n| *n += 1);
    }

    fn per_cluster(&self, cluster: &str) -> PerCluster {
        self.clusters
            .lock()
            .expect("lock")
            .entry(cluster.to_string())
            .or_default()
            .clone()
    }

    /// The requests in flight at `cluster`, and since when there were none.
    pub fn activity(&self, cluster: &str) -> Arc<listener::Activity> {
        self.per_cluster(cluster).activity
    }

    /// What a hibernating `cluster`'s life waits on to wake.
    pub fn wake_signal(&self, cluster: &str) -> Arc<tokio::sync::Notify> {
        self.per_cluster(cluster).wake
    }

    /// Asks `cluster` to wake (idempotent until it does).
    pub fn wake(&self, cluster: &str) {
        self.per_cluster(cluster).wake.notify_one();
    }

    /// Whether `cluster`'s apiserver is up on this host.
    pub fn serves(&self, cluster: &str) -> bool {
        self.get(cluster)
            .is_some_and(|m| matches!(m.state, MountState::Up(_)))
    }

    fn get(&self, cluster: &str) -> Option<Arc<Mount>> {
        self.mounts.read().expect("lock").get(cluster).cloned()
    }
}

/// One TLS connection: its client certificate and what it was admitted to.
#[derive(Debug)]
struct Conn {
    peer: SocketAddr,
    leaf: Option<Vec<u8>>,
    admitted: Mutex<Option<Admitted>>,
    /// Said once a certificate is admitted: only then is the connection watched for
    /// revocation and expiry.
    on_admit: tokio::sync::Notify,
    /// Its requests in flight (an idle connection is closed).
    activity: Arc<listener::Activity>,
    /// Cancelled when the connection ends or is cut: ends its upgraded tunnels.
    cut: CancellationToken,
    /// Its upgraded tunnels, which outlive the HTTP connection they came from.
    tunnels: tokio_util::task::TaskTracker,
}

/// The address a request came from, which the front puts on every request it hands to the
/// gateway API (for its per-source rate limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer(pub SocketAddr);

/// Serves `front` and `api` on `listen`, within `limits`, until `stop`.
pub async fn serve(
    listen: SocketAddr,
    tls: rustls::ServerConfig,
    limits: listener::Limits,
    front: Arc<Front>,
    api: axum::Router,
    stop: CancellationToken,
) -> Result<SocketAddr> {
    let tcp = TcpListener::bind(listen)
        .await
        .with_context(|| format!("front.listen: binding {listen}"))?;
    let bound = tcp.local_addr()?;
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    let limits = limits.within_fd_limit();
    info!(%bound, url = %front.public_url, max_connections = limits.max_connections,
          max_per_source = limits.max_per_source, "front listening");
    let counts = front.counts.clone();
    let s = stop.clone();
    let serve_one = move |tls, peer, slot| {
        let (front, api, stop) = (front.clone(), api.clone(), s.clone());
        async move { connection(front, api, tls, peer, slot, limits, stop).await }
    };
    tokio::spawn(listener::accept_loop(
        tcp, acceptor, limits, counts, stop, serve_one,
    ));
    Ok(bound)
}

/// One connection, TLS done: its requests, then its upgraded tunnels, each cut when the
/// certificate stops being good, when it idles, or on shutdown.
async fn connection(
    front: Arc<Front>,
    api: axum::Router,
    tls: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    peer: SocketAddr,
    slot: listener::Slot,
    limits: listener::Limits,
    stop: CancellationToken,
) {
    let leaf = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec());
    let conn = Arc::new(Conn {
        peer,
        leaf,
        admitted: Mutex::new(None),
        on_admit: tokio::sync::Notify::new(),
        activity: slot.activity.clone(),
        cut: CancellationToken::new(),
        tunnels: tokio_util::task::TaskTracker::new(),
    });
    let svc = {
        let (front, conn) = (front.clone(), conn.clone());
        hyper::service::service_fn(move |req| {
            let (front, conn, api) = (front.clone(), conn.clone(), api.clone());
            async move {
                let in_flight = conn.activity.start();
                let req = req.map(|b| body::paced(Body::new(b), limits.body, &conn.activity));
                let t = std::time::Instant::now();
                let at_api = req.uri().path().starts_with("/xrpc/");
                let resp = handle(&front, &conn, api, req).await;
                front
                    .metrics
                    .front_request(at_api, resp.status().as_u16(), t.elapsed());
                Ok::<_, std::convert::Infallible>(listener::tracked(resp, in_flight))
            }
        })
    };
    let builder = listener::builder(&limits);
    let served = builder.serve_connection_with_upgrades(TokioIo::new(tls), svc);
    tokio::select! {
        r = served => debug!(%peer, "connection ended or upgraded: {r:?}"),
        why = watch_cut(&front, &conn) => {
            debug!(%peer, "connection cut: {why}");
            conn.cut.cancel();
            return;
        }
        _ = listener::idle(&conn.activity, &limits), if conn.tunnels.is_empty() => {
            debug!(%peer, "connection closed: idle for {:?}", limits.idle_timeout);
            return;
        }
        _ = slot.shed.cancelled() => {
            debug!(%peer, "connection closed: idle longest when the front was full");
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
    drop(slot);
}

/// Returns once the connection's admitted certificate stops being good: revoked (at once:
/// the records' signal), expired (checked every half second), or its cluster gone.
async fn watch_cut(front: &Front, conn: &Conn) -> String {
    // Nothing to watch until a certificate is admitted (most connections never are: the
    // gateway API's, and strangers').
    while conn.admitted.lock().expect("lock").is_none() {
        conn.on_admit.notified().await;
    }
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

/// The one answer to a certificate that is not of the cluster at a path, or a path no
/// cluster is mounted at.
fn not_admitted_here() -> Refusal {
    unauthorized(
        "the client certificate is not good at this path: no cluster it was issued for is \
         mounted here (use the kubeconfig getKubeconfig returned)",
    )
}

fn unauthorized(m: &str) -> Refusal {
    Refusal(StatusCode::UNAUTHORIZED, "Unauthorized", m.to_string())
}

/// The cluster a request is for -- the one its path mounts, or else the one its certificate
/// is for -- and the path the apiserver sees; or the answer that refuses it.
fn which_mount(front: &Front, leaf: &[u8], path: &str) -> Result<(Arc<Mount>, String), Refusal> {
    if let Some((hash, cluster, tail)) = names::split_mount(path) {
        // The same answer as a certificate of another cluster's: which mount paths exist
        // is told to no one without a certificate good there.
        return match front.get(cluster) {
            Some(m) if m.account_hash.as_deref() == Some(hash) => Ok((m, tail.to_string())),
            _ => Err(not_admitted_here()),
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
        let now = SystemTime::now();
        admit::still_good(&r, now).map_err(|e| unauthorized(&e))?;
        // Its CA retired since the connection was admitted (`cluster rotate-ca`'s overlap
        // over): admitted again, or refused with why.
        if a.ca_sha256
            .as_deref()
            .is_none_or(|fp| mount.users.admits(fp, now))
        {
            return Ok(a);
        }
        *conn.admitted.lock().expect("lock") = None;
    }
    let a = admit::admit(
        leaf,
        cluster,
        &mount.users,
        &front.records,
        SystemTime::now(),
    )
    .map_err(|e| match e {
        admit::Refused::NotHere(why) => {
            tracing::debug!("front: {why}");
            not_admitted_here()
        }
        admit::Refused::Why(e) => unauthorized(&e),
    })?;
    *conn.admitted.lock().expect("lock") = Some(a.clone());
    conn.on_admit.notify_one();
    Ok(a)
}

async fn handle(
    front: &Front,
    conn: &Conn,
    api: axum::Router,
    req: Request<Body>,
) -> Response<Body> {
    let path = req.uri().path().to_string();
    if path.starts_with("/xrpc/") {
        let mut req = req;
        req.extensions_mut().insert(Peer(conn.peer));
        return api.oneshot(req).await.unwrap_or_else(|e| match e {});
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
    // A watch, a followed log or an upgraded stream holds one of its certificate's permits
    // for as long as it lasts.
    let permit = if streams::long_lived(&req, &tail) {
        match front.streams.acquire(&who.serial) {
            Some(p) => Some(p),
            None => {
                return proxy::status(
                    StatusCode::TOO_MANY_REQUESTS,
                    "TooManyRequests",
                    &format!(
                        "this client certificate holds {} watches and streams, the most one \
                         may (front.max_streams_per_certificate): end some first",
                        front.streams.max()
                    ),
                );
            }
        }
    } else {
        None
    };
    // Counted from here: a request held while its cluster wakes keeps it from hibernating
    // again, and so does its response body (a watch) or its upgraded stream.
    let busy = front.activity(&mount.cluster).start().holding(permit);
    let answer = match front.hosts.get() {
        Some(hosts) => {
            carry::carry(
                front,
                hosts,
                conn,
                &mount.cluster,
                &tail,
                &who.did,
                req,
                busy,
            )
            .await
        }
        None => match wake::target(front, &mount.cluster, false).await {
            Ok(wake::Target::Here(up)) => proxy::forward(&up, req, &tail, &who.did, conn, busy)
                .await
                .unwrap_or_else(proxy::Unsent::answer),
            Ok(wake::Target::Host(host)) => proxy::status(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                &format!("cluster {} is run by broker host {host}", mount.cluster),
            ),
            Err(answer) => answer,
        },
    };
    front
        .metrics
        .cluster_request(&mount.cluster, answer.status().as_u16());
    answer
}
