//! One registered worker: its identity and spec (fixed), what it told us at registration
//! (replaced whole when learned), and its live counters (atomics the request path moves).

use std::sync::Arc;

use arc_swap::{ArcSwap, ArcSwapOption};
use axum::http::HeaderValue;
use sluice_core::admission::drain::OverCeiling;
use sluice_core::breaker::BreakerState;
use sluice_core::health::{Health, HealthState, HealthTransition};
use sluice_core::latency::{Prediction, Situation, Work};
use sluice_core::lora::{affinity, Affinity};
use sluice_core::overload::{Projection, VetoClass};
use sluice_core::{ModelName, WorkerId};
use tokio::time::Instant;

use super::adapters::AdapterUse;
use super::adaptive::AdaptiveLimit;
use super::atomic::AtomicEnum;
use super::breaker::WorkerBreaker;
use super::held::HeldIndex;
use super::latency::WorkerLatency;
use super::pd::{DecodeWindow, Role};
use super::signals::Signals;
use super::spec::WorkerSpec;
use super::traffic::Traffic;
use super::veto::Vetoes;
use crate::metrics::WorkerMetrics;
use crate::upstream::Endpoint;

/// The last probe of a worker, for `GET /workers`.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeRecord {
    /// Why it failed (`timeout after 5s`, `connect`, `status 503`); `None` when it passed.
    pub(crate) error: Option<String>,
    pub(crate) at: Instant,
}

/// One model as a worker lists it in `/v1/models`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelCard {
    pub(crate) id: ModelName,
    /// The card as the worker served it, relayed by the gateway's `/v1/models`.
    pub(crate) card: serde_json::Value,
}

/// What a worker said about itself when it was reached.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerInfo {
    /// `owned_by` of its models: `vllm`, `sglang`, or whatever it says.
    pub(crate) flavor: String,
    pub(crate) models: Vec<ModelCard>,
}

impl WorkerInfo {
    /// The same models, each with the same parent: what routing reads from a list (the cards
    /// also carry `created`, which vLLM stamps per answer).
    pub(crate) fn same_models(&self, other: &WorkerInfo) -> bool {
        let key = |m: &ModelCard| (m.id.clone(), m.card.get("parent").cloned());
        self.flavor == other.flavor
            && self.models.len() == other.models.len()
            && self.models.iter().map(key).eq(other.models.iter().map(key))
    }
}

/// Where a registration came from, as `GET /workers` shows it. A discovery source changes only
/// the workers it registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// `--worker-urls`.
    WorkerUrls,
    /// `POST` or `PUT /workers`.
    Api,
    /// `--discovery-file`.
    DiscoveryFile,
    /// `--discovery-dns`.
    Dns,
    /// `--service-discovery`.
    Kubernetes,
}

impl Origin {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Origin::WorkerUrls => "worker_urls",
            Origin::Api => "api",
            Origin::DiscoveryFile => "discovery_file",
            Origin::Dns => "dns",
            Origin::Kubernetes => "kubernetes",
        }
    }
}

/// The spec and what is derived from it, replaced together by `PATCH`.
#[derive(Debug)]
pub struct LiveSpec {
    pub spec: WorkerSpec,
    /// `Bearer <api key>`, marked sensitive so it never reaches a log.
    pub(crate) authorization: Option<HeaderValue>,
}

impl LiveSpec {
    pub fn new(spec: WorkerSpec) -> Self {
        let authorization = spec.api_key.as_ref().and_then(|k| {
            let mut v = HeaderValue::try_from(format!("Bearer {k}")).ok()?;
            v.set_sensitive(true);
            Some(v)
        });
        Self {
            spec,
            authorization,
        }
    }
}

/// A worker's health, written only through the fleet and the health checker: the state machine
/// under a short lock (never held across an `.await`), its state mirrored in an atomic for the
/// request path, and the last probe for views.
#[derive(Debug)]
pub struct HealthCell {
    machine: parking_lot::Mutex<Health>,
    state: AtomicEnum<HealthState>,
    last_probe: ArcSwapOption<ProbeRecord>,
}

impl HealthCell {
    fn new() -> Self {
        Self {
            machine: parking_lot::Mutex::new(Health::new(Instant::now())),
            state: AtomicEnum::new(HealthState::Pending),
            last_probe: ArcSwapOption::empty(),
        }
    }

    pub(crate) fn state(&self) -> HealthState {
        self.state.load()
    }

