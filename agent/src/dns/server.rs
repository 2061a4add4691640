//! Serving: UDP on one socket per core (SO_REUSEPORT, a blocking thread each, so the cluster
//! zone and cache hits never wait on the async runtime) and TCP on the runtime. Anything that
//! needs an upstream goes to the runtime and answers from there.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use arc_swap::ArcSwap;
use hickory_proto::op::{Message, ResponseCode};
use ipnet::IpNet;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tracing::{debug, info, warn};

use super::forward::{Forwarder, Resolved};
use super::stats::{DnsStats, Stats, bump};
use socialweb_dns_core::answer::{self, Context, Decision, MAX_UDP_PAYLOAD};
use socialweb_dns_core::store::{Snapshot, Store};
use socialweb_dns_core::wire::{self, WireCache};

/// How long a TCP client may be silent (between or within queries) before it is dropped.
pub const TCP_IDLE: Duration = Duration::from_secs(10);
/// TCP connections served at once; more wait in the kernel's backlog.
pub const TCP_MAX_CONNECTIONS: usize = 256;
/// UDP queries waiting on an upstream at once. Each holds a task and, while it asks, a
/// socket; beyond this a query is answered REFUSED at once and counted as shed (CoreDNS's
/// `forward max_concurrent` does the same), so a flood of uncached names costs neither file
/// descriptors nor memory. Well under the soft limit of 1024 descriptors systemd gives.
pub const SLOW_UDP_MAX: usize = 512;

/// The server's state, shared by every socket.
#[derive(Debug)]
pub struct Dns {
    pub snapshot: ArcSwap<Snapshot>,
    /// This node's pods: address -> namespace (for the search-path shortcut).
    pub pods: ArcSwap<HashMap<IpAddr, String>>,
    pub reverse_nets: Vec<IpNet>,
    pub forwarder: Forwarder,
    pub stats: Arc<Stats>,
    /// Finished answers as bytes, for repeated questions.
    wire: WireCache,
    /// Bumped with every new snapshot: cluster answers cached as bytes are good for one.
    generation: AtomicU64,
    /// Permits for UDP queries waiting on an upstream ([`SLOW_UDP_MAX`]).
    slow_udp: Arc<Semaphore>,
}

/// Which counter a wire-cache hit bumps.
const FROM_CLUSTER: u8 = 1;
const FROM_CACHE: u8 = 2;

/// What the synchronous path made of a packet.
#[derive(Debug)]
pub enum Fast {
    Reply(Vec<u8>),
    /// Needs the forwarder: the request and what was decided about it.
    Slow(Box<(Message, Decision)>),
    /// Not a DNS message: no answer at all.
    Drop,
}

impl Dns {
    pub fn new(zone: &str, reverse_nets: Vec<IpNet>, upstreams: Vec<SocketAddr>) -> Dns {
        let stats = Arc::new(Stats::default());
        Dns {
            snapshot: ArcSwap::from_pointee(Store::default().snapshot(zone)),
            pods: ArcSwap::from_pointee(HashMap::new()),
            reverse_nets,
            forwarder: Forwarder::new(upstreams, stats.clone()),
            stats,
            wire: WireCache::new(200_000),
            generation: AtomicU64::new(0),
            slow_udp: Arc::new(Semaphore::new(SLOW_UDP_MAX)),
        }
    }

    /// Installs a new cluster zone.
    pub fn set_snapshot(&self, snap: Snapshot) {
        self.snapshot.store(Arc::new(snap));
        self.generation.fetch_add(1, Ordering::Release);
    }

    pub fn stats(&self) -> DnsStats {
        let mut s = self.stats.snapshot();
        s.cache_entries = self.forwarder.cache_len();
        s.cluster_names = self.snapshot.load().names();
        s.pods_known = self.pods.load().len();
        s.slow_udp_in_flight = SLOW_UDP_MAX - self.slow_udp.available_permits();
        s
    }

