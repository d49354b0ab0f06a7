//! The gateway queue (`--queue-size`): a request that no worker of its model can take now waits
//! here, not on an engine's queue, and is routed when it leaves — so it goes to whichever worker
//! frees first ("late binding").
//!
//! The order is `sluice_core::admission::FairQueue`'s: strict tiers, tenants weighted fair by
//! tokens, earliest deadline first. One dispatcher task owns the moment of leaving: it wakes when
//! room may have opened — a request stopped waiting on a worker or ended (`Fleet::freed`), the
//! fleet changed (a veto lifted, a worker came), a gateway slot came back, an at-capacity veto
//! ran out — and sends out, one at a time, the first waiter whose model has room, waiting for it
//! to take its worker before looking again (so one freed place is not promised twice). A waiter
//! that times out, passes its deadline or whose client leaves takes itself out.
//!
//! A full queue makes room for a more urgent arrival, or for a tenant under its share of the
//! queue, by evicting (503 `queue_evicted`) the newest waiter of whoever holds most
//! (`FairQueue::push`); each eviction is counted under the evicted request's tenant and tier.
//!
//! Each tier also runs CoDel (`codel`): whenever the dispatcher looks, and when a tier's head
//! reaches its target, its next drop is due or an interval ends, a queue that has stood above
//! its target for an interval is cut at its head (503 `codel_drop`), and an arrival that would
//! wait past the target is refused the same way, until an interval passes with nothing to
//! refuse; a burst that drains within the interval loses nothing.
//!
//! With `--worker-overload-shed`, a request every worker of its model is over its ceiling for
//! waits only while room is measured freeing there in time for it (`drain::overload_wait`): at
//! arrival, and at each report while it waits (`dispatch`).
//!
//! ## Layout
//!
//! - `mod.rs` — the waiters: arrival, the wait for a turn, how it ends, the views.
//! - `dispatch` — the dispatcher task: sends waiters out, cuts and sheds the hopeless.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use sluice_core::adaptive::CodelConfig;
use sluice_core::admission::drain::{self, QueueRates};
use sluice_core::admission::{FairQueue, Pushed, Tier, Waiter};
use sluice_core::{ModelName, TenantId};
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

mod dispatch;
mod turn;

pub use turn::Turn;

use super::codel::TierCodels;
use crate::admit::AdmitError;
use crate::error::Expired;
use crate::metrics::TenantCounters;

/// The queue's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueConfig {
    /// `--queue-size`: waiters at most.
    pub size: usize,
    /// How long each tier may wait (`--queue-timeout-secs`, `--queue-timeout-by-tier`).
    pub timeouts: [Duration; 3],
    /// `--worker-overload-shed`: refuse, by tier, what would wait too long (see `arrival`).
    pub shed: bool,
    /// Retry-After of a shed request: the load interval, when a vetoed worker is judged again.
    pub shed_retry_after: Duration,
    /// CoDel per tier; `None`: off (`--disable-codel`).
    pub codel: Option<[CodelConfig; 3]>,
}

/// How a waiter's wait ends.
enum Called {
    /// Go now; tell the dispatcher when a worker is taken (or drop it).
    Go(oneshot::Sender<()>),
    /// Made room for a more urgent arrival.
    Evicted,
    /// Cut by its tier's CoDel, at the head of a standing queue.
    Dropped,
    /// Shed (`--worker-overload-shed`): every candidate over its ceiling and no room freeing on
    /// them in time for it.
    Shed,
}

