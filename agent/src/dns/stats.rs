//! Node-local DNS counters (atomics), and the snapshot `socialweb-agent dns stats` prints.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Upper bounds (µs) of the upstream latency histogram's buckets; the last bucket is open.
const BUCKETS_US: [u64; 12] = [
    250, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 250_000, 1_000_000, 5_000_000,
];

#[derive(Debug, Default)]
pub struct Stats {
    pub queries_udp: AtomicU64,
    pub queries_tcp: AtomicU64,
    /// Answered from the cluster zone (or its reverse zones).
    pub cluster: AtomicU64,
    /// Pod search walks answered in one round trip.
    pub autopath: AtomicU64,
    pub cache_hits: AtomicU64,
    pub cache_misses: AtomicU64,
    /// Queries that waited for another identical query's upstream answer.
    pub coalesced: AtomicU64,
    pub upstream_queries: AtomicU64,
    pub upstream_failures: AtomicU64,
    pub upstream_tcp_fallbacks: AtomicU64,
    /// Answers served past their TTL because the upstreams failed.
    pub stale: AtomicU64,
    pub servfail: AtomicU64,
    pub formerr: AtomicU64,
    pub truncated: AtomicU64,
    /// Packets that were not DNS messages at all (no reply sent).
    pub dropped: AtomicU64,
    /// UDP queries refused because [`super::server::SLOW_UDP_MAX`] were already waiting on an
    /// upstream.
    pub shed: AtomicU64,
    latency: [AtomicU64; BUCKETS_US.len() + 1],
    latency_sum_us: AtomicU64,
}

pub fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Stats {
    pub fn upstream_latency(&self, d: Duration) {
        let us = d.as_micros() as u64;
        let i = BUCKETS_US
            .iter()
            .position(|b| us <= *b)
            .unwrap_or(BUCKETS_US.len());
        bump(&self.latency[i]);
        self.latency_sum_us.fetch_add(us, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> DnsStats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let counts: Vec<u64> = self.latency.iter().map(g).collect();
        let total: u64 = counts.iter().sum();
        let quantile = |q: f64| -> Option<f64> {
            if total == 0 {
                return None;
            }
            let want = (total as f64 * q).ceil() as u64;
            let mut seen = 0;
            for (i, c) in counts.iter().enumerate() {
                seen += c;
                if seen >= want {
                    return Some(*BUCKETS_US.get(i).unwrap_or(&10_000_000) as f64 / 1000.0);
                }
            }
            None
        };
        DnsStats {
            queries_udp: g(&self.queries_udp),
            queries_tcp: g(&self.queries_tcp),
            cluster: g(&self.cluster),
            autopath: g(&self.autopath),
            cache_hits: g(&self.cache_hits),
            cache_misses: g(&self.cache_misses),
            coalesced: g(&self.coalesced),
            upstream_queries: g(&self.upstream_queries),
            upstream_failures: g(&self.upstream_failures),
            upstream_tcp_fallbacks: g(&self.upstream_tcp_fallbacks),
            stale: g(&self.stale),
            servfail: g(&self.servfail),
            formerr: g(&self.formerr),
            truncated: g(&self.truncated),
            dropped: g(&self.dropped),
            shed: g(&self.shed),
            upstream_latency_mean_ms: (total > 0)
                .then(|| g(&self.latency_sum_us) as f64 / total as f64 / 1000.0),
            upstream_latency_p50_ms_at_most: quantile(0.5),
            upstream_latency_p99_ms_at_most: quantile(0.99),
            cache_entries: 0,
            cluster_names: 0,
            pods_known: 0,
            slow_udp_in_flight: 0,
        }
    }
}

/// What `dns stats` shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DnsStats {
    pub queries_udp: u64,
    pub queries_tcp: u64,
    pub cluster: u64,
    pub autopath: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub coalesced: u64,
    pub upstream_queries: u64,
    pub upstream_failures: u64,
    pub upstream_tcp_fallbacks: u64,
    pub stale: u64,
    pub servfail: u64,
    pub formerr: u64,
    pub truncated: u64,
    pub dropped: u64,
    pub shed: u64,
    pub upstream_latency_mean_ms: Option<f64>,
    /// Upper bound of the histogram bucket holding the median.
    pub upstream_latency_p50_ms_at_most: Option<f64>,
    pub upstream_latency_p99_ms_at_most: Option<f64>,
    pub cache_entries: usize,
    pub cluster_names: usize,
    pub pods_known: usize,
    /// UDP queries waiting on an upstream now.
    pub slow_udp_in_flight: usize,
}
