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

use super::answer::MAX_UDP_PAYLOAD;
use super::cache::{Cache, Hit, Key};
use super::stats::{Stats, bump};

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
    /// under way), then a stale answer.
    pub async fn resolve(&self, q: &Query) -> Resolved {
        let key = Key::new(&q.name, q.query_type, q.query_class);
        if let Some(m) = self.cached(q) {
            return Resolved::Answer(m);
        }
        bump(&self.stats.cache_misses);
        let (sender, waiter) = {
            let mut inflight = self.inflight.lock().expect("lock");
            match inflight.get(&key) {
                Some(rx) => (None, Some(rx.clone())),
                None => {
                    let (tx, rx) = watch::channel(None);
                    inflight.insert(key.clone(), rx);
                    (Some(tx), None)
                }
            }
        };
        if let Some(mut rx) = waiter {
            bump(&self.stats.coalesced);
            let result = rx.wait_for(Option::is_some).await.map(|r| r.clone());
            return match result {
                Ok(Some(r)) => r,
                _ => Resolved::Failed,
            };
        }
        let result = self.ask_upstreams(q, &key).await;
        self.inflight.lock().expect("lock").remove(&key);
        if let Some(tx) = sender {
            let _ = tx.send(Some(result.clone()));
        }
        result
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
