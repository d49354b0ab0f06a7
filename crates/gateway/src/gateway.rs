//! Starting and stopping a gateway.
//!
//! Shutdown (SIGTERM in the binary): readiness turns 503 `draining` at once and new OpenAI
//! requests are refused with 503 `shutting_down` (a client retries them elsewhere), requests in
//! flight run to their end, and the gateway stops the moment none is left — bounded by the grace
//! period, never a fixed wait.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{info, warn};

use crate::access_log::{AccessLog, AccessLogError};
use crate::config::Config;
use crate::error::GatewayError;
use crate::fleet::{Fleet, FleetCollector, FleetSettings};
use crate::forward::{Forwarder, Upstream};
use crate::front::{self, App, Keys};
use crate::inflight::InFlight;
use crate::metrics::Metrics;
use crate::probes::{ProbeListener, Probes};
use crate::{probes, server};

/// Why a gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    AccessLog(#[from] AccessLogError),
    #[error("--worker-urls: {0}")]
    Worker(GatewayError),
}

/// How a shutdown ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// Every request in flight finished.
    Drained,
    /// The grace period ran out with requests still in flight; they were cut.
    GraceExpired { in_flight: u64 },
}

/// A running gateway.
pub struct Gateway {
    addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    probe_listener: Option<ProbeListener>,
    app: Arc<App>,
    in_flight: Arc<InFlight>,
    stop: watch::Sender<bool>,
    listeners: JoinSet<()>,
    grace: Duration,
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { addr, source })
}

impl Gateway {
    /// Binds the listeners, registers the configured workers (they become ready as they answer)
    /// and starts serving.
    pub async fn start(config: Config) -> Result<Self, StartError> {
        let mut registry = Registry::with_prefix("sluice");
        let metrics = Metrics::register(&mut registry);
        let upstream = Upstream::new(config.connect_timeout);
        let fleet = Fleet::new(
            FleetSettings {
                breaker: config.breaker,
                http2_default: config.upstream_http2,
                prefix_capacity: config.prefix_capacity,
                drain_settle: config.drain_settle,
                startup_check_interval: config.startup_check_interval,
                policy: config.policy.name(),
                health: config.health.clone(),
                load: config.load.clone(),
                liveness: config.liveness,
            },
            upstream.clone(),
            metrics.clone(),
        );
        registry.register_collector(Box::new(FleetCollector(fleet.clone())));
        let access_log = match &config.access_log {
            Some(path) => Some(AccessLog::open(path, metrics.clone()).await?),
            None => None,
        };
        let in_flight = Arc::new(InFlight::default());
        let draining = Arc::new(AtomicBool::new(false));
        let probes = Probes::new(fleet.clone(), draining.clone());
        let app = Arc::new(App {
            fleet: fleet.clone(),
            forwarder: Forwarder::new(
                upstream,
                config.policy,
                config.shedding,
                config.retry.clone(),
                config.request_timeout,
                metrics.clone(),
            ),
            metrics,
            registry,
            keys: Keys {
                client: config.api_keys.clone(),
                admin: config.admin_api_key.clone(),
            },
            max_payload: config.max_payload_size,
            routing_key_header: config.routing_key_header.clone(),
            access_log,
            draining,
            probes: probes.clone(),
            in_flight: in_flight.clone(),
        });
        for spec in config.workers.iter().cloned() {
            fleet.add(spec).map_err(StartError::Worker)?;
        }

        let (stop, stop_rx) = watch::channel(false);
        let mut listeners = JoinSet::new();
        let listener = bind(config.listen).await?;
        let addr = listener.local_addr().map_err(|source| StartError::Bind {
            addr: config.listen,
            source,
        })?;
        listeners.spawn(server::serve(
            listener,
            front::router(app.clone()),
            config.header_read_timeout,
            stop_rx.clone(),
        ));
        let metrics_addr = match config.metrics_listen {
            Some(at) => {
                let listener = bind(at).await?;
                let local = listener
                    .local_addr()
                    .map_err(|source| StartError::Bind { addr: at, source })?;
                let router = Router::new()
                    .route("/metrics", get(probes::metrics))
                    .with_state(app.clone());
                listeners.spawn(server::serve(
                    listener,
                    router,
                    config.header_read_timeout,
                    stop_rx,
                ));
                Some(local)
            }
            None => None,
        };
        let probe_listener = match config.health_listen {
            Some(at) => Some(
                ProbeListener::start(at, probes, config.header_read_timeout, stop.subscribe())
                    .map_err(|source| StartError::Bind { addr: at, source })?,
            ),
            None => None,
        };
        info!(%addr, policy = config.policy.name(), workers = config.workers.len(), "sluice gateway listening");
        Ok(Self {
            addr,
            metrics_addr,
            probe_listener,
            app,
            in_flight,
            stop,
            listeners,
            grace: config.shutdown_grace,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The `--prometheus-port` listener's address, when there is one.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The `--health-check-port` listener's address, when there is one.
    pub fn health_addr(&self) -> Option<SocketAddr> {
        self.probe_listener.as_ref().map(|p| p.addr)
    }

    pub fn fleet(&self) -> &Arc<Fleet> {
        &self.app.fleet
    }

    /// OpenAI requests in flight.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.count()
    }

    /// Turns readiness to `draining` and refuses new requests, without stopping.
    pub fn begin_shutdown(&self) {
        if !self.app.draining.swap(true, Ordering::SeqCst) {
            info!(
                in_flight = self.in_flight.count(),
                "shutting down: draining requests in flight"
            );
        }
    }

    /// Drains (see the module docs) and stops.
    pub async fn shutdown(mut self) -> Stopped {
        self.begin_shutdown();
        let outcome = match tokio::time::timeout(self.grace, self.in_flight.idle()).await {
            Ok(()) => Stopped::Drained,
            Err(_) => {
                let in_flight = self.in_flight.count();
                warn!(in_flight, grace = ?self.grace, "grace period over; cutting requests still in flight");
                Stopped::GraceExpired { in_flight }
            }
        };
        let _ = self.stop.send(true);
        while self.listeners.join_next().await.is_some() {}
        if let Some(probe_listener) = self.probe_listener.take() {
            probe_listener.join().await;
        }
        info!("stopped");
        outcome
    }
}
