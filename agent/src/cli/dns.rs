//! `socialweb-agent dns stats`.

use std::fmt::Write;

use crate::dns::stats::DnsStats;

/// One counter a line, `-` for a latency not measured yet.
pub fn stats_text(s: &DnsStats) -> String {
    let ms = |v: Option<f64>| v.map(|v| v.to_string()).unwrap_or_else(|| "-".into());
    let rows: [(&str, String); 23] = [
        ("queries_udp", s.queries_udp.to_string()),
        ("queries_tcp", s.queries_tcp.to_string()),
        ("cluster", s.cluster.to_string()),
        ("autopath", s.autopath.to_string()),
        ("cache_hits", s.cache_hits.to_string()),
        ("cache_misses", s.cache_misses.to_string()),
        ("coalesced", s.coalesced.to_string()),
        ("upstream_queries", s.upstream_queries.to_string()),
        ("upstream_failures", s.upstream_failures.to_string()),
        (
            "upstream_tcp_fallbacks",
            s.upstream_tcp_fallbacks.to_string(),
        ),
        ("stale", s.stale.to_string()),
        ("servfail", s.servfail.to_string()),
        ("formerr", s.formerr.to_string()),
        ("truncated", s.truncated.to_string()),
        ("dropped", s.dropped.to_string()),
        ("shed", s.shed.to_string()),
        ("upstream_latency_mean_ms", ms(s.upstream_latency_mean_ms)),
        (
            "upstream_latency_p50_ms_at_most",
            ms(s.upstream_latency_p50_ms_at_most),
        ),
        (
            "upstream_latency_p99_ms_at_most",
            ms(s.upstream_latency_p99_ms_at_most),
        ),
        ("cache_entries", s.cache_entries.to_string()),
        ("cluster_names", s.cluster_names.to_string()),
        ("pods_known", s.pods_known.to_string()),
        ("slow_udp_in_flight", s.slow_udp_in_flight.to_string()),
    ];
    let mut out = String::new();
    for (name, value) in rows {
        let _ = writeln!(out, "{name:<28} {value}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_counter_has_its_line() {
        let stats = crate::dns::stats::Stats::default().snapshot();
        let text = stats_text(&stats);
        let json = serde_json::to_value(&stats).unwrap();
        for key in json.as_object().unwrap().keys() {
            assert!(
                text.lines()
                    .any(|l| l.split_whitespace().next() == Some(key)),
                "{key} missing:\n{text}"
            );
        }
        assert_eq!(text.lines().count(), json.as_object().unwrap().len());
    }
}
