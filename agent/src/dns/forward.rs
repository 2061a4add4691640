//! Everything outside the cluster zone: the cache, and the upstream resolvers behind it.
//! Identical questions in flight at once share one upstream query; when every upstream fails,
//! an expired answer is served (counted) rather than an error.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::sync::watch;

use super::stats::{Stats, bump};
use socialweb_dns_core::answer::MAX_UDP_PAYLOAD;
use socialweb_dns_core::cache::{Cache, Hit, Key};

/// How long one upstream gets before the next is tried.
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_millis(1500);

/// The outcome of resolving a question.
#[derive(Debug, Clone)]
pub enum Resolved {
    /// An answer (fresh from the cache or the upstream): records, rcode, flags.
    Answer(Message),
    /// An expired answer, because the upstreams failed.
    Stale(Message),
    /// Nothing to give: SERVFAIL.
    Failed,
}

type InFlight = watch::Receiver<Option<Resolved>>;

/// The cache and the upstreams.
#[derive(Debug)]
pub struct Forwarder {
    upstreams: Vec<SocketAddr>,
    cache: Mutex<Cache>,
    inflight: Mutex<HashMap<Key, InFlight>>,
    stats: Arc<Stats>,
}

impl Forwarder {
    pub fn new(upstreams: Vec<SocketAddr>, stats: Arc<Stats>) -> Forwarder {
        Forwarder {
            upstreams,
            cache: Mutex::new(Cache::new(100_000, Duration::from_secs(24 * 3600))),
            inflight: Mutex::new(HashMap::new()),
            stats,
        }
    }

    pub fn upstreams(&self) -> &[SocketAddr] {
        &self.upstreams
    }

    pub fn cache_len(&self) -> usize {
        self.cache.lock().expect("lock").len()
    }

    /// The cache's fresh answer, if any (the synchronous fast path).
    pub fn cached(&self, q: &Query) -> Option<Message> {
        let key = Key::new(&q.name, q.query_type, q.query_class);
        match self.cache.lock().expect("lock").get(&key, Instant::now()) {
            Some(Hit::Fresh(m)) => {
                bump(&self.stats.cache_hits);
                Some(m)
            }
            _ => None,
        }
    }

    /// Resolves a question: cache, then the upstreams (sharing an identical query already
    /// under way), then a stale answer. Cancellation-safe: if this future is dropped while it
    /// leads a shared query, the query's entry goes with it and those waiting on it ask again.
    pub async fn resolve(&self, q: &Query) -> Resolved {
        let key = Key::new(&q.name, q.query_type, q.query_class);
        if let Some(m) = self.cached(q) {
            return Resolved::Answer(m);
        }
        bump(&self.stats.cache_misses);
        loop {
            match self.join_or_lead(&key) {
                Role::Follow(mut rx) => {
                    bump(&self.stats.coalesced);
                    if let Ok(r) = rx.wait_for(Option::is_some).await
                        && let Some(r) = r.clone()
                    {
                        return r;
                    }
                    // The leader was dropped before it had an answer: ask again (perhaps
                    // the cache has it by now, perhaps as the new leader).
                    if let Some(m) = self.cached(q) {
                        return Resolved::Answer(m);
                    }
                }
                Role::Lead(leader) => {
                    let result = self.ask_upstreams(q, &key).await;
                    leader.finish(result.clone());
                    return result;
                }
            }
        }
    }

    /// Waits on the identical query under way, or becomes its leader.
    fn join_or_lead(&self, key: &Key) -> Role<'_> {
        let mut inflight = self.inflight.lock().expect("lock");
        if let Some(rx) = inflight.get(key) {
            return Role::Follow(rx.clone());
        }
        let (tx, rx) = watch::channel(None);
        inflight.insert(key.clone(), rx);
        Role::Lead(Leader {
            inflight: &self.inflight,
            key: key.clone(),
            tx,
        })
    }

    async fn ask_upstreams(&self, q: &Query, key: &Key) -> Resolved {
        for upstream in &self.upstreams {
            bump(&self.stats.upstream_queries);
            let started = Instant::now();
            match query_upstream(*upstream, q, &self.stats).await {
                Ok(m) => {
                    self.stats.upstream_latency(started.elapsed());
                    self.cache
                        .lock()
                        .expect("lock")
                        .insert(key.clone(), &m, Instant::now());
                    return Resolved::Answer(m);
                }
                Err(e) => {
                    bump(&self.stats.upstream_failures);
                    tracing::debug!(upstream = %upstream, "upstream failed: {e:#}");
                }
            }
        }
        match self.cache.lock().expect("lock").get(key, Instant::now()) {
            Some(Hit::Stale(m)) | Some(Hit::Fresh(m)) => {
                bump(&self.stats.stale);
                Resolved::Stale(m)
            }
            None => Resolved::Failed,
        }
    }
}

