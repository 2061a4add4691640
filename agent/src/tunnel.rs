//! The node's way to its control plane (contract 9, docs/tunnel.md): one QUIC connection from
//! the node's mesh endpoint to the broker's tunnel endpoint, kept up for as long as the agent
//! runs, and every TCP connection either side needs carried as one stream on it.
//!
//! - The apiserver, node-local: the agent listens on `server_url`'s address (169.254.20.11 on
//!   the node) and on the `kubernetes` Service's endpoint (100.100.20.11: Endpoints refuse
//!   link-local addresses), and each connection the kubelet,
//!   kube-proxy, the agent itself or a Pod opens there becomes an `api` stream to the broker,
//!   which connects it to this cluster's apiserver. TLS stays end to end.
//! - The apiserver's `cluster` egress: the broker opens `connect <ip>:<port>` streams (logs,
//!   exec, attach, port-forward, proxy, webhooks) and the agent dials the destination here,
//!   only inside what [`Allow`] admits; a refusal names the destination and the reason, and
//!   nothing ever falls back to another way.
//!
//! The node dials; nothing dials the node (it may sit behind NAT). In a fleet of broker hosts
//! the identity names each host's endpoint: the node keeps to the one that takes it (the
//! host running its cluster; another closes the connection at once), and when that one
//! closes or does not answer, tries the next in turn.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use arc_swap::ArcSwapOption;
use ipnet::IpNet;
use iroh::endpoint::{Connection, RecvStream, SendStream};
use iroh::{Endpoint, EndpointAddr, EndpointId, RelayUrl};
use serde::{Deserialize, Serialize};
use socialweb_wire::BrokerEndpoint;
use socialweb_wire::tunnel::{ALPN, Allow, MAX_LINE, Open, Reply};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use url::Url;

/// How long a header or a reply may take.
const LINE_WITHIN: Duration = Duration::from_secs(10);
/// How long dialling a destination for the broker may take.
const DIAL_WITHIN: Duration = Duration::from_secs(5);
/// How long a local connection waits for the tunnel to be up before it is closed.
const WAIT_FOR_TUNNEL: Duration = Duration::from_secs(10);

/// What the tunnel is built from.
#[derive(Debug, Clone)]
pub struct TunnelConfig {
    /// The broker's endpoint, then the fleet's other hosts' (the identity's `fleet`).
    pub brokers: Vec<BrokerEndpoint>,
    /// Every relay (the identity's `relay_url`, then `fleet_relays`): a host's tunnel
    /// endpoint is at home on its own host's relay, so each broker is dialed on all.
    pub relays: Vec<Url>,
    /// Where the apiserver is offered on the node: `server_url`'s address, and the
    /// `kubernetes` Service's endpoint (both must be on the node already).
    pub listen: Vec<SocketAddr>,
    /// This node's address; the service CIDR (the pod CIDR comes later, with the Node).
    pub node_ip: std::net::IpAddr,
    pub service_cidr: IpNet,
}

/// The tunnel as `socialweb-agent status` shows it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TunnelStatus {
    pub broker: String,
    pub listen: String,
    pub connected: bool,
    /// `direct <addr>` or `relay <url>`.
    pub path: String,
    /// Connections since the agent started (a reconnect after a cut adds one).
    pub connections: u64,
    pub api_streams: u64,
    pub connect_streams: u64,
    pub connects_refused: u64,
    pub last_error: Option<String>,
}

/// The running tunnel.
#[derive(Debug, Clone)]
pub struct Tunnel {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    cfg: TunnelConfig,
    /// `cfg.brokers`' endpoint ids.
    brokers: Vec<EndpointId>,
    /// The one dialled now.
    current: AtomicUsize,
    endpoint: Endpoint,
    conn: ArcSwapOption<Connection>,
    up: watch::Sender<bool>,
    pod_cidr: Mutex<Option<IpNet>>,
    connections: AtomicU64,
    api_streams: AtomicU64,
    connect_streams: AtomicU64,
    refused: AtomicU64,
    last_error: Mutex<Option<String>>,
    stop: CancellationToken,
}

impl Tunnel {
    /// Binds the local apiserver listener (its address must be on the node already) and
    /// starts keeping the connection to the broker up, on the mesh's `endpoint`.
    pub async fn start(endpoint: Endpoint, cfg: TunnelConfig) -> Result<Tunnel> {
        let mut listeners = Vec::new();
        for a in &cfg.listen {
            listeners.push(
                TcpListener::bind(a)
                    .await
                    .with_context(|| format!("listening on {a} for the apiserver"))?,
            );
        }
        let brokers = cfg
            .brokers
            .iter()
            .map(|b| EndpointId::from_bytes(&b.endpoint))
            .collect::<Result<Vec<_>, _>>()
            .context("the identity's broker.endpoint is not an endpoint id")?;
        if brokers.is_empty() {
            bail!("the tunnel needs a broker endpoint");
        }
        let t = Tunnel {
            inner: Arc::new(Inner {
                cfg,
                brokers,
                current: AtomicUsize::new(0),
                endpoint,
                conn: ArcSwapOption::empty(),
                up: watch::channel(false).0,
                pod_cidr: Mutex::new(None),
                connections: AtomicU64::new(0),
                api_streams: AtomicU64::new(0),
                connect_streams: AtomicU64::new(0),
                refused: AtomicU64::new(0),
                last_error: Mutex::new(None),
                stop: CancellationToken::new(),
            }),
        };
        tokio::spawn(t.clone().keep_connected());
        for l in listeners {
            tokio::spawn(t.clone().serve_local(l));
        }
        Ok(t)
    }

