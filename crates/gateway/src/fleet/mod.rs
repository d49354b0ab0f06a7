//! The fleet: which workers exist, which models they serve, and the snapshot requests read.
//!
//! One writer: every change (registration, a worker learned, PUT, PATCH, drain, removal) goes
//! through `Fleet`'s methods, which edit the registry under a short lock (never across an
//! `.await`) and publish a fresh immutable `Snapshot`. The request path only ever loads the
//! snapshot (`ArcSwap`) and reads per-worker atomics; it takes no lock a control task holds.

mod breaker;
mod collector;
mod discover;
mod get;
mod health;
mod liveness;
mod monitor;
mod spec;
mod verdicts;
mod veto;
mod worker;

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use serde::Serialize;
use sluice_core::breaker::BreakerConfig;
use sluice_core::health::HealthState;
use sluice_core::overload::BusyThresholds;
use sluice_core::prefix::PrefixIndex;
use sluice_core::{ModelName, WorkerId};
use tokio::sync::{watch, Semaphore};
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tracing::info;

pub use breaker::{Permit, WorkerBreaker};
pub use collector::FleetCollector;
pub use health::{probe, Effective, HealthConfig, ProbeError, MAX_PROBES_IN_FLIGHT};
pub use liveness::Signals;
pub use monitor::{LoadConfig, PollError};
pub use spec::{HealthOverrides, OverloadOverrides, SpecError, WorkerPatch, WorkerSpec};
pub use veto::{EngineLoad, Vetoes};
pub use worker::{Lease, LiveSpec, ModelCard, ProbeRecord, Worker, WorkerInfo};

use crate::error::GatewayError;
use crate::forward::Upstream;
use crate::metrics::Metrics;

/// What the fleet needs to create workers.
#[derive(Debug, Clone)]
pub struct FleetSettings {
    pub breaker: Option<BreakerConfig>,
    pub http2_default: bool,
    pub prefix_capacity: usize,
    pub drain_settle: Duration,
    /// How often a worker that has not answered `/v1/models` is asked again.
    pub startup_check_interval: Duration,
    /// The policy's name, a label of per-worker selection counts.
    pub policy: &'static str,
    pub health: HealthConfig,
    pub load: LoadConfig,
    pub liveness: sluice_core::liveness::LivenessConfig,
}

/// Routing state of one model that outlives snapshots: the round-robin counter and the prefix
/// index must not reset every time a worker comes or goes.
#[derive(Debug)]
pub struct PoolState {
    pub ticket: AtomicU64,
    pub prefix: parking_lot::Mutex<PrefixIndex>,
}

/// The workers of one model.
#[derive(Debug, Clone)]
pub struct Pool {
    pub model: ModelName,
    pub workers: Vec<Arc<Worker>>,
    pub state: Arc<PoolState>,
}

/// An immutable view of the fleet, swapped whole on every change.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Every registered worker, draining ones included, in registration order.
    pub workers: Vec<Arc<Worker>>,
    pub pools: HashMap<ModelName, Pool>,
    /// Workers whose models are not known yet (never reached, no `model_id`).
    pub unresolved: usize,
}

impl Snapshot {
    pub fn worker(&self, id: &str) -> Option<&Arc<Worker>> {
        self.workers.iter().find(|w| w.id.as_str() == id)
    }
}

struct Entry {
    worker: Arc<Worker>,
    /// The worker's background tasks (breaker timer, registration, prober), ended on removal.
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
    pools: HashMap<ModelName, Arc<PoolState>>,
}

/// How a removal went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Removal {
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
    registry: parking_lot::Mutex<Registry>,
    settings: FleetSettings,
    upstream: Upstream,
    metrics: Arc<Metrics>,
    /// Caps the probes out at once, fleet-wide.
    probe_permits: Arc<Semaphore>,
    /// The busy thresholds in force (`POST /busy_threshold` swaps them).
    busy: ArcSwap<BusyThresholds>,
}

