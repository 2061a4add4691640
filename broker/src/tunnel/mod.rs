//! The broker's side of contract 9 (docs/tunnel.md): the tunnel endpoint every node dials,
//! a public QUIC listener that admits only the live nodes of each cluster (by the endpoint id
//! the broker gave each node's mesh key), and the streams on each node's connection:
//!
//! - `api` from a node: connected to its own cluster's apiserver on loopback, nothing else.
//!   TLS is end to end between the kubelet and the apiserver; the broker sees bytes.
//! - `connect <ip>:<port>` to a node: the apiserver's `cluster` egress, which [`egress`]
//!   serves on a per-cluster Unix socket and routes by the core's `egress::route`; also what
//!   its `controlplane` egress ([`controlplane`]) sends to an address of the cluster.

pub mod controlplane;
pub mod egress;

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use iroh::endpoint::{Connection, RecvStream, SendStream, presets};
use iroh::tls::CaTlsConfig;
use iroh::{Endpoint, EndpointId, RelayMode, RelayUrl, SecretKey};
use socialweb_wire::tunnel::{ALPN, MAX_LINE, Open, Reply};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::store::Store;

/// How long a header or reply line may take.
const LINE_WITHIN: Duration = Duration::from_secs(10);
/// How long connecting to an apiserver on loopback may take.
const DIAL_WITHIN: Duration = Duration::from_secs(5);

/// What the tunnel endpoint is built from (the `[tunnel]` section, the service address, the
/// relay and its CA).
#[derive(Debug, Clone)]
pub struct TunnelSettings {
    pub bind: SocketAddr,
    /// The IPv6 socket beside it, where the host has `service_addr_v6`.
    pub bind_v6: Option<SocketAddr>,
    pub relay_url: url::Url,
    /// The relay's CA (DER), when it is the broker's own.
    pub relay_ca: Option<Vec<u8>>,
    /// `<state_dir>/tunnel.key`: the endpoint's secret key, made once.
    pub key_file: std::path::PathBuf,
}

/// A node's connection, as admitted.
#[derive(Debug, Clone)]
pub struct Link {
    pub cluster: String,
    pub node: String,
    pub conn: Connection,
}

/// The tunnel endpoint and the nodes connected to it.
#[derive(Debug, Clone)]
pub struct Tunnels {
    inner: Arc<Inner>,
}

/// Whether this host runs a cluster now (a fleet host's: [`Tunnels::serve_only`]).
pub type RunsHere = Box<dyn Fn(&str) -> bool + Send + Sync>;

struct Inner {
    endpoint: Endpoint,
    store: Store,
    links: RwLock<HashMap<EndpointId, Link>>,
    /// In a fleet: a node of a cluster this host does not run is closed at once, and tries
    /// the next host its identity names.
    runs_here: std::sync::OnceLock<RunsHere>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("endpoint", &self.endpoint)
            .field("links", &self.links)
            .field("fleet", &self.runs_here.get().is_some())
            .finish()
    }
}

/// The endpoint's secret key: read, or made (owner-only) on first start, so that nodes'
/// identities stay valid across restarts.
fn secret_key(path: &Path) -> Result<SecretKey> {
    if let Ok(text) = std::fs::read_to_string(path) {
        let hex = text.trim();
        let mut key = [0u8; 32];
        if hex.len() != 64 {
            bail!("{}: not 64 hex digits", path.display());
        }
        for (i, b) in key.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
                .with_context(|| format!("{}: not hex", path.display()))?;
        }
        return Ok(SecretKey::from_bytes(&key));
    }
    let key: [u8; 32] = rand::random();
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    crate::pki::write_private(path, format!("{hex}\n").as_bytes(), 0o600)?;
    Ok(SecretKey::from_bytes(&key))
}

