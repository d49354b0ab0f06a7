//! The workers of one model as the request path reads them (a pool), and the routing state
//! that outlives snapshots; a disaggregated model's prefill and decode sides are pools too.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use sluice_core::admission::drain::OverCeiling;
use sluice_core::admission::Tier;
use sluice_core::latency::lateness;
use sluice_core::overload::{reserve_in_force, seeks_room, Projection};
use sluice_core::prefix::PrefixIndex;
use sluice_core::slo::Slos;
use sluice_core::ModelName;
use tokio::time::Instant;

use super::pd::Role;
use super::worker::Worker;
use super::FleetSettings;

/// Routing state of one model that outlives snapshots: the round-robin counter and the prefix
/// index must not reset every time a worker comes or goes.
#[derive(Debug)]
pub struct PoolState {
    pub(crate) ticket: AtomicU64,
    pub(crate) prefix: parking_lot::Mutex<PrefixIndex>,
    /// `--interactive-reserve`: the share of each worker's capacity less urgent requests leave.
    reserve: f64,
    /// With `--policy predicted`, the tiers' objectives: a worker predicted to start a new
    /// prompt later than its tier's first-token objective has no room for it.
    objectives: Option<Slos>,
}

/// The workers of one model.
#[derive(Debug, Clone)]
pub struct Pool {
    pub(crate) model: ModelName,
    /// Every worker of the model, whatever its role.
    pub(crate) workers: Vec<Arc<Worker>>,
    pub(crate) state: Arc<PoolState>,
    /// Set when the model is served disaggregated (some of its workers are prefill or decode
    /// workers): its requests go to a pair, one of each.
    pub(crate) pd: Option<Arc<PdPools>>,
    /// Its name, when the model is a LoRA adapter (a worker lists it with a `parent`): its
    /// requests go where the adapter runs or has a slot first (`sluice_core::lora`).
    pub(crate) adapter: Option<Arc<str>>,
}

/// A disaggregated model's prefill and decode workers, each a pool of its own (its own
/// round-robin counter and prefix index, its own policy).
#[derive(Debug)]
pub struct PdPools {
    pub(crate) prefill: Pool,
    pub(crate) decode: Pool,
}

impl Pool {
    /// Whether a request of `tier` could go to one of its workers now without waiting: one is
    /// routable, under its adaptive limit and under every veto, its queue projected warily
    /// (`Projection::Wary`: the gateway queue can release many at once), with room beyond
    /// the interactive reserve for a less urgent request (`reserve_for`), and, with `--policy
    /// predicted`, predicted to start a new prompt within the tier's first-token objective
    /// (`in_time`). The gateway queue holds requests while this is false. A disaggregated model
    /// needs room on both sides.
    pub(crate) fn has_room_for(&self, tier: Tier) -> bool {
        self.has_room_after(tier, Duration::ZERO)
    }

    /// With `--policy predicted`: room is gated on the predictions (`has_room_after`).
    pub(crate) fn gates_by_prediction(&self) -> bool {
        self.state.objectives.is_some()
    }

    /// `has_room_for` a request of `tier` that has waited `waited` already: with `--policy
    /// predicted`, a worker must be predicted to start a new prompt within what is left of the
    /// tier's first-token objective, which counts from the request's arrival (none left: out of
    /// time, whatever is predicted). A queue that
    /// released its oldest waiter on room in time for a fresh one would hold requests until
    /// most of their time was spent, then send them to be late.
    pub(crate) fn has_room_after(&self, tier: Tier, waited: Duration) -> bool {
        if let Some(pd) = &self.pd {
            return pd.prefill.has_room_after(tier, waited)
                && pd.decode.has_room_after(tier, waited);
        }
        let reserve = self.reserve_for(tier);
        let objective = self
            .state
            .objectives
            .and_then(|slos| slos.of(tier).ttft)
            .filter(|t| !t.is_zero())
            .map(|t| t.saturating_sub(waited));
        self.workers.iter().any(|w| {
            w.is_routable()
                && !w.at_limit(1)
                && w.veto_class_for(Projection::Wary, reserve).is_none()
                && objective.is_none_or(|left| !left.is_zero() && in_time(w, left))
        })
    }

    /// When a request of `tier` finds every one of its routable workers over its ceiling: each,
    /// with how fast room frees on it (`--worker-overload-shed` judges the wait by them).
    /// `None` when one has room, or is out for another reason, or none is routable; and for a
    /// disaggregated model, whose decode side has its own admission window.
    pub(crate) fn over_ceilings(&self, tier: Tier) -> Option<Vec<OverCeiling>> {
        if self.pd.is_some() {
            return None;
        }
        let reserve = self.reserve_for(tier);
        let now = Instant::now();
        let over: Option<Vec<OverCeiling>> = self
            .workers
            .iter()
            .filter(|w| w.is_routable())
            .map(|w| w.over_ceiling(reserve, now))
            .collect();
        over.filter(|o| !o.is_empty())
    }

    /// Whether one of its workers can serve at all, full or not: ready, its circuit not open,
    /// awake (both sides, disaggregated). With none, the gateway queue would hold a request for
    /// a health check or a breaker's timeout: it is answered at once instead, as without a queue.
    pub(crate) fn has_routable(&self) -> bool {
        if let Some(pd) = &self.pd {
            return pd.prefill.has_routable() && pd.decode.has_routable();
        }
        self.workers.iter().any(|w| w.is_routable())
    }