struct Waiting {
    model: ModelName,
    arrived: Instant,
    /// When its wait ends: its tier's timeout after it first asked, or its deadline.
    until: Instant,
    turn: oneshot::Sender<Called>,
    /// Its tenant's counters, to count it if it is evicted.
    counters: Option<Arc<TenantCounters>>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TierLabel {
    tier: &'static str,
}

/// The queue, shared by every request and its dispatcher.
pub struct GatewayQueue {
    config: QueueConfig,
    waiting: Mutex<FairQueue<Waiting>>,
    /// Wakes the dispatcher: an arrival, or a gateway slot given back.
    kick: Notify,
    /// The model of the waiter sent out and not yet on its worker: the room it was sent for is
    /// its, so an arrival for that model waits rather than take it.
    in_transit: Mutex<Option<ModelName>>,
    /// Recent dispatches and arrivals, for the expected wait and Retry-After.
    rates: Mutex<QueueRates>,
    /// Each tier's CoDel, unless `--disable-codel`.
    codel: Option<TierCodels>,
    depth: Family<TierLabel, Gauge>,
    wait: Family<TierLabel, Histogram>,
}

impl std::fmt::Debug for GatewayQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayQueue")
            .field("config", &self.config)
            .field("len", &self.waiting.lock().len())
            .finish()
    }
}

/// What the queue needs to know of a request.
#[derive(Debug, Clone)]
pub struct Asker {
    pub(crate) tier: Tier,
    pub(crate) tenant: TenantId,
    pub(crate) weight: f64,
    pub(crate) cost: u64,
    pub(crate) model: ModelName,
    /// The client's deadline, if it gave one.
    pub(crate) deadline: Option<Instant>,
    /// Its tenant's counters.
    pub(crate) counters: Option<Arc<TenantCounters>>,
    /// Why it would wait: overload, or only the interactive reserve (`drain::hopeless`).
    pub(crate) hold: drain::Hold,
    /// Every candidate over its ceiling, with how fast room frees on each
    /// (`Pool::over_ceilings`); `None` when it waits for anything else.
    pub(crate) over_ceilings: Option<Vec<drain::OverCeiling>>,
    /// When it first asked for room: a request sent back to wait (its room gone before it took
    /// it) waits what is left of its tier's timeout, not a fresh one.
    pub(crate) asked: Instant,
}

/// The longest the dispatcher waits for a request it sent out to take its worker before it
/// looks again. A request takes its worker within microseconds of its turn; the bound is for
/// one that does not (a stall the gateway did not foresee), so it cannot stop the queue for
/// every model: past it, the room may be promised twice, which costs one request a wait on an
/// engine.
pub const TURN_BOUND: Duration = Duration::from_millis(250);

/// Takes a waiter out of the queue if its wait ends any other way than its turn.
struct Leave<'q> {
    queue: &'q GatewayQueue,
    ticket: Option<sluice_core::admission::Ticket>,
}

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            self.queue.waiting.lock().remove(ticket);
            self.queue.count_depth();
        }
    }
}

impl GatewayQueue {
    pub fn new(config: QueueConfig, registry: &mut Registry) -> Arc<Self> {
        let codel = config.codel.map(|c| TierCodels::new(c, Instant::now()));
        let queue = Self {
            config,
            waiting: Mutex::new(FairQueue::new(0)),
            kick: Notify::new(),
            in_transit: Mutex::new(None),
            rates: Mutex::new(QueueRates::default()),
            codel,
            depth: Family::default(),
            wait: Family::new_with_constructor(|| {
                Histogram::new([
                    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                ])
            }),
        };
        *queue.waiting.lock() = FairQueue::new(queue.config.size);
        for tier in Tier::ALL {
            let label = TierLabel { tier: tier.name() };
            let _ = queue.depth.get_or_create(&label);
            let _ = queue.wait.get_or_create(&label);
        }
        registry.register(
            "admission_queue_depth",
            "Requests waiting in the gateway queue, by tier",
            queue.depth.clone(),
        );
        registry.register(
            "admission_wait_seconds",
            "Time requests waited in the gateway queue before their turn, by tier",
            queue.wait.clone(),
        );
        Arc::new(queue)
    }

    fn count_depth(&self) {
        let waiting = self.waiting.lock();
        for tier in Tier::ALL {
            self.depth
                .get_or_create(&TierLabel { tier: tier.name() })
                .set(waiting.depth(tier) as i64);
        }
    }

