//! The relay's gate: its public TCP listener, in front of the iroh relay server, so that every
//! connection to the relay is bounded (docs/security.md).
//!
//! iroh-relay bounds none of it: no total or per-address cap (its `accept_conn_limit` is not
//! implemented), it binds its own listener, and a client that completes the WebSocket upgrade
//! and then says nothing is held for ever (the relay handshake after the upgrade has no
//! timeout). So the broker binds the relay's public address itself, and the iroh server
//! listens on loopback behind it. Each accepted connection is:
//!
//! - refused, closed at once, when its source (an IPv6 /64) already has
//!   `max_per_source`, or the relay `max_connections`. At the total cap a new connection is
//!   refused rather than taking an older one's place (the front sheds its idlest): a relay's
//!   clients are long-lived and each answers the relay's pings, so the longest idle is
//!   never a client that works, but a flood that talks a little would still push working
//!   clients out, and a node that is refused retries where one that is cut loses its paths;
//! - cut when its first bytes (the TLS ClientHello) are not in within `handshake_timeout`,
//!   before it costs the relay anything; iroh then gives it 30 s to finish TLS and the
//!   WebSocket upgrade;
//! - cut when its client has sent nothing for `idle_timeout`: a registered client answers
//!   the relay's pings (every 15-20 s), so only stalled handshakes and dead peers meet it.
//!
//! An admitted connection is carried byte for byte to the iroh server's loopback listener
//! (TLS passes through; iroh terminates it). That costs two more descriptors and a copy on
//! loopback per connection; iroh's `RelayService::handle_connection` would take the socket
//! itself, but it hands the connection to iroh's client registry and returns at the upgrade,
//! so nothing could tell when it ends or that it went quiet. iroh's logs name the gate's
//! loopback address as the peer; the gate logs (at debug) which client that was.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// The gate's bounds (`[relay]` in the configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_connections: usize,
    pub max_per_source: usize,
    pub handshake_timeout: Duration,
    pub idle_timeout: Duration,
}

/// Descriptors one connection takes: the client's socket, and both ends of its loopback
/// connection to the iroh server.
const DESCRIPTORS_PER_CONNECTION: usize = 3;

/// How often a refusal is logged at warn (with the count since); each is logged at debug.
const WARN_EVERY: Duration = Duration::from_secs(60);

impl Limits {
    /// `max_connections` kept so that the relay's descriptors stay under 10% of the process's
    /// open-file limit: the front may take 80% (`front::listener::Limits::within_fd_limit`),
    /// and the rest of the daemon needs some.
    pub fn within_fd_limit(mut self) -> Limits {
        if let Ok((soft, _)) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        {
            let cap = usize::try_from(soft).unwrap_or(usize::MAX) / 10 / DESCRIPTORS_PER_CONNECTION;
            if cap < self.max_connections {
                warn!(
                    max_connections = self.max_connections,
                    open_files = soft,
                    "relay.max_connections lowered to {cap}: its connections' descriptors \
                     (3 each) within 10% of the open-file limit"
                );
                self.max_connections = cap.max(1);
                self.max_per_source = self.max_per_source.min(self.max_connections);
            }
        }
        self
    }
}

/// Why a connection was refused at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    PerSource,
    Total,
}

impl Refusal {
    /// Its name in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::PerSource => "per_source",
            Refusal::Total => "total",
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refusal::PerSource => "this address is at relay.max_connections_per_source",
            Refusal::Total => "the relay is at relay.max_connections",
        })
    }
}

/// Why an admitted connection was cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// No first bytes within `handshake_timeout`.
    Handshake,
    /// Nothing from the client for `idle_timeout`.
    Idle,
}

impl Cut {
    /// Its name in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Cut::Handshake => "handshake",
            Cut::Idle => "idle",
        }
    }
}

/// What the gate reports as it goes (the daemon counts it in its metrics; the relay on its
/// own, `socialweb-broker relay`, reports nowhere: `()`).
pub trait Observe: Send + Sync + 'static {
    /// A connection was admitted (`true`) or has ended (`false`).
    fn held(&self, _admitted: bool) {}
    fn refused(&self, _why: Refusal) {}
    fn cut(&self, _why: Cut) {}
}

impl Observe for () {}

/// The connections open now, in all and by source.
#[derive(Debug, Default)]
struct Counts {
    open: Mutex<Open>,
}

#[derive(Debug, Default)]
struct Open {
    total: usize,
    by_source: HashMap<IpAddr, usize>,
}

/// One connection's place in [`Counts`], given back when dropped.
struct Slot {
    counts: Arc<Counts>,
    source: IpAddr,
    observe: Arc<dyn Observe>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.counts.open.lock().expect("lock");
        open.total -= 1;
        if let Some(n) = open.by_source.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                open.by_source.remove(&self.source);
            }
        }
        drop(open);
        self.observe.held(false);
    }
}

