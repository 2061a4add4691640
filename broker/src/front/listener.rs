//! The front's listener: it faces the internet, so every connection is bounded (docs/security.md).
//!
//! - At most `max_connections` at once, and `max_per_source` from one address. Beyond the
//!   per-source cap a new connection is closed at once, before its handshake; at the global
//!   cap it takes the place of the connection idle longest, and is refused only when every
//!   connection has a request in flight. The cap stays under the process's file-descriptor
//!   limit, so a flood cannot take the daemon down, nor shut out a client that works.
//! - The TLS handshake within `handshake_timeout`; then each request's headers within
//!   `header_read_timeout` (HTTP/1.1: also the wait for the next request on a kept-alive
//!   connection); its body at a minimum pace (`front::body`), and while it arrives the
//!   request is no work in flight (the connection may be shed); an HTTP/2 connection with no request in flight for `idle_timeout` is closed,
//!   and HTTP/2 pings find dead peers.
//! - An accept error (out of file descriptors) waits before the next accept instead of
//!   spinning.
//!
//! Upgraded connections (exec, attach, port-forward) live on as tunnels until either side
//! closes or their certificate stops being good.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use http::Response;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use socialweb_broker_core::source::source_key;
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
    /// How a request body must arrive.
    pub body: super::body::Pace,
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

/// Connections open now, in all and by source address, each with its activity, so that a
/// connection arriving at `max_connections` can take the place of the one idle longest.
#[derive(Debug, Default)]
pub struct Counts {
    inner: Mutex<Open>,
}

#[derive(Debug, Default)]
struct Open {
    next: u64,
    by_source: HashMap<IpAddr, usize>,
    conns: HashMap<u64, Held>,
}

#[derive(Debug)]
struct Held {
    source: IpAddr,
    activity: Arc<Activity>,
    shed: CancellationToken,
}

impl Open {
    /// Gives back connection `id`'s place; false if it was given back already (shed).
    fn remove(&mut self, id: u64) -> bool {
        let Some(h) = self.conns.remove(&id) else {
            return false;
        };
        if let Some(n) = self.by_source.get_mut(&h.source) {
            *n -= 1;
            if *n == 0 {
                self.by_source.remove(&h.source);
            }
        }
        true
    }

    /// The connection sheddable for longest (no request in flight, or only requests whose
    /// bodies are still arriving), if any is.
    fn idlest(&self) -> Option<u64> {
        self.conns
            .iter()
            .filter_map(|(id, h)| h.activity.sheddable_for().map(|d| (d, *id)))
            .max()
            .map(|(_, id)| id)
    }
}

/// One connection's place in [`Counts`], given back when dropped: its activity, and the
/// signal that it was shed to make room.
#[derive(Debug)]
pub struct Slot {
    counts: Arc<Counts>,
    id: u64,
    pub activity: Arc<Activity>,
    pub shed: CancellationToken,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.counts.inner.lock().expect("lock").remove(self.id);
    }
}

impl Counts {
    /// A slot for a connection from `source`, or why there is none. At `max_connections`
    /// the connection idle longest (handshaking, or no request in flight) is shed for it:
    /// a flood of idle connections, from however many addresses, cannot shut out a client
    /// that sends requests. Only when every connection is busy is the new one refused.
    pub fn admit(self: &Arc<Self>, source: IpAddr, l: &Limits) -> Result<Slot, &'static str> {
        let mut open = self.inner.lock().expect("lock");
        if open.by_source.get(&source).copied().unwrap_or(0) >= l.max_per_source {
            return Err("this address is at max_connections_per_source");
        }
        if open.conns.len() >= l.max_connections {
            let Some(id) = open.idlest() else {
                return Err("the front is at max_connections, every connection busy");
            };
            if let Some(h) = open.conns.get(&id) {
                h.shed.cancel();
            }
            open.remove(id);
        }
        let (id, activity, shed) = (
            open.next,
            Arc::new(Activity::default()),
            CancellationToken::new(),
        );
        open.next += 1;
        *open.by_source.entry(source).or_insert(0) += 1;
        open.conns.insert(
            id,
            Held {
                source,
                activity: activity.clone(),
                shed: shed.clone(),
            },
        );
        Ok(Slot {
            counts: self.clone(),
            id,
            activity,
            shed,
        })
    }

    pub fn total(&self) -> usize {
        self.inner.lock().expect("lock").conns.len()
    }
}

/// Requests in flight on one connection (or at one cluster), how many of them are still
/// receiving their bodies, and since when there was none (idle) and none but those
/// (sheddable): one lock over all, so they never disagree.
#[derive(Debug)]
pub struct Activity {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    in_flight: usize,
    receiving: usize,
    idle_since: Option<Instant>,
    sheddable_since: Option<Instant>,
}

impl State {
    fn changed(&mut self) {
        let now = Instant::now();
        if self.in_flight == 0 {
            self.idle_since.get_or_insert(now);
        } else {
            self.idle_since = None;
        }
        if self.in_flight <= self.receiving {
            self.sheddable_since.get_or_insert(now);
        } else {
            self.sheddable_since = None;
        }
    }
}