    /// The share of each worker's capacity a request of `tier` must leave to the interactive
    /// tier: the reserve, for a less urgent request while the model has interactive traffic
    /// (an interactive first token on one of its workers within `RESERVE_HOLD`); none
    /// otherwise.
    pub(crate) fn reserve_for(&self, tier: Tier) -> f64 {
        let reserve = self.state.reserve;
        if tier == Tier::Interactive || reserve <= 0.0 {
            return 0.0;
        }
        // The latest first, then one reading of the clock: this runs for every less urgent
        // request.
        let last = self
            .workers
            .iter()
            .filter_map(|w| w.signals.interactive_answered_at())
            .max();
        reserve_in_force(reserve, tier, last.map(|at| at.elapsed()))
    }

    /// Whether a request of `tier` goes to a worker where it starts at once when one exists
    /// (`sluice_core::overload::seeks_room`): an interactive request while a reserve is set.
    pub(crate) fn seeks_room(&self, tier: Tier) -> bool {
        seeks_room(tier, self.state.reserve)
    }

    /// The shortest time to a first token a request of `prompt_tokens` could expect on one of
    /// its routable workers, as their latency models predict it (the prompts waiting for
    /// prefill there and its own at the worker's learned rate, plus a step of the batch it
    /// would join). `None` until one is learned.
    pub(crate) fn expected_ttft(&self, prompt_tokens: u64) -> Option<Duration> {
        if let Some(pd) = &self.pd {
            return pd.prefill.expected_ttft(prompt_tokens);
        }
        self.workers
            .iter()
            .filter(|w| w.is_routable())
            .filter_map(|w| w.predict(prompt_tokens, 1))
            .map(|p| p.ttft)
            .min()
    }

    /// The earliest moment one of its workers' at-capacity vetoes ends, or, with `--policy
    /// predicted`, one of them should be in time again for a tier: the changes of room no event
    /// announces.
    pub(crate) fn next_room(&self) -> Option<Instant> {
        self.workers
            .iter()
            .filter_map(|w| w.vetoes.at_capacity_until())
            .chain(self.predicted_room())
            .min()
    }

    /// With `--policy predicted`, when the worker least late for a tier's first-token objective
    /// should be in time, its backlog drained by as much (no sooner than `RECHECK_FLOOR`).
    fn predicted_room(&self) -> Option<Instant> {
        let slos = self.state.objectives?;
        let objectives: Vec<Duration> = Tier::ALL
            .iter()
            .filter_map(|&tier| slos.of(tier).ttft.filter(|t| !t.is_zero()))
            .collect();
        let late_by = self
            .workers
            .iter()
            .filter(|w| w.is_routable())
            .filter_map(|w| {
                let predicted = w.predict(0, 1)?.ttft;
                objectives
                    .iter()
                    .filter_map(|&objective| lateness(Some(predicted), Some(objective)))
                    .min()
            })
            .min()?;
        Some(Instant::now() + late_by.max(RECHECK_FLOOR))
    }
}

/// The shortest wait before room predicted late is looked at again: a worker late by a hair is
/// not polled in a loop.
const RECHECK_FLOOR: Duration = Duration::from_millis(10);

/// Whether `worker`'s first token for a new (empty) prompt is predicted within `objective`: the
/// prefill queued there at its learned rate, and a step. A worker not learned yet is in time.
fn in_time(worker: &Worker, objective: Duration) -> bool {
    lateness(worker.predict(0, 1).map(|p| p.ttft), Some(objective)).is_none()
}

/// The lasting routing state of a model's pool (`role`: one side of a disaggregated model).
pub(super) fn pool_state(
    pools: &mut HashMap<(ModelName, Option<&'static str>), Arc<PoolState>>,
    settings: &FleetSettings,
    model: &ModelName,
    role: Option<&'static str>,
) -> Arc<PoolState> {
    pools
        .entry((model.clone(), role))
        .or_insert_with(|| {
            Arc::new(PoolState {
                ticket: AtomicU64::new(0),
                prefix: parking_lot::Mutex::new(PrefixIndex::new(settings.prefix_capacity)),
                reserve: settings.interactive_reserve,
                objectives: settings.room_by_prediction,
            })
        })
        .clone()
}

/// A model's prefill and decode pools, when some of its workers have those roles.
pub(super) fn pd_pools(
    pools: &mut HashMap<(ModelName, Option<&'static str>), Arc<PoolState>>,
    settings: &FleetSettings,
    pool: &Pool,
) -> Option<Arc<PdPools>> {
    let of = |wanted: fn(Role) -> bool| -> Vec<Arc<Worker>> {
        pool.workers
            .iter()
            .filter(|w| wanted(w.role()))
            .cloned()
            .collect()
    };
    let prefill = of(|r| matches!(r, Role::Prefill { .. }));
    let decode = of(|r| r == Role::Decode);
    if prefill.is_empty() && decode.is_empty() {
        return None;
    }
    let mut side = |role, workers| Pool {
        model: pool.model.clone(),
        workers,
        state: pool_state(pools, settings, &pool.model, Some(role)),
        pd: None,
        adapter: pool.adapter.clone(),
    };
    let prefill = side("prefill", prefill);
    let decode = side("decode", decode);
    Some(Arc::new(PdPools { prefill, decode }))
}