impl Counts {
    fn admit(
        self: &Arc<Self>,
        source: IpAddr,
        l: &Limits,
        observe: &Arc<dyn Observe>,
    ) -> Result<Slot, Refusal> {
        let mut open = self.open.lock().expect("lock");
        if open.by_source.get(&source).copied().unwrap_or(0) >= l.max_per_source {
            return Err(Refusal::PerSource);
        }
        if open.total >= l.max_connections {
            return Err(Refusal::Total);
        }
        open.total += 1;
        *open.by_source.entry(source).or_insert(0) += 1;
        drop(open);
        observe.held(true);
        Ok(Slot {
            counts: self.clone(),
            source,
            observe: observe.clone(),
        })
    }
}

/// Refusals logged at warn at most once per [`WARN_EVERY`]: a flood would otherwise be a
/// flood of log lines too.
#[derive(Debug, Default)]
struct Quiet {
    state: Mutex<(Option<Instant>, u64)>,
}

impl Quiet {
    fn refused(&self, peer: SocketAddr, why: Refusal) {
        debug!(%peer, "relay connection refused: {why}");
        let mut s = self.state.lock().expect("lock");
        if s.0.is_some_and(|t| t.elapsed() < WARN_EVERY) {
            s.1 += 1;
            return;
        }
        let since = std::mem::take(&mut s.1);
        s.0 = Some(Instant::now());
        drop(s);
        warn!(
            %peer,
            refused_since_last_warning = since,
            "relay connection refused: {why} (refusals are logged here at most once a \
             minute; socialweb_broker_relay_connections_refused_total counts each)"
        );
    }
}

/// The gate: its limits and whom it reports to.
#[derive(Clone)]
pub struct Gate {
    pub limits: Limits,
    pub observe: Arc<dyn Observe>,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("limits", &self.limits)
            .finish()
    }
}

impl Gate {
    /// A gate with `limits` (kept within the open-file limit), reporting to `observe`.
    pub fn new(limits: Limits, observe: Arc<dyn Observe>) -> Gate {
        if limits.idle_timeout < Duration::from_secs(30) {
            warn!(
                idle_timeout = ?limits.idle_timeout,
                "relay.idle_timeout is under 30 s: the relay pings its clients every 15-20 s, \
                 so clients that work will be cut between pings"
            );
        }
        Gate {
            limits: limits.within_fd_limit(),
            observe,
        }
    }

    /// Binds `bind` and carries each connection it admits to `upstream` until `stop`;
    /// returns the address bound and the accepting task.
    pub async fn open(
        self,
        bind: SocketAddr,
        upstream: SocketAddr,
        stop: CancellationToken,
    ) -> Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
        let listener = TcpListener::bind(bind)
            .await
            .with_context(|| format!("binding the relay's address {bind}"))?;
        let bound = listener.local_addr()?;
        Ok((
            bound,
            tokio::spawn(self.accept_loop(listener, upstream, stop)),
        ))
    }

    async fn accept_loop(
        self,
        listener: TcpListener,
        upstream: SocketAddr,
        stop: CancellationToken,
    ) {
        let counts = Arc::new(Counts::default());
        let quiet = Quiet::default();
        loop {
            let (tcp, peer) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(x) => x,
                    Err(e) => {
                        // Out of file descriptors, most likely: let some close first.
                        warn!("relay: accept: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                _ = stop.cancelled() => return,
            };
            let source = socialweb_broker_core::source::source_key(peer.ip());
            match counts.admit(source, &self.limits, &self.observe) {
                Ok(slot) => {
                    let (limits, observe, stop) = (self.limits, self.observe.clone(), stop.clone());
                    tokio::spawn(async move {
                        tokio::select! {
                            _ = carry(tcp, peer, upstream, &limits, observe.as_ref()) => {}
                            _ = stop.cancelled() => {}
                        }
                        drop(slot);
                    });
                }
                Err(why) => {
                    self.observe.refused(why);
                    quiet.refused(peer, why);
                    drop(tcp);
                }
            }
        }
    }
}

/// One admitted connection: its first bytes within the handshake timeout, then carried to
/// `upstream` until either side closes or the client goes quiet.
async fn carry(
    client: TcpStream,
    peer: SocketAddr,
    upstream: SocketAddr,
    l: &Limits,
    observe: &dyn Observe,
) {
    let mut first = [0u8; 1];
    match tokio::time::timeout(l.handshake_timeout, client.peek(&mut first)).await {
        Err(_) => {
            debug!(%peer, "relay connection cut: no handshake within {:?}", l.handshake_timeout);
            observe.cut(Cut::Handshake);
            return;
        }
        Ok(Ok(0)) | Ok(Err(_)) => return,
        Ok(Ok(_)) => {}
    }
    let relay = match tokio::time::timeout(l.handshake_timeout, TcpStream::connect(upstream)).await
    {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            warn!(%peer, "relay: connecting to the relay server at {upstream}: {e}");
            return;
        }
        Err(_) => {
            warn!(%peer, "relay: the relay server at {upstream} did not accept in time");
            return;
        }
    };
    let _ = (client.set_nodelay(true), relay.set_nodelay(true));
    debug!(%peer, via = ?relay.local_addr().ok(), "relay connection carried");
    match splice(client, relay, l.idle_timeout).await {
        Ok(End::Idle) => {
            debug!(%peer, "relay connection cut: nothing from the client for {:?}", l.idle_timeout);
            observe.cut(Cut::Idle);
        }
        Ok(End::Closed) => debug!(%peer, "relay connection closed"),
        Err(e) => debug!(%peer, "relay connection ended: {e}"),
    }
}

