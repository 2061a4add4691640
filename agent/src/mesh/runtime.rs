//! The mesh at run time: peers from the directory, one QUIC connection per peer (the endpoint
//! with the smaller id dials, the other accepts), a kernel route per connected peer, and the
//! two data paths between the TUN device and the connections.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use arc_swap::{ArcSwap, ArcSwapOption};
use ipnet::IpNet;
use iroh::endpoint::Connection;
use iroh::{Endpoint, EndpointId, TransportAddr};
use socialweb_netlink::Handle;
use socialweb_wire::mesh::CLOSE_NOT_A_PEER;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use url::Url;

use socialweb_mesh_core::directory::{NodeEntry, View};
use socialweb_mesh_core::filter::{DropReason, NodeAddrs, Routes};
use socialweb_mesh_core::peers;
use socialweb_mesh_core::refusals::Refusals;

use super::queue::{Clock, Inbound, Outbound, PeerQueue};
use super::stats::{Drops, Flow, MeshStatus, PeerStatus, RouteStatus};
use super::{routes, transport};

mod recv;
mod send;

/// How long a refused endpoint may take to appear in the directory and count as a peer that
/// dialled early rather than a stranger. Directory sources on two nodes lag each other by
/// well under a second (one API watch each, or one file polled every 500 ms).
const REFUSAL_WINDOW: Duration = Duration::from_secs(10);
/// Refusals waiting for that at once (a flood of strangers beyond it is counted at once).
const REFUSALS_PENDING_MAX: usize = 1024;

/// How the mesh is set up.
#[derive(Debug, Clone)]
pub struct MeshConfig {
    pub node: String,
    pub endpoint: transport::EndpointConfig,
    pub tun_name: String,
    pub mtu: u16,
    /// This node's address in the cluster (the identity's `node_ip`), which peers reach over
    /// the mesh and which is the source of what the node itself sends into it.
    pub node_ip: Option<IpAddr>,
}

/// This node's own place in the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Own {
    cidr: IpNet,
    gateway: IpAddr,
    node_ip: Option<IpAddr>,
}

impl Own {
    fn addrs(&self) -> NodeAddrs {
        NodeAddrs {
            pod_cidr: self.cidr,
            node_ip: self.node_ip,
        }
    }

    /// The source of what this node sends into the mesh itself (hostNetwork, the kubelet,
    /// kube-proxy's SNAT): its node address when it has one, else its pod gateway.
    fn source(&self) -> IpAddr {
        self.node_ip.unwrap_or(self.gateway)
    }
}

fn peer_addrs(e: &NodeEntry) -> NodeAddrs {
    NodeAddrs {
        pod_cidr: e.pod_cidr,
        node_ip: e.node_ip,
    }
}

/// A peer and its connection.
#[derive(Debug)]
struct PeerSlot {
    entry: NodeEntry,
    id: EndpointId,
    conn: ArcSwapOption<Connection>,
    tx: Flow,
    rx: Flow,
    drops: Drops,
    /// Packets waiting for the connection (TUN to peer).
    out_q: PeerQueue<Outbound>,
    /// Packets from the peer waiting for the TUN.
    in_q: PeerQueue<Inbound>,
    /// The largest datagram the current connection carries (0: no connection), read from
    /// the connection now and then rather than per packet (that takes its lock).
    max_datagram: AtomicUsize,
    /// Times the sender found the connection's datagram send buffer full and waited.
    send_waits: AtomicU64,
    last_error: Mutex<Option<String>>,
    since: Mutex<Option<Instant>>,
    /// Cancelled when the peer leaves the directory.
    gone: CancellationToken,
}

impl PeerSlot {
    fn set_error(&self, e: impl std::fmt::Display) {
        *self.last_error.lock().expect("lock") = Some(e.to_string());
    }

