//! The control loops: background tasks that each own one fact about the workers and feed the
//! fleet, never the request path.
//!
//! ## Layout
//!
//! - `discover` — registration: a worker's models and flavor from `GET /v1/models`, asked until it
//!   answers; it turns a `Pending` worker `Ready`; then asked again now and then, for the LoRA
//!   adapters loaded and unloaded since.
//! - `health` — the prober: each worker probed on its own schedule, results fed to the health
//!   state machine; failed workers removed under auto-recovery.
//! - `load` — the load monitor: engine load polled (vLLM `/metrics`, SGLang `/v1/loads`), turned
//!   into the overload and busy verdicts; the busy thresholds in force.
//! - `adaptive` — the limiter: each worker's adaptive concurrency limit judged once per window
//!   (`--adaptive-concurrency`).
//! - `liveness` — one checker for the fleet: transport failures, silence and missing progress
//!   turned into unreachable, wedged and unresponsive vetoes.
//! - `trial` — one-token generations that tell when a worker out for a veto that awaits
//!   progress is back.
//! - `kv_events` — each HTTP worker's KV events over ZMQ, subscribed per rank, applied to what
//!   its engine is known to hold (a gRPC worker's come on the load monitor's stream).
//! - `adapter_loads` — a LoRA adapter loaded onto a worker its spec allows, when a request for it
//!   is placed there (the one loop the request path starts: it waits for the load).
//! - `discovery` — workers registered, re-registered and drained as a source lists them
//!   (`--discovery-file`, `--discovery-dns`).
//!
//! `Control` holds what they share (the upstream client, their settings, the probe permits) and
//! starts the per-worker loops for each registration (`fleet::Supervise`).

mod adapter_loads;
mod adaptive;
mod discover;
pub mod discovery;
mod health;
mod kv_events;
mod liveness;
mod load;
mod trial;

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use axum::http::StatusCode;
use bytes::Bytes;
use sluice_core::liveness::LivenessConfig;
use sluice_core::overload::BusyThresholds;
use tokio::sync::Semaphore;
use tokio::task::AbortHandle;
use tracing::info;

pub(crate) use adapter_loads::{AdapterLoads, LoadError};
pub use adaptive::AdaptiveConfig;
pub use health::{probe, Effective, HealthConfig, ProbeError, MAX_PROBES_IN_FLIGHT};
pub(crate) use kv_events::KvEventsConfig;
pub use load::{activity, busy_thresholds, LoadConfig, PollError};

use crate::fleet::{Fleet, Supervise, Worker};
use crate::upstream::{self, GetError, Upstream};

/// The control loops' settings, built by the settings sections of their flags and taken whole.
#[derive(Debug, Clone)]
pub struct ControlSettings {
    /// The health prober's: interval, timeout, thresholds, endpoint, removal of failed workers.
    pub health: HealthConfig,
    /// The load monitor's: interval, ceilings, busy thresholds.
    pub load: LoadConfig,
    /// `None`: no liveness checker (`--disable-liveness-checks`).
    pub liveness: Option<LivenessConfig>,
    /// How often a worker that has not answered `/v1/models` is asked again.
    pub startup_check_interval: Duration,
    /// `--worker-startup-delay`: the wait before a new worker is first asked.
    pub(crate) startup_delay: Duration,
    /// `--worker-startup-timeout-secs`: how long a worker may stay unregistered before it is
    /// Failed; `None`: forever.
    pub startup_timeout: Option<Duration>,
    /// `--worker-models-refresh-secs`: how often a registered worker's models are read again;
    /// `None`: never.
    pub models_refresh: Option<Duration>,
    /// `--adapter-load-timeout-secs`: how long one call to a worker's adapter load or unload
    /// endpoint may take.
    pub adapter_load_timeout: Duration,
    /// `--adaptive-concurrency` and its settings; `None`: off.
    pub adaptive: Option<AdaptiveConfig>,
    /// Where workers' KV events are subscribed to.
    pub(crate) kv_events: KvEventsConfig,
}

/// What the control loops share.
pub struct Control {
    upstream: Upstream,
    settings: ControlSettings,
    /// Caps the probes out at once, fleet-wide.
    probe_permits: Arc<Semaphore>,
    /// The busy thresholds in force (`POST /busy_threshold` swaps them).
    busy: ArcSwap<BusyThresholds>,
    /// Each discovery source's view, written by that source's task alone.
    sources: parking_lot::Mutex<Vec<Option<discovery::SourceView>>>,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control").finish_non_exhaustive()
    }
}

