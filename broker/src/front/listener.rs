//! The front's listener: it faces the internet, so every connection is bounded (docs/security.md).
//!
//! - At most `max_connections` at once, and `max_per_source` from one address: beyond them a
//!   new connection is closed at once, before its handshake; the cap stays under the
//!   process's file-descriptor limit, so a flood cannot take the daemon down.
//! - The TLS handshake within `handshake_timeout`; then each request's headers within
//!   `header_read_timeout` (HTTP/1.1: also the wait for the next request on a kept-alive
//!   connection); an HTTP/2 connection with no request in flight for `idle_timeout` is closed,
//!   and HTTP/2 pings find dead peers.
//! - An accept error (out of file descriptors) waits before the next accept instead of
//!   spinning.
//!
//! Upgraded connections (exec, attach, port-forward) live on as tunnels until either side
//! closes or their certificate stops being good.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use http::Response;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// The bounds of the front's listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_connections: usize,
    pub max_per_source: usize,
    pub handshake_timeout: Duration,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub h2_keepalive: Duration,
}

impl Limits {
    /// `max_connections` kept under 80% of the process's open-file limit (each connection
    /// is a descriptor, and the daemon needs others).
    pub fn within_fd_limit(mut self) -> Limits {
        if let Ok((soft, _)) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        {
            let cap = (soft as usize).saturating_mul(8) / 10;
            if cap < self.max_connections {
                warn!(
                    max_connections = self.max_connections,
                    open_files = soft,
                    "front.max_connections lowered to {cap}: 80% of the open-file limit"
                );
                self.max_connections = cap.max(1);
            }
        }
        self
    }
}

/// Connections open now, in all and by source address.
#[derive(Debug, Default)]
pub struct Counts {
    total: AtomicUsize,
    by_source: Mutex<HashMap<IpAddr, usize>>,
}

/// One connection's place in [`Counts`], given back when dropped.
#[derive(Debug)]
pub struct Slot {
    counts: Arc<Counts>,
    source: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.counts.total.fetch_sub(1, Ordering::Relaxed);
        let mut m = self.counts.by_source.lock().expect("lock");
        if let Some(n) = m.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.source);
            }
        }
    }
}

impl Counts {
    /// A slot for a connection from `source`, or why there is none.
    pub fn admit(self: &Arc<Self>, source: IpAddr, l: &Limits) -> Result<Slot, &'static str> {
        let mut m = self.by_source.lock().expect("lock");
        if self.total.load(Ordering::Relaxed) >= l.max_connections {
            return Err("the front is at max_connections");
        }
        let n = m.entry(source).or_insert(0);
        if *n >= l.max_per_source {
            return Err("this address is at max_connections_per_source");
        }
        *n += 1;
        self.total.fetch_add(1, Ordering::Relaxed);
        Ok(Slot {
            counts: self.clone(),
            source,
        })
    }

    pub fn total(&self) -> usize {
        self.total.load(Ordering::Relaxed)
    }
}

/// Requests in flight on one connection, and since when there were none.
#[derive(Debug)]
pub struct Activity {
    active: AtomicUsize,
    idle_since: Mutex<Option<Instant>>,
}

impl Default for Activity {
    fn default() -> Activity {
        Activity {
            active: AtomicUsize::new(0),
            idle_since: Mutex::new(Some(Instant::now())),
        }
    }
}

/// A request in flight, until its response body is done (or dropped).
#[derive(Debug)]
pub struct InFlight(Arc<Activity>);

impl Activity {
    pub fn start(self: &Arc<Self>) -> InFlight {
        self.active.fetch_add(1, Ordering::Relaxed);
        *self.idle_since.lock().expect("lock") = None;
        InFlight(self.clone())
    }

    /// How long the connection has had no request in flight.
    fn idle_for(&self) -> Option<Duration> {
        self.idle_since.lock().expect("lock").map(|t| t.elapsed())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.active.fetch_sub(1, Ordering::Relaxed) == 1 {
            *self.0.idle_since.lock().expect("lock") = Some(Instant::now());
        }
    }
}

/// A response body that holds its request's [`InFlight`] until it ends.
struct Tracked {
    inner: Body,
    _in_flight: InFlight,
}

impl http_body::Body for Tracked {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// `resp` with its body tracking `in_flight`.
pub fn tracked(resp: Response<Body>, in_flight: InFlight) -> Response<Body> {
    resp.map(|inner| {
        Body::new(Tracked {
            inner,
            _in_flight: in_flight,
        })
    })
}

/// The hyper connection builder with the limits' timeouts.
pub fn builder(l: &Limits) -> hyper_util::server::conn::auto::Builder<TokioExecutor> {
    let mut b = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    b.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(l.header_read_timeout);
    b.http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(l.h2_keepalive))
        .keep_alive_timeout(Duration::from_secs(20));
    b
}

/// Resolves once `activity` has had no request in flight for the idle timeout.
pub async fn idle(activity: &Activity, l: &Limits) {
    loop {
        let wait = match activity.idle_for() {
            Some(d) if d >= l.idle_timeout => return,
            Some(d) => l.idle_timeout - d,
            None => l.idle_timeout,
        };
        tokio::time::sleep(wait.max(Duration::from_millis(100))).await;
    }
}

/// Accepts connections on `listener` within the limits, and hands each, TLS done, to
/// `serve` with its slot.
pub async fn accept_loop<F, Fut>(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    limits: Limits,
    counts: Arc<Counts>,
    stop: CancellationToken,
    serve: F,
) where
    F: Fn(tokio_rustls::server::TlsStream<tokio::net::TcpStream>, SocketAddr, Slot) -> Fut
        + Clone
        + Send
        + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    loop {
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors, most likely: let some close first.
                    warn!("front: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = stop.cancelled() => return,
        };
        let slot = match counts.admit(peer.ip(), &limits) {
            Ok(s) => s,
            Err(why) => {
                debug!(%peer, "connection refused: {why}");
                drop(tcp);
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let (acceptor, serve) = (acceptor.clone(), serve.clone());
        tokio::spawn(async move {
            match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => serve(tls, peer, slot).await,
                Ok(Err(e)) => debug!(%peer, "TLS handshake: {e}"),
                Err(_) => debug!(%peer, "TLS handshake: no handshake within the timeout"),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            max_connections: 3,
            max_per_source: 2,
            handshake_timeout: Duration::from_secs(1),
            header_read_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(1),
            h2_keepalive: Duration::from_secs(1),
        }
    }

    #[test]
    fn connections_are_counted_in_all_and_by_source_and_given_back() {
        let c = Arc::new(Counts::default());
        let (a, b): (IpAddr, IpAddr) = ("192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap());
        let l = limits();
        let a1 = c.admit(a, &l).unwrap();
        let _a2 = c.admit(a, &l).unwrap();
        assert_eq!(
            c.admit(a, &l).unwrap_err(),
            "this address is at max_connections_per_source"
        );
        let _b1 = c.admit(b, &l).unwrap();
        assert_eq!(
            c.admit(b, &l).unwrap_err(),
            "the front is at max_connections"
        );
        drop(a1);
        assert_eq!(c.total(), 2);
        assert!(c.admit(b, &l).is_ok(), "a freed slot is free again");
    }

    #[test]
    fn a_connection_is_idle_only_with_no_request_in_flight() {
        let a = Arc::new(Activity::default());
        assert!(a.idle_for().is_some());
        let r1 = a.start();
        let r2 = a.start();
        assert!(a.idle_for().is_none());
        drop(r1);
        assert!(a.idle_for().is_none(), "one still in flight");
        drop(r2);
        assert!(a.idle_for().is_some());
    }
}
