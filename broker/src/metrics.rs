//! The broker's Prometheus metrics (`prometheus-client`) and its health, served on the
//! metrics address (loopback by default): `/metrics` (decisions by action, provisions by step
//! and live ones by cluster and provider, provision latency, the front's and the gateway
//! API's requests, market calls and failures by provider, control planes' component
//! restarts, hibernation, a fleet host's leases, the state directory's free space),
//! `/healthz` and `/readyz` ([`Health`]).
//!
//! Every label is bounded: `cluster` by the clusters that exist (at most
//! `access.max_clusters`; a deleted cluster's series are removed), `provider` by the
//! configured providers, `call`, `kind`, `method`, `door`, `class`, `step` and `component` by
//! fixed lists. A request for a path no mounted cluster answers is counted without a cluster.

mod backups;
mod certificates;
mod disk;
mod fleet;
mod health;

pub use backups::Backups;
pub use certificates::Certificates;
pub use disk::Disk;
pub use fleet::Fleet;
pub use health::{Check, Health, check};

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use socialweb_broker_core::{Provision, Step};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabel {
    action: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepLabel {
    step: String,
}

/// Which door of the front a request came in by: `cluster` (a tenant apiserver) or `api`
/// (the gateway API, `/xrpc/`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DoorLabel {
    door: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DoorClass {
    door: String,
    class: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterClass {
    cluster: String,
    class: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabel {
    method: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodClass {
    method: String,
    class: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabel {
    provider: String,
    call: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabel {
    provider: String,
    call: String,
    kind: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ComponentLabel {
    cluster: String,
    component: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

/// The relay's gate (`relay::gate`): connections it holds now, those it refused at once by
/// reason (`per_source`, `total`), and those it cut by reason (`handshake`: no first bytes
/// within `relay.handshake_timeout`; `idle`: nothing from the client for
/// `relay.idle_timeout`). Cheap to clone; a gate outside the daemon (`socialweb-broker
/// relay`) keeps one that no registry reads.
#[derive(Debug, Clone, Default)]
pub struct RelayGate {
    held: Gauge,
    refused: Family<ReasonLabel, Counter>,
    cut: Family<ReasonLabel, Counter>,
}

impl RelayGate {
    fn register(&self, r: &mut Registry) {
        r.register(
            "relay_connections",
            "TCP connections the relay holds open now",
            self.held.clone(),
        );
        r.register(
            "relay_connections_refused",
            "TCP connections to the relay closed at once, by reason (per_source, total)",
            self.refused.clone(),
        );
        r.register(
            "relay_connections_cut",
            "TCP connections to the relay cut, by reason (handshake: no first bytes in time; idle: nothing from the client for relay.idle_timeout)",
            self.cut.clone(),
        );
    }

    /// A connection was admitted (`true`) or has ended (`false`).
    pub fn held(&self, yes: bool) {
        if yes {
            self.held.inc();
        } else {
            self.held.dec();
        }
    }

    pub fn refused(&self, reason: &str) {
        self.refused
            .get_or_create(&ReasonLabel {
                reason: reason.into(),
            })
            .inc();
    }

    pub fn cut(&self, reason: &str) {
        self.cut
            .get_or_create(&ReasonLabel {
                reason: reason.into(),
            })
            .inc();
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProvisionLabel {
    cluster: String,
    provider: String,
    step: String,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// Request latency buckets, seconds: time to the response's headers (a watch's or an exec's
/// is the time its stream was answered, not how long it stayed open).
fn request_histogram() -> Histogram {
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    ])
}

/// A status code's class: `2xx`, `4xx`, ...
pub fn status_class(status: u16) -> String {
    format!("{}xx", (status / 100).clamp(1, 5))
}

/// The front's and the gateway API's requests, the market's calls, control-plane restarts
/// and the live provisions by cluster and provider.
#[derive(Debug, Clone)]
struct Traffic {
    front_requests: Family<DoorClass, Counter>,
    front_seconds: Histograms<DoorLabel>,
    cluster_requests: Family<ClusterClass, Counter>,
    api_requests: Family<MethodClass, Counter>,
    api_seconds: Histograms<MethodLabel>,
    market_calls: Family<CallLabel, Counter>,
    market_failures: Family<FailureLabel, Counter>,
    restarts: Family<ComponentLabel, Counter>,
    provisions: Family<ProvisionLabel, Gauge>,
    /// The label sets of `provisions` set last (the ones to remove when they go).
    provisions_set: Arc<Mutex<Vec<ProvisionLabel>>>,
    oldest_pending: Gauge,
}

impl Default for Traffic {
    fn default() -> Traffic {
        Traffic {
            front_requests: Family::default(),
            front_seconds: Family::new_with_constructor(request_histogram),
            cluster_requests: Family::default(),
            api_requests: Family::default(),
            api_seconds: Family::new_with_constructor(request_histogram),
            market_calls: Family::default(),
            market_failures: Family::default(),
            restarts: Family::default(),
            provisions: Family::default(),
            provisions_set: Arc::default(),
            oldest_pending: Gauge::default(),
        }
    }
}

impl Traffic {
    fn register(&self, r: &mut Registry) {
        r.register(
            "front_requests",
            "Requests the front answered, by door (cluster, api) and status class",
            self.front_requests.clone(),
        );
        r.register(
            "front_request_seconds",
            "Time the front took to answer a request's headers, by door",
            self.front_seconds.clone(),
        );
        r.register(
            "cluster_requests",
            "Requests the front answered for a mounted cluster, by cluster and status class",
            self.cluster_requests.clone(),
        );
        r.register(
            "api_requests",
            "Gateway API calls, by method (other: no such method) and status class",
            self.api_requests.clone(),
        );
        r.register(
            "api_request_seconds",
            "Time a gateway API call took, by method",
            self.api_seconds.clone(),
        );
        self.register_market(r);
    }

    fn register_market(&self, r: &mut Registry) {
        r.register(
            "market_calls",
            "Market protocol calls made, by provider and call",
            self.market_calls.clone(),
        );
        r.register(
            "market_failures",
            "Market calls that failed, by provider, call and kind (timeout, unreachable, refused, garbage)",
            self.market_failures.clone(),
        );
        r.register(
            "component_restarts",
            "Control-plane components the broker's supervisor restarted after they exited, by cluster and component",
            self.restarts.clone(),
        );
        r.register(
            "provisions",
            "Live provisions by cluster, provider (none before a bid is accepted) and step",
            self.provisions.clone(),
        );
        r.register(
            "provision_oldest_pending_timestamp_seconds",
            "When the oldest live provision not yet joined was planned (Unix time); 0 when none is pending",
            self.oldest_pending.clone(),
        );
    }
}

/// The metrics; cheap to clone.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Arc<Mutex<Registry>>,
    decisions: Family<ActionLabel, Counter>,
    steps: Family<StepLabel, Counter>,
    provision_seconds: Histogram,
    decide_seconds: Histogram,
    orphans_released: Counter,
    /// Live provisions, set by the daemon after each change.
    pub live_provisions: Gauge,
    pub relay_bytes: Counter,
    /// The relay's gate: its connections held, refused and cut.
    pub relay_gate: RelayGate,
    /// Clusters whose control plane hibernates now (docs/hibernation.md).
    pub hibernating: Gauge,
    hibernations: Counter,
    wakes: Counter,
    wake_failures: Counter,
    wake_seconds: Histogram,
    traffic: Traffic,
    /// `/healthz` and `/readyz`, and the gauges they set at each scrape.
    pub health: Health,
    /// A fleet host's leases.
    pub fleet: Fleet,
    /// The state directory's filesystem.
    pub disk: Disk,
    /// Scheduled backups.
    pub backups: Backups,
    /// When the certificates end.
    pub certificates: Certificates,
}

impl Default for Metrics {
    fn default() -> Metrics {
        let mut r = Registry::with_prefix("socialweb_broker");
        let m = Metrics {
            registry: Arc::new(Mutex::new(Registry::default())),
            decisions: Family::default(),
            steps: Family::default(),
            provision_seconds: Histogram::new([
                1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0,
            ]),
            decide_seconds: Histogram::new([1e-5, 1e-4, 1e-3, 1e-2, 1e-1]),
            orphans_released: Counter::default(),
            live_provisions: Gauge::default(),
            relay_bytes: Counter::default(),
            relay_gate: RelayGate::default(),
            hibernating: Gauge::default(),
            hibernations: Counter::default(),
            wakes: Counter::default(),
            wake_failures: Counter::default(),
            wake_seconds: Histogram::new([0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 60.0]),
            traffic: Traffic::default(),
            health: Health::default(),
            fleet: Fleet::default(),
            disk: Disk::default(),
            backups: Backups::default(),
            certificates: Certificates::default(),
        };
        r.register(
            "decisions",
            "Scale decisions recorded, by action",
            m.decisions.clone(),
        );
        r.register(
            "provision_steps",
            "Provisions entering each step",
            m.steps.clone(),
        );
        r.register(
            "provision_seconds",
            "Time from a node planned to its Node joined",
            m.provision_seconds.clone(),
        );
        r.register(
            "decide_seconds",
            "Time one scale decision takes",
            m.decide_seconds.clone(),
        );
        r.register(
            "orphan_leases_released",
            "Leases found at the provider that no provision owned, released",
            m.orphans_released.clone(),
        );
        r.register(
            "live_provisions",
            "Nodes rented or being rented",
            m.live_provisions.clone(),
        );
        r.register(
            "relay_bytes",
            "Bytes the mesh relay carried",
            m.relay_bytes.clone(),
        );
        m.relay_gate.register(&mut r);
        m.register_hibernation(&mut r);
        m.traffic.register(&mut r);
        m.health.register(&mut r);
        m.fleet.register(&mut r);
        m.disk.register(&mut r);
        m.backups.register(&mut r);
        m.certificates.register(&mut r);
        *m.registry.lock().expect("lock") = r;
        m
    }
}

impl Metrics {
    /// Hibernation's metrics (docs/hibernation.md).
    fn register_hibernation(&self, r: &mut Registry) {
        r.register(
            "clusters_hibernating",
            "Clusters whose control plane is stopped while idle",
            self.hibernating.clone(),
        );
        r.register(
            "hibernations",
            "Control planes stopped while idle",
            self.hibernations.clone(),
        );
        r.register(
            "wakes",
            "Hibernating clusters woken (one per wake, however many requests asked)",
            self.wakes.clone(),
        );
        r.register(
            "wake_failures",
            "Wakes that failed (their held requests were answered 503)",
            self.wake_failures.clone(),
        );
        r.register(
            "wake_seconds",
            "Time from a wake's start to its apiserver answering",
            self.wake_seconds.clone(),
        );
    }

    pub fn decision(&self, action: &str) {
        self.decisions
            .get_or_create(&ActionLabel {
                action: action.into(),
            })
            .inc();
    }

    pub fn step(&self, step: Step) {
        self.steps
            .get_or_create(&StepLabel {
                step: step.as_str().into(),
            })
            .inc();
    }

    pub fn provisioned(&self, seconds: f64) {
        self.provision_seconds.observe(seconds);
    }

    pub fn decided(&self, seconds: f64) {
        self.decide_seconds.observe(seconds);
    }

    /// A control plane stopped while idle.
    pub fn hibernated(&self) {
        self.hibernations.inc();
    }

    /// A cluster's life sleeps (`true`) or stopped sleeping (`false`).
    pub fn asleep(&self, yes: bool) {
        if yes {
            self.hibernating.inc();
        } else {
            self.hibernating.dec();
        }
    }

    /// A wake began.
    pub fn waking(&self) {
        self.wakes.inc();
    }

    /// A wake's apiserver answered after `seconds`.
    pub fn woke(&self, seconds: f64) {
        self.wake_seconds.observe(seconds);
    }

    pub fn wake_failed(&self) {
        self.wake_failures.inc();
    }

    pub fn orphan(&self) {
        self.orphans_released.inc();
    }

    /// A request the front answered: at the gateway API (`api`) or a cluster's door.
    pub fn front_request(&self, api: bool, status: u16, took: Duration) {
        let door = if api { "api" } else { "cluster" }.to_string();
        self.traffic
            .front_requests
            .get_or_create(&DoorClass {
                door: door.clone(),
                class: status_class(status),
            })
            .inc();
        self.traffic
            .front_seconds
            .get_or_create(&DoorLabel { door })
            .observe(took.as_secs_f64());
    }

    /// A request the front answered for mounted cluster `cluster` (forwarded to its
    /// apiserver, or answered 503 by a failed wake).
    pub fn cluster_request(&self, cluster: &str, status: u16) {
        self.traffic
            .cluster_requests
            .get_or_create(&ClusterClass {
                cluster: cluster.into(),
                class: status_class(status),
            })
            .inc();
    }

    /// A gateway API call to `method` (one of the API's methods, or `other`).
    pub fn api_request(&self, method: &str, status: u16, took: Duration) {
        self.traffic
            .api_requests
            .get_or_create(&MethodClass {
                method: method.into(),
                class: status_class(status),
            })
            .inc();
        self.traffic
            .api_seconds
            .get_or_create(&MethodLabel {
                method: method.into(),
            })
            .observe(took.as_secs_f64());
    }

    /// A market call to `provider`, and how it failed (`None`: it did not).
    pub fn market_call(&self, provider: &str, call: &str, failed: Option<&str>) {
        let (provider, call) = (provider.to_string(), call.to_string());
        self.traffic
            .market_calls
            .get_or_create(&CallLabel {
                provider: provider.clone(),
                call: call.clone(),
            })
            .inc();
        if let Some(kind) = failed {
            self.traffic
                .market_failures
                .get_or_create(&FailureLabel {
                    provider,
                    call,
                    kind: kind.into(),
                })
                .inc();
        }
    }

    /// The supervisor restarted `component` of `cluster`'s control plane after it exited.
    pub fn component_restarted(&self, cluster: &str, component: &str) {
        self.traffic
            .restarts
            .get_or_create(&ComponentLabel {
                cluster: cluster.into(),
                component: component.into(),
            })
            .inc();
    }

    /// A deleted cluster's series go (its label stays bounded by the clusters that exist).
    pub fn forget_cluster(&self, cluster: &str) {
        self.certificates.forget(cluster);
        let t = &self.traffic;
        for class in ["1xx", "2xx", "3xx", "4xx", "5xx"] {
            t.cluster_requests.remove(&ClusterClass {
                cluster: cluster.into(),
                class: class.into(),
            });
        }
        for component in [
            "etcd",
            "kine",
            "apiserver",
            "controller-manager",
            "scheduler",
        ] {
            t.restarts.remove(&ComponentLabel {
                cluster: cluster.into(),
                component: component.into(),
            });
        }
    }

    /// The live provisions as the store has them now: the gauges by cluster, provider and
    /// step, and when the oldest one not yet joined was planned.
    pub fn provisions(&self, live: &[Provision]) {
        let t = &self.traffic;
        let mut counts: HashMap<ProvisionLabel, i64> = HashMap::new();
        for p in live {
            let key = ProvisionLabel {
                cluster: p.cluster.clone(),
                provider: p.provider.clone().unwrap_or_else(|| "none".into()),
                step: p.state.as_str().into(),
            };
            *counts.entry(key).or_default() += 1;
        }
        let mut set = t.provisions_set.lock().expect("lock");
        for gone in set.iter().filter(|k| !counts.contains_key(*k)) {
            t.provisions.remove(gone);
        }
        for (k, n) in &counts {
            t.provisions.get_or_create(k).set(*n);
        }
        *set = counts.into_keys().collect();
        let oldest = live
            .iter()
            .filter(|p| p.state != Step::Joined)
            .map(|p| p.created_at)
            .min();
        t.oldest_pending.set(oldest.map_or(0, |ms| ms / 1000));
    }

    /// The text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(
            &mut out,
            &self.registry.lock().expect("lock"),
        );
        out
    }

    /// Serves `/metrics`, `/healthz` and `/readyz` on `addr` until `stop`.
    pub async fn serve(&self, addr: SocketAddr, stop: CancellationToken) -> Result<SocketAddr> {
        let m = self.clone();
        let app = axum::Router::new()
            .route(
                "/metrics",
                axum::routing::get(move || {
                    let m = m.clone();
                    async move {
                        // The readiness gauges as of this scrape.
                        m.health.readyz().await;
                        (
                            [(
                                "content-type",
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            )],
                            m.encode(),
                        )
                    }
                }),
            )
            .merge(self.health.router());
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("metrics.listen: binding {addr}"))?;
        let bound = listener.local_addr()?;
        self.health.beat(stop.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await;
        });
        Ok(bound)
    }
}

/// The series names an exposition (text or OpenMetrics) declares: for each `# TYPE name
/// kind`, the names its samples carry (`name`, a counter's `name_total`, a histogram's
/// `name_bucket`, `name_sum`, `name_count`).
pub fn series_names(exposition: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    for line in exposition.lines() {
        let mut w = line.split_whitespace();
        if (w.next(), w.next()) != (Some("#"), Some("TYPE")) {
            continue;
        }
        let (Some(name), Some(kind)) = (w.next(), w.next()) else {
            continue;
        };
        out.insert(name.to_string());
        let suffixes: &[&str] = match kind {
            "counter" => &["_total", "_created"],
            "histogram" => &["_bucket", "_sum", "_count", "_created"],
            _ => &[],
        };
        out.extend(suffixes.iter().map(|s| format!("{name}{s}")));
    }
    out
}

/// The `socialweb_*` series a rules file or a dashboard reads.
pub fn names_used(text: &str) -> std::collections::BTreeSet<String> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    text.split(|c: char| !is_name(c))
        .filter(|w| w.starts_with("socialweb_"))
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn monitoring(file: &str) -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("deploy/monitoring")
            .join(file)
    }

    #[test]
    fn the_alert_rules_pass_promtool() {
        let rules = monitoring("alerts.yaml");
        let out = std::process::Command::new("promtool")
            .arg("check")
            .arg("rules")
            .arg(&rules)
            .output()
            .expect("running promtool (Debian's prometheus package; ./x installs it)");
        assert!(
            out.status.success(),
            "promtool check rules {}:\n{}{}",
            rules.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Every family with a sample: an empty one is not encoded at all.
    async fn every_family() -> Metrics {
        let m = Metrics::default();
        m.decision("Provision");
        m.step(Step::Planned);
        m.provisioned(1.0);
        m.decided(0.001);
        m.orphan();
        m.hibernated();
        m.waking();
        m.woke(1.0);
        m.wake_failed();
        m.front_request(true, 200, Duration::from_millis(1));
        m.cluster_request("a", 200);
        m.api_request("other", 501, Duration::from_millis(1));
        m.market_call("p", "offer", Some("timeout"));
        m.component_restarted("a", "apiserver");
        m.relay_gate.held(true);
        m.relay_gate.refused("per_source");
        m.relay_gate.cut("idle");
        m.traffic
            .provisions
            .get_or_create(&ProvisionLabel {
                cluster: "a".into(),
                provider: "p".into(),
                step: "joined".into(),
            })
            .set(1);
        m.health.readyz().await;
        m.fleet.claimed(true);
        m.fleet.ended(true);
        m.fleet.fenced(1);
        m.fleet.renewed(0.01);
        m.disk.refused();
        m.backups.taken(1);
        m.backups.failed();
        m.certificates.seen("front", crate::pki::Expiry::default());
        m
    }

    /// The provider's series are checked against a running provider (tests/tests/broker.rs).
    #[tokio::test]
    async fn the_rules_and_the_dashboard_read_only_series_the_broker_exports() {
        let exported = series_names(&every_family().await.encode());
        assert!(exported.contains("socialweb_broker_front_requests_total"));
        for file in ["alerts.yaml", "dashboard.json"] {
            let text = std::fs::read_to_string(monitoring(file)).unwrap();
            let used = names_used(&text);
            assert!(!used.is_empty(), "{file} reads no socialweb series");
            let unknown: Vec<_> = used
                .iter()
                .filter(|n| n.starts_with("socialweb_broker_") && !exported.contains(*n))
                .collect();
            assert!(
                unknown.is_empty(),
                "{file} reads series the broker does not export: {unknown:?}"
            );
        }
        let dashboard: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(monitoring("dashboard.json")).unwrap())
                .unwrap();
        assert!(dashboard["panels"].as_array().is_some_and(|p| p.len() > 10));
    }

    #[test]
    fn labels_stay_bounded_and_a_deleted_clusters_series_go() {
        let m = Metrics::default();
        m.cluster_request("a", 200);
        m.cluster_request("a", 503);
        m.component_restarted("a", "apiserver");
        m.front_request(false, 404, Duration::from_millis(3));
        m.market_call("p1", "accept", Some("timeout"));
        let text = m.encode();
        assert!(
            text.contains(r#"socialweb_broker_cluster_requests_total{cluster="a",class="5xx"} 1"#),
            "{text}"
        );
        assert!(text.contains(r#"socialweb_broker_market_failures_total{provider="p1",call="accept",kind="timeout"} 1"#), "{text}");
        m.forget_cluster("a");
        let text = m.encode();
        assert!(!text.contains(r#"cluster="a""#), "{text}");
        assert_eq!(status_class(99), "1xx");
        assert_eq!(status_class(504), "5xx");
        assert_eq!(status_class(600), "5xx");
    }
}
