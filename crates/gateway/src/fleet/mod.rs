//! The fleet: which workers exist, which models they serve, and the snapshot requests read.
//!
//! One writer: every change (registration, a worker learned, PUT, PATCH, drain, removal) goes
//! through `Fleet`'s methods, which edit the registry under a short lock (never across an
//! `.await`) and publish a fresh immutable `Snapshot`. The request path only ever loads the
//! snapshot (`ArcSwap`) and reads per-worker atomics; it takes no lock a control task holds.
//!
//! The fleet knows no HTTP: the control loops that probe, poll and register a worker are started
//! for each registration by a `Supervise` the gateway hands in (`control::Control`), and the
//! fleet aborts them when the registration ends.
//!
//! ## Layout
//!
//! - `worker` — one registered worker, its fields grouped by their one writer.
//! - `traffic` — this gateway's requests on a worker (`Traffic`, and other replicas' as Redis
//!   tells).
//! - `lease` — `Lease`, a request's hold on a worker, which alone moves its counts.
//! - `veto`, `signals`, `breaker` — per-worker facts: why it gets no new request, what the
//!   gateway hears from it, its circuit.
//! - `pool` — a model's workers as the request path reads them, and a disaggregated model's
//!   prefill and decode sides.
//! - `pd` — its role in prefill/decode disaggregation, and a decode worker's admission window.
//! - `adaptive` — its adaptive concurrency limit and the latency samples it is learned from.
//! - `atomic` — the typed cells those facts live in (an enum, an instant).
//! - `spec` — the worker spec of `--worker-urls` and the admin API.
//! - `collector` — per-worker gauges read at scrape time.
//! - `held` — the KV blocks its engine holds, as its events tell (precise prefix routing).
//! - `adapters` — the LoRA adapters of this gateway's requests in flight on it.

mod adapters;
mod adaptive;
mod atomic;
mod breaker;
mod collector;
mod held;
mod latency;
mod lease;
mod pd;
mod pool;
mod signals;
mod spec;
mod traffic;
mod veto;
mod worker;
#[cfg(test)]
mod worker_tests;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use axum::http::HeaderValue;
use serde::Serialize;
use sluice_core::breaker::BreakerConfig;
use sluice_core::health::{HealthState, HealthTransition};
use sluice_core::{ModelName, WorkerId};
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tracing::{info, warn};

pub(crate) use adaptive::LimitWindow;
pub(crate) use breaker::WorkerBreaker;
pub(crate) use collector::FleetCollector;
pub(crate) use held::PrefixCacheView;
pub(crate) use latency::LatencyView;
pub(crate) use lease::Lease;
pub(crate) use pd::{DecodeRooms, NoRoom, Role};
pub use pool::{PdPools, Pool, PoolState};
pub use signals::{Heard, Signals};
pub use spec::{
    AdaptiveOverrides, HealthOverrides, OverloadOverrides, SpecError, WorkerPatch, WorkerSpec,
    WorkerType, ZmqEndpoint,
};
pub use veto::{EngineLoad, Vetoes, AT_CAPACITY_VETO};
pub use worker::{
    HealthCell, LiveSpec, ModelCard, Notices, Origin, ProbeRecord, Worker, WorkerInfo,
};

use crate::metrics::Metrics;
use crate::upstream::Endpoint;

/// What the fleet needs to create workers, from its own flags.
#[derive(Debug, Clone)]
pub struct FleetSettings {
    /// The circuit breaker's thresholds; `None` with `--disable-circuit-breaker`.
    pub breaker: Option<BreakerConfig>,
    /// `--max-tree-size`, in the cache-aware policy's prefix blocks per model.
    pub(crate) prefix_capacity: usize,
    /// `--interactive-reserve`: the share of each worker's capacity less urgent requests leave
    /// to the interactive tier while it is asked for.
    pub interactive_reserve: f64,
    /// `--drain-settle-secs`: how long a removed worker that was serving drains.
    pub drain_settle: Duration,
    /// The key sent to a worker whose spec has none.
    pub(crate) default_worker_key: Option<String>,
    /// With `--policy predicted`, the tiers' objectives: room for a tier's request in a pool
    /// (what the gateway queue waits for) is a worker predicted to start it in time.
    pub room_by_prediction: Option<sluice_core::slo::Slos>,
}