    /// An arrival that cannot help by waiting is refused at once: with `--worker-overload-shed`,
    /// one whose wait is hopeless — every candidate over its ceiling and no room measured
    /// freeing on them fast enough (`drain::overload_hopeless`), else by the queue's drain rate
    /// (`drain::hopeless`); while its tier's CoDel is dropping, one expected to wait past the
    /// tier's target (`Codel::admits`).
    fn arrival(&self, asker: &Asker, now: Instant) -> Result<(), AdmitError> {
        let dropping = self.codel.as_ref().filter(|c| c.dropping(asker.tier));
        if !self.config.shed && dropping.is_none() {
            return Ok(());
        }
        let ahead = self
            .waiting
            .lock()
            .ahead_of_arrival(asker.tier, &asker.tenant, asker.weight);
        let shed = AdmitError::WorkerOverloadShed {
            model: asker.model.clone(),
            retry_after: self.config.shed_retry_after,
        };
        // The flag's own answer first: the fleet is too full, whatever the queue would say.
        if let (true, Some(over)) = (self.config.shed, &asker.over_ceilings) {
            let left = self.wait_until(asker).saturating_duration_since(now);
            if drain::overload_hopeless(asker.tier, drain::overload_wait(ahead, over), left) {
                return Err(shed);
            }
        }
        let expected = drain::likely_wait(ahead, self.rates.lock().tier_rate(asker.tier, now));
        if let Some(codel) = dropping {
            if !codel.admits(asker.tier, expected, now) {
                return Err(AdmitError::CodelDrop {
                    retry_after: self.retry_after(now),
                });
            }
        }
        let timeout = self.config.timeouts[asker.tier.index()];
        if self.config.shed
            && asker.over_ceilings.is_none()
            && drain::hopeless(asker.tier, asker.hold, expected, timeout)
        {
            return Err(shed);
        }
        Ok(())
    }

    /// `--worker-overload-shed`: waiting that cannot help is refused.
    pub(crate) fn sheds(&self) -> bool {
        self.config.shed
    }

    /// When the asker's wait ends: its tier's timeout after it first asked, or its deadline.
    fn wait_until(&self, asker: &Asker) -> Instant {
        let timeout_at = asker.asked + self.config.timeouts[asker.tier.index()];
        asker.deadline.map_or(timeout_at, |d| d.min(timeout_at))
    }

    /// Whether an arrival for `model` at `tier` must queue rather than go on: someone of its
    /// tier or a more urgent one waits for the same model, or was sent out for it and has not
    /// taken its worker yet (the arrival would pass them, or take the room one was sent for).
    /// With the gateway's slots capped (`capped`), also such a waiter for another model that
    /// has room (`has_room`), or one sent out for it: they wait only for a slot, which they
    /// asked for first, and an arrival taking a slot as it frees would pass them. Less urgent
    /// waiters do not hold it back: they would go after it, and may be waiting for room beyond
    /// the interactive reserve it does not need.
    pub(crate) fn has_waiters_for(
        &self,
        model: &ModelName,
        tier: Tier,
        capped: bool,
        has_room: impl Fn(&ModelName, Tier) -> bool,
    ) -> bool {
        if let Some(sent) = self.in_transit.lock().as_ref() {
            if sent == model || capped {
                return true;
            }
        }
        self.waiting.lock().waiters().any(|w| {
            w.tier <= tier
                && (&w.item.model == model || (capped && has_room(&w.item.model, w.tier)))
        })
    }

