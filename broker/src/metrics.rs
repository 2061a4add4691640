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
        *m.registry.lock().expect("lock") = r;
        m
    }
}

impl Metrics {
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
