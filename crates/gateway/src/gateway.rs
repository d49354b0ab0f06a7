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

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{info, warn};

use crate::access_log::AccessLogWriter;
use crate::app::{App, AssembleError, Assembled};
use crate::config::{Config, ListenConfig};
use crate::context::InFlight;
use crate::fleet::{Fleet, Origin};
use crate::http;
use crate::probes::ProbeListener;

/// Why a gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Assemble(#[from] AssembleError),
    #[error("--worker-urls: {0}")]
    Worker(crate::fleet::FleetError),
    #[error(transparent)]
    Discovery(#[from] crate::control::discovery::DiscoveryError),
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
    /// `https` when the listener serves TLS, else `http`.
    scheme: &'static str,
    probe_listener: Option<ProbeListener>,
    /// Whether the shared limits are in use (`--redis-url`).
    shared_state: Option<watch::Receiver<crate::shared::SharedState>>,
    fleet: Arc<Fleet>,
    /// The request path's stages, for a data plane's requests (`sluice epp`).
    front: Arc<crate::front::Front>,
    probes: Arc<crate::probes::Probes>,
    /// Set when shutdown begins.
    draining: Arc<AtomicBool>,
    in_flight: Arc<InFlight>,
    stop: watch::Sender<bool>,
    listeners: JoinSet<()>,
    /// Written out at shutdown.
    access_log_writer: Option<AccessLogWriter>,
    /// Exported at shutdown.
    trace_exporting: Option<crate::trace::Exporting>,
    grace: Duration,
}

/// How long shutdown waits for the access log's queued lines to be written.
const ACCESS_LOG_FLUSH: Duration = Duration::from_secs(5);

/// A listener bound at `addr`, and the address it got (its port, when `addr` asked for 0).
async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), StartError> {
    let bound = |source| StartError::Bind { addr, source };
    let listener = TcpListener::bind(addr).await.map_err(bound)?;
    let local = listener.local_addr().map_err(bound)?;
    Ok((listener, local))
}

impl Gateway {
    /// Binds the listeners, registers the configured workers (they become ready as they answer)
    /// and starts serving.
    pub async fn start(config: Config) -> Result<Self, StartError> {
        let Assembled {
            app,
            fleet,
            draining,
            in_flight,
            access_log_writer,
            trace_exporting,
            shared,
        } = App::assemble(&config).await?;
        if let Some(shared) = &shared {
            // Before serving, so the first requests already spend the shared budgets.
            shared.connect().await;
        }
        for spec in config.workers.iter().cloned() {
            fleet
                .add(spec, Origin::WorkerUrls)
                .map_err(StartError::Worker)?;
        }

        let limits = config.connection_limits();
        let (stop, stop_rx) = watch::channel(false);
        let mut listeners = JoinSet::new();
        let listen = &config.listener;
        let (listener, addr) = bind(listen.addr).await?;
        crate::control::discovery::start(
            &config.discovery,
            &fleet,
            &app.admin.control,
            &stop_rx,
            &mut listeners,
        )
        .await?;
        let shared_state = shared.as_ref().map(|s| s.changes());
        spawn_loops(&app, &fleet, shared, &stop_rx, &mut listeners);
        let serving = Serving {
            app: &app,
            limits,
            stop: &stop,
        };
        let (scheme, probe_listener) = serving.serve(listen, listener, &mut listeners).await?;
        announce(addr, scheme, &config);
        Ok(Self {
            addr,
            scheme,
            probe_listener,
            shared_state,
            fleet,
            front: app.front.clone(),
            probes: app.probes.clone(),
            draining,
            in_flight,
            stop,
            listeners,
            access_log_writer,
            trace_exporting,
            grace: config.listener.shutdown_grace,
        })
    }

    /// The trace exporter's counts as they change (`--enable-trace`).
    pub fn trace_exports(&self) -> Option<watch::Receiver<crate::trace::ExportStats>> {
        self.front
            .accounts
            .tracing
            .as_ref()
            .map(crate::trace::Tracing::stats)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://addr`.
    /// The base URL clients use: `https://` when the listener serves TLS.
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    /// The `--health-check-port` listener's address, when there is one.
    pub fn health_addr(&self) -> Option<SocketAddr> {
        self.probe_listener.as_ref().map(|p| p.addr)
    }

    /// The fleet, for what no HTTP surface shows (tests say why when they use it).
    pub fn fleet(&self) -> &Arc<Fleet> {
        &self.fleet
    }

    /// The request path's stages: what an endpoint picker hands a data plane's requests to.
    pub fn front(&self) -> &Arc<crate::front::Front> {
        &self.front
    }

    /// What `/readiness` answers from (`Probes::is_ready`), for other surfaces' health.
    pub fn probes(&self) -> &Arc<crate::probes::Probes> {
        &self.probes
    }

    /// Changes whenever the fleet may have changed (a worker's health, a circuit, a veto, a load
    /// report, the set of workers): something to await before reading `/workers` or `/loads`
    /// again, instead of polling them.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.fleet.changes()
    }

    /// With `--redis-url`: changes when Redis goes away or comes back (the same facts as
    /// `sluice_redis_up` and `sluice_redis_fallback_total`), something to await.
    pub fn shared_state(&self) -> Option<watch::Receiver<crate::shared::SharedState>> {
        self.shared_state.clone()
    }