    /// Reads the connection's largest datagram again, keeps it and returns it.
    fn refresh_max_datagram(&self, conn: &Connection) -> usize {
        let max = conn.max_datagram_size().unwrap_or(0);
        self.max_datagram.store(max, Ordering::Relaxed);
        max
    }

    /// The largest datagram the peer's current connection carries now (0: no connection),
    /// read from the connection, not the kept value. What a packet is refused against, and
    /// what `mesh status` shows, so that the two always agree.
    fn current_max_datagram(&self) -> usize {
        match self.conn.load().as_ref() {
            Some(conn) => self.refresh_max_datagram(conn),
            None => 0,
        }
    }
}

/// Everything the data path reads, swapped as a whole when the directory changes.
#[derive(Debug, Default)]
struct State {
    own: Option<Own>,
    by_node: BTreeMap<String, Arc<PeerSlot>>,
    by_endpoint: HashMap<EndpointId, Arc<PeerSlot>>,
    routes: Routes<Arc<PeerSlot>>,
    rejected: Vec<(String, String)>,
}

/// The running mesh.
#[derive(Debug, Clone)]
pub struct Mesh {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: MeshConfig,
    endpoint: Endpoint,
    tun: super::tun::Tun,
    tun_index: u32,
    nl: Handle,
    state: ArcSwap<State>,
    /// Serialises directory updates (the data path never takes it).
    update: tokio::sync::Mutex<()>,
    drops: Drops,
    /// Connections refused for an endpoint the directory did not list.
    refusals: Mutex<Refusals>,
    /// What the queues judge waiting times by.
    clock: Clock,
    shutdown: CancellationToken,
    /// The runtime every task of the mesh runs on (stopped when the mesh is dropped).
    rt: super::thread::MeshRuntime,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mesh")
            .field("node", &self.cfg.node)
            .field("tun", &self.cfg.tun_name)
            .finish()
    }
}

impl Mesh {
    /// Starts the mesh's runtime, and on it creates the TUN device, binds the endpoint and
    /// starts the accept loop and the TUN reader. Peers come with [`Mesh::apply`].
    pub async fn start(cfg: MeshConfig) -> Result<Mesh> {
        let tuning = cfg.endpoint.tuning;
        let rt = super::thread::start(
            tuning.threads,
            super::thread::Scheduling {
                realtime: tuning.realtime,
                nice: tuning.nice,
            },
        )?;
        let handle = rt.handle.clone();
        handle
            .spawn(Mesh::start_on(cfg, rt))
            .await
            .context("the mesh's runtime stopped")?
    }