    /// Answers what can be answered without waiting: repeated questions (as bytes), malformed
    /// requests, the cluster zone, cache hits.
    pub fn fast(&self, packet: &[u8], src: IpAddr, udp: bool) -> Fast {
        let pods = self.pods.load();
        let generation = self.generation.load(Ordering::Acquire);
        let quick = wire::read_query(packet, wire::namespace_of(&pods, &src));
        if let Some(q) = &quick
            && let Some((out, from)) = self.wire.get(q, generation, Instant::now())
            && (!udp || out.len() <= q.udp_limit)
        {
            bump(if from == FROM_CLUSTER {
                &self.stats.cluster
            } else {
                &self.stats.cache_hits
            });
            return Fast::Reply(out);
        }
        let req = match Message::from_vec(packet) {
            Ok(m) => m,
            Err(_) => return self.malformed(packet),
        };
        let snap = self.snapshot.load();
        let ctx = Context {
            snapshot: &snap,
            pod_namespace: pods.get(&src).map(String::as_str),
            reverse_nets: &self.reverse_nets,
        };
        let (out, keep) = match answer::decide(&req, &ctx) {
            Decision::Reply(m) => {
                if m.metadata.response_code == ResponseCode::FormErr {
                    bump(&self.stats.formerr);
                    (self.finish(&req, m, udp), None)
                } else {
                    bump(&self.stats.cluster);
                    (
                        self.finish(&req, m, udp),
                        Some((FROM_CLUSTER, Instant::now() + Duration::from_secs(3600))),
                    )
                }
            }
            Decision::Shortcut(m) => {
                bump(&self.stats.cluster);
                bump(&self.stats.autopath);
                (
                    self.finish(&req, m, udp),
                    Some((FROM_CLUSTER, Instant::now() + Duration::from_secs(3600))),
                )
            }
            Decision::Forward => match self.forwarder.cached(&req.queries[0]) {
                Some(cached) => {
                    // TTLs in the bytes are right for this second only.
                    let fresh = cached
                        .answers
                        .iter()
                        .chain(cached.authorities.iter())
                        .all(|r| r.ttl >= 1);
                    let keep = fresh.then(|| (FROM_CACHE, Instant::now() + Duration::from_secs(1)));
                    (self.finish(&req, forwarded(&req, &cached), udp), keep)
                }
                None => return Fast::Slow(Box::new((req, Decision::Forward))),
            },
            d @ (Decision::Autopath { .. } | Decision::Chase { .. }) => {
                return Fast::Slow(Box::new((req, d)));
            }
        };
        // Keep it as bytes, unless truncated (the same question over TCP needs the whole).
        if let (Some(q), Some((from, until))) = (quick, keep)
            && out.len() > 3
            && out[2] & 0x02 == 0
        {
            self.wire
                .put(q.key, out.clone(), generation, Instant::now(), until, from);
        }
        Fast::Reply(out)
    }

    /// The answer to a request that needed the forwarder.
    pub async fn slow(&self, req: Message, decision: Decision, udp: bool) -> Vec<u8> {
        let response = match decision {
            Decision::Reply(m) | Decision::Shortcut(m) => m,
            Decision::Forward => match self.forwarder.resolve(&req.queries[0]).await {
                Resolved::Answer(m) | Resolved::Stale(m) => forwarded(&req, &m),
                Resolved::Failed => {
                    bump(&self.stats.servfail);
                    answer::error(&req, ResponseCode::ServFail)
                }
            },
            Decision::Chase { external, fallback } => {
                let mut q = req.queries[0].clone();
                q.name = external;
                match self.forwarder.resolve(&q).await {
                    Resolved::Answer(m) | Resolved::Stale(m)
                        if m.metadata.response_code == ResponseCode::NoError =>
                    {
                        let mut out = fallback;
                        out.answers.extend(m.answers.iter().cloned());
                        out
                    }
                    _ => fallback,
                }
            }
            Decision::Autopath { external } => {
                let mut q = req.queries[0].clone();
                q.name = external;
                match self.forwarder.resolve(&q).await {
                    // NOERROR with or without records (NODATA): the name exists and the
                    // walk ends here, as CoreDNS autopath answers.
                    Resolved::Answer(m) | Resolved::Stale(m)
                        if m.metadata.response_code == ResponseCode::NoError =>
                    {
                        bump(&self.stats.autopath);
                        answer::autopath_answer(&req, &m)
                    }
                    _ => {
                        // The walk's end is not found either: this step is NXDOMAIN, and the
                        // client carries on (its later steps are answered from memory).
                        let mut m = answer::response_to(&req);
                        m.metadata.authoritative = true;
                        m.metadata.response_code = ResponseCode::NXDomain;
                        m
                    }
                }
            }
        };
        self.finish(&req, response, udp)
    }