    /// Waits until the broker is connected, at most `within`.
    pub async fn wait_connected(&self, within: Duration) -> Result<()> {
        let mut up = self.inner.up.subscribe();
        match tokio::time::timeout(within, up.wait_for(|u| *u)).await {
            Ok(Ok(_)) => Ok(()),
            _ => bail!(
                "no connection to the broker {} within {within:?}: {}",
                self.broker().fmt_short(),
                self.inner
                    .last_error
                    .lock()
                    .expect("lock")
                    .clone()
                    .unwrap_or_else(|| "no answer".into())
            ),
        }
    }

    /// This node's pod CIDR, once allocated: the broker may then dial Pods here.
    pub fn set_pod_cidr(&self, cidr: IpNet) {
        *self.inner.pod_cidr.lock().expect("lock") = Some(cidr);
    }

    pub fn status(&self) -> TunnelStatus {
        let i = &self.inner;
        let conn = i.conn.load_full();
        TunnelStatus {
            broker: self.broker().to_string(),
            listen: i
                .cfg
                .listen
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            connected: conn.is_some(),
            path: conn
                .as_ref()
                .map(|c| crate::mesh::path_of(c))
                .unwrap_or_else(|| "none".into()),
            connections: i.connections.load(Ordering::Relaxed),
            api_streams: i.api_streams.load(Ordering::Relaxed),
            connect_streams: i.connect_streams.load(Ordering::Relaxed),
            connects_refused: i.refused.load(Ordering::Relaxed),
            last_error: i.last_error.lock().expect("lock").clone(),
        }
    }

    pub fn shutdown(&self) {
        self.inner.stop.cancel();
        if let Some(c) = self.inner.conn.swap(None) {
            c.close(0u32.into(), b"agent shutting down");
        }
    }

    fn set_error(&self, e: impl std::fmt::Display) {
        *self.inner.last_error.lock().expect("lock") = Some(e.to_string());
    }

    /// The broker host dialled now.
    fn broker(&self) -> EndpointId {
        let i = &self.inner;
        i.brokers[i.current.load(Ordering::Relaxed) % i.brokers.len()]
    }

    /// On to the next broker host, if there are others.
    fn next_broker(&self) {
        let i = &self.inner;
        if i.brokers.len() > 1 {
            let n = (i.current.load(Ordering::Relaxed) + 1) % i.brokers.len();
            i.current.store(n, Ordering::Relaxed);
        }
    }

    fn broker_addr(&self) -> EndpointAddr {
        let cfg = &self.inner.cfg;
        let at = self.inner.current.load(Ordering::Relaxed) % cfg.brokers.len();
        let mut a = EndpointAddr::new(self.broker());
        for r in &cfg.relays {
            a = a.with_relay_url(RelayUrl::from(r.clone()));
        }
        for d in &cfg.brokers[at].addrs {
            a = a.with_ip_addr(*d);
        }
        a
    }

    /// Dials the broker, serves the connection until it ends, and dials again (250 ms
    /// doubling to 5 s between attempts), until the agent stops. With a fleet, every ended
    /// connection or failed dial moves on to the next broker host (one that does not run
    /// this node's cluster closes the connection at once; one that died does not answer),
    /// a dial waits 3 s instead of 10 before it moves on, and attempts are at most 1 s
    /// apart.
    async fn keep_connected(self) {
        // With several hosts, each refusal or silence is one host's, not the fleet's: the
        // next is tried soon.
        let (within, most) = if self.inner.brokers.len() > 1 {
            (Duration::from_secs(3), Duration::from_secs(1))
        } else {
            (Duration::from_secs(10), Duration::from_secs(5))
        };
        let mut backoff = crate::backoff::Backoff::new(Duration::from_millis(250), most);
        while !self.inner.stop.is_cancelled() {
            let dial = self.inner.endpoint.connect(self.broker_addr(), ALPN);
            let attempt = tokio::select! {
                r = tokio::time::timeout(within, dial) => r,
                _ = self.inner.stop.cancelled() => return,
            };
            match attempt {
                Ok(Ok(conn)) => {
                    let since = std::time::Instant::now();
                    self.serve(conn).await;
                    // Only a connection that lasted counts as a success (one closed at once
                    // is a host that does not take this node).
                    if since.elapsed() > Duration::from_secs(5) {
                        backoff.reset();
                    }
                }
                Ok(Err(e)) => self.set_error(format!("connecting to the broker: {e}")),
                Err(_) => self.set_error(format!(
                    "connecting to the broker: timed out after {within:?}"
                )),
            }
            self.next_broker();
            tokio::select! {
                _ = tokio::time::sleep(backoff.next_delay()) => {}
                _ = self.inner.stop.cancelled() => return,
            }
        }
    }

