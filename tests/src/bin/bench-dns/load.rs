//! An open-loop DNS load generator at a fixed rate, for latency percentiles that no per-query
//! printing distorts (dnsperf 2.10 reports only a mean and, with `-v`, prints a line per
//! answer, and its own printing lands in the latencies it reports).
//!
//! Queries go out at `rate` a second, paced against the clock (a late sender catches up, it
//! does not skip), round-robin over a few connected UDP sockets; each socket has its own 16-bit
//! id space, so an id is reused only after 65,536 queries on that socket (2.6 s at 100,000 a
//! second over four sockets). Latency is from the moment a query is sent to the moment its
//! answer is read. A query unanswered one second after the last one was sent is lost; lost
//! queries are counted, not put into the percentiles.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Sockets the queries are spread over.
const SOCKETS: usize = 4;
/// How long answers are awaited after the last query.
const DRAIN: Duration = Duration::from_secs(1);

/// What one run measured.
#[derive(Debug, Clone)]
pub struct Load {
    pub sent: u64,
    pub answered: u64,
    /// Queries sent per second, as achieved.
    pub achieved_qps: f64,
    /// Latencies of answered queries, microseconds, sorted.
    latencies_us: Vec<u32>,
}

impl Load {
    pub fn lost(&self) -> u64 {
        self.sent - self.answered
    }

    /// The `q` quantile (0..1) of answered queries' latency, in milliseconds
    /// (`testbed::stats`: the nearest rank); none when no query was answered.
    pub fn quantile_ms(&self, q: f64) -> Option<f64> {
        testbed::stats::rank(self.latencies_us.len(), q)
            .map(|i| f64::from(self.latencies_us[i]) / 1e3)
    }
}

/// A query for `name` (dotted, no trailing dot) of type `qtype`, id 0, RD set.
pub fn query(name: &str, qtype: u16) -> Vec<u8> {
    let mut q = vec![0, 0, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.split('.').filter(|l| !l.is_empty()) {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&qtype.to_be_bytes());
    q.extend_from_slice(&1u16.to_be_bytes());
    q
}

/// Sends `queries` (cycled; ids are overwritten) to `server` at `rate` a second for
/// `duration`, from the calling thread's network namespace.
pub fn run(
    server: SocketAddr,
    queries: &[Vec<u8>],
    rate: u32,
    duration: Duration,
) -> std::io::Result<Load> {
    let sockets: Vec<Arc<UdpSocket>> = (0..SOCKETS)
        .map(|_| {
            let s = UdpSocket::bind(("0.0.0.0", 0))?;
            s.connect(server)?;
            s.set_read_timeout(Some(Duration::from_millis(50)))?;
            Ok(Arc::new(s))
        })
        .collect::<std::io::Result<_>>()?;
    // When each (socket, id) was sent, in ns since `start` plus one; 0: nothing outstanding.
    let sent_at: Arc<Vec<AtomicU64>> =
        Arc::new((0..SOCKETS * 65536).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let receivers: Vec<_> = sockets
        .iter()
        .enumerate()
        .map(|(k, sock)| {
            let (sock, sent_at, stop) = (sock.clone(), sent_at.clone(), stop.clone());
            std::thread::spawn(move || receive(&sock, k, &sent_at, &stop, start))
        })
        .collect();

    let total = (f64::from(rate) * duration.as_secs_f64()) as u64;
    let period_ns = 1e9 / f64::from(rate);
    let mut buf = Vec::with_capacity(512);
    let mut sent = 0u64;
    while sent < total {
        // Everything due by now goes out; then sleep until the next one is due.
        let now_ns = start.elapsed().as_nanos() as f64;
        let due = ((now_ns / period_ns) as u64 + 1).min(total);
        while sent < due {
            let k = (sent as usize) % SOCKETS;
            let id = ((sent as usize / SOCKETS) % 65536) as u16;
            buf.clear();
            buf.extend_from_slice(&queries[(sent as usize) % queries.len()]);
            buf[..2].copy_from_slice(&id.to_be_bytes());
            let slot = k * 65536 + usize::from(id);
            sent_at[slot].store(start.elapsed().as_nanos() as u64 + 1, Ordering::Release);
            if sockets[k].send(&buf).is_err() {
                sent_at[slot].store(0, Ordering::Release);
            }
            sent += 1;
        }
        let next_ns = (sent as f64 * period_ns) as u64;
        let now_ns = start.elapsed().as_nanos() as u64;
        if next_ns > now_ns + 50_000 {
            std::thread::sleep(Duration::from_nanos(next_ns - now_ns - 20_000));
        }
    }
    let sending = start.elapsed();
    std::thread::sleep(DRAIN);
    stop.store(true, Ordering::Release);
    let mut latencies_us = Vec::with_capacity(total as usize);
    for r in receivers {
        latencies_us.extend(r.join().expect("a receiver thread panicked"));
    }
    latencies_us.sort_unstable();
    Ok(Load {
        sent,
        answered: latencies_us.len() as u64,
        achieved_qps: sent as f64 / sending.as_secs_f64(),
        latencies_us,
    })
}

/// Reads answers on socket `k` until told to stop; returns their latencies (µs).
fn receive(
    sock: &UdpSocket,
    k: usize,
    sent_at: &[AtomicU64],
    stop: &AtomicBool,
    start: Instant,
) -> Vec<u32> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while !stop.load(Ordering::Acquire) {
        let Ok(n) = sock.recv(&mut buf) else { continue };
        if n < 12 {
            continue;
        }
        let id = u16::from_be_bytes([buf[0], buf[1]]);
        let t0 = sent_at[k * 65536 + usize::from(id)].swap(0, Ordering::AcqRel);
        if t0 != 0 {
            let ns = (start.elapsed().as_nanos() as u64).saturating_sub(t0 - 1);
            out.push(u32::try_from(ns / 1000).unwrap_or(u32::MAX));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_take_the_rank_above() {
        let l = Load {
            sent: 10,
            answered: 10,
            achieved_qps: 0.0,
            latencies_us: (1..=10).map(|x| x * 1000).collect(),
        };
        assert_eq!(l.quantile_ms(0.5), Some(5.0));
        assert_eq!(l.quantile_ms(0.99), Some(10.0));
        assert_eq!(l.quantile_ms(0.0), Some(1.0));
    }

    #[test]
    fn queries_are_plain_wire_format() {
        let q = query("a.bc", 1);
        assert_eq!(
            q,
            [
                0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, b'a', 2, b'b', b'c', 0, 0, 1, 0, 1
            ]
        );
    }
}