impl Fleet {
    pub fn new(settings: FleetSettings, upstream: Upstream, metrics: Arc<Metrics>) -> Arc<Self> {
        let settings_busy = settings.load.busy;
        let liveness = settings.liveness;
        let fleet = Arc::new(Self {
            snapshot: ArcSwap::from_pointee(Snapshot::default()),
            changed: Arc::new(watch::channel(0).0),
            registry: parking_lot::Mutex::new(Registry::default()),
            settings,
            upstream,
            metrics,
            probe_permits: Arc::new(Semaphore::new(MAX_PROBES_IN_FLIGHT)),
            busy: ArcSwap::from_pointee(settings_busy),
        });
        tokio::spawn(liveness::run_checker(Arc::downgrade(&fleet), liveness));
        fleet
    }

    pub fn busy_thresholds(&self) -> BusyThresholds {
        **self.busy.load()
    }

    /// New busy thresholds; each worker's verdict follows at its next report.
    pub fn set_busy_thresholds(&self, thresholds: BusyThresholds) {
        self.busy.store(Arc::new(thresholds));
        info!(?thresholds, "busy thresholds changed");
    }

    /// The load settings in force.
    pub fn load_config(&self) -> &LoadConfig {
        &self.settings.load
    }

    /// A number that changes whenever the fleet may have (snapshot, circuit, health).
    pub fn version(&self) -> u64 {
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

    /// Waits until the fleet satisfies `done` (checked now and after every change), and returns
    /// the snapshot that did.
    pub async fn until(&self, mut done: impl FnMut(&Snapshot) -> bool) -> Arc<Snapshot> {
        let mut changes = self.changed.subscribe();
        loop {
            let snapshot = self.snapshot();
            if done(&snapshot) {
                return snapshot;
            }
            if changes.changed().await.is_err() {
                return snapshot;
            }
        }
    }

    /// Registers a worker; it is `Pending` until it answers `/v1/models`.
    pub fn add(self: &Arc<Self>, spec: WorkerSpec) -> Result<Arc<Worker>, GatewayError> {
        let mut registry = self.registry.lock();
        if let Some(existing) = registry
            .entries
            .iter()
            .find(|e| e.worker.live().spec.url == spec.url)
        {
            return Err(GatewayError::WorkerExists {
                url: spec.url,
                id: existing.worker.id.clone(),
            });
        }
        let id = unique_id(&registry, &spec.url);
        let entry = self.start_worker(id, spec);
        let worker = entry.worker.clone();
        registry.entries.push(entry);
        self.publish(&mut registry);
        info!(worker = %worker.id, url = %worker.live().spec.url, "worker registered");
        Ok(worker)
    }

    /// Replaces a worker's whole spec and registers it again under the same id.
    pub fn replace(
        self: &Arc<Self>,
        id: &str,
        spec: WorkerSpec,
    ) -> Result<Arc<Worker>, GatewayError> {
        let mut registry = self.registry.lock();
        if let Some(other) = registry
            .entries
            .iter()
            .find(|e| e.worker.live().spec.url == spec.url && e.worker.id.as_str() != id)
        {
            return Err(GatewayError::WorkerExists {
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
        let entry = self.start_worker(id, spec);
        let worker = entry.worker.clone();
        registry.entries[at] = entry;
        self.publish(&mut registry);
        info!(worker = %worker.id, "worker replaced");
        Ok(worker)
    }

    /// Changes the patchable parts of a worker's spec in place.
    pub fn patch(&self, id: &str, patch: WorkerPatch) -> Result<Arc<Worker>, GatewayError> {
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
    pub fn remove(self: &Arc<Self>, id: &str) -> Result<Removal, GatewayError> {
        let mut registry = self.registry.lock();
        let worker = registry
            .entries
            .iter()
            .find(|e| e.worker.id.as_str() == id)
            .map(|e| e.worker.clone())
            .ok_or_else(|| not_found(id))?;
        let settle = self.health_of(&worker).drain_settle;
        if worker.status() == HealthState::Draining {
            return Ok(Removal::Draining);
        }
        let draining = if settle.is_zero() {
            None
        } else {
            worker.change_health(|h| h.drain(Instant::now()))
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
    fn remove_now(&self, worker: &Arc<Worker>) {
        let mut registry = self.registry.lock();
        let before = registry.entries.len();
        registry.entries.retain(|e| !Arc::ptr_eq(&e.worker, worker));
        if registry.entries.len() < before {
            self.metrics
                .forget_worker(worker.id.as_str(), self.settings.policy);
            worker.metrics.removed();
            self.publish(&mut registry);
            info!(worker = %worker.id, "worker removed");
        }
    }

    /// A worker answered `/v1/models`: it serves these models, and a pending one is ready.
    fn learned(self: &Arc<Self>, worker: &Arc<Worker>, info: WorkerInfo) {
        let mut registry = self.registry.lock();
        if !registry
            .entries
            .iter()
            .any(|e| Arc::ptr_eq(&e.worker, worker))
        {
            return;
        }
        let models: Vec<_> = info.models.iter().map(|m| m.id.to_string()).collect();
        worker.set_info(info);
        self.publish(&mut registry);
        drop(registry);
        info!(worker = %worker.id, ?models, "worker models learned");
        if let Some(t) = worker.change_health(|h| h.registered(Instant::now())) {
            self.health_changed(worker, t);
        }
    }

    fn start_worker(self: &Arc<Self>, id: WorkerId, spec: WorkerSpec) -> Entry {
        let breaker = Arc::new(WorkerBreaker::new(
            id.as_str(),
            self.settings.breaker,
            self.metrics.clone(),
            self.changed.clone(),
        ));
        let worker = Arc::new(Worker::new(
            id.clone(),
            spec,
            self.settings.http2_default,
            breaker.clone(),
            self.metrics.for_worker(id.as_str(), self.settings.policy),
        ));
        worker.metrics.health.set(0);
        let timer = tokio::spawn(breaker.run_timer()).abort_handle();
        let prober = tokio::spawn(health::run_prober(
            Arc::downgrade(self),
            worker.clone(),
            self.upstream.clone(),
            self.probe_permits.clone(),
        ))
        .abort_handle();
        let monitor = tokio::spawn(monitor::run_monitor(
            Arc::downgrade(self),
            worker.clone(),
            self.upstream.clone(),
        ))
        .abort_handle();
        let registration = tokio::spawn(discover::register(
            Arc::downgrade(self),
            worker.clone(),
            self.upstream.clone(),
            self.settings.startup_check_interval,
        ))
        .abort_handle();
        Entry {
            worker,
            tasks: vec![timer, registration, prober, monitor],
        }
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
            for model in models {
                let state = registry
                    .pools
                    .entry(model.clone())
                    .or_insert_with(|| {
                        Arc::new(PoolState {
                            ticket: AtomicU64::new(0),
                            prefix: parking_lot::Mutex::new(PrefixIndex::new(
                                self.settings.prefix_capacity,
                            )),
                        })
                    })
                    .clone();
                pools
                    .entry(model.clone())
                    .or_insert_with(|| Pool {
                        model,
                        workers: Vec::new(),
                        state,
                    })
                    .workers
                    .push(worker.clone());
            }
        }
        registry.pools.retain(|model, _| pools.contains_key(model));
        self.snapshot.store(Arc::new(Snapshot {
            workers: registry.entries.iter().map(|e| e.worker.clone()).collect(),
            pools,
            unresolved,
        }));
        self.changed.send_modify(|v| *v += 1);
    }
}

fn not_found(id: &str) -> GatewayError {
    GatewayError::WorkerNotFound { id: id.to_string() }
}

/// `w` and 8 hex digits of the URL's hash: stable across restarts, and says nothing of the URL.
fn unique_id(registry: &Registry, url: &str) -> WorkerId {
    let base = format!(
        "w{:08x}",
        sluice_core::policy::key_of(url.as_bytes()) as u32
    );
    let taken = |id: &str| registry.entries.iter().any(|e| e.worker.id.as_str() == id);
    let mut id = base.clone();
    let mut n = 2;
    while taken(&id) {
        id = format!("{base}-{n}");
        n += 1;
    }
    WorkerId::new(id)
}
