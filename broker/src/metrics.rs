//! The broker's Prometheus metrics (`prometheus-client`), served at `/metrics` on the
//! metrics address (loopback by default): decisions by action, provisions by step,
//! provision latency (planned to joined), relay traffic, and the decision's cost.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use socialweb_broker_core::Step;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabel {
    action: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepLabel {
    step: String,
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
    /// Clusters whose control plane hibernates now (docs/hibernation.md).
    pub hibernating: Gauge,
    hibernations: Counter,
    wakes: Counter,
    wake_failures: Counter,
    wake_seconds: Histogram,
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
            hibernating: Gauge::default(),
            hibernations: Counter::default(),
            wakes: Counter::default(),
            wake_failures: Counter::default(),
            wake_seconds: Histogram::new([0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 60.0]),
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
        m.register_hibernation(&mut r);
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

    /// The text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(
            &mut out,
            &self.registry.lock().expect("lock"),
        );
        out
    }

    /// Serves `/metrics` on `addr` until `stop`.
    pub async fn serve(&self, addr: SocketAddr, stop: CancellationToken) -> Result<SocketAddr> {
        let m = self.clone();
        let app = axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || {
                let m = m.clone();
                async move {
                    (
                        [(
                            "content-type",
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        m.encode(),
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("metrics: binding {addr}"))?;
        let bound = listener.local_addr()?;
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await;
        });
        Ok(bound)
    }
}