enum Role<'f> {
    Follow(InFlight),
    Lead(Leader<'f>),
}

/// The leader of a shared upstream query. Its entry in the in-flight table lives exactly as
/// long as it does: [`Leader::finish`] hands the answer to the waiters, and dropping it
/// unfinished (the future that held it was cancelled) still removes the entry, and the
/// waiters see the channel close.
struct Leader<'f> {
    inflight: &'f Mutex<HashMap<Key, InFlight>>,
    key: Key,
    tx: watch::Sender<Option<Resolved>>,
}

impl Leader<'_> {
    fn finish(self, result: Resolved) {
        let _ = self.tx.send(Some(result));
    }
}

impl Drop for Leader<'_> {
    fn drop(&mut self) {
        let mut inflight = self.inflight.lock().expect("lock");
        // Only this leader inserts under its key while it lives, but check: never remove
        // another query's entry.
        if inflight
            .get(&self.key)
            .is_some_and(|rx| rx.same_channel(&self.tx.subscribe()))
        {
            inflight.remove(&self.key);
        }
    }
}

/// One question to one upstream: UDP with EDNS0, and TCP when the answer comes back
/// truncated. Answers that are not for the question are ignored (spoofing).
pub async fn query_upstream(upstream: SocketAddr, q: &Query, stats: &Stats) -> Result<Message> {
    let id: u16 = rand::random();
    let mut req = Message::new(id, MessageType::Query, OpCode::Query);
    req.metadata.recursion_desired = true;
    req.queries.push(q.clone());
    let mut edns = Edns::new();
    edns.set_max_payload(MAX_UDP_PAYLOAD);
    req.edns = Some(edns);
    let bytes = req.to_vec()?;

    let bind: SocketAddr = if upstream.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    }
    .parse()?;
    let sock = UdpSocket::bind(bind).await?;
    sock.connect(upstream).await?;
    sock.send(&bytes).await?;
    let deadline = tokio::time::Instant::now() + UPSTREAM_TIMEOUT;
    let mut buf = vec![0u8; 4096];
    let answer = loop {
        let n = tokio::time::timeout_at(deadline, sock.recv(&mut buf))
            .await
            .map_err(|_| anyhow!("timed out"))??;
        let Ok(m) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        if m.metadata.id == id
            && m.queries
                .first()
                .is_some_and(|a| a.name.eq_ignore_root_case(&q.name))
        {
            break m;
        }
    };
    if !answer.metadata.truncation {
        return Ok(answer);
    }
    bump(&stats.upstream_tcp_fallbacks);
    let mut tcp = tokio::time::timeout(UPSTREAM_TIMEOUT, TcpStream::connect(upstream)).await??;
    let len = u16::try_from(bytes.len())?;
    tcp.write_all(&len.to_be_bytes()).await?;
    tcp.write_all(&bytes).await?;
    let mut len = [0u8; 2];
    tokio::time::timeout(UPSTREAM_TIMEOUT, tcp.read_exact(&mut len)).await??;
    let mut body = vec![0u8; usize::from(u16::from_be_bytes(len))];
    tokio::time::timeout(UPSTREAM_TIMEOUT, tcp.read_exact(&mut body)).await??;
    let m = Message::from_vec(&body)?;
    if m.metadata.id != id {
        bail!("TCP answer with the wrong id");
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::rr::rdata::A;
    use hickory_proto::rr::{Name, RData, Record, RecordType};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A real upstream on loopback: answers every question with 192.0.2.7 after `delay`;
    /// with `truncate`, sets TC over UDP so the client must come back over TCP.
    async fn upstream(
        delay: Duration,
        truncate: bool,
    ) -> (SocketAddr, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        let udp = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
        let addr = udp.local_addr().unwrap();
        let tcp = tokio::net::TcpListener::bind(addr).await.unwrap();
        let (udp_count, tcp_count) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let answer = |req: &Message, tc: bool| {
            let mut m = Message::new(req.metadata.id, MessageType::Response, OpCode::Query);
            m.queries = req.queries.clone();
            m.metadata.truncation = tc;
            if !tc {
                m.answers.push(Record::from_rdata(
                    req.queries[0].name.clone(),
                    60,
                    RData::A(A::new(192, 0, 2, 7)),
                ));
            }
            m.to_vec().unwrap()
        };
        let c = udp_count.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 1500];
            while let Ok((n, peer)) = udp.recv_from(&mut buf).await {
                c.fetch_add(1, Ordering::SeqCst);
                let req = Message::from_vec(&buf[..n]).unwrap();
                let (udp, out) = (udp.clone(), answer(&req, truncate));
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let _ = udp.send_to(&out, peer).await;
                });
            }
        });
        let c = tcp_count.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = tcp.accept().await {
                c.fetch_add(1, Ordering::SeqCst);
                let mut len = [0u8; 2];
                s.read_exact(&mut len).await.unwrap();
                let mut body = vec![0u8; usize::from(u16::from_be_bytes(len))];
                s.read_exact(&mut body).await.unwrap();
                let out = answer(&Message::from_vec(&body).unwrap(), false);
                s.write_all(&(out.len() as u16).to_be_bytes())
                    .await
                    .unwrap();
                s.write_all(&out).await.unwrap();
            }
        });
        (addr, udp_count, tcp_count)
    }

    fn question(name: &str) -> Query {
        Query::query(Name::from_ascii(name).unwrap(), RecordType::A)
    }

    #[tokio::test]
    async fn identical_questions_in_flight_share_one_upstream_query() {
        let (addr, udp, _) = upstream(Duration::from_millis(200), false).await;
        let stats = Arc::new(Stats::default());
        let f = Arc::new(Forwarder::new(vec![addr], stats.clone()));
        let answers = futures_util::future::join_all((0..10).map(|_| {
            let f = f.clone();
            async move { f.resolve(&question("same.example.")).await }
        }))
        .await;
        assert!(
            answers
                .iter()
                .all(|a| matches!(a, Resolved::Answer(m) if m.answers.len() == 1))
        );
        assert_eq!(
            udp.load(Ordering::SeqCst),
            1,
            "one upstream query for ten clients"
        );
        assert_eq!(stats.snapshot().coalesced, 9);
        // And the next one comes from the cache.
        assert!(f.cached(&question("SAME.example.")).is_some());
    }

    #[tokio::test]
    async fn a_dropped_leader_leaves_the_name_resolvable() {
        use futures_util::FutureExt;
        let (addr, udp, _) = upstream(Duration::from_millis(300), false).await;
        let stats = Arc::new(Stats::default());
        let f = Forwarder::new(vec![addr], stats.clone());
        // The leader sends its upstream query and is dropped before the answer: a client
        // timeout, a shutdown, a select! that took another branch.
        assert!(
            f.resolve(&question("dropped.example."))
                .now_or_never()
                .is_none(),
            "the first poll is still waiting for the upstream"
        );
        assert!(
            f.inflight.lock().unwrap().is_empty(),
            "no coalescing entry outlives its leader"
        );
        // The next client for the name is answered, by a query of its own.
        assert!(matches!(
            f.resolve(&question("dropped.example.")).await,
            Resolved::Answer(m) if m.answers.len() == 1
        ));
        assert_eq!(stats.snapshot().coalesced, 0);
        assert!(udp.load(Ordering::SeqCst) >= 1);
    }

    #[tokio::test]
    async fn followers_of_a_dropped_leader_ask_again_instead_of_failing() {
        let (addr, _, _) = upstream(Duration::from_millis(300), false).await;
        let f = Arc::new(Forwarder::new(vec![addr], Arc::new(Stats::default())));
        let leader = tokio::spawn({
            let f = f.clone();
            async move { f.resolve(&question("shared.example.")).await }
        });
        // Wait until the leader is in flight, then start a follower and drop the leader.
        while f.inflight.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        let follower = tokio::spawn({
            let f = f.clone();
            async move { f.resolve(&question("shared.example.")).await }
        });
        while f.stats.snapshot().coalesced == 0 {
            tokio::task::yield_now().await;
        }
        leader.abort();
        assert!(matches!(
            follower.await.unwrap(),
            Resolved::Answer(m) if m.answers.len() == 1
        ));
    }

    #[tokio::test]
    async fn a_truncated_upstream_answer_is_asked_again_over_tcp() {
        let (addr, udp, tcp) = upstream(Duration::ZERO, true).await;
        let stats = Stats::default();
        let m = query_upstream(addr, &question("big.example."), &stats)
            .await
            .unwrap();
        assert_eq!(m.answers.len(), 1);
        assert_eq!(
            (udp.load(Ordering::SeqCst), tcp.load(Ordering::SeqCst)),
            (1, 1)
        );
        assert_eq!(stats.snapshot().upstream_tcp_fallbacks, 1);
    }

    #[tokio::test]
    async fn a_dead_upstream_is_a_failure_and_the_next_upstream_is_tried() {
        let dead = UdpSocket::bind("127.0.0.1:0").await.unwrap(); // never answers
        let (alive, _, _) = upstream(Duration::ZERO, false).await;
        let stats = Arc::new(Stats::default());
        let f = Forwarder::new(vec![dead.local_addr().unwrap(), alive], stats.clone());
        assert!(matches!(
            f.resolve(&question("x.example.")).await,
            Resolved::Answer(_)
        ));
        assert_eq!(stats.snapshot().upstream_failures, 1);
    }
}