    /// Waits for the request's turn: the dispatcher sends it when its model has room. Refused
    /// when the queue is full and the request may take no one's place; ended by its tier's
    /// timeout, its client's deadline or an eviction. A client that leaves drops this future and with it its
    /// place.
    pub(crate) async fn wait_turn(&self, asker: Asker) -> Result<Turn, AdmitError> {
        let arrived = Instant::now();
        self.arrival(&asker, arrived)?;
        let (turn, rx) = oneshot::channel();
        let waiter = Waiter {
            tier: asker.tier,
            tenant: asker.tenant.clone(),
            weight: asker.weight,
            cost: asker.cost,
            deadline: asker.deadline,
            item: Waiting {
                model: asker.model.clone(),
                arrived,
                until: self.wait_until(&asker),
                turn,
                counters: asker.counters.clone(),
            },
        };
        let pushed = self.waiting.lock().push(waiter);
        let ticket = match pushed {
            Pushed::Queued(ticket) => ticket,
            Pushed::Evicted(ticket, victim) => {
                if let Some(counters) = &victim.item.counters {
                    counters.evicted(victim.tier);
                }
                let _ = victim.item.turn.send(Called::Evicted);
                ticket
            }
            Pushed::Full(_) => {
                return Err(AdmitError::QueueFull {
                    retry_after: self.retry_after(arrived),
                })
            }
        };
        self.rates.lock().arrived(asker.tier, arrived);
        self.count_depth();
        let mut leave = Leave {
            queue: self,
            ticket: Some(ticket),
        };
        self.kick.notify_one();
        let timeout_at = asker.asked + self.config.timeouts[asker.tier.index()];
        let turn = tokio::time::timeout_at(self.wait_until(&asker), rx).await;
        if turn.is_ok() {
            // Out of the queue already: sent out, or evicted.
            leave.ticket = None;
        }
        self.ended(turn, &asker, arrived, timeout_at)
    }

    /// What a wait that ended gives the request.
    fn ended(
        &self,
        turn: Result<Result<Called, oneshot::error::RecvError>, tokio::time::error::Elapsed>,
        asker: &Asker,
        arrived: Instant,
        timeout_at: Instant,
    ) -> Result<Turn, AdmitError> {
        let waited = arrived.elapsed();
        match turn {
            Ok(Ok(Called::Go(ack))) => {
                self.wait
                    .get_or_create(&TierLabel {
                        tier: asker.tier.name(),
                    })
                    .observe(waited.as_secs_f64());
                Ok(Turn::new(ack))
            }
            Ok(Ok(Called::Evicted)) | Ok(Err(_)) => Err(AdmitError::QueueEvicted {
                retry_after: self.retry_after(Instant::now()),
            }),
            Ok(Ok(Called::Dropped)) => Err(AdmitError::CodelDrop {
                retry_after: self.retry_after(Instant::now()),
            }),
            Ok(Ok(Called::Shed)) => Err(AdmitError::WorkerOverloadShed {
                model: asker.model.clone(),
                retry_after: self.config.shed_retry_after,
            }),
            Err(_) if asker.deadline.is_some_and(|d| d <= timeout_at) => {
                Err(Expired::DeadlineExceeded {
                    budget: asker.asked.elapsed(),
                }
                .into())
            }
            Err(_) => Err(AdmitError::QueueTimeout {
                waited: asker.asked.elapsed(),
                retry_after: self.retry_after(Instant::now()),
            }),
        }
    }

    /// How long a refused request should wait (`drain::retry_after`).
    fn retry_after(&self, now: Instant) -> Duration {
        let waiting = self.waiting.lock().len();
        drain::retry_after(waiting, self.rates.lock().drain(now))
    }

    /// A request of `tier` found room and went on without waiting: it took room as a waiter sent
    /// out does, so it counts in the rates the expected wait is judged on (counting only the
    /// waiters, a queue that most requests pass by would seem to drain slowly).
    pub(crate) fn went_direct(&self, tier: Tier) {
        let now = Instant::now();
        let mut rates = self.rates.lock();
        rates.arrived(tier, now);
        rates.dispatched(now);
    }

    /// Room may have opened outside the fleet (a gateway slot came back).
    pub(crate) fn kick(&self) {
        self.kick.notify_one();
    }