/// What the fleet takes from other sections' settings, read where they are when the gateway is
/// assembled.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Borrowed {
    /// The route's policy name, a label of per-worker selection counts.
    pub(crate) policy: &'static str,
    /// `--upstream-http2`: a worker whose spec does not say is spoken to over HTTP/2.
    pub(crate) http2_default: bool,
    /// How long nothing owed ends a worker's silence (liveness's `--worker-unresponsive-secs`).
    pub(crate) silence_lapse: Duration,
}

/// Starts the control loops of a newly registered worker (registration, probes, load polls) and
/// hands back their handles; the fleet aborts them when the registration ends.
pub trait Supervise: Send + Sync {
    fn supervise(self: Arc<Self>, fleet: &Arc<Fleet>, worker: &Arc<Worker>) -> Vec<AbortHandle>;
}

/// An immutable view of the fleet, swapped whole on every change.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Every registered worker, draining ones included, in registration order.
    pub workers: Vec<Arc<Worker>>,
    /// Shared, so a request's placement can hold its pool past the next snapshot.
    pub(crate) pools: HashMap<ModelName, Arc<Pool>>,
    /// Workers whose models are not known yet (never reached, no `model_id`).
    pub(crate) unresolved: usize,
}

impl Snapshot {
    pub fn worker(&self, id: &str) -> Option<&Arc<Worker>> {
        self.workers.iter().find(|w| w.id.as_str() == id)
    }
}

struct Entry {
    worker: Arc<Worker>,
    /// The worker's background tasks (breaker timer, and the control loops), ended on removal.
    tasks: Vec<AbortHandle>,
}

impl Drop for Entry {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

#[derive(Default)]
struct Registry {
    entries: Vec<Entry>,
    /// By model and role (`None`: the whole pool).
    pools: HashMap<(ModelName, Option<&'static str>), Arc<PoolState>>,
}

/// How a removal went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Removal {
    /// It was serving: it takes no new requests now and goes after the drain settle time.
    Draining,
    /// It was not serving: gone at once.
    Removed,
}

/// The fleet and its snapshot.
pub struct Fleet {
    snapshot: ArcSwap<Snapshot>,
    /// Bumped on every change a reader could notice (snapshot, circuit), for `until`.
    changed: Arc<watch::Sender<u64>>,
    /// Told when a request stops waiting on any worker or ends (`Traffic`).
    freed: Arc<tokio::sync::Notify>,
    registry: parking_lot::Mutex<Registry>,
    settings: FleetSettings,
    borrowed: Borrowed,
    metrics: Arc<Metrics>,
    supervisor: Arc<dyn Supervise>,
}

impl Fleet {
    pub(crate) fn new(
        (settings, borrowed): (FleetSettings, Borrowed),
        metrics: Arc<Metrics>,
        supervisor: Arc<dyn Supervise>,
    ) -> Arc<Self> {
        Arc::new(Self {
            snapshot: ArcSwap::from_pointee(Snapshot::default()),
            changed: Arc::new(watch::channel(0).0),
            freed: Arc::default(),
            registry: parking_lot::Mutex::new(Registry::default()),
            settings,
            borrowed,
            metrics,
            supervisor,
        })
    }

    /// `--interactive-reserve`, the most any pool keeps (`Pool::reserve_for`).
    pub(crate) fn interactive_reserve(&self) -> f64 {
        self.settings.interactive_reserve
    }

