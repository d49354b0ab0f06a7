//! The degradation ladder (seed 003; docs/degradation.md): under pressure, requests are asked to
//! cost the engines less before anyone is refused.
//!
//! One task owns the level (`run`): it reads the pressure a few times an interval — each tier's
//! oldest wait in the gateway queue, CoDel's state, the share of the worst-off model's workers
//! vetoed — and moves the level by `sluice_core::degrade::Ladder` (up at once; down a step per
//! hold, a level with a step of its own first released to a growing share of the requests). The
//! request path reads the level and the release from two atomics and asks `shed`, `cascade` and `rewrite`
//! which steps apply to its tier and model; a request none applies to is sent on byte for byte.
//! The rewrites themselves are pure (`sluice_core::degrade::rewrite`).
//!
//! ## Layout
//!
//! - `apply` — what a request gets at the level in force: a refusal (hard shedding), a cascade,
//!   its body rewritten.

mod apply;

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use sluice_core::admission::Tier;
use sluice_core::degrade::{
    level_of, passes_release, room_for, Ladder, Pressure, PruneBudget, ReasoningSwitch,
};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::info;

use super::GatewayQueue;
use crate::fleet::Fleet;

/// Where a step applies: its models (all when `None`) and tiers.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Scope {
    pub(crate) models: Option<Vec<String>>,
    pub(crate) tiers: Vec<Tier>,
}

impl Scope {
    fn covers(&self, tier: Tier, model: &str) -> bool {
        self.tiers.contains(&tier)
            && self
                .models
                .as_ref()
                .is_none_or(|models| models.iter().any(|m| m == model))
    }
}

/// What a step does.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum StepKind {
    /// 1: reasoning off or capped.
    Reasoning(ReasoningSwitch),
    /// 2: to this model.
    Cascade(String),
    /// 3: old turns dropped.
    Prune(PruneBudget),
    /// 4: `max_tokens` capped.
    Clamp(u64),
}

impl StepKind {
    /// The level it applies from.
    pub(crate) fn level(&self) -> u8 {
        match self {
            StepKind::Reasoning(_) => 1,
            StepKind::Cascade(_) => 2,
            StepKind::Prune(_) => 3,
            StepKind::Clamp(_) => 4,
        }
    }

    /// Its name in `x-sluice-degraded` and `sluice_degraded_total{step}`.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            StepKind::Reasoning(_) => "reasoning",
            StepKind::Cascade(_) => "cascade",
            StepKind::Prune(_) => "prune",
            StepKind::Clamp(_) => "max_tokens",
        }
    }
}

/// One configured step.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Step {
    pub(crate) scope: Scope,
    pub(crate) kind: StepKind,
}

/// The ladder, checked (`config` builds it from the file).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DegradationConfig {
    pub(crate) steps: Vec<Step>,
    /// Step 5: tier 2 refused at level 5, tier 1 too at level 6.
    pub(crate) shed: bool,
    /// How long a level holds before it may fall a step (the hold grows if it flaps).
    pub(crate) interval: Duration,
    /// How long a shedding level (5, 6) holds.
    pub(crate) shed_interval: Duration,
    /// Each tier's oldest wait in the queue that is level 1 (interactive, agent, batch).
    pub(crate) references: [Duration; 3],
}

/// The cascade's level.
const CASCADE: u8 = 2;

/// Readings per interval: the level follows pressure within a fifth of an interval.
const READINGS_PER_INTERVAL: u32 = 5;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepTier {
    step: &'static str,
    tier: &'static str,
}

/// The ladder at run time.
#[derive(Debug)]
pub(crate) struct Degrader {
    config: DegradationConfig,
    level: AtomicU8,
    /// Quarters of the requests that pass the top level's step (`Ladder::released`).
    released: AtomicU8,
    /// Counts the requests the top level's step could apply to while released
    /// (`passes_release`).
    draws: AtomicU64,
    /// Cascaded requests in flight (`Diverted` guards): what undoing the cascade brings back.
    diverted: Arc<AtomicU64>,
    /// The last reading and the ladder's hold then, for `/admission`.
    last: parking_lot::Mutex<(Option<Pressure>, Duration)>,
    degraded: Family<StepTier, Counter>,
    level_gauge: Gauge,
}

impl Degrader {
    pub fn new(config: DegradationConfig, registry: &mut Registry) -> Arc<Self> {
        let degraded = Family::<StepTier, Counter>::default();
        for step in ["reasoning", "cascade", "prune", "max_tokens", "shed"] {
            for tier in Tier::ALL {
                let _ = degraded.get_or_create(&StepTier {
                    step,
                    tier: tier.name(),
                });
            }
        }
        let level_gauge = Gauge::default();
        registry.register(
            "degraded",
            "Requests degraded by the ladder, by step and tier (shed: refused by its hard shedding)",
            degraded.clone(),
        );
        registry.register(
            "degradation_level",
            "The degradation ladder's level: 0 none, 1 reasoning, 2 cascade, 3 prune, 4 clamp, 5 tier 2 shed, 6 tier 1 shed",
            level_gauge.clone(),
        );
        let hold = config.interval;
        Arc::new(Self {
            config,
            level: AtomicU8::new(0),
            released: AtomicU8::new(0),
            draws: AtomicU64::new(0),
            diverted: Arc::new(AtomicU64::new(0)),
            last: parking_lot::Mutex::new((None, hold)),
            degraded,
            level_gauge,
        })
    }

    pub(crate) fn level(&self) -> u8 {
        self.level.load(Ordering::Relaxed)
    }

    /// Whether this request passes the top level's step: while the level is released, the
    /// released share of the requests the step would apply to.
    fn passes_top_step(&self) -> bool {
        let released = self.released.load(Ordering::Relaxed);
        released > 0 && passes_release(released, self.draws.fetch_add(1, Ordering::Relaxed))
    }