    async fn start_on(cfg: MeshConfig, rt: super::thread::MeshRuntime) -> Result<Mesh> {
        let tun = super::tun::open(&cfg.tun_name, cfg.mtu)?;
        let nl = routes::handle().await?;
        let tun_index = routes::link_index(&nl, &cfg.tun_name).await?;
        // The TUN is IPv4-only (pod CIDRs are); keep the kernel's IPv6 chatter (router
        // solicitations, MLD) off it, before it comes up.
        let _ = std::fs::write(
            format!("/proc/sys/net/ipv6/conf/{}/disable_ipv6", cfg.tun_name),
            "1",
        );
        socialweb_netlink::link::set_up(&nl, tun_index, &cfg.tun_name)
            .await
            .context("bringing the TUN device up")?;
        // The node's cluster address lives on the TUN: the kubelet serves on it, and what the
        // node sends into the mesh from elsewhere (kube-proxy's masquerade of NodePort traffic
        // to a remote Pod) takes it as its source -- a TUN without an address would lend the
        // masquerade some other address, which the peer refuses as spoofed.
        if let Some(IpAddr::V4(ip)) = cfg.node_ip {
            socialweb_netlink::addr::ensure_v4(&nl, tun_index, ip, 32)
                .await
                .with_context(|| format!("putting the node address {ip} on the TUN"))?;
        }
        // Routes a crashed run left behind point at a device that no longer exists and are
        // gone with it; nothing else to clean.
        routes::enable_forwarding()?;
        let mut cfg = cfg;
        if cfg.endpoint.bind.ip().is_unspecified() {
            let ip = routes::default_source_v4(&nl).await?;
            cfg.endpoint.bind.set_ip(ip.into());
            info!(addr = %cfg.endpoint.bind, "mesh binds the default route's address");
            if let Some(v6) = routes::default_source_v6(&nl).await? {
                let v6 = SocketAddr::new(v6.into(), cfg.endpoint.bind.port());
                info!(addr = %v6, "and the IPv6 default route's");
                cfg.endpoint.bind_v6 = Some(v6);
            }
        }
        let endpoint = transport::bind(&cfg.endpoint).await?;
        info!(endpoint = %endpoint.id(), tun = %cfg.tun_name, mtu = cfg.mtu, "mesh endpoint up");
        let mesh = Mesh {
            inner: Arc::new(Inner {
                cfg,
                endpoint,
                tun,
                tun_index,
                nl,
                state: ArcSwap::from_pointee(State::default()),
                update: tokio::sync::Mutex::new(()),
                drops: Drops::default(),
                refusals: Mutex::new(Refusals::new(REFUSAL_WINDOW, REFUSALS_PENDING_MAX)),
                clock: Clock::new(),
                shutdown: CancellationToken::new(),
                rt,
            }),
        };
        mesh.spawn(mesh.clone().accept_loop());
        mesh.spawn(mesh.clone().tun_loop());
        Ok(mesh)
    }

    /// Runs a task on the mesh's runtime, whichever runtime asks.
    fn spawn<F>(&self, task: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.inner.rt.handle.spawn(task);
    }

    pub fn endpoint_id(&self) -> EndpointId {
        self.inner.endpoint.id()
    }

    /// The endpoint, which the tunnel to the broker shares (one identity, one socket, one
    /// relay connection per node).
    pub fn endpoint(&self) -> Endpoint {
        self.inner.endpoint.clone()
    }

    /// The UDP addresses the endpoint is bound to.
    pub fn bound_addrs(&self) -> Vec<std::net::SocketAddr> {
        self.inner.endpoint.bound_sockets()
    }

    /// Brings the peers in line with a directory view ([`peers::plan`] decides, this carries
    /// the plan out).
    pub async fn apply(&self, view: &View) -> Result<()> {
        let _guard = self.inner.update.lock().await;
        let old = self.inner.state.load_full();
        let running: BTreeMap<String, NodeEntry> = old
            .by_node
            .iter()
            .map(|(k, v)| (k.clone(), v.entry.clone()))
            .collect();
        let plan = peers::plan(
            &running,
            old.own.as_ref().map(|o| o.cidr),
            view,
            self.inner.endpoint.id().as_bytes(),
        );
        let mut by_node = old.by_node.clone();
        for (node, why) in &plan.retire {
            if let Some(slot) = by_node.remove(node) {
                self.retire(&slot, why.reason()).await;
            }
        }
        let mut dial = Vec::new();
        for add in &plan.add {
            let e = &add.entry;
            let id = match transport::parse_endpoint_id(&e.endpoint) {
                Ok(id) => id,
                Err(err) => {
                    warn!(node = %e.node, "ignoring peer: {err:#}");
                    continue;
                }
            };
            info!(node = %e.node, cidr = %e.pod_cidr, endpoint = %id.fmt_short(), "peer added");
            let slot = self.new_slot(e, id);
            if add.dial {
                dial.push(slot.clone());
            }
            by_node.insert(e.node.clone(), slot);
        }
        let state = self.state_of(view, by_node);
        for (node, reason) in &view.rejected {
            warn!(node = %node, "peer refused: {reason}");
        }
        let new_state = Arc::new(state);
        self.inner.state.store(new_state.clone());
        // Endpoints refused a moment ago that the directory lists now dialled early.
        self.inner.refusals.lock().expect("lock").listed(
            new_state.by_endpoint.keys().map(|id| id.as_bytes()),
            Instant::now(),
        );
        for slot in dial {
            self.spawn(self.clone().dial_loop(slot));
        }
        if plan.reroute_kept {
            self.reroute_kept(&old, &new_state).await;
        }
        Ok(())
    }