impl Control {
    pub fn new(settings: ControlSettings, upstream: Upstream) -> Arc<Self> {
        Arc::new(Self {
            upstream,
            busy: ArcSwap::from_pointee(settings.load.busy),
            settings,
            probe_permits: Arc::new(Semaphore::new(MAX_PROBES_IN_FLIGHT)),
            sources: parking_lot::Mutex::default(),
        })
    }

    /// Records what discovery source `slot` last did; whether that changed anything.
    fn show_source(&self, slot: usize, view: discovery::SourceView) -> bool {
        let mut sources = self.sources.lock();
        if sources.len() <= slot {
            sources.resize(slot + 1, None);
        }
        let changed = sources[slot].as_ref() != Some(&view);
        sources[slot] = Some(view);
        changed
    }

    /// What each discovery source last did (`GET /workers`).
    pub(crate) fn sources(&self) -> Vec<discovery::SourceView> {
        self.sources.lock().iter().flatten().cloned().collect()
    }

    /// Starts the fleet-wide loops (the liveness checker, unless turned off); they end with the
    /// fleet.
    pub(crate) fn watch(&self, fleet: &Arc<Fleet>) {
        if let Some(cfg) = self.settings.liveness {
            let trials = cfg
                .trials
                .then(|| trial::Trials::new(self.upstream.clone(), trial::trial_every(cfg.stall)));
            tokio::spawn(liveness::run_checker(Arc::downgrade(fleet), cfg, trials));
        }
    }

    /// The health settings in force for `worker`.
    pub(crate) fn health_of(&self, fleet: &Fleet, worker: &Worker) -> Effective {
        self.settings
            .health
            .for_worker(&worker.live().spec.health, fleet.drain_settle_of(worker))
    }

    pub fn busy_thresholds(&self) -> BusyThresholds {
        **self.busy.load()
    }

    /// New busy thresholds; each worker's verdict follows at its next report.
    pub(crate) fn set_busy_thresholds(&self, thresholds: BusyThresholds) {
        self.busy.store(Arc::new(thresholds));
        info!(?thresholds, "busy thresholds changed");
    }
}

impl Supervise for Control {
    fn supervise(self: Arc<Self>, fleet: &Arc<Fleet>, worker: &Arc<Worker>) -> Vec<AbortHandle> {
        let weak = Arc::downgrade(fleet);
        let mut tasks = vec![
            tokio::spawn(discover::register(
                weak.clone(),
                worker.clone(),
                self.clone(),
            ))
            .abort_handle(),
            tokio::spawn(health::run_prober(
                weak.clone(),
                worker.clone(),
                self.clone(),
            ))
            .abort_handle(),
        ];
        if let Some(adaptive) = self.settings.adaptive {
            tasks
                .push(tokio::spawn(adaptive::run_limiter(worker.clone(), adaptive)).abort_handle());
        }
        if worker.endpoint.grpc() {
            let held = HeldConnection(self.clone(), worker.endpoint.clone());
            tasks.push(tokio::spawn(held.until_removed()).abort_handle());
        }
        if let Some(endpoints) = self.settings.kv_events.endpoints(worker) {
            let max_blocks = self.settings.kv_events.max_blocks;
            let subscriber = kv_events::run_subscriber(worker.clone(), endpoints, max_blocks);
            tasks.push(tokio::spawn(subscriber).abort_handle());
        }
        tasks.push(tokio::spawn(load::run_monitor(weak, worker.clone(), self)).abort_handle());
        tasks
    }
}

/// A gRPC worker's connection, held for as long as its registration lives: the fleet aborts
/// the task that owns it when the registration ends, and the connection is forgotten then.
struct HeldConnection(Arc<Control>, upstream::Endpoint);

impl HeldConnection {
    async fn until_removed(self) {
        std::future::pending::<()>().await;
    }
}

impl Drop for HeldConnection {
    fn drop(&mut self) {
        self.0.upstream.grpc().forget(&self.1);
    }
}

/// `GET` on a worker's endpoint with its key (see `upstream::get`).
async fn get(
    upstream: &Upstream,
    worker: &Worker,
    path: &str,
    limit: usize,
    timeout: Duration,
) -> Result<(StatusCode, Bytes), GetError> {
    let authorization = worker.live().authorization.clone();
    upstream::get(
        upstream,
        &worker.endpoint,
        authorization.as_ref(),
        path,
        limit,
        timeout,
    )
    .await
}