    /// Runs one health event under the lock and publishes the resulting state.
    pub(crate) fn change(
        &self,
        event: impl FnOnce(&mut Health) -> Option<HealthTransition>,
    ) -> Option<HealthTransition> {
        let mut health = self.machine.lock();
        let transition = event(&mut health);
        self.state.store(health.state());
        transition
    }

    /// A copy of the state machine (counts and since when), for views.
    pub(crate) fn machine(&self) -> Health {
        self.machine.lock().clone()
    }

    pub(crate) fn last_probe(&self) -> Option<Arc<ProbeRecord>> {
        self.last_probe.load_full()
    }

    pub(crate) fn set_last_probe(&self, record: ProbeRecord) {
        self.last_probe.store(Some(Arc::new(record)));
    }
}

/// How a worker's counts tell the fleet they moved.
#[derive(Debug, Clone)]
pub struct Notices {
    /// Woken when a request leaves a worker (the gateway queue waits on it).
    pub(crate) freed: Arc<tokio::sync::Notify>,
    /// The fleet's change announcements (`Fleet::changes`).
    pub(crate) changed: Arc<tokio::sync::watch::Sender<u64>>,
}

/// A registered worker. Its fields are grouped by the one writer of each group.
#[derive(Debug)]
pub struct Worker {
    /// Fixed for the registration.
    pub id: WorkerId,
    /// `policy::key_of(id)`, what policies hash.
    pub(crate) key: u64,
    /// Where it is reached (fixed: a new URL is a new registration).
    pub endpoint: Endpoint,
    /// Who registered it (fixed: a `PUT` is a new registration).
    pub(crate) origin: Origin,
    /// The parts of the spec `PATCH` may change, swapped whole (the admin API).
    live: ArcSwap<LiveSpec>,
    /// What it said about itself at registration (discovery).
    info: ArcSwapOption<WorkerInfo>,
    /// Its health (the health checker, and the fleet for registration and drain).
    pub(crate) health: HealthCell,
    /// This gateway's requests on it (the request path, through `Lease`).
    pub(crate) traffic: Traffic,
    /// Why it should get no new request now, health and circuit aside (see `Vetoes` for the
    /// writer of each).
    pub vetoes: Vetoes,
    /// What the gateway hears from it (many writers, each moving a signal only forward).
    pub signals: Signals,
    /// Its circuit (the request path records outcomes, its timer reopens trials).
    pub(crate) breaker: Arc<WorkerBreaker>,
    /// Its adaptive concurrency limit (the limiter loop) and the samples it is learned from (the
    /// request path).
    pub(crate) adaptive: AdaptiveLimit,
    /// A decode worker's admission window (the request path, through `DecodeRooms`).
    pub(crate) decode_window: Arc<DecodeWindow>,
    /// The KV blocks its engine holds, as its events tell (its event subscriber).
    pub(crate) held: HeldIndex,
    /// The LoRA adapters of this gateway's requests on it (the request path, through `Lease`).
    pub(crate) adapters: AdapterUse,
    /// What its answers take, predicted and learned (the request path, through `Lease`).
    pub(crate) latency: WorkerLatency,
    pub(crate) metrics: WorkerMetrics,
}

impl Worker {
    pub fn new(
        id: WorkerId,
        spec: WorkerSpec,
        origin: Origin,
        http2_default: bool,
        breaker: Arc<WorkerBreaker>,
        metrics: WorkerMetrics,
        notices: Notices,
    ) -> Self {
        let (scheme, authority) = spec.endpoint();
        Self {
            key: sluice_core::policy::key_of(id.as_str().as_bytes()),
            id,
            endpoint: Endpoint {
                scheme,
                authority,
                http2: spec.http2.unwrap_or(http2_default),
            },
            origin,
            live: ArcSwap::from_pointee(LiveSpec::new(spec)),
            info: ArcSwapOption::empty(),
            health: HealthCell::new(),
            traffic: Traffic::new(notices.freed),
            vetoes: Vetoes::default(),
            signals: Signals::default(),
            breaker,
            adaptive: AdaptiveLimit::default(),
            decode_window: Arc::new(DecodeWindow::new(notices.changed)),
            held: HeldIndex::default(),
            adapters: AdapterUse::default(),
            latency: WorkerLatency::default(),
            metrics,
        }
    }

    /// Its part in prefill/decode disaggregation, as its spec says.
    pub(crate) fn role(&self) -> Role {
        self.live().spec.role()
    }