/// How a spliced connection ended.
#[derive(Debug, PartialEq, Eq)]
enum End {
    /// Either side closed.
    Closed,
    /// The client sent nothing for the idle timeout.
    Idle,
}

/// Carries bytes both ways between `client` and `relay` until the relay closes, the client
/// has closed and the relay has answered, or the client sends nothing for `idle`.
async fn splice(client: TcpStream, relay: TcpStream, idle: Duration) -> io::Result<End> {
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_relay, mut to_relay) = relay.into_split();
    // Client to relay by hand: every read is under the idle timeout, and only the client's
    // silence counts (a relay slow to take bytes is not the client's).
    let inbound = async {
        let mut buf = vec![0u8; 8 * 1024];
        loop {
            let n = match tokio::time::timeout(idle, from_client.read(&mut buf)).await {
                Err(_) => return Ok::<End, io::Error>(End::Idle),
                Ok(r) => r?,
            };
            if n == 0 {
                to_relay.shutdown().await?;
                return Ok(End::Closed);
            }
            to_relay.write_all(&buf[..n]).await?;
        }
    };
    let outbound = async {
        tokio::io::copy(&mut from_relay, &mut to_client).await?;
        to_client.shutdown().await
    };
    tokio::pin!(inbound, outbound);
    tokio::select! {
        r = &mut inbound => match r? {
            // The client is done sending: the relay's answer may still be on its way.
            End::Closed => match tokio::time::timeout(idle, &mut outbound).await {
                Ok(r) => r.map(|_| End::Closed),
                Err(_) => Ok(End::Closed),
            },
            End::Idle => Ok(End::Idle),
        },
        r = &mut outbound => r.map(|_| End::Closed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            max_connections: 3,
            max_per_source: 2,
            handshake_timeout: Duration::from_millis(300),
            idle_timeout: Duration::from_millis(500),
        }
    }

    #[test]
    fn connections_are_counted_in_all_and_by_source_and_given_back() {
        let c = Arc::new(Counts::default());
        let o: Arc<dyn Observe> = Arc::new(());
        let src = |i: u8| IpAddr::from([192, 0, 2, i]);
        let l = limits();
        let a1 = c.admit(src(1), &l, &o).unwrap();
        let _a2 = c.admit(src(1), &l, &o).unwrap();
        assert_eq!(c.admit(src(1), &l, &o).err(), Some(Refusal::PerSource));
        let _b1 = c.admit(src(2), &l, &o).unwrap();
        assert_eq!(c.admit(src(3), &l, &o).err(), Some(Refusal::Total));
        drop(a1);
        assert!(
            c.admit(src(3), &l, &o).is_ok(),
            "a freed place is free again"
        );
        assert!(c.admit(src(1), &l, &o).is_ok(), "and its source's too");
    }

    /// An echo server standing for the iroh relay server.
    async fn echo() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    /// Reads until the gate closes `s` (or `within` passes: `false`).
    async fn closed(s: &mut TcpStream, within: Duration) -> bool {
        let mut buf = [0u8; 64];
        loop {
            match tokio::time::timeout(within, s.read(&mut buf)).await {
                Err(_) => return false,
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => {}
            }
        }
    }

    #[tokio::test]
    async fn the_gate_carries_bytes_refuses_past_its_caps_and_cuts_the_silent() {
        let stop = CancellationToken::new();
        let gate = Gate::new(limits(), Arc::new(()));
        let (addr, _task) = gate
            .open("127.0.0.1:0".parse().unwrap(), echo().await, stop.clone())
            .await
            .unwrap();
        let mut talker = TcpStream::connect(addr).await.unwrap();
        talker.write_all(b"hello").await.unwrap();
        let mut back = [0u8; 5];
        talker.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"hello", "carried both ways");
        // A second from this address is held (and says nothing); a third is closed at once.
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let mut third = TcpStream::connect(addr).await.unwrap();
        assert!(closed(&mut third, Duration::from_millis(200)).await);
        // The silent one is cut at the handshake timeout (300 ms).
        let t = Instant::now();
        assert!(closed(&mut silent, Duration::from_secs(5)).await);
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        // The talker, quiet now, is cut at the idle timeout (500 ms).
        assert!(closed(&mut talker, Duration::from_secs(5)).await);
        stop.cancel();
    }
}