    /// Waiters by tier, for `/admission`: depth, the oldest wait, and per tenant.
    pub(crate) fn view(&self) -> serde_json::Value {
        let now = Instant::now();
        let waiting = self.waiting.lock();
        let tiers: Vec<serde_json::Value> = Tier::ALL
            .iter()
            .map(|tier| {
                let oldest = waiting
                    .waiters()
                    .filter(|w| w.tier == *tier)
                    .map(|w| now.saturating_duration_since(w.item.arrived).as_secs_f64())
                    .fold(0.0, f64::max);
                let tenants: serde_json::Map<String, serde_json::Value> = waiting
                    .tenants(*tier)
                    .map(|(name, n)| (name.to_string(), n.into()))
                    .collect();
                serde_json::json!({
                    "tier": tier.name(),
                    "depth": waiting.depth(*tier),
                    "oldest_wait_secs": oldest,
                    "tenants": tenants,
                    "codel": self.codel.as_ref().map(|c| c.view(*tier)),
                })
            })
            .collect();
        serde_json::json!({
            "size": self.config.size,
            "timeouts_secs": self.config.timeouts.map(|t| t.as_secs_f64()),
            "tiers": tiers,
        })
    }

    /// The longest any waiter of each tier now in the queue has waited (interactive, agent,
    /// batch).
    pub(crate) fn oldest_waits(&self, now: Instant) -> [Duration; 3] {
        let waiting = self.waiting.lock();
        Tier::ALL.map(|tier| {
            waiting
                .oldest(tier)
                .map(|(_, w)| now.saturating_duration_since(w.item.arrived))
                .unwrap_or_default()
        })
    }

    /// Which tiers' CoDel is dropping (interactive, agent, batch).
    pub(crate) fn codel_dropping(&self) -> [bool; 3] {
        self.codel
            .as_ref()
            .map_or([false; 3], |c| Tier::ALL.map(|t| c.dropping(t)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue() -> Arc<GatewayQueue> {
        let config = QueueConfig {
            size: 8,
            timeouts: [Duration::from_secs(60); 3],
            shed: false,
            shed_retry_after: Duration::from_secs(5),
            codel: None,
        };
        GatewayQueue::new(config, &mut Registry::default())
    }

    fn asker(model: &str, tier: Tier) -> Asker {
        Asker {
            tier,
            tenant: TenantId::new("t"),
            weight: 1.0,
            cost: 1,
            model: ModelName::new(model),
            deadline: None,
            counters: None,
            hold: drain::Hold::Full,
            over_ceilings: None,
            asked: Instant::now(),
        }
    }

    /// A waiter for model `big` of the agent tier; an arrival for `small` waits behind it only
    /// when the gateway's slots are capped and `big` has room: then it waits for a slot alone.
    #[tokio::test]
    async fn an_arrival_waits_behind_a_waiter_for_another_model_only_for_a_capped_slot() {
        let queue = queue();
        let waiting = queue.wait_turn(asker("big", Tier::Agent));
        tokio::pin!(waiting);
        assert!(futures_util::poll!(&mut waiting).is_pending(), "it waits");
        let small = ModelName::new("small");
        let room = |_: &ModelName, _: Tier| true;
        let full = |_: &ModelName, _: Tier| false;
        assert!(queue.has_waiters_for(&small, Tier::Agent, true, room));
        assert!(!queue.has_waiters_for(&small, Tier::Agent, true, full));
        assert!(!queue.has_waiters_for(&small, Tier::Agent, false, room));
        // A more urgent arrival goes before it anyway; a less urgent one waits.
        assert!(!queue.has_waiters_for(&small, Tier::Interactive, true, room));
        assert!(queue.has_waiters_for(&small, Tier::Batch, true, room));
        // For its own model, whatever the slots.
        let big = ModelName::new("big");
        assert!(queue.has_waiters_for(&big, Tier::Agent, false, full));
    }
}
