//! A fleet host's reachability, carried out (`socialweb_broker_core::reach` decides): once a
//! renewal period the host tries a TCP connection to every live peer's link (its public
//! address, where users' requests and nodes' tunnels arrive too), records its successes in
//! the store, and reads what its peers recorded of it. Cut off -- no live peer reached it
//! for a lease's TTL while they reached each other -- it gives its clusters up as a drained
//! host does (each control plane stopped, its lease released, so another host serves it at
//! once) and claims none until a peer reaches it again. Without it, a host that reaches the
//! store but not its users keeps its leases, and its clusters unserved, for ever.

use std::sync::Arc;
use std::time::Duration;

use socialweb_broker_core::reach::{Verdict, verdict};
use tokio::time::Instant;
use tracing::{info, warn};

use super::Clusters;

/// How long one probe may take: half a renewal period, at most a second.
fn probe_timeout(period: Duration) -> Duration {
    (period / 2).min(Duration::from_secs(1))
}

/// The peers of `links` (id, link URL) whose link took a TCP connection within `timeout`.
async fn probe(links: &[(String, String)], timeout: Duration) -> Vec<String> {
    let tries = links.iter().map(|(id, link)| async move {
        let uri: http::Uri = link.parse().ok()?;
        let (host, port) = (uri.host()?.trim_matches(['[', ']']), uri.port_u16()?);
        let connected = tokio::time::timeout(timeout, tokio::net::TcpStream::connect((host, port)));
        matches!(connected.await, Ok(Ok(_))).then(|| id.clone())
    });
    futures_util::future::join_all(tries)
        .await
        .into_iter()
        .flatten()
        .collect()
}

impl Clusters {
    /// Probes the fleet's peers and follows the verdict until the broker stops; returns at
    /// once outside a fleet.
    pub(super) async fn watch_reach(self: Arc<Self>) {
        let Some(own) = self.ownership() else {
            return;
        };
        let (period, window) = (own.timing.renew_every(), own.timing.ttl);
        let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
        // Peers need a window to have tried this host: no verdict before.
        let started = Instant::now();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = self.stop.cancelled() => return,
            }
            let reach = match self.store.reach(window).await {
                Ok(r) => r,
                Err(e) => {
                    // The leases' own rules handle a store out of reach.
                    warn!("reading the fleet's reachability: {e:#}");
                    continue;
                }
            };
            let peers: Vec<(String, String)> = reach
                .live
                .iter()
                .filter(|(id, _)| *id != own.host)
                .cloned()
                .collect();
            let ok = probe(&peers, probe_timeout(period)).await;
            if let Err(e) = self.store.reached(&own.host, &ok).await {
                warn!("recording the peers this host reached: {e:#}");
            }
            let live: Vec<String> = reach.live.into_iter().map(|(id, _)| id).collect();
            let v = verdict(&own.host, &live, &reach.reached, reach.now, window_ms);
            self.set_cut_off(&v, started.elapsed() >= window, &own.metrics);
        }
    }

    /// Follows verdict `v` (acted on only once `judged`: peers had a window to try).
    fn set_cut_off(&self, v: &Verdict, judged: bool, metrics: &crate::metrics::Fleet) {
        let cut = judged && matches!(v, Verdict::CutOff { .. });
        let was = self.cut_off.swap(cut, std::sync::atomic::Ordering::SeqCst);
        if cut != was {
            if let Verdict::CutOff { peers } = v {
                warn!(
                    reached_each_other = ?peers,
                    "no host of the fleet reached this one for a lease's TTL while they reached \
                     each other: this host is cut off from its users, and gives its clusters up"
                );
            } else {
                info!("a host of the fleet reached this one again: it claims clusters again");
            }
            metrics.cut_off(cut);
        }
        self.give_up_or_not();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_probe_names_the_peers_whose_link_took_a_connection() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let open = listener.local_addr().unwrap().port();
        // A port just closed: refused.
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let links = [
            ("up".to_string(), format!("https://127.0.0.1:{open}")),
            ("down".to_string(), format!("https://127.0.0.1:{closed}")),
            ("bad".to_string(), "not a url".to_string()),
        ];
        assert_eq!(probe(&links, Duration::from_secs(1)).await, vec!["up"]);
        assert_eq!(
            probe_timeout(Duration::from_secs(2)),
            Duration::from_secs(1)
        );
        assert_eq!(
            probe_timeout(Duration::from_millis(400)),
            Duration::from_millis(200)
        );
    }
}