impl Tunnels {
    /// Binds the endpoint and starts admitting nodes.
    pub async fn start(
        s: &TunnelSettings,
        store: Store,
        stop: CancellationToken,
    ) -> Result<Tunnels> {
        let key = secret_key(&s.key_file)?;
        let mut b = Endpoint::builder(presets::Minimal)
            .secret_key(key)
            .alpns(vec![ALPN.to_vec()])
            .relay_mode(RelayMode::custom([RelayUrl::from(s.relay_url.clone())]))
            .clear_address_lookup()
            .clear_ip_transports()
            .bind_addr(s.bind)
            .with_context(|| format!("tunnel.port: {}", s.bind))?;
        if let Some(v6) = s.bind_v6 {
            b = b
                .bind_addr(v6)
                .with_context(|| format!("tunnel.port: {v6}"))?;
        }
        if let Some(ca) = &s.relay_ca {
            let root = rustls::pki_types::CertificateDer::from(ca.clone());
            b = b.ca_tls_config(CaTlsConfig::embedded().with_extra_roots([root]));
        }
        let endpoint = b.bind().await.context("binding the tunnel endpoint")?;
        info!(endpoint = %endpoint.id(), bind = %s.bind, bind_v6 = ?s.bind_v6, "tunnel endpoint up");
        let t = Tunnels {
            inner: Arc::new(Inner {
                endpoint,
                store,
                links: RwLock::new(HashMap::new()),
                runs_here: std::sync::OnceLock::new(),
            }),
        };
        tokio::spawn(t.clone().accept_loop(stop));
        Ok(t)
    }

    pub fn id(&self) -> EndpointId {
        self.inner.endpoint.id()
    }

    /// The node's link, if it is connected now.
    pub fn link(&self, id: &EndpointId) -> Option<Link> {
        self.inner.links.read().expect("lock").get(id).cloned()
    }

    /// Drops the links of nodes that are no longer live (released, failed): a released node
    /// keeps no way to its control plane.
    pub fn retain(&self, live: &[EndpointId]) {
        let mut links = self.inner.links.write().expect("lock");
        links.retain(|id, l| {
            let keep = live.contains(id);
            if !keep {
                info!(cluster = %l.cluster, node = %l.node, "tunnel closed: the node is no longer live");
                l.conn.close(2u32.into(), b"not a live node");
            }
            keep
        });
    }

    /// Makes this a fleet host's endpoint: it takes the nodes of the clusters `runs_here`
    /// says it runs, and no others.
    pub fn serve_only(&self, runs_here: RunsHere) {
        let _ = self.inner.runs_here.set(runs_here);
    }

    /// Closes the links of `cluster`'s nodes: this host no longer runs it (a fleet's
    /// cluster moved), and they are to find the host that does.
    pub fn close_cluster(&self, cluster: &str) {
        let mut links = self.inner.links.write().expect("lock");
        links.retain(|_, l| {
            let keep = l.cluster != cluster;
            if !keep {
                info!(cluster = %l.cluster, node = %l.node, "tunnel closed: the cluster runs elsewhere now");
                l.conn.close(3u32.into(), b"this host does not run the node's cluster");
            }
            keep
        });
    }

    pub async fn close(&self) {
        self.inner.endpoint.close().await;
    }

    async fn accept_loop(self, stop: CancellationToken) {
        loop {
            let incoming = tokio::select! {
                i = self.inner.endpoint.accept() => match i { Some(i) => i, None => return },
                _ = stop.cancelled() => return,
            };
            let me = self.clone();
            tokio::spawn(async move {
                match incoming.await {
                    Ok(conn) => me.admit(conn).await,
                    Err(e) => debug!("an incoming tunnel failed: {e}"),
                }
            });
        }
    }

    /// Admits a connection from a live node (its endpoint id is a live provision's), then
    /// serves its streams until it closes.
    async fn admit(&self, conn: Connection) {
        let id = conn.remote_id();
        let who = self.inner.store.provisions(None).await.ok().and_then(|ps| {
            ps.into_iter()
                .find(|p| p.state.live() && p.endpoint == id.to_string())
        });
        let Some(p) = who else {
            warn!(endpoint = %id, "tunnel refused: not a live node of any cluster");
            conn.close(1u32.into(), b"not a live node");
            return;
        };
        if let Some(runs_here) = self.inner.runs_here.get()
            && !runs_here(&p.cluster)
        {
            debug!(cluster = %p.cluster, node = %p.node, "tunnel refused: another host runs the cluster");
            conn.close(3u32.into(), b"this host does not run the node's cluster");
            return;
        }
        info!(cluster = %p.cluster, node = %p.node, path = %path_of(&conn), "tunnel up");
        let link = Link {
            cluster: p.cluster.clone(),
            node: p.node.clone(),
            conn: conn.clone(),
        };
        if let Some(old) = self.inner.links.write().expect("lock").insert(id, link) {
            old.conn
                .close(0u32.into(), b"replaced by a newer connection");
        }
        while let Ok((send, recv)) = conn.accept_bi().await {
            let (me, cluster) = (self.clone(), p.cluster.clone());
            tokio::spawn(async move { me.api_stream(&cluster, send, recv).await });
        }
        let mut links = self.inner.links.write().expect("lock");
        if links
            .get(&id)
            .is_some_and(|l| l.conn.stable_id() == conn.stable_id())
        {
            links.remove(&id);
        }
        info!(cluster = %p.cluster, node = %p.node, "tunnel down");
    }