    /// The gateway's metrics, which the control loops count into.
    pub(crate) fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Tells readiness and waiters that something about the fleet may have changed (a veto, a
    /// report, a health state).
    /// Resolves when a request has stopped waiting on a worker or ended since the last call:
    /// room may have opened (one waiter: the gateway queue's dispatcher).
    pub(crate) async fn freed(&self) {
        self.freed.notified().await;
    }

    pub(crate) fn announce(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    /// How long `worker` drains when removed while serving: its spec's, else the flag's.
    pub(crate) fn drain_settle_of(&self, worker: &Worker) -> Duration {
        worker
            .live()
            .spec
            .health
            .drain_settle_secs
            .and_then(|s| Duration::try_from_secs_f64(s).ok())
            .unwrap_or(self.settings.drain_settle)
    }

    /// A number that changes whenever the fleet may have (snapshot, circuit, health).
    pub(crate) fn version(&self) -> u64 {
        *self.changed.borrow()
    }

    /// Resolves when the fleet may have changed (snapshot, a circuit, a worker's health).
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    /// Registers a worker; it is `Pending` until it answers `/v1/models`.
    pub(crate) fn add(
        self: &Arc<Self>,
        spec: WorkerSpec,
        origin: Origin,
    ) -> Result<Arc<Worker>, FleetError> {
        let mut registry = self.registry.lock();
        if let Some(existing) = registry
            .entries
            .iter()
            .find(|e| e.worker.live().spec.url == spec.url)
        {
            return Err(FleetError::Exists {
                url: spec.url,
                id: existing.worker.id.clone(),
            });
        }
        let id = unique_id(&registry, &spec.url);
        let entry = self.start_worker(id, spec, origin);
        let worker = entry.worker.clone();
        registry.entries.push(entry);
        self.publish(&mut registry);
        info!(worker = %worker.id, url = %worker.live().spec.url, origin = origin.as_str(), "worker registered");
        Ok(worker)
    }

    /// Replaces a worker's whole spec and registers it again under the same id.
    pub(crate) fn replace(
        self: &Arc<Self>,
        id: &str,
        spec: WorkerSpec,
        origin: Origin,
    ) -> Result<Arc<Worker>, FleetError> {
        let mut registry = self.registry.lock();
        if let Some(other) = registry
            .entries
            .iter()
            .find(|e| e.worker.live().spec.url == spec.url && e.worker.id.as_str() != id)
        {
            return Err(FleetError::Exists {
                url: spec.url,
                id: other.worker.id.clone(),
            });
        }
        let Some(at) = registry
            .entries
            .iter()
            .position(|e| e.worker.id.as_str() == id)
        else {
            return Err(not_found(id));
        };
        let id = registry.entries[at].worker.id.clone();
        let entry = self.start_worker(id, spec, origin);
        let worker = entry.worker.clone();
        registry.entries[at] = entry;
        self.publish(&mut registry);
        info!(worker = %worker.id, "worker replaced");
        Ok(worker)
    }

    /// Changes the patchable parts of a worker's spec in place.
    pub(crate) fn patch(&self, id: &str, patch: WorkerPatch) -> Result<Arc<Worker>, FleetError> {
        let registry = self.registry.lock();
        let entry = registry
            .entries
            .iter()
            .find(|e| e.worker.id.as_str() == id)
            .ok_or_else(|| not_found(id))?;
        let mut spec = entry.worker.live().spec.clone();
        spec.apply(patch);
        entry.worker.set_spec(spec);
        // A changed worker is judged afresh from its next report.
        self.load_cleared(&entry.worker, "its spec changed");
        Ok(entry.worker.clone())
    }

    /// Removes a worker: a serving one drains first.
    pub(crate) fn remove(self: &Arc<Self>, id: &str) -> Result<Removal, FleetError> {
        let mut registry = self.registry.lock();
        let worker = registry
            .entries
            .iter()
            .find(|e| e.worker.id.as_str() == id)
            .map(|e| e.worker.clone())
            .ok_or_else(|| not_found(id))?;
        let settle = self.drain_settle_of(&worker);
        if worker.status() == HealthState::Draining {
            return Ok(Removal::Draining);
        }
        let draining = if settle.is_zero() {
            None
        } else {
            worker.health.change(|h| h.drain(Instant::now()))
        };
        let Some(transition) = draining else {
            drop(registry);
            self.remove_now(&worker);
            return Ok(Removal::Removed);
        };
        self.publish(&mut registry);
        drop(registry);
        self.health_changed(&worker, transition);
        let fleet = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(settle).await;
            fleet.remove_now(&worker);
        });
        Ok(Removal::Draining)
    }