    /// FORMERR for a packet with a readable header, silence for anything else.
    fn malformed(&self, packet: &[u8]) -> Fast {
        if packet.len() < 12 || packet[2] & 0x80 != 0 {
            bump(&self.stats.dropped);
            return Fast::Drop;
        }
        bump(&self.stats.formerr);
        // Echo the id and opcode, QR set, RCODE 1, no sections.
        let mut out = packet[..12].to_vec();
        out[2] = 0x80 | (packet[2] & 0x79);
        out[3] = 0x01;
        out[4..12].fill(0);
        Fast::Reply(out)
    }

    /// Serialises `m`; over UDP, one that does not fit the client's limit becomes an empty
    /// truncated answer, so the client asks again over TCP.
    fn finish(&self, req: &Message, mut m: Message, udp: bool) -> Vec<u8> {
        m.metadata.id = req.metadata.id;
        let limit = if !udp {
            usize::from(u16::MAX)
        } else {
            match &req.edns {
                Some(e) => usize::from(e.max_payload().clamp(512, MAX_UDP_PAYLOAD)),
                None => 512,
            }
        };
        match m.to_vec() {
            Ok(bytes) if bytes.len() <= limit => bytes,
            Ok(_) => {
                bump(&self.stats.truncated);
                let mut t = answer::response_to(req);
                t.metadata.response_code = m.metadata.response_code;
                t.metadata.authoritative = m.metadata.authoritative;
                t.metadata.truncation = true;
                t.to_vec().unwrap_or_default()
            }
            Err(e) => {
                warn!("encoding a DNS answer: {e}");
                bump(&self.stats.servfail);
                answer::error(req, ResponseCode::ServFail)
                    .to_vec()
                    .unwrap_or_default()
            }
        }
    }
}

/// An upstream (or cached) answer re-addressed to this request: its records and rcode, the
/// request's question as asked (case included).
fn forwarded(req: &Message, upstream: &Message) -> Message {
    let mut m = answer::response_to(req);
    m.metadata.response_code = upstream.metadata.response_code;
    m.metadata.authoritative = false;
    m.answers = upstream.answers.clone();
    m.authorities = upstream.authorities.clone();
    m.additionals = upstream.additionals.clone();
    m
}

/// The receive buffer each UDP socket asks for by default: room for a burst of some
/// thousands of queries while a thread is busy.
pub const DEFAULT_RCVBUF: usize = 4 << 20;

/// A UDP socket on `addr` shared with the other serving threads (SO_REUSEPORT); `rcvbuf`
/// bytes of receive buffer asked for, or the kernel's default for 0.
fn reuseport_udp(addr: SocketAddr, rcvbuf: usize) -> Result<UdpSocket> {
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    s.set_reuse_port(true)?;
    if rcvbuf > 0 {
        s.set_recv_buffer_size(rcvbuf)?;
    }
    s.bind(&addr.into())
        .with_context(|| format!("binding UDP {addr}"))?;
    Ok(s.into())
}

/// Serves UDP on `addr` with `threads` sockets (each asking for `rcvbuf` bytes of receive
/// buffer, 0 for the kernel's default) and TCP on the runtime.
pub async fn serve(dns: Arc<Dns>, addr: SocketAddr, threads: usize, rcvbuf: usize) -> Result<()> {
    let rt = tokio::runtime::Handle::current();
    for i in 0..threads.max(1) {
        let sock = reuseport_udp(addr, rcvbuf)?;
        let dns = dns.clone();
        let rt = rt.clone();
        std::thread::Builder::new()
            .name(format!("dns-udp-{i}"))
            .spawn(move || udp_loop(dns, sock, rt))
            .context("starting a DNS thread")?;
    }
    let listener = {
        let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        s.set_reuse_address(true)?;
        s.bind(&addr.into())
            .with_context(|| format!("binding TCP {addr}"))?;
        s.listen(128)?;
        s.set_nonblocking(true)?;
        TcpListener::from_std(s.into())?
    };
    let permits = Arc::new(tokio::sync::Semaphore::new(TCP_MAX_CONNECTIONS));
    info!(%addr, threads, "node-local DNS serving");
    tokio::spawn(async move {
        loop {
            let Ok(permit) = permits.clone().acquire_owned().await else {
                return;
            };
            let (stream, peer) = match listener.accept().await {
                Ok(s) => s,
                Err(e) => {
                    warn!("DNS TCP accept: {e}");
                    continue;
                }
            };
            let dns = dns.clone();
            tokio::spawn(async move {
                if let Err(e) = tcp_client(dns, stream, peer).await {
                    debug!(%peer, "DNS TCP client: {e:#}");
                }
                drop(permit);
            });
        }
    });
    Ok(())
}