    /// Its engine's running window: the spec's, else what its load reports say; `None` (not
    /// gated) when neither tells.
    pub(crate) fn running_window(&self) -> Option<u64> {
        self.live().spec.max_running_requests.or_else(|| {
            self.vetoes
                .load()
                .and_then(|load| load.report.max_running())
        })
    }

    /// The current spec (and the authorization header built from it).
    pub fn live(&self) -> arc_swap::Guard<Arc<LiveSpec>> {
        self.live.load()
    }

    pub(crate) fn set_spec(&self, spec: WorkerSpec) {
        self.live.store(Arc::new(LiveSpec::new(spec)));
    }

    pub(crate) fn status(&self) -> HealthState {
        self.health.state()
    }

    pub(crate) fn info(&self) -> Option<Arc<WorkerInfo>> {
        self.info.load_full()
    }

    pub(crate) fn set_info(&self, info: WorkerInfo) {
        self.info.store(Some(Arc::new(info)));
    }

    pub(crate) fn in_flight(&self) -> u64 {
        self.traffic.in_flight()
    }

    /// Every replica's requests in flight on it (this one's alone without `--redis-url`): the
    /// load the policies and the all-vetoed rule compare.
    pub(crate) fn load_everywhere(&self) -> u64 {
        self.traffic.in_flight() + self.traffic.in_flight_elsewhere()
    }

    /// Where a request with `uncached` prompt tokens to prefill would stand on it now: behind
    /// the prefill backlog (`WorkerLatency::ahead`), in a batch of every replica's requests in flight
    /// there (or its engine's last reported running count, when more: other clients'), plus
    /// `joining` (the request's own sequences, when not counted in flight yet) — up to the
    /// engine's running slots, the rest queued for one (`Situation::slot_queue`).
    pub(crate) fn situation(&self, uncached: u64, joining: u64) -> Situation {
        let ahead = self.latency.ahead();
        self.situation_behind(ahead, uncached, joining)
    }

    /// The same, behind `ahead` (the backlog as a request's send left it).
    pub(crate) fn situation_behind(&self, ahead: Work, uncached: u64, joining: u64) -> Situation {
        let reported = self.vetoes.load().map_or(0, |l| l.report.running());
        let in_hand = self.load_everywhere().max(reported) + joining;
        // Past the engine's running slots, the rest wait for one (when the slots are known).
        let slots = self
            .running_window()
            .or_else(|| self.vetoes.window())
            .filter(|w| *w > 0);
        let (batch, slot_queue) = match slots {
            Some(slots) => (in_hand.min(slots), in_hand.saturating_sub(slots)),
            None => (in_hand, 0),
        };
        Situation {
            prefill_ahead: ahead,
            uncached_prompt: uncached,
            batch,
            slot_queue,
        }
    }

    /// What a request of `weight` sequences with `uncached` prompt tokens should expect if sent
    /// now; `None` until its latency is learned.
    pub(crate) fn predict(&self, uncached: u64, weight: u64) -> Option<Prediction> {
        self.latency.predict(&self.situation(uncached, weight))
    }

    /// At its adaptive concurrency limit for a request of `weight`: it takes no such request now,
    /// and is never steered to.
    pub(crate) fn at_limit(&self, weight: u64) -> bool {
        !self.adaptive.admits(self.in_flight(), weight)
    }

    /// Its waiting queue now, by `projection`: the last report's, moved by this gateway's
    /// requests sent and started since (`QueueGate::projected_by`).
    pub(crate) fn projected_waiting(&self, projection: Projection) -> u64 {
        self.vetoes
            .queue_gate()
            .projected_by(self.traffic.pending_everywhere(), projection)
    }

    /// The veto in force on it now, if any.
    pub(crate) fn veto_class(&self) -> Option<VetoClass> {
        self.veto_class_by(Projection::Hopeful)
    }

    /// The veto in force on it now, its queue projected by `projection`.
    pub(crate) fn veto_class_by(&self, projection: Projection) -> Option<VetoClass> {
        self.vetoes
            .class(self.traffic.pending_everywhere(), projection)
    }