    /// A peer's slot, not connected yet.
    fn new_slot(&self, e: &NodeEntry, id: EndpointId) -> Arc<PeerSlot> {
        let queue = self.inner.cfg.endpoint.tuning.queue(self.inner.cfg.mtu);
        Arc::new(PeerSlot {
            entry: e.clone(),
            id,
            conn: ArcSwapOption::empty(),
            tx: Flow::default(),
            rx: Flow::default(),
            drops: Drops::default(),
            out_q: PeerQueue::new(queue),
            in_q: PeerQueue::new(queue),
            max_datagram: AtomicUsize::new(0),
            send_waits: AtomicU64::new(0),
            last_error: Mutex::new(None),
            since: Mutex::new(None),
            gone: self.inner.shutdown.child_token(),
        })
    }

    /// The state the data paths read, for these peers under this view.
    fn state_of(&self, view: &View, by_node: BTreeMap<String, Arc<PeerSlot>>) -> State {
        State {
            own: view.own.as_ref().map(|o| Own {
                cidr: o.pod_cidr,
                gateway: o.gateway(),
                node_ip: self.inner.cfg.node_ip,
            }),
            by_endpoint: by_node.values().map(|s| (s.id, s.clone())).collect(),
            routes: Routes::new(
                by_node
                    .values()
                    .flat_map(|s| s.entry.prefixes().into_iter().map(move |p| (p, s.clone()))),
            ),
            by_node,
            rejected: view.rejected.clone(),
        }
    }

    /// Reinstalls the routes of the connected peers kept from `old`: they carry the old
    /// gateway as their source.
    async fn reroute_kept(&self, old: &State, new: &State) {
        for slot in new.by_node.values() {
            let kept = old
                .by_node
                .get(&slot.entry.node)
                .is_some_and(|o| Arc::ptr_eq(o, slot));
            if kept && slot.conn.load().is_some() {
                self.install_route(slot).await;
            }
        }
    }

    async fn retire(&self, slot: &Arc<PeerSlot>, why: &str) {
        info!(node = %slot.entry.node, "peer removed: {why}");
        slot.gone.cancel();
        if let Some(conn) = slot.conn.swap(None) {
            conn.close(0u32.into(), why.as_bytes());
        }
        self.withdraw_routes(slot).await;
    }

    /// Removes the kernel routes to a peer's prefixes.
    async fn withdraw_routes(&self, slot: &PeerSlot) {
        for prefix in slot.entry.prefixes() {
            if let Err(e) = routes::del(&self.inner.nl, &prefix, self.inner.tun_index).await {
                warn!("{e:#}");
            }
        }
    }

    /// Routes a peer's prefixes (its pod CIDR, its node address) into the TUN.
    async fn install_route(&self, slot: &PeerSlot) {
        let src = self.inner.state.load().own.as_ref().map(Own::source);
        for prefix in slot.entry.prefixes() {
            if let Err(e) = routes::add(&self.inner.nl, &prefix, self.inner.tun_index, src).await {
                // The bridge holding our gateway address may not exist yet: route without a
                // preferred source rather than not at all.
                debug!("{e:#}; retrying without a source address");
                if let Err(e) =
                    routes::add(&self.inner.nl, &prefix, self.inner.tun_index, None).await
                {
                    warn!(node = %slot.entry.node, "{e:#}");
                    slot.set_error(format!("{e:#}"));
                }
            }
        }
    }