    /// OpenAI requests in flight.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.count()
    }

    /// Turns readiness to `draining` and refuses new requests, without stopping.
    pub fn begin_shutdown(&self) {
        if !self.draining.swap(true, Ordering::SeqCst) {
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
        if let Some(writer) = self.access_log_writer.take() {
            // Its handles go with the connections, which end with the listeners.
            writer.finish(ACCESS_LOG_FLUSH).await;
        }
        if let Some(exporting) = self.trace_exporting.take() {
            exporting.finish(ACCESS_LOG_FLUSH).await;
        }
        info!("stopped");
        outcome
    }
}

/// The loops the gateway runs beside its listeners, each stopped with them: the shared state's
/// link to the other replicas, the gateway queue's dispatcher, the ladder's level, the status
/// page's sampler.
fn spawn_loops(
    app: &App,
    fleet: &Arc<Fleet>,
    shared: Option<Arc<crate::shared::Shared>>,
    stop_rx: &watch::Receiver<bool>,
    listeners: &mut JoinSet<()>,
) {
    if let Some(shared) = shared {
        listeners.spawn(shared.run(Arc::downgrade(fleet), stop_rx.clone()));
    }
    let admit = &app.front.admit;
    if let Some(queue) = admit.admit.queue() {
        listeners.spawn(queue.clone().dispatch(
            fleet.clone(),
            admit.admit.slots_free(),
            stop_rx.clone(),
        ));
    }
    if let Some(degrade) = &admit.degrade {
        listeners.spawn(degrade.clone().run(
            admit.admit.queue().cloned(),
            fleet.clone(),
            stop_rx.clone(),
        ));
    }
    if let Some(status) = &app.status {
        listeners.spawn(status.clone().run(stop_rx.clone()));
    }
}

/// What the listeners share: the routes, the connection bounds, the stop signal.
struct Serving<'a> {
    app: &'a App,
    limits: http::Limits,
    stop: &'a watch::Sender<bool>,
}

impl Serving<'_> {
    /// Serves the main `listener` (HTTPS when `listen` has TLS), and the metrics and probe
    /// ports when `listen` asks for them: the main listener's scheme, and the probe listener.
    async fn serve(
        &self,
        listen: &ListenConfig,
        listener: TcpListener,
        listeners: &mut JoinSet<()>,
    ) -> Result<(&'static str, Option<ProbeListener>), StartError> {
        let tls = listen.tls.clone().map(tokio_rustls::TlsAcceptor::from);
        let scheme = if tls.is_some() { "https" } else { "http" };
        let stop_rx = self.stop.subscribe();
        let routes = self.app.routes();
        listeners.spawn(http::serve(
            listener,
            tls,
            routes,
            self.limits,
            stop_rx.clone(),
        ));
        if let Some(at) = listen.metrics {
            serve_metrics(at, self.app, self.limits, stop_rx, listeners).await?;
        }
        let probes = match listen.health {
            Some(at) => Some(
                ProbeListener::start(
                    at,
                    self.app.probes.clone(),
                    self.limits,
                    self.stop.subscribe(),
                )
                .map_err(|source| StartError::Bind { addr: at, source })?,
            ),
            None => None,
        };
        Ok((scheme, probes))
    }
}

/// `/metrics` on its own listener (`--prometheus-port`), the address it got logged.
async fn serve_metrics(
    at: SocketAddr,
    app: &App,
    limits: http::Limits,
    stop_rx: watch::Receiver<bool>,
    listeners: &mut JoinSet<()>,
) -> Result<(), StartError> {
    let (listener, local) = bind(at).await?;
    info!(addr = %local, "metrics listening (--prometheus-port)");
    listeners.spawn(http::serve(
        listener,
        None,
        app.metrics_router(),
        limits,
        stop_rx,
    ));
    Ok(())
}

/// The protective settings in force, once at startup: what an operator must know to read the
/// gateway's behaviour under load, and whose defaults filled what no flag gave.
fn protections(config: &Config) {
    let secs = |d: Duration| d.as_secs_f64();
    let ceilings = config.control.load.ceilings;
    let queue = config.admission.queue.as_ref();
    let codel = queue.and_then(|q| q.codel);
    info!(
        defaults = if config.telemetry.smg_defaults { "smg" } else { "sluice" },
        waiting_ceiling = ?ceilings.waiting_requests,
        kv_ceiling = ?ceilings.token_usage,
        load_poll_secs = secs(config.control.load.interval),
        liveness = config.control.liveness.is_some(),
        overload_shed = config.route.shedding.enabled,
        queue_size = queue.map_or(0, |q| q.size),
        queue_timeouts_secs = ?queue.map(|q| q.timeouts.map(secs)),
        codel_targets_ms = ?codel.map(|c| c.map(|t| t.target.as_millis() as u64)),
        interactive_reserve = config.fleet.interactive_reserve,
        max_concurrent_requests = ?config.admission.max_concurrent,
        tenants = config.admission.tenants.len(),
        breaker_failures = ?config.fleet.breaker.map(|b| b.failure_threshold),
        max_retries = config.forward.retry.max_retries,
        adaptive_concurrency = config.control.adaptive.is_some(),
        degradation_steps = config.degradation.as_ref().map_or(0, |d| d.steps.len()),
        "protective settings"
    );
}

/// The startup line, and a warning when only loopback is served: SMG listens on every
/// interface by default, and a launch line carried over from it would otherwise serve nobody
/// else without a word.
fn announce(addr: SocketAddr, scheme: &str, config: &Config) {
    info!(%addr, scheme, policy = config.route.policy.name(), workers = config.workers.len(), "sluice gateway listening");
    protections(config);
    if addr.ip().is_loopback() {
        warn!(
            %addr,
            "serving on loopback only: other hosts cannot reach this gateway; --host 0.0.0.0 serves every interface (SMG's default)"
        );
    }
}