    /// Takes this registration out (not a later one that replaced it under the same id).
    pub(crate) fn remove_now(&self, worker: &Arc<Worker>) {
        let mut registry = self.registry.lock();
        let before = registry.entries.len();
        registry.entries.retain(|e| !Arc::ptr_eq(&e.worker, worker));
        if registry.entries.len() < before {
            self.metrics
                .forget_worker(worker.id.as_str(), self.borrowed.policy);
            self.publish(&mut registry);
            info!(worker = %worker.id, "worker removed");
        }
    }

    /// A worker answered `/v1/models`: it serves these models, and a pending one is ready.
    pub(crate) fn learned(self: &Arc<Self>, worker: &Arc<Worker>, info: WorkerInfo) {
        if !self.set_models(worker, info, "worker models learned") {
            return;
        }
        if let Some(t) = worker.health.change(|h| h.registered(Instant::now())) {
            self.health_changed(worker, t);
        }
    }

    /// A registered worker lists other models than it did (an adapter loaded or unloaded): its
    /// pools are rebuilt; its health is not the list's to change.
    pub(crate) fn models_changed(&self, worker: &Arc<Worker>, info: WorkerInfo) {
        self.set_models(worker, info, "worker models changed");
    }

    /// Records what a still registered worker serves and publishes the pools; whether it was.
    fn set_models(&self, worker: &Arc<Worker>, info: WorkerInfo, what: &str) -> bool {
        let mut registry = self.registry.lock();
        if !registry
            .entries
            .iter()
            .any(|e| Arc::ptr_eq(&e.worker, worker))
        {
            return false;
        }
        let models: Vec<_> = info.models.iter().map(|m| m.id.to_string()).collect();
        worker.set_info(info);
        self.publish(&mut registry);
        drop(registry);
        info!(worker = %worker.id, ?models, "{what}");
        true
    }

    /// Acts on a health transition: log, gauge, breaker readmission on promotion, no load opinion
    /// once it leaves Ready, and a change signal for readiness and waiters.
    pub(crate) fn health_changed(&self, worker: &Worker, t: HealthTransition) {
        let (from, to) = (t.from.as_str(), t.to.as_str());
        match t.to {
            HealthState::Ready => {
                info!(worker = %worker.id, from, to, cause = %t.cause, "worker health changed")
            }
            _ => warn!(worker = %worker.id, from, to, cause = %t.cause, "worker health changed"),
        }
        worker
            .metrics
            .health
            .set(i64::from(t.to == HealthState::Ready));
        if t.is_promotion() {
            worker.breaker.readmit();
        }
        if t.from == HealthState::Ready {
            self.load_cleared(worker, "it left Ready");
        }
        self.announce();
    }

    /// No opinion on `worker`'s load any more.
    pub(crate) fn load_cleared(&self, worker: &Worker, why: &'static str) {
        let (was_overloaded, was_busy) = worker.vetoes.clear_load();
        if was_overloaded || was_busy {
            info!(worker = %worker.id, why, "overload veto cleared");
            self.announce();
        }
    }