    /// Bit `l` set when level `l` has a configured step.
    fn levels_with_steps(&self) -> u8 {
        self.config
            .steps
            .iter()
            .fold(0, |mask, s| mask | 1 << s.kind.level())
    }

    fn count(&self, step: &'static str, tier: Tier) {
        self.degraded
            .get_or_create(&StepTier {
                step,
                tier: tier.name(),
            })
            .inc();
    }

    /// The level and the reading it follows, for `/admission`.
    pub(crate) fn view(&self) -> serde_json::Value {
        let (last, hold) = *self.last.lock();
        serde_json::json!({
            "level": self.level(),
            "released_quarters": self.released.load(Ordering::Relaxed),
            "cascaded_in_flight": self.diverted.load(Ordering::Relaxed),
            "interval_secs": self.config.interval.as_secs_f64(),
            "shed_interval_secs": self.config.shed_interval.as_secs_f64(),
            "hold_secs": hold.as_secs_f64(),
            "reference_delay_ms_by_tier": self.config.references.map(millis),
            "pressure": last.map(|p| serde_json::json!({
                "queue_delay_ms_by_tier": p.queue_delay.map(millis),
                "vetoed_share": p.vetoed_share,
                "codel_dropping": p.codel_dropping,
            })),
        })
    }

    /// Owns the level until `stop`: reads the pressure and moves the level.
    pub(crate) async fn run(
        self: Arc<Self>,
        queue: Option<Arc<GatewayQueue>>,
        fleet: Arc<Fleet>,
        mut stop: watch::Receiver<bool>,
    ) {
        let (interval, shed) = (self.config.interval, self.config.shed_interval);
        let mut ladder = Ladder::new(interval, shed, self.levels_with_steps(), Instant::now());
        let every = interval.min(shed) / READINGS_PER_INTERVAL;
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            let now = Instant::now();
            let pressure = Pressure {
                queue_delay: queue
                    .as_ref()
                    .map_or([Duration::ZERO; 3], |q| q.oldest_waits(now)),
                vetoed_share: vetoed_share(&fleet),
                codel_dropping: queue.as_ref().map_or([false; 3], |q| q.codel_dropping()),
            };
            let before = ladder.level();
            let wanted = level_of(&pressure, self.config.references);
            let room = before != CASCADE || self.room_to_undo_cascade(&fleet, ladder.released());
            let level = ladder.observe_with_room(wanted, room, now);
            *self.last.lock() = (Some(pressure), ladder.hold());
            self.level.store(level, Ordering::Relaxed);
            let released = ladder.released();
            if self.released.swap(released, Ordering::Relaxed) < released {
                info!(
                    level,
                    released_quarters = released,
                    "degradation level released: a share of the requests pass its step"
                );
            }
            self.level_gauge.set(i64::from(level));
            if level != before {
                info!(
                    from = before,
                    to = level,
                    queue_delay_ms_by_tier = ?pressure.queue_delay.map(|d| d.as_millis() as u64),
                    vetoed_share = pressure.vetoed_share,
                    codel_dropping = ?pressure.codel_dropping,
                    hold_secs = ladder.hold().as_secs_f64(),
                    "degradation level changed"
                );
            }
        }
    }
}

impl Degrader {
    /// Whether the models the cascade diverts from have room, by their workers' reports, for
    /// the share of the cascaded requests undoing its next quarter brings back — room beyond the
    /// interactive reserve, as those requests are less urgent (`room_for`).
    fn room_to_undo_cascade(&self, fleet: &Fleet, released: u8) -> bool {
        let diverted = self.diverted.load(Ordering::Relaxed);
        let snapshot = fleet.snapshot();
        let mut room: Option<u64> = Some(0);
        for step in &self.config.steps {
            let (StepKind::Cascade(_), Some(models)) = (&step.kind, &step.scope.models) else {
                continue;
            };
            for pool in models.iter().filter_map(|m| snapshot.pools.get(m.as_str())) {
                let reserve = pool.reserve_for(Tier::Agent);
                for w in pool.workers.iter().filter(|w| w.is_routable()) {
                    let beyond = w
                        .vetoes
                        .start_room()
                        .beyond_reserve(w.load_everywhere(), reserve);
                    room = room.zip(beyond).map(|(a, b)| a + b);
                }
            }
        }
        room_for(diverted, released, room)
    }

    /// Counts a cascaded request in flight until it ends (held in its context).
    pub(crate) fn diverting(&self) -> Box<dyn crate::context::Hold> {
        self.diverted.fetch_add(1, Ordering::Relaxed);
        Box::new(Diverted(self.diverted.clone()))
    }
}

/// One cascaded request in flight.
struct Diverted(Arc<AtomicU64>);

impl crate::context::Hold for Diverted {
    fn release(self: Box<Self>, _: &crate::context::Ending) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// For the model worst off, the share of its routable workers that take no new request now:
/// vetoed, or at their concurrency limit. Per model, since a model whose workers are all full is
/// under pressure however idle another model's are.
fn vetoed_share(fleet: &Fleet) -> f64 {
    let snapshot = fleet.snapshot();
    snapshot
        .pools
        .values()
        .map(|pool| {
            let (mut routable, mut out) = (0usize, 0usize);
            for w in pool.workers.iter().filter(|w| w.is_routable()) {
                routable += 1;
                if w.veto_class().is_some() || w.at_limit(1) {
                    out += 1;
                }
            }
            if routable == 0 {
                0.0
            } else {
                out as f64 / routable as f64
            }
        })
        .fold(0.0, f64::max)
}
