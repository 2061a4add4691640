//! `/healthz` and `/readyz` on the metrics address: plain text, one line per check
//! (`[+] name: what it saw` or `[-] name: why it fails`) and a last line that says the
//! outcome; 200 when every check holds, 503 otherwise.
//!
//! - `/healthz`, alive: the process's runtime turns (a heartbeat task ticks every second;
//!   it fails when its last tick is over [`STALE`] old), and every liveness check the daemon
//!   added (the embedded provider's monitor loop turns).
//! - `/readyz`, ready to serve: what `/healthz` checks, and every readiness check the daemon
//!   added (the store answers a query, the front accepts connections, every cluster was
//!   resumed, the embedded provider takes leases).
//!
//! Each check has [`CHECK_TIMEOUT`]. A scrape of `/metrics` runs the readiness checks too and
//! sets `socialweb_broker_ready` and `socialweb_broker_check_ok{check}` from them (what the
//! alert rules read: Prometheus scrapes `/metrics`, not `/readyz`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use futures_util::future::BoxFuture;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

/// A check: `Ok(what it saw)` or `Err(why it fails)`.
pub type Check = Arc<dyn Fn() -> BoxFuture<'static, Result<String, String>> + Send + Sync>;

/// A [`Check`] from an async closure.
pub fn check<F, Fut>(f: F) -> Check
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<String, String>> + Send + 'static,
{
    Arc::new(move || -> BoxFuture<'static, Result<String, String>> { Box::pin(f()) })
}

/// How old the runtime's last heartbeat may be.
pub const STALE: Duration = Duration::from_secs(10);

/// How long one check may take before it counts as failed.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckLabel {
    check: String,
}

type Checks = Arc<Mutex<Vec<(&'static str, Check)>>>;

/// The health checks; cheap to clone.
#[derive(Clone)]
pub struct Health {
    start: Instant,
    /// Milliseconds from `start` to the heartbeat's last tick.
    beat: Arc<AtomicU64>,
    live: Checks,
    ready: Checks,
    ready_gauge: Gauge,
    check_ok: Family<CheckLabel, Gauge>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names = |c: &Checks| -> Vec<&'static str> {
            c.lock().expect("lock").iter().map(|(n, _)| *n).collect()
        };
        f.debug_struct("Health")
            .field("live", &names(&self.live))
            .field("ready", &names(&self.ready))
            .finish_non_exhaustive()
    }
}

impl Default for Health {
    fn default() -> Health {
        Health {
            start: Instant::now(),
            beat: Arc::default(),
            live: Arc::default(),
            ready: Arc::default(),
            ready_gauge: Gauge::default(),
            check_ok: Family::default(),
        }
    }
}

/// One check's line and whether it held.
struct Seen {
    name: &'static str,
    ok: bool,
    line: String,
}

async fn run(name: &'static str, check: Check) -> Seen {
    let r = match tokio::time::timeout(CHECK_TIMEOUT, check()).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {CHECK_TIMEOUT:?}")),
    };
    let (ok, line) = match r {
        Ok(what) => (true, format!("[+] {name}: {what}")),
        Err(why) => (false, format!("[-] {name}: {why}")),
    };
    Seen { name, ok, line }
}

impl Health {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "ready",
            "1 when /readyz answers 200 (every check holds), 0 otherwise; set at each scrape",
            self.ready_gauge.clone(),
        );
        r.register(
            "check_ok",
            "1 when the health check holds, 0 when it fails, by check (the lines of /readyz)",
            self.check_ok.clone(),
        );
    }

    /// Adds a liveness check (`/healthz` and `/readyz`).
    pub fn live(&self, name: &'static str, check: Check) {
        self.live.lock().expect("lock").push((name, check));
    }

    /// Adds a readiness check (`/readyz` only).
    pub fn ready(&self, name: &'static str, check: Check) {
        self.ready.lock().expect("lock").push((name, check));
    }

    /// Ticks the heartbeat every second until `stop`; each tick is also told to systemd's
    /// watchdog when it has one ([`crate::notify`]).
    pub(super) fn beat(&self, stop: CancellationToken) {
        let (start, beat) = (self.start, self.beat.clone());
        let watchdog = crate::notify::watchdog_enabled();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        beat.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
                        if watchdog {
                            crate::notify::alive();
                        }
                    }
                    _ = stop.cancelled() => return,
                }
            }
        });
    }

    fn runtime(&self) -> Seen {
        let last = Duration::from_millis(self.beat.load(Ordering::Relaxed));
        let ago = self.start.elapsed().saturating_sub(last);
        let ok = ago <= STALE;
        let line = if ok {
            format!(
                "[+] runtime: the heartbeat ticked {:.1} s ago",
                ago.as_secs_f64()
            )
        } else {
            format!(
                "[-] runtime: the heartbeat last ticked {:.1} s ago (over {STALE:?}: the runtime is stuck)",
                ago.as_secs_f64()
            )
        };
        Seen {
            name: "runtime",
            ok,
            line,
        }
    }

    async fn check(&self, with_ready: bool) -> Vec<Seen> {
        let mut checks = self.live.lock().expect("lock").clone();
        if with_ready {
            checks.extend(self.ready.lock().expect("lock").iter().cloned());
        }
        let mut seen = vec![self.runtime()];
        seen.extend(
            futures_util::future::join_all(checks.into_iter().map(|(n, c)| run(n, c))).await,
        );
        seen
    }

    /// `/healthz`: whether alive, and the text.
    pub async fn healthz(&self) -> (bool, String) {
        answer("healthz", self.check(false).await)
    }

    /// `/readyz`: whether ready, and the text; sets the readiness gauges.
    pub async fn readyz(&self) -> (bool, String) {
        let seen = self.check(true).await;
        for s in &seen {
            self.check_ok
                .get_or_create(&CheckLabel {
                    check: s.name.into(),
                })
                .set(i64::from(s.ok));
        }
        let (ok, text) = answer("readyz", seen);
        self.ready_gauge.set(i64::from(ok));
        (ok, text)
    }

    /// The two routes.
    pub(super) fn router(&self) -> axum::Router {
        let (h, r) = (self.clone(), self.clone());
        axum::Router::new()
            .route(
                "/healthz",
                axum::routing::get(move || {
                    let h = h.clone();
                    async move { respond(h.healthz().await) }
                }),
            )
            .route(
                "/readyz",
                axum::routing::get(move || {
                    let r = r.clone();
                    async move { respond(r.readyz().await) }
                }),
            )
    }
}

fn answer(what: &str, seen: Vec<Seen>) -> (bool, String) {
    let ok = seen.iter().all(|s| s.ok);
    let mut text: String = seen.into_iter().map(|s| s.line + "\n").collect();
    text.push_str(&format!("{what}: {}\n", if ok { "ok" } else { "failed" }));
    (ok, text)
}

fn respond((ok, text): (bool, String)) -> (StatusCode, String) {
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, text)
}