    /// One connection's life: the streams the broker opens, until it closes.
    async fn serve(&self, conn: Connection) {
        let conn = Arc::new(conn);
        let n = self.inner.connections.fetch_add(1, Ordering::Relaxed) + 1;
        info!(broker = %self.broker().fmt_short(), path = %crate::mesh::path_of(&conn), connection = n, "tunnel to the broker up");
        self.inner.conn.store(Some(conn.clone()));
        self.inner.up.send_replace(true);
        loop {
            let (send, recv) = tokio::select! {
                r = conn.accept_bi() => match r {
                    Ok(s) => s,
                    Err(e) => {
                        self.set_error(format!("the tunnel closed: {e}"));
                        break;
                    }
                },
                _ = self.inner.stop.cancelled() => break,
            };
            let me = self.clone();
            tokio::spawn(async move { me.answer(send, recv).await });
        }
        self.inner.up.send_replace(false);
        self.inner.conn.store(None);
        warn!("tunnel to the broker down; dialling again");
    }

    /// A stream the broker opened: dial what it names, if this node allows it.
    async fn answer(&self, mut send: SendStream, mut recv: RecvStream) {
        self.inner.connect_streams.fetch_add(1, Ordering::Relaxed);
        let open = match read_line(&mut recv).await {
            Ok(line) => Open::parse(&line).map_err(|e| e.to_string()),
            Err(e) => Err(format!("{e:#}")),
        };
        let to = match open {
            Ok(Open::Connect(to)) => to,
            Ok(Open::Api) => {
                return self
                    .refuse(&mut send, "a node serves no api streams".into())
                    .await;
            }
            Err(e) => return self.refuse(&mut send, format!("bad header: {e}")).await,
        };
        let allow = Allow {
            node_ip: self.inner.cfg.node_ip,
            pod_cidr: *self.inner.pod_cidr.lock().expect("lock"),
            service_cidr: self.inner.cfg.service_cidr,
        };
        if let Err(why) = allow.check(to) {
            return self.refuse(&mut send, why).await;
        }
        let tcp = match tokio::time::timeout(DIAL_WITHIN, TcpStream::connect(to)).await {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => return self.refuse(&mut send, format!("{to}: {e}")).await,
            Err(_) => {
                let why = format!("{to}: no answer within {DIAL_WITHIN:?}");
                return self.refuse(&mut send, why).await;
            }
        };
        if send.write_all(Reply::Ok.line().as_bytes()).await.is_err() {
            return;
        }
        debug!(%to, "connect stream from the broker");
        splice(tcp, send, recv).await;
    }

    async fn refuse(&self, send: &mut SendStream, why: String) {
        self.inner.refused.fetch_add(1, Ordering::Relaxed);
        warn!("refused the broker's connect: {why}");
        let _ = send.write_all(Reply::Refused(why).line().as_bytes()).await;
        let _ = send.finish();
    }

    /// The node-local apiserver: every connection becomes an `api` stream.
    async fn serve_local(self, listener: TcpListener) {
        loop {
            let tcp = tokio::select! {
                r = listener.accept() => match r {
                    Ok((tcp, _)) => tcp,
                    Err(e) => {
                        warn!("accepting for the apiserver: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                _ = self.inner.stop.cancelled() => return,
            };
            let me = self.clone();
            tokio::spawn(async move {
                if let Err(e) = me.carry_api(tcp).await {
                    debug!("an apiserver connection through the tunnel ended: {e:#}");
                }
            });
        }
    }

    async fn carry_api(&self, tcp: TcpStream) -> Result<()> {
        let _ = tcp.set_nodelay(true);
        let mut up = self.inner.up.subscribe();
        tokio::time::timeout(WAIT_FOR_TUNNEL, up.wait_for(|u| *u))
            .await
            .context("the tunnel to the broker is down")??;
        let conn = self
            .inner
            .conn
            .load_full()
            .context("the tunnel to the broker is down")?;
        let (mut send, mut recv) = conn.open_bi().await.context("opening a stream")?;
        self.inner.api_streams.fetch_add(1, Ordering::Relaxed);
        send.write_all(Open::Api.line().as_bytes()).await?;
        match Reply::parse(&read_line(&mut recv).await?)? {
            Reply::Ok => {}
            Reply::Refused(why) => bail!("the broker refused the apiserver stream: {why}"),
        }
        splice(tcp, send, recv).await;
        Ok(())
    }
}

/// Reads one header or reply line (newline included), at most [`MAX_LINE`] bytes, within
/// [`LINE_WITHIN`] (`socialweb_proc::stream`, shared with the broker's end).
pub async fn read_line(recv: &mut RecvStream) -> Result<Vec<u8>> {
    socialweb_proc::stream::read_line(recv, MAX_LINE, LINE_WITHIN).await
}

/// Copies both ways between a TCP connection and a stream until both ends are done.
async fn splice(tcp: TcpStream, send: SendStream, recv: RecvStream) {
    if let Err(e) = socialweb_proc::stream::splice(tcp, recv, send).await {
        debug!("tunnelled connection: {e}");
    }
}