    /// A node's `api` stream: to its cluster's apiserver on loopback.
    async fn api_stream(&self, cluster: &str, mut send: SendStream, mut recv: RecvStream) {
        let open = match read_line(&mut recv).await {
            Ok(l) => Open::parse(&l).map_err(|e| e.to_string()),
            Err(e) => Err(format!("{e:#}")),
        };
        let result = match open {
            Ok(Open::Api) => self.apiserver(cluster).await,
            Ok(Open::Connect(to)) => {
                Err(format!("a node may not connect to {to} through the broker"))
            }
            Err(e) => Err(format!("bad header: {e}")),
        };
        match result {
            Ok(tcp) => {
                if send.write_all(Reply::Ok.line().as_bytes()).await.is_ok() {
                    splice(tcp, send, recv).await;
                }
            }
            Err(why) => {
                warn!(cluster, "refused a node's stream: {why}");
                let _ = send.write_all(Reply::Refused(why).line().as_bytes()).await;
                let _ = send.finish();
            }
        }
    }

    async fn apiserver(&self, cluster: &str) -> Result<TcpStream, String> {
        let ports = self
            .inner
            .store
            .ports(cluster)
            .await
            .map_err(|e| format!("{e:#}"))?;
        let port = ports
            .iter()
            .find(|(p, _)| p == "api")
            .map(|(_, p)| *p)
            .ok_or_else(|| format!("cluster {cluster} has no apiserver"))?;
        let addr = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
        match tokio::time::timeout(DIAL_WITHIN, TcpStream::connect(addr)).await {
            Ok(Ok(t)) => {
                let _ = t.set_nodelay(true);
                Ok(t)
            }
            Ok(Err(e)) => Err(format!("cluster {cluster}'s apiserver: {e}")),
            Err(_) => Err(format!(
                "cluster {cluster}'s apiserver: no answer within {DIAL_WITHIN:?}"
            )),
        }
    }
}

/// `direct <addr>` or `relay <url>` for a connection's selected path.
pub fn path_of(conn: &Connection) -> String {
    let paths = conn.paths();
    match paths
        .iter()
        .find(|p| p.is_selected())
        .map(|p| p.remote_addr().clone())
    {
        Some(iroh::TransportAddr::Ip(a)) => format!("direct {a}"),
        Some(iroh::TransportAddr::Relay(u)) => format!("relay {u}"),
        Some(other) => format!("{other:?}"),
        None => "none".into(),
    }
}

/// Serves the Unix socket `socket` (mode 0600: only the broker's user, whom the apiserver
/// runs as) until `stop`, handing each connection to `one`; the socket is removed at the end.
/// The way a cluster's apiserver reaches its egresses.
pub fn serve_socket<F, Fut>(
    socket: &Path,
    what: &'static str,
    cluster: &str,
    stop: CancellationToken,
    one: F,
) -> Result<()>
where
    F: Fn(tokio::net::UnixStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = socialweb_proc::owner_only::unix_listener(socket)
        .with_context(|| format!("binding {}", socket.display()))?;
    let path = socket.to_path_buf();
    info!(%cluster, socket = %path.display(), "{what} served");
    tokio::spawn(async move {
        loop {
            let uds = tokio::select! {
                r = listener.accept() => match r {
                    Ok((s, _)) => s,
                    Err(err) => {
                        warn!("{what} socket: accept: {err}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                _ = stop.cancelled() => break,
            };
            tokio::spawn(one(uds));
        }
        let _ = std::fs::remove_file(&path);
    });
    Ok(())
}

/// Reads one header or reply line (newline included), at most [`MAX_LINE`] bytes, within
/// [`LINE_WITHIN`] (`socialweb_proc::stream`, shared with the agent's end).
pub async fn read_line(recv: &mut RecvStream) -> Result<Vec<u8>> {
    socialweb_proc::stream::read_line(recv, MAX_LINE, LINE_WITHIN).await
}

/// Copies both ways between `tcp` and a stream until both ends are done.
pub async fn splice<T>(tcp: T, send: SendStream, recv: RecvStream)
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    if let Err(e) = socialweb_proc::stream::splice(tcp, recv, send).await {
        debug!("tunnelled connection: {e}");
    }
}