    /// Keeps a connection to `slot` up while the peer is in the directory: dial, serve, and
    /// when the connection ends, dial again with backoff (250 ms doubling to 5 s).
    async fn dial_loop(self, slot: Arc<PeerSlot>) {
        let relays = self.inner.cfg.endpoint.relays.clone();
        let mut backoff =
            crate::backoff::Backoff::new(Duration::from_millis(250), Duration::from_secs(5));
        loop {
            if slot.gone.is_cancelled() {
                return;
            }
            // A direct address the mesh itself routes (inside a peer's pod CIDR or a node
            // address) would send the mesh's own UDP into its TUN: never dial one. Nor our
            // own: guests behind user-mode NAT all have the same private address (slirp's
            // 10.0.2.15), so a peer's advertised one is often ours.
            let routed = self.inner.state.load();
            let ours = self.inner.endpoint.bound_sockets();
            let direct: Vec<_> = slot
                .entry
                .addrs
                .iter()
                .filter(|a| routed.routes.lookup(a.ip()).is_none() && !ours.contains(a))
                .copied()
                .collect();
            let addr = transport::dial_addr(slot.id, &relays, &direct);
            let attempt = tokio::select! {
                r = tokio::time::timeout(Duration::from_secs(10), self.inner.endpoint.connect(addr, socialweb_wire::mesh::ALPN)) => r,
                _ = slot.gone.cancelled() => return,
            };
            match attempt {
                Ok(Ok(conn)) => {
                    backoff.reset();
                    self.serve(slot.clone(), conn).await;
                }
                Ok(Err(e)) => slot.set_error(format!("connect: {e}")),
                Err(_) => slot.set_error("connect: timed out after 10 s"),
            }
            let jitter = Duration::from_millis(rand::random::<u64>() % 100);
            tokio::select! {
                _ = tokio::time::sleep(backoff.next_delay() + jitter) => {}
                _ = slot.gone.cancelled() => return,
            }
        }
    }

    async fn accept_loop(self) {
        while let Some(incoming) = self.inner.endpoint.accept().await {
            let mesh = self.clone();
            self.spawn(async move {
                let conn = match incoming.await {
                    Ok(c) => c,
                    Err(e) => {
                        debug!("incoming connection failed: {e}");
                        return;
                    }
                };
                let id = conn.remote_id();
                let slot = mesh.inner.state.load().by_endpoint.get(&id).cloned();
                match slot {
                    Some(slot) => mesh.serve(slot, conn).await,
                    None => {
                        mesh.inner
                            .refusals
                            .lock()
                            .expect("lock")
                            .refused(*id.as_bytes(), Instant::now());
                        warn!(endpoint = %id, "refused a connection from an endpoint not in the peer directory (yet?)");
                        conn.close(CLOSE_NOT_A_PEER.into(), b"not in the peer directory");
                    }
                }
            });
        }
    }