fn udp_loop(dns: Arc<Dns>, sock: UdpSocket, rt: tokio::runtime::Handle) {
    let sock = Arc::new(sock);
    let mut buf = vec![0u8; 4096];
    loop {
        let (n, peer) = match sock.recv_from(&mut buf) {
            Ok(x) => x,
            Err(e) => {
                warn!("DNS UDP receive: {e}");
                continue;
            }
        };
        bump(&dns.stats.queries_udp);
        match dns.fast(&buf[..n], peer.ip(), true) {
            Fast::Reply(out) => {
                let _ = sock.send_to(&out, peer);
            }
            Fast::Drop => {}
            Fast::Slow(slow) => {
                let (req, decision) = *slow;
                let Ok(permit) = dns.slow_udp.clone().try_acquire_owned() else {
                    bump(&dns.stats.shed);
                    let refused = answer::error(&req, ResponseCode::Refused);
                    let _ = sock.send_to(&dns.finish(&req, refused, true), peer);
                    continue;
                };
                let (dns, sock) = (dns.clone(), sock.clone());
                rt.spawn(async move {
                    let out = dns.slow(req, decision, true).await;
                    let _ = sock.send_to(&out, peer);
                    drop(permit);
                });
            }
        }
    }
}

/// One TCP client: length-prefixed messages until it goes quiet, closes, or sends garbage.
async fn tcp_client(dns: Arc<Dns>, mut stream: TcpStream, peer: SocketAddr) -> Result<()> {
    loop {
        let mut len = [0u8; 2];
        match tokio::time::timeout(TCP_IDLE, stream.read_exact(&mut len)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => return Ok(()),
        }
        let len = usize::from(u16::from_be_bytes(len));
        if len < 12 {
            return Ok(()); // not even a header: hang up
        }
        let mut body = vec![0u8; len];
        tokio::time::timeout(TCP_IDLE, stream.read_exact(&mut body))
            .await
            .context("frame shorter than its length")??;
        bump(&dns.stats.queries_tcp);
        let out = match dns.fast(&body, peer.ip(), false) {
            Fast::Reply(out) => out,
            Fast::Drop => return Ok(()),
            Fast::Slow(slow) => {
                let (req, decision) = *slow;
                dns.slow(req, decision, false).await
            }
        };
        let mut framed = Vec::with_capacity(out.len() + 2);
        framed.extend_from_slice(&(out.len() as u16).to_be_bytes());
        framed.extend_from_slice(&out);
        tokio::time::timeout(TCP_IDLE, stream.write_all(&framed))
            .await
            .context("client not reading")??;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dns() -> Dns {
        use socialweb_dns_core::store::{Port, Service, ServiceKind};
        let mut store = Store::default();
        store.upsert_service(Service {
            namespace: "default".into(),
            name: "web".into(),
            kind: ServiceKind::ClusterIp(vec!["10.43.0.10".parse().unwrap()]),
            ports: vec![Port {
                name: Some("http".into()),
                protocol: "TCP".into(),
                port: 80,
            }],
            publish_not_ready: false,
        });
        let d = Dns::new(
            "cluster.local",
            vec!["10.43.0.0/16".parse().unwrap()],
            vec![],
        );
        d.set_snapshot(store.snapshot("cluster.local"));
        d
    }

    fn query(name: &str) -> Vec<u8> {
        use hickory_proto::op::{MessageType, OpCode, Query};
        use hickory_proto::rr::{Name, RecordType};
        let mut m = Message::new(9, MessageType::Query, OpCode::Query);
        m.queries
            .push(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
        m.to_vec().unwrap()
    }

    #[test]
    fn repeated_questions_are_answered_from_bytes_alike() {
        let d = dns();
        let src: IpAddr = "10.42.1.9".parse().unwrap();
        let Fast::Reply(first) = d.fast(&query("web.default.svc.cluster.local."), src, true) else {
            panic!()
        };
        let Fast::Reply(second) = d.fast(&query("WEB.default.svc.cluster.local."), src, true)
        else {
            panic!()
        };
        let (a, b) = (
            Message::from_vec(&first).unwrap(),
            Message::from_vec(&second).unwrap(),
        );
        assert_eq!(a.answers.len(), 1);
        assert_eq!(b.answers[0].data, a.answers[0].data);
        assert_eq!(
            b.queries[0].name.to_ascii(),
            "WEB.default.svc.cluster.local."
        );
        assert_eq!(d.stats().cluster, 2);
        // A new zone invalidates the bytes.
        d.set_snapshot(Store::default().snapshot("cluster.local"));
        let Fast::Reply(third) = d.fast(&query("web.default.svc.cluster.local."), src, true) else {
            panic!()
        };
        assert_eq!(
            Message::from_vec(&third).unwrap().metadata.response_code,
            ResponseCode::NXDomain
        );
    }

    #[test]
    fn names_outside_the_zone_need_the_forwarder() {
        let d = dns();
        assert!(matches!(
            d.fast(&query("example.com."), "10.0.0.1".parse().unwrap(), true),
            Fast::Slow(..)
        ));
    }

    fn open_fds() -> usize {
        std::fs::read_dir("/proc/self/fd").unwrap().count()
    }

    /// A flood of names nobody has cached, against an upstream that never answers (each
    /// upstream query holds a socket for its whole timeout): the slow path stays within its
    /// bound, sheds the rest, and the zone is still answered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_flood_of_uncached_names_is_shed_not_piled_up() {
        let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
        let d = dns();
        let dns = Arc::new(Dns::new(
            "cluster.local",
            vec![],
            vec![silent.local_addr().unwrap()],
        ));
        dns.set_snapshot(d.snapshot.load_full().as_ref().clone());
        let addr = UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        serve(dns.clone(), addr, 1, DEFAULT_RCVBUF).await.unwrap();
        let baseline = open_fds();

        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut peak = baseline;
        for i in 0..6000 {
            client
                .send_to(&query(&format!("n{i}.flood.example.")), addr)
                .unwrap();
            if i % 200 == 0 {
                tokio::time::sleep(Duration::from_millis(2)).await;
                peak = peak.max(open_fds());
            }
        }
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(25)).await;
            peak = peak.max(open_fds());
        }
        assert!(
            peak <= baseline + SLOW_UDP_MAX + 100,
            "{peak} descriptors open at the peak, {baseline} before the flood"
        );
        let stats = dns.stats();
        assert!(stats.shed > 0, "{stats:?}");
        assert!(stats.slow_udp_in_flight <= SLOW_UDP_MAX);
        // The zone is still answered from the hot path. Asked from a socket of its own: the
        // flooding one's receive buffer is full of the flood's answers, and the kernel drops
        // what does not fit, whatever the server did.
        let asker = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut ask = Message::from_vec(&query("web.default.svc.cluster.local.")).unwrap();
        ask.metadata.id = 4242;
        asker.send_to(&ask.to_vec().unwrap(), addr).unwrap();
        asker
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut buf = [0u8; 1500];
        let n = asker.recv(&mut buf).expect("an answer for the zone");
        let m = Message::from_vec(&buf[..n]).unwrap();
        assert_eq!(m.metadata.id, 4242, "{m:?}");
        assert_eq!(m.answers.len(), 1, "{m:?}");
        // And what the flooder got back are refusals (shed) or, for the admitted few whose
        // silent upstream timed out, SERVFAIL.
        client
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut refused = 0;
        while let Ok(n) = client.recv(&mut buf) {
            let m = Message::from_vec(&buf[..n]).unwrap();
            match m.metadata.response_code {
                ResponseCode::Refused => refused += 1,
                ResponseCode::ServFail => {}
                other => panic!("a flood answer was {other:?}: {m:?}"),
            }
        }
        assert!(refused > 0, "no refusal reached the flooder");
    }

    proptest::proptest! {
        /// The query path on arbitrary bytes: an answer, silence, or the forwarder; never a
        /// panic. And every answer parses.
        #[test]
        fn arbitrary_packets_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..700)) {
            let d = dns();
            if let Fast::Reply(out) = d.fast(&bytes, "10.42.1.9".parse().unwrap(), true) {
                proptest::prop_assert!(out.len() >= 12);
                proptest::prop_assert!(out.len() <= 512 || bytes.len() >= 12);
            }
        }

        /// Well-formed queries for arbitrary names: always an answer or the forwarder.
        #[test]
        fn arbitrary_names_are_answered(labels in proptest::collection::vec("[a-zA-Z0-9][a-zA-Z0-9_]{0,19}", 1..6)) {
            let d = dns();
            let name = format!("{}.svc.cluster.local.", labels.join("."));
            match d.fast(&query(&name), "10.42.1.9".parse().unwrap(), true) {
                Fast::Reply(out) => proptest::prop_assert!(Message::from_vec(&out).is_ok()),
                Fast::Slow(..) => {}
                Fast::Drop => proptest::prop_assert!(false, "a well-formed query was dropped"),
            }
        }
    }
}