impl Default for Activity {
    fn default() -> Activity {
        let now = Instant::now();
        Activity {
            state: Mutex::new(State {
                in_flight: 0,
                receiving: 0,
                idle_since: Some(now),
                sheddable_since: Some(now),
            }),
        }
    }
}

/// A request in flight, until its response body is done (or dropped); with the permit of a
/// long-lived request (`front::streams`), which it gives back then.
#[derive(Debug)]
pub struct InFlight(Arc<Activity>, Option<super::streams::StreamPermit>);

impl InFlight {
    /// This request, holding `permit` as long as it is in flight.
    pub fn holding(mut self, permit: Option<super::streams::StreamPermit>) -> InFlight {
        self.1 = permit;
        self
    }
}

/// A request body still arriving (`front::body`), until it has arrived or failed.
#[derive(Debug)]
pub struct Receiving(Arc<Activity>);

impl Activity {
    pub fn start(self: &Arc<Self>) -> InFlight {
        let mut s = self.state.lock().expect("lock");
        s.in_flight += 1;
        s.changed();
        InFlight(self.clone(), None)
    }

    /// Marks a request's body as arriving: the request is no work of the front's until it
    /// has arrived.
    pub fn receiving(self: &Arc<Self>) -> Receiving {
        let mut s = self.state.lock().expect("lock");
        s.receiving += 1;
        s.changed();
        Receiving(self.clone())
    }

    /// How long there has been no request in flight (`None`: one is).
    pub fn idle_for(&self) -> Option<Duration> {
        self.state
            .lock()
            .expect("lock")
            .idle_since
            .map(|t| t.elapsed())
    }

    /// How long every request in flight, if any, has been receiving its body (`None`: one
    /// is being answered). Such a connection may be shed for a new one at the cap.
    pub fn sheddable_for(&self) -> Option<Duration> {
        self.state
            .lock()
            .expect("lock")
            .sheddable_since
            .map(|t| t.elapsed())
    }

    /// How many requests are in flight.
    pub fn in_flight(&self) -> usize {
        self.state.lock().expect("lock").in_flight
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut s = self.0.state.lock().expect("lock");
        s.in_flight -= 1;
        s.changed();
    }
}

impl Drop for Receiving {
    fn drop(&mut self) {
        let mut s = self.0.state.lock().expect("lock");
        s.receiving -= 1;
        s.changed();
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
        let slot = match counts.admit(source_key(peer.ip()), &limits) {
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
            body: super::super::body::Pace {
                timeout: Duration::from_secs(1),
                min_bytes_per_sec: 1,
            },
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
        let b1 = c.admit(b, &l).unwrap();
        drop(a1);
        assert_eq!(c.total(), 2);
        assert!(c.admit(b, &l).is_ok(), "a freed slot is free again");
        drop(b1);
    }

    #[test]
    fn at_the_cap_the_connection_idle_longest_makes_room_and_busy_ones_stay() {
        let c = Arc::new(Counts::default());
        let src = |i: u8| IpAddr::from([192, 0, 2, i]);
        let l = limits();
        let oldest = c.admit(src(1), &l).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let busy = c.admit(src(2), &l).unwrap();
        let _request = busy.activity.start();
        let newer = c.admit(src(3), &l).unwrap();
        let fourth = c.admit(src(4), &l).unwrap();
        assert!(oldest.shed.is_cancelled(), "the idlest was shed");
        assert!(!busy.shed.is_cancelled() && !newer.shed.is_cancelled());
        assert_eq!(c.total(), 3);
        drop(oldest);
        assert_eq!(c.total(), 3, "a shed slot is given back once");
        let _fifth = c.admit(src(5), &l).unwrap();
        assert!(newer.shed.is_cancelled());
        let _request4 = fourth.activity.start();
        // Left: busy, fourth (both with a request in flight) and the fifth, idle.
        let sixth = c.admit(src(6), &l).unwrap();
        let _request6 = sixth.activity.start();
        assert_eq!(
            c.admit(src(7), &l).unwrap_err(),
            "the front is at max_connections, every connection busy",
            "the sixth took the fifth's place, and no idle one is left"
        );
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

    #[test]
    fn a_connection_whose_requests_all_receive_their_bodies_is_sheddable() {
        let c = Arc::new(Counts::default());
        let src = |i: u8| IpAddr::from([192, 0, 2, i]);
        let l = limits();
        let slow = c.admit(src(1), &l).unwrap();
        let _r = slow.activity.start();
        let arriving = slow.activity.receiving();
        let busy = c.admit(src(2), &l).unwrap();
        let _b = busy.activity.start();
        let other = c.admit(src(3), &l).unwrap();
        let _o = other.activity.start();
        assert!(slow.activity.idle_for().is_none(), "not idle: a request");
        let _new = c.admit(src(4), &l).unwrap();
        assert!(slow.shed.is_cancelled(), "its body was still arriving");
        assert!(!busy.shed.is_cancelled() && !other.shed.is_cancelled());
        drop(arriving);
        assert!(slow.activity.sheddable_for().is_none(), "arrived: work");
    }
}