    /// Serves one connection for `slot` until it closes: installs the route, carries
    /// datagrams both ways, answers pings; then withdraws the route if this connection was
    /// still the peer's.
    async fn serve(&self, slot: Arc<PeerSlot>, conn: Connection) {
        let conn = Arc::new(conn);
        slot.refresh_max_datagram(&conn);
        if let Some(old) = slot.conn.swap(Some(conn.clone())) {
            old.close(0u32.into(), b"replaced by a newer connection");
        }
        *slot.since.lock().expect("lock") = Some(Instant::now());
        self.install_route(&slot).await;
        info!(node = %slot.entry.node, path = %path_of(&conn), "peer connected");

        // The sender of a replaced connection stops when its connection closes.
        let stop = slot.gone.child_token();
        let pings = answer_pings(conn.clone());
        let datagrams = self.datagram_loop(&slot, &conn);
        let sends = self.send_loop(&slot, &conn, &stop);
        tokio::select! {
            e = datagrams => slot.set_error(format!("connection closed: {e}")),
            _ = sends => {}
            _ = pings => {}
            _ = slot.gone.cancelled() => {}
        }
        stop.cancel();
        // Only the connection currently installed may take the route down.
        let current = slot.conn.load_full();
        if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, &conn)) {
            slot.conn.store(None);
            slot.max_datagram.store(0, Ordering::Relaxed);
            *slot.since.lock().expect("lock") = None;
            self.withdraw_routes(&slot).await;
            for _ in 0..slot.out_q.clear() + slot.in_q.clear() {
                slot.drops.count(DropReason::NoConnection);
            }
            info!(node = %slot.entry.node, "peer disconnected; route withdrawn");
        }
    }

    /// Round trip to a peer's agent over its connection (a bidirectional stream echo).
    pub async fn ping(&self, target: &str) -> Result<(String, Duration, String)> {
        let state = self.inner.state.load();
        let slot = match target.parse::<IpAddr>() {
            Ok(ip) => state
                .routes
                .lookup(ip)
                .cloned()
                .ok_or_else(|| anyhow!("no peer's pod CIDR holds {ip}"))?,
            Err(_) => state
                .by_node
                .get(target)
                .cloned()
                .ok_or_else(|| anyhow!("no peer named {target}"))?,
        };
        let conn = slot
            .conn
            .load_full()
            .ok_or_else(|| anyhow!("{} is not connected", slot.entry.node))?;
        let started = Instant::now();
        let (mut send, mut recv) = conn.open_bi().await.context("opening a stream")?;
        let nonce: [u8; 16] = rand::random();
        send.write_all(&nonce).await.context("sending the ping")?;
        send.finish().context("finishing the ping")?;
        let back = tokio::time::timeout(Duration::from_secs(5), recv.read_to_end(64))
            .await
            .context("no answer within 5 s")?
            .context("reading the answer")?;
        if back != nonce {
            return Err(anyhow!("the answer did not match"));
        }
        Ok((slot.entry.node.clone(), started.elapsed(), path_of(&conn)))
    }

    /// The whole mesh, for `mesh status`.
    pub fn status(&self) -> MeshStatus {
        let state = self.inner.state.load();
        let refused = {
            let mut r = self.inner.refusals.lock().expect("lock");
            r.settle(Instant::now());
            r.counts()
        };
        let addr = self.inner.endpoint.addr();
        let home = {
            use iroh::Watcher;
            self.inner.endpoint.home_relay_status().get()
        };
        MeshStatus {
            node: self.inner.cfg.node.clone(),
            endpoint: self.inner.endpoint.id().to_string(),
            pod_cidr: state.own.as_ref().map(|o| o.cidr.to_string()),
            node_ip: self.inner.cfg.node_ip.map(|ip| ip.to_string()),
            // The home relay, once the endpoint has picked one.
            relay_url: home
                .first()
                .map_or_else(|| self.relay_url().to_string(), |r| r.url().to_string()),
            relays: self
                .inner
                .cfg
                .endpoint
                .relays
                .iter()
                .map(Url::to_string)
                .collect(),
            tun: self.inner.cfg.tun_name.clone(),
            mtu: self.inner.cfg.mtu,
            scheduling: self.inner.rt.scheduling.clone(),
            direct_addrs: addr.ip_addrs().map(|a| a.to_string()).collect(),
            relay_connected: home.iter().any(|r| r.is_connected()),
            peers: state.by_node.values().map(|s| peer_status(s)).collect(),
            drops: self.inner.drops.snapshot(),
            strangers_refused: refused.strangers,
            early_peers_refused: refused.early_peers,
            refusals_pending: refused.pending,
            rejected: state.rejected.clone(),
        }
    }

    /// Routes as the mesh means them, and whether the kernel has each.
    pub async fn routes(&self) -> Result<Vec<RouteStatus>> {
        let installed = routes::installed(&self.inner.nl).await?;
        let state = self.inner.state.load();
        Ok(state
            .by_node
            .values()
            .map(|s| RouteStatus {
                cidr: s.entry.pod_cidr.to_string(),
                node: s.entry.node.clone(),
                via: s
                    .conn
                    .load()
                    .as_ref()
                    .map(|c| path_of(c))
                    .unwrap_or_else(|| "none".into()),
                installed: installed.contains(&s.entry.pod_cidr),
            })
            .collect())
    }

    /// Closes every connection and removes every route the mesh installed.
    pub async fn shutdown(&self) {
        self.inner.shutdown.cancel();
        let state = self.inner.state.load_full();
        for slot in state.by_node.values() {
            self.retire(slot, "agent shutting down").await;
        }
        self.inner.endpoint.close().await;
    }

    /// The renting host's relay (the first of the configured ones; never empty).
    pub fn relay_url(&self) -> &Url {
        &self.inner.cfg.endpoint.relays[0]
    }
}