    fn start_worker(self: &Arc<Self>, id: WorkerId, mut spec: WorkerSpec, origin: Origin) -> Entry {
        if spec.api_key.is_none() {
            spec.api_key.clone_from(&self.settings.default_worker_key);
        }
        let breaker = Arc::new(WorkerBreaker::new(
            id.as_str(),
            self.settings.breaker,
            self.metrics.clone(),
            self.changed.clone(),
        ));
        let worker = Arc::new(Worker::new(
            id.clone(),
            spec,
            origin,
            self.borrowed.http2_default,
            breaker.clone(),
            self.metrics.for_worker(id.as_str(), self.borrowed.policy),
            Notices {
                freed: self.freed.clone(),
                changed: self.changed.clone(),
            },
        ));
        worker.metrics.health.set(0);
        worker
            .signals
            .set_silence_lapse(self.borrowed.silence_lapse);
        let mut tasks = vec![tokio::spawn(breaker.run_timer()).abort_handle()];
        tasks.extend(self.supervisor.clone().supervise(self, &worker));
        Entry { worker, tasks }
    }

    /// How a worker of `spec` would be reached, and with which authorization, were it registered
    /// now (discovery asks a removed worker's health endpoint before registering it again).
    pub(crate) fn reach(&self, spec: &WorkerSpec) -> (Endpoint, Option<HeaderValue>) {
        let mut spec = spec.clone();
        if spec.api_key.is_none() {
            spec.api_key.clone_from(&self.settings.default_worker_key);
        }
        let (scheme, authority) = spec.endpoint();
        let endpoint = Endpoint {
            scheme,
            authority,
            http2: spec.http2.unwrap_or(self.borrowed.http2_default),
        };
        (endpoint, LiveSpec::new(spec).authorization)
    }

    /// Rebuilds the snapshot from the registry.
    fn publish(&self, registry: &mut Registry) {
        let mut pools: HashMap<ModelName, Pool> = HashMap::new();
        let mut unresolved = 0;
        for entry in &registry.entries {
            let worker = &entry.worker;
            if worker.status() == HealthState::Draining {
                continue;
            }
            let models = worker.models();
            if models.is_empty() {
                unresolved += 1;
            }
            for model in models.iter().cloned().chain(worker.loadable(&models)) {
                let state = pool::pool_state(&mut registry.pools, &self.settings, &model, None);
                pools
                    .entry(model.clone())
                    .or_insert_with(|| Pool {
                        model,
                        workers: Vec::new(),
                        state,
                        pd: None,
                        adapter: None,
                    })
                    .workers
                    .push(worker.clone());
            }
        }
        for pool in pools.values_mut() {
            if pool
                .workers
                .iter()
                .any(|w| w.lists_as_adapter(&pool.model) || w.may_load(&pool.model))
            {
                pool.adapter = Some(Arc::from(pool.model.as_str()));
            }
            pool.pd = pool::pd_pools(&mut registry.pools, &self.settings, pool);
        }
        registry
            .pools
            .retain(|(model, _), _| pools.contains_key(model));
        self.snapshot.store(Arc::new(Snapshot {
            workers: registry.entries.iter().map(|e| e.worker.clone()).collect(),
            pools: pools
                .into_iter()
                .map(|(model, pool)| (model, Arc::new(pool)))
                .collect(),
            unresolved,
        }));
        self.announce();
    }
}

fn not_found(id: &str) -> FleetError {
    FleetError::NotFound { id: id.to_string() }
}

/// Why a change to the registry was refused: the fleet's own terms, which the admin API and
/// discovery each answer in theirs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FleetError {
    /// Another worker is registered at this URL.
    #[error("a worker with URL {url} is already registered as {id}")]
    Exists { url: String, id: WorkerId },
    #[error("no worker with id '{id}'")]
    NotFound { id: String },
}

/// `w` and 8 hex digits of the URL's hash: stable across restarts, and says nothing of the URL.
fn unique_id(registry: &Registry, url: &str) -> WorkerId {
    let base = WorkerId::for_url(url).as_str().to_string();
    let taken = |id: &str| registry.entries.iter().any(|e| e.worker.id.as_str() == id);
    let mut id = base.clone();
    let mut n = 2;
    while taken(&id) {
        id = format!("{base}-{n}");
        n += 1;
    }
    WorkerId::new(id)
}
