//! What one update of the status page carries: a card per worker, the admission queue by tier
//! and tenant, the tenants, the degradation level, the objectives, and the newest chart point.

use serde::Serialize;
use sluice_core::admission::Tier;
use sluice_core::health::HealthState;
use sluice_core::overload::VetoClass;
use sluice_core::status::CardState;
use tokio::time::Instant;

use super::sampler::Point;
use crate::admin::Admin;
use crate::fleet::Worker;

/// A veto in force and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct VetoNote {
    /// `unreachable`, `wedged`, `unresponsive`, `overloaded`, `busy` or `at_capacity`.
    pub(crate) kind: &'static str,
    pub(crate) cause: String,
}

#[derive(Debug, Serialize)]
struct EngineView {
    waiting: u64,
    running: u64,
    kv_usage: f64,
    age_secs: f64,
}

/// One worker's card.
#[derive(Debug, Serialize)]
pub(crate) struct Card {
    id: String,
    url: String,
    role: &'static str,
    models: Vec<String>,
    pub(crate) state: CardState,
    health: HealthState,
    circuit: &'static str,
    vetoes: Vec<VetoNote>,
    engine: Option<EngineView>,
    in_flight: u64,
    pending: u64,
    /// The adaptive concurrency limit, where one is on.
    limit: Option<u64>,
}

fn vetoes_of(worker: &Worker) -> Vec<VetoNote> {
    let v = &worker.vetoes;
    let mut notes = Vec::new();
    if let Some(liveness) = v.liveness() {
        notes.push(VetoNote {
            kind: liveness.reason(),
            cause: liveness.to_string(),
        });
    }
    if worker.veto_class() == Some(VetoClass::Overload) {
        if v.busy() {
            notes.push(VetoNote {
                kind: "busy",
                cause: "a rank over its busy thresholds".into(),
            });
        }
        if v.at_capacity() {
            notes.push(VetoNote {
                kind: "at_capacity",
                cause: "it answered that it is at capacity".into(),
            });
        }
        if !v.busy() && !v.at_capacity() {
            let cause = match v.load().and_then(|l| l.overload) {
                Some(cause) => cause.to_string(),
                None => format!(
                    "{} waiting, projected, at its ceiling",
                    v.queue_gate()
                        .projected(worker.traffic.pending_everywhere())
                ),
            };
            notes.push(VetoNote {
                kind: "overloaded",
                cause,
            });
        }
    }
    notes
}

impl Card {
    pub(crate) fn of(worker: &Worker, now: Instant) -> Self {
        let veto = worker.veto_class();
        let circuit = worker.breaker.state();
        Self {
            id: worker.id.to_string(),
            url: worker.live().spec.url.clone(),
            role: worker.role().as_str(),
            models: worker.models().iter().map(ToString::to_string).collect(),
            state: CardState::of(worker.status(), circuit, veto),
            health: worker.status(),
            circuit: circuit.as_str(),
            vetoes: vetoes_of(worker),
            engine: worker.vetoes.load().map(|l| EngineView {
                waiting: l.report.waiting(),
                running: l.report.running(),
                kv_usage: l.report.mean_kv_usage(),
                age_secs: now.saturating_duration_since(l.at).as_secs_f64(),
            }),
            in_flight: worker.in_flight(),
            pending: worker.traffic.pending_requests(),
            limit: worker.adaptive.limit(),
        }
    }
}

#[derive(Debug, Serialize)]
struct SloView {
    tier: &'static str,
    ttft_ms: Option<u128>,
    tpot_ms: Option<u128>,
}

/// One update.
#[derive(Debug, Serialize)]
pub(crate) struct Update {
    pub(crate) workers: Vec<Card>,
    queue: Option<serde_json::Value>,
    tenants: Vec<TenantView>,
    degradation: Option<serde_json::Value>,
    slos: Vec<SloView>,
    pub(crate) point: Point,
}

#[derive(Debug, Serialize)]
struct TenantView {
    name: String,
    tier: &'static str,
    in_flight: u32,
}

impl Update {
    pub(crate) fn of(admin: &Admin, slos: &sluice_core::slo::Slos, point: Point) -> Self {
        let now = Instant::now();
        let snapshot = admin.fleet.snapshot();
        Self {
            workers: snapshot.workers.iter().map(|w| Card::of(w, now)).collect(),
            queue: admin.admit.queue().map(|q| q.view()),
            tenants: admin
                .admit
                .tenants()
                .all()
                .map(|t| TenantView {
                    name: t.id.to_string(),
                    tier: t.tier.name(),
                    in_flight: t.in_flight(),
                })
                .collect(),
            degradation: admin.degrade.as_ref().map(|d| d.view()),
            slos: Tier::ALL
                .iter()
                .map(|&tier| {
                    let slo = slos.of(tier);
                    SloView {
                        tier: tier.name(),
                        ttft_ms: slo.ttft.map(|d| d.as_millis()),
                        tpot_ms: slo.tpot.map(|d| d.as_millis()),
                    }
                })
                .collect(),
            point,
        }
    }
}