fn peer_status(s: &PeerSlot) -> PeerStatus {
    let conn = s.conn.load_full();
    let (path, stats) = conn
        .as_ref()
        .map(|c| {
            let paths = c.paths();
            let selected = paths.iter().find(|p| p.is_selected());
            (path_of(c), selected.map(|p| p.stats()))
        })
        .unwrap_or_else(|| ("none".into(), None));
    let rtt = stats.as_ref().map(|s| s.rtt.as_secs_f64() * 1e3);
    let totals = conn.as_ref().map(|c| c.stats());
    let quic = stats.map(|s| super::stats::QuicPathStats {
        datagrams_sent: totals.as_ref().map_or(0, |t| t.frame_tx.datagram),
        datagrams_received: totals.as_ref().map_or(0, |t| t.frame_rx.datagram),
        cwnd: s.cwnd,
        congestion_events: s.congestion_events,
        lost_packets: s.lost_packets,
        sent_packets: s.sent_packets,
        black_holes: s.black_holes_detected,
        current_mtu: s.current_mtu,
    });
    PeerStatus {
        node: s.entry.node.clone(),
        pod_cidr: s.entry.pod_cidr.to_string(),
        endpoint: s.id.to_string(),
        connected: conn.is_some(),
        path,
        rtt_ms: rtt,
        tx: s.tx.snapshot(),
        rx: s.rx.snapshot(),
        drops: s.drops.snapshot(),
        last_error: s.last_error.lock().expect("lock").clone(),
        connected_for_s: s
            .since
            .lock()
            .expect("lock")
            .map(|t| t.elapsed().as_secs_f64()),
        // The size a packet is refused against (send.rs reads the same, fresh).
        max_packet: conn.as_ref().and_then(|c| c.max_datagram_size()),
        quic,
        send_waits: s.send_waits.load(Ordering::Relaxed),
        queue_out: Some(s.out_q.status()),
        queue_in: Some(s.in_q.status()),
    }
}

/// `direct <addr>` or `relay <url>` for the connection's selected path.
pub fn path_of(conn: &Connection) -> String {
    let paths = conn.paths();
    // iroh 1.4.1 leaves a connection accepted through a relay that is not this node's home
    // (a peer's, after a fleet host's relay was lost) without a selected path while it
    // carries traffic; its one open path is then the path.
    let selected = paths
        .iter()
        .find(|p| p.is_selected())
        .or_else(|| paths.iter().next());
    match selected.map(|p| p.remote_addr().clone()) {
        Some(TransportAddr::Ip(a)) => format!("direct {a}"),
        Some(TransportAddr::Relay(u)) => format!("relay {u}"),
        Some(other) => format!("{other:?}"),
        None => "none".into(),
    }
}

/// Echoes every bidirectional stream the peer opens (the other side of [`Mesh::ping`]).
async fn answer_pings(conn: Arc<Connection>) {
    while let Ok((mut send, mut recv)) = conn.accept_bi().await {
        tokio::spawn(async move {
            if let Ok(data) = recv.read_to_end(64).await {
                let _ = send.write_all(&data).await;
                let _ = send.finish();
            }
        });
    }
}
