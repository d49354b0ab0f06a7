//! The gateway's own probes: `/liveness` and `/health` (200 while the process runs, shutdown
//! included) and `/readiness` (whether a request could be served now), plus `/metrics`.
//!
//! Readiness is served from memory: it is recomputed only when the fleet signals a change (a
//! worker's health, a circuit, the snapshot), so a probe costs the same whatever the fleet's
//! size. With `--health-check-port`, the probes are also served from a listener with its own
//! thread and runtime, so a saturated gateway still answers its orchestrator.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use arc_swap::ArcSwap;
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use prometheus_client::registry::Registry;
use serde::Serialize;
use tokio::sync::watch;

use crate::fleet::Fleet;
use crate::http;
use crate::metrics::{to_text_0_0_4, wants_openmetrics, OPENMETRICS, TEXT_0_0_4};

/// What readiness depends on: the fleet, and whether shutdown has begun.
pub struct Probes {
    fleet: Arc<Fleet>,
    draining: Arc<AtomicBool>,
    cached: ArcSwap<Counted>,
}

/// Routable and registered workers, as of one fleet version.
#[derive(Debug, Clone, Copy)]
struct Counted {
    version: u64,
    healthy: usize,
    total: usize,
}

#[derive(Serialize)]
struct Readiness {
    status: &'static str,
    healthy_workers: usize,
    total_workers: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'static str>,
}

impl Probes {
    pub fn new(fleet: Arc<Fleet>, draining: Arc<AtomicBool>) -> Arc<Self> {
        Arc::new(Self {
            fleet,
            draining,
            cached: ArcSwap::from_pointee(Counted {
                version: u64::MAX,
                healthy: 0,
                total: 0,
            }),
        })
    }

    /// Workers a request could use now — Ready *and* circuit not open, so readiness never
    /// claims a fleet whose every circuit is open — and all registered workers.
    fn counted(&self) -> Counted {
        let version = self.fleet.version();
        let cached = **self.cached.load();
        if cached.version == version {
            return cached;
        }
        let snapshot = self.fleet.snapshot();
        let fresh = Counted {
            version,
            healthy: snapshot.workers.iter().filter(|w| w.is_routable()).count(),
            total: snapshot.workers.len(),
        };
        self.cached.store(Arc::new(fresh));
        fresh
    }

    /// What `/readiness` answers, as a yes or no.
    pub fn is_ready(&self) -> bool {
        self.readiness().0 == StatusCode::OK
    }

    fn readiness(&self) -> (StatusCode, Readiness) {
        let counted = self.counted();
        let reason = if self.draining.load(Ordering::Acquire) {
            Some("draining")
        } else if counted.healthy == 0 {
            Some("insufficient healthy workers")
        } else {
            None
        };
        let status = if reason.is_some() {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            StatusCode::OK
        };
        let body = Readiness {
            status: if reason.is_some() {
                "not_ready"
            } else {
                "ready"
            },
            healthy_workers: counted.healthy,
            total_workers: counted.total,
            reason,
        };
        (status, body)
    }
}

/// `sluice_ready` and `sluice_routable_workers`, read at scrape time from what `/readiness`
/// answers, so an alert on readiness fires on the very answer a load balancer got.
#[derive(Debug)]
pub(crate) struct ReadinessCollector(pub Arc<Probes>);

impl std::fmt::Debug for Probes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probes").finish_non_exhaustive()
    }
}

impl prometheus_client::collector::Collector for ReadinessCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::gauge::ConstGauge;
        use prometheus_client::metrics::MetricType;
        let (status, body) = self.0.readiness();
        let ready = encoder.encode_descriptor(
            "ready",
            "1 while /readiness answers 200 (a worker is routable and the gateway is not draining), else 0",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(i64::from(status == StatusCode::OK)).encode(ready)?;
        let routable = encoder.encode_descriptor(
            "routable_workers",
            "Workers a request could use now (Ready, circuit not open), as /readiness counts them",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(body.healthy_workers as i64).encode(routable)?;
        Ok(())
    }
}

/// `/liveness`, `/health` and `/readiness`, for any router.
pub(crate) fn routes<S: Clone + Send + Sync + 'static>(probes: Arc<Probes>) -> Router<S> {
    Router::new()
        .route("/liveness", get(live))
        .route("/health", get(live))
        .route("/readiness", get(ready))
        .with_state(probes)
}

async fn live() -> StatusCode {
    StatusCode::OK
}

async fn ready(State(probes): State<Arc<Probes>>) -> Response<Body> {
    let (status, body) = probes.readiness();
    (status, axum::Json(body)).into_response()
}

/// `/metrics`, for any router.
pub(crate) fn metrics_routes<S: Clone + Send + Sync + 'static>(
    registry: Arc<Registry>,
) -> Router<S> {
    Router::new()
        .route("/metrics", get(metrics))
        .with_state(registry)
}

/// Prometheus text (OpenMetrics).
/// Prometheus text 0.0.4, or OpenMetrics when the scraper's `Accept` asks for it
/// (`metrics::wants_openmetrics`).
async fn metrics(State(registry): State<Arc<Registry>>, headers: HeaderMap) -> Response<Body> {
    let mut text = String::with_capacity(16 * 1024);
    if prometheus_client::encoding::text::encode(&mut text, &registry).is_err() {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let (body, content_type) = if wants_openmetrics(accept) {
        (text, OPENMETRICS)
    } else {
        (to_text_0_0_4(&text), TEXT_0_0_4)
    };
    let mut response = body.into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// The `--health-check-port` listener, on a thread with a runtime of its own.
pub(crate) struct ProbeListener {
    pub(crate) addr: SocketAddr,
    thread: JoinHandle<()>,
}

impl ProbeListener {
    /// Binds `addr` now (so a taken port fails startup) and serves the probes until `stop`.
    pub fn start(
        addr: SocketAddr,
        probes: Arc<Probes>,
        limits: http::Limits,
        stop: watch::Receiver<bool>,
    ) -> std::io::Result<Self> {
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = std::thread::Builder::new()
            .name("sluice-probes".into())
            .spawn(move || {
                runtime.block_on(async move {
                    match tokio::net::TcpListener::from_std(listener) {
                        Ok(listener) => {
                            http::serve(listener, None, routes(probes), limits, stop).await;
                        }
                        Err(e) => tracing::error!(error = %e, "probe listener failed"),
                    }
                });
            })?;
        Ok(Self { addr, thread })
    }

    /// Waits for the thread to end (after `stop` was set).
    pub(crate) async fn join(self) {
        let _ = tokio::task::spawn_blocking(move || self.thread.join()).await;
    }
}