    /// The veto in force on it now for a request that must leave `reserve` of the worker's
    /// capacity to the interactive tier (0: none; `Pool::reserve_for`): kept for that tier
    /// (`VetoClass::Reserve`) while the worker could start no more than the reserve.
    pub(crate) fn veto_class_for(&self, projection: Projection, reserve: f64) -> Option<VetoClass> {
        let veto = self.veto_class_by(projection);
        if reserve <= 0.0 {
            return veto;
        }
        veto.or_else(|| {
            self.vetoes
                .start_room()
                .keeps_off(
                    &self.vetoes.queue_gate(),
                    self.traffic.pending_everywhere(),
                    self.load_everywhere(),
                    projection,
                    reserve,
                )
                .then_some(VetoClass::Reserve)
        })
    }

    /// Over its ceiling for a request that must leave `reserve` (warily projected, as the gateway
    /// queue judges room), and how fast room frees on it; `None` when it has room or is kept
    /// out for another reason.
    pub(crate) fn over_ceiling(&self, reserve: f64, now: Instant) -> Option<OverCeiling> {
        if self.veto_class_for(Projection::Wary, reserve) != Some(VetoClass::Overload) {
            return None;
        }
        let load = self.vetoes.load()?;
        let (_, ended) = self.traffic.sent_and_ended();
        Some(OverCeiling {
            short_by: self
                .vetoes
                .queue_gate()
                .short_by(self.traffic.pending_everywhere(), Projection::Wary)
                .max(1),
            started: load.starts.rate(now),
            ended_since_report: ended.saturating_sub(load.starts.at_report.ended),
            since_report: now.saturating_duration_since(load.at),
        })
    }

    /// Whether a request sent to it now would start at once, by its last report and what was
    /// sent and ended since (`StartRoom::starts_now`).
    pub(crate) fn starts_now(&self) -> bool {
        self.vetoes.start_room().starts_now(self.load_everywhere())
    }

    /// Where a request for `adapter` stands on it: its engine's last report of its adapter
    /// slots, and the adapters of this gateway's requests in flight there.
    pub(crate) fn adapter_affinity(&self, adapter: &str) -> Affinity {
        let load = self.vetoes.load();
        let slots = load.as_ref().and_then(|l| l.report.adapters.as_ref());
        let names = self.adapters.names();
        let here: Vec<&str> = names.iter().map(|n| &**n).collect();
        affinity(adapter, slots, &here)
    }

    /// Ready, awake, and its circuit lets requests through: a request could use it now.
    pub fn is_routable(&self) -> bool {
        self.status() == HealthState::Ready
            && self.breaker.state() != BreakerState::Open
            && !self.vetoes.asleep()
    }

    /// Whether it lists `model` as a LoRA adapter: its `/v1/models` card names a `parent` (the
    /// base model), as vLLM's and SGLang's do.
    pub(crate) fn lists_as_adapter(&self, model: &ModelName) -> bool {
        self.listed_adapters().contains(model)
    }

    /// The adapters its spec lets the gateway load that it does not list (`models`): it joins
    /// their pools, to be loaded onto when no worker lists them. None before it registered.
    pub(crate) fn loadable(&self, models: &[ModelName]) -> Vec<ModelName> {
        if self.info().is_none() {
            return Vec::new();
        }
        let live = self.live();
        live.spec
            .lora
            .modules
            .iter()
            .map(|m| ModelName::new(&m.name))
            .filter(|name| !models.contains(name))
            .collect()
    }

    /// Whether the gateway may load adapter `model` onto it, its spec naming it and its
    /// `/v1/models` not listing it yet.
    pub(crate) fn may_load(&self, model: &ModelName) -> bool {
        self.live().spec.lora.module(model.as_str()).is_some() && !self.lists(model)
    }

    /// The LoRA adapters its `/v1/models` lists (cards with a `parent`).
    pub(crate) fn listed_adapters(&self) -> Vec<ModelName> {
        self.info().map_or_else(Vec::new, |info| {
            info.models
                .iter()
                .filter(|m| m.card.get("parent").is_some_and(|p| p.is_string()))
                .map(|m| m.id.clone())
                .collect()
        })
    }

    /// Whether its `/v1/models` lists `model`.
    pub(crate) fn lists(&self, model: &ModelName) -> bool {
        self.info()
            .is_some_and(|info| info.models.iter().any(|m| &m.id == model))
    }

    /// The models it serves, once known.
    pub(crate) fn models(&self) -> Vec<ModelName> {
        match (&self.live().spec.model_id, self.info()) {
            (Some(declared), _) => vec![ModelName::new(declared)],
            (None, Some(info)) => info.models.iter().map(|m| m.id.clone()).collect(),
            (None, None) => Vec::new(),
        }
    }
}
