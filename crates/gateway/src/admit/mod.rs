//! The admit stage: whether a request may go on, where it goes, and when — or why not — and
//! what it holds while it runs (seed 003, layer 1).
//!
//! In order: the request's tenant (a trusted header, else its key's owner, else the default
//! tenant) and tier (`x-sluice-priority` or SMG's `x-smg-priority`, never more urgent than the
//! tenant's); its deadlines (the gateway's request timeout, and the client's
//! `X-Request-Deadline-Ms`); then the budgets, each taken in one step so concurrent requests
//! cannot together overspend: the gateway-wide request rate and concurrency cap, the tenant's
//! concurrency, requests per minute and tokens per minute (the prompt estimate plus the most it
//! may generate, settled against what the response reports when it ends). Then the ladder's hard
//! shedding, and the pool (`place`): the model's (with the ladder's cascade), a deadline that
//! cannot be met refused (`feasible`), with `--queue-size` the wait for a turn when no worker can
//! take it now (`wait_room`), and the pool found again after a wait; last, the body its worker
//! gets. The answer is one `Admitted`, which the route stage consumes (the pool, the terms, the
//! turn, the body, and what was taken as `Grants`, given back however the request ends), or a
//! typed `AdmitError`.
//!
//! ## Layout
//!
//! - `admitted` — the hand-off: `Admitted`, its `Terms`, and what is decided on the way.
//! - `config` — what admission is configured with (built by `crate::config`).
//! - `tenants` — the tenants at run time and how a request finds its own.
//! - `holds` — slots and reservations, given back at the end.
//! - `budget` — a budget or cap kept locally or shared with the other replicas (`--redis-url`).
//! - `queue` — the gateway queue and its dispatcher (`--queue-size`).
//! - `codel` — CoDel on each tier of the queue: a standing queue cut at its head.
//! - `headers` — the request headers admission reads and the `x-ratelimit-*` it writes.
//! - `place` — the stage as the request path sees it: admission, then the pool and the queue.
//! - `body` — the body the worker gets: the served model's name spliced in.
//! - `degrade` — the degradation ladder: the level from the pressure, and what it does to a
//!   request (hard shedding, a cascade, a rewritten body).

mod admitted;
mod body;
mod budget;
mod codel;
mod config;
pub(crate) mod degrade;
mod headers;
mod holds;
mod place;
mod queue;
mod refusal;
mod tenants;

use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderMap;
use prometheus_client::registry::Registry;
use sluice_core::admission::deadline::{feasible, Expected};
use sluice_core::admission::drain::Hold;
use sluice_core::admission::{Refusal, Tier};
use sluice_core::ModelName;
use tokio::sync::Semaphore;
use tokio::time::Instant;

pub(crate) use admitted::{Admitted, Terms};
pub use config::{AdmissionConfig, TenantConfig, DEFAULT_TENANT};
pub(crate) use place::AdmitStage;
pub use queue::{Asker, GatewayQueue, QueueConfig, Turn, TURN_BOUND};
pub(crate) use refusal::AdmitError;
pub(crate) use tenants::{Tenant, Tenants};

use crate::context::RequestContext;
use crate::error::{Answerable, Expired};
use crate::http::KeyOwner;
use crate::metrics::{AdmissionMetrics, RejectedLabels};
use crate::shared::{Shared, SharedSlots, Short};
use admitted::Decided;
use budget::{not_yet, Budget};
use holds::{GatewaySlot, SharedGatewaySlot, Spend, TenantSlot};

/// What admission reads of a request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Asking<'a> {
    pub(crate) headers: &'a HeaderMap,
    pub(crate) owner: KeyOwner,
    pub(crate) prompt_tokens: u64,
    /// `max_tokens` (or `max_completion_tokens`), when given.
    pub(crate) max_tokens: Option<u64>,
    /// Choices asked for: each may generate `max_tokens`.
    pub(crate) n: u64,
}

/// `--max-concurrent-requests`: this gateway's own, or shared with the other replicas.
#[derive(Debug)]
enum Slots {
    Local(Arc<Semaphore>),
    Shared(Arc<SharedSlots>),
}

/// The gateway-wide caps.
#[derive(Debug)]
struct Gateway {
    /// `--max-concurrent-requests`, and the cap it was set to.
    slots: Option<(Slots, u32)>,
    /// `--rate-limit-tokens-per-second` (requests per second).
    rate: Option<Budget>,
}

/// A refusal for want of the shared state (`--redis-fail-open=false` with Redis away).
fn unavailable(short: Short, refused: impl FnOnce(Refusal) -> AdmitError) -> AdmitError {
    match short {
        Short::Refused(refusal) => refused(refusal),
        Short::Unavailable => AdmitError::SharedStateUnavailable,
    }
}

/// The admit stage, shared by every request.
#[derive(Debug)]
pub(crate) struct Admit {
    /// `--request-timeout-secs`: the longest a request may take, answer and stream included.
    request_timeout: Duration,
    tenants: Tenants,
    default_max_tokens: u64,
    /// `--default-deadline-ms-by-tier`.
    tier_deadlines: [Option<Duration>; 3],
    gateway: Gateway,
    queue: Option<Arc<GatewayQueue>>,
    metrics: Arc<AdmissionMetrics>,
}

impl Admit {
    /// The stage for `config`, its metric families registered in `registry`; its budgets and
    /// caps shared through `shared` when given.
    pub fn new(config: &AdmissionConfig, registry: &mut Registry, shared: Option<&Shared>) -> Self {
        let now = Instant::now();
        let burst = config.max_concurrent.unwrap_or(0);
        let metrics = AdmissionMetrics::register(registry, &Tenants::labels(config));
        let tenants = Tenants::new(config, now, &metrics, shared);
        let queue = config.queue.clone().map(|q| GatewayQueue::new(q, registry));
        let slots = config.max_concurrent.map(|n| {
            let slots = match shared {
                Some(shared) => Slots::Shared(shared.slots("gateway:concurrent", u64::from(n))),
                None => Slots::Local(Arc::new(Semaphore::new(n as usize))),
            };
            (slots, n)
        });
        if let (Some(shared), Some(queue)) = (shared, &queue) {
            // A grown grant is room the queue's dispatcher cannot see otherwise.
            let queue = queue.clone();
            shared.on_room(move || queue.kick());
        }
        Self {
            queue,
            request_timeout: config.request_timeout,
            tenants,
            default_max_tokens: config.default_max_tokens,
            tier_deadlines: config.tier_deadlines,
            gateway: Gateway {
                slots,
                rate: config.request_rate.map(|per_sec| {
                    // Bursting up to the concurrency cap, as SMG's does; a second's worth without.
                    let burst = u64::from(burst).max(per_sec.ceil() as u64).max(1);
                    let period = Duration::from_secs_f64(burst as f64 / per_sec);
                    Budget::new(shared, "gateway:rate", burst, period, now)
                }),
            },
            metrics,
        }
    }

    pub(crate) fn tenants(&self) -> &Tenants {
        &self.tenants
    }

    /// The gateway-wide caps as they stand, for `/admission`.
    pub(crate) fn gateway_view(&self) -> serde_json::Value {
        let now = Instant::now();
        serde_json::json!({
            "max_concurrent_requests": self.gateway.slots.as_ref().map(|(_, cap)| cap),
            "in_flight_under_cap": self.gateway.slots.as_ref()
                .map(|(slots, cap)| match slots {
                    Slots::Local(s) => (*cap as usize - s.available_permits()) as u64,
                    Slots::Shared(s) => s.in_use(),
                }),
            "requests_per_second": self.gateway.rate.as_ref().map(|r| {
                let level = r.level(now);
                serde_json::json!({"burst": level.limit, "remaining": level.remaining})
            }),
        })
    }

    /// Admits the request of `ctx` now or refuses it: what admission decides for it and takes.
    /// Who asked, in which tier, and the budgets its answer shows are written to `ctx`.
    async fn admit(
        &self,
        ctx: &mut RequestContext,
        asking: &Asking<'_>,
    ) -> Result<Decided, AdmitError> {
        let now = Instant::now();
        let tenant = self.tenants.of(asking.headers, asking.owner);
        let mut decided = Decided::new(ctx.started + self.request_timeout, tenant.tier);
        let outcome = self.decide(ctx, &mut decided, &tenant, asking, now).await;
        if tenant.limited() {
            ctx.admission.rate_headers = Some(headers::rate_limits(&tenant, now));
        }
        match outcome {
            Ok(()) => Ok(decided),
            Err(error) => {
                self.count_rejected(ctx, &error);
                Err(error)
            }
        }
    }

    async fn decide(
        &self,
        ctx: &mut RequestContext,
        decided: &mut Decided,
        tenant: &Arc<Tenant>,
        asking: &Asking<'_>,
        now: Instant,
    ) -> Result<(), AdmitError> {
        decided.tenant = Some(tenant.id.clone());
        ctx.admission.tenant = Some(tenant.id.clone());
        ctx.admission.counters = Some(tenant.counters.clone());
        decided.counters = Some(tenant.counters.clone());
        // The tenant's until the request's own is known (a refusal is counted under it).
        ctx.admission.tier = Some(tenant.tier);
        let tier = Tier::clamped(headers::asked_tier(asking.headers)?, tenant.tier);
        ctx.admission.tier = Some(tier);
        decided.tier = tier;
        let budget = headers::client_budget(asking.headers)?.or(self.tier_deadlines[tier.index()]);
        if let Some(budget) = budget {
            let due = ctx.started + budget;
            decided.client_deadline = Some(due);
            decided.deadline = decided.deadline.min(due);
            if due <= now {
                return Err(Expired::DeadlineExceeded { budget }.into());
            }
        }
        self.take_gateway(decided, now).await?;
        let entered = tenant
            .enter()
            .await
            .map_err(|short| unavailable(short, |_| AdmitError::SharedStateUnavailable))?;
        if !entered {
            return Err(AdmitError::TenantConcurrency {
                tenant: tenant.id.to_string(),
                limit: tenant.max_concurrent.unwrap_or(0),
            });
        }
        decided.grants.hold(Box::new(TenantSlot(tenant.clone())));
        let out = asking.n.max(1) * asking.max_tokens.unwrap_or(self.default_max_tokens);
        let tokens = asking.prompt_tokens + out;
        decided.weight = tenant.weight;
        decided.cost = tokens;
        if !tenant.limited() {
            // No budget to reserve from, nothing to settle.
            return Ok(());
        }
        self.reserve(decided, tenant, tokens, asking.prompt_tokens, now)
            .await
    }

    /// One request and `tokens` from the tenant's buckets, settled when the request ends.
    async fn reserve(
        &self,
        decided: &mut Decided,
        tenant: &Arc<Tenant>,
        tokens: u64,
        prompt_estimate: u64,
        now: Instant,
    ) -> Result<(), AdmitError> {
        let limited = |what, error: Refusal| match error {
            Refusal::NotYet { retry_after } => AdmitError::RateLimited {
                tenant: tenant.id.to_string(),
                what,
                retry_after,
            },
            Refusal::TooBig { capacity } => AdmitError::RequestTooLarge {
                tenant: tenant.id.to_string(),
                needs: if what == "tokens" { tokens } else { 1 },
                limit: capacity,
            },
        };
        Tenant::reserve(&tenant.requests, 1, now)
            .await
            .map_err(|short| unavailable(short, |e| limited("requests", e)))?;
        if let Err(short) = Tenant::reserve(&tenant.tokens, tokens, now).await {
            Tenant::settle(&tenant.requests, 1, 0, now);
            return Err(unavailable(short, |e| limited("tokens", e)));
        }
        decided.metered = tenant.tokens.is_some();
        decided.grants.hold(Box::new(Spend {
            tenant: tenant.clone(),
            tokens: if tenant.tokens.is_some() { tokens } else { 0 },
            prompt_estimate,
            metrics: self.metrics.clone(),
        }));
        Ok(())
    }

    /// The gateway-wide request rate and concurrency cap.
    async fn take_gateway(&self, decided: &mut Decided, now: Instant) -> Result<(), AdmitError> {
        if let Some(rate) = &self.gateway.rate {
            rate.reserve(1, now).await.map_err(|short| {
                unavailable(short, |refusal| AdmitError::GatewayFull {
                    why: "its request rate",
                    retry_after: not_yet(refusal),
                })
            })?;
        }
        if self.queue.is_some() {
            // Taken when the request may go (`wait_room`): it waits for one rather than refused.
            return Ok(());
        }
        let full = AdmitError::GatewayFull {
            why: "its concurrent requests",
            retry_after: Duration::from_secs(1),
        };
        match &self.gateway.slots {
            None => {}
            Some((Slots::Local(slots), _)) => {
                let permit = slots.clone().try_acquire_owned().map_err(|_| full)?;
                decided.grants.hold(Box::new(GatewaySlot(permit, None)));
            }
            Some((Slots::Shared(slots), _)) => {
                let entered = slots
                    .enter()
                    .await
                    .map_err(|_| AdmitError::SharedStateUnavailable)?;
                if !entered {
                    return Err(full);
                }
                decided
                    .grants
                    .hold(Box::new(SharedGatewaySlot(slots.clone(), None)));
            }
        }
        Ok(())
    }

    pub(crate) fn queue(&self) -> Option<&Arc<GatewayQueue>> {
        self.queue.as_ref()
    }

    /// Whether `--max-concurrent-requests` leaves room (always, without the cap).
    pub(crate) fn slots_free(&self) -> impl Fn() -> bool + Send + 'static {
        let local = match &self.gateway.slots {
            Some((Slots::Local(s), _)) => Some(s.clone()),
            _ => None,
        };
        let shared = match &self.gateway.slots {
            Some((Slots::Shared(s), _)) => Some(s.clone()),
            _ => None,
        };
        move || {
            local.as_ref().is_none_or(|s| s.available_permits() > 0)
                && shared.as_ref().is_none_or(|s| s.has_free())
        }
    }

    /// With the gateway queue: waits, if it must, until `pool` has room for the request and the
    /// gateway a slot; then takes the slot. A pool with no worker that can serve at all (none
    /// ready, or every circuit open) is not waited for. Its turn when it waited (its routing is
    /// then stale), `None` when it went on at once (or there is no queue).
    async fn wait_room(
        &self,
        ctx: &RequestContext,
        decided: &mut Decided,
        pool: &crate::fleet::Pool,
        snapshot: &crate::fleet::Snapshot,
    ) -> Result<Option<Turn>, AdmitError> {
        let Some(queue) = &self.queue else {
            return Ok(None);
        };
        if !pool.has_routable() && self.take_slot(decided, queue) {
            // Nothing the queue could wait for: routing answers why.
            return Ok(None);
        }
        let slots_free = self.slots_free();
        let tier = decided.tier;
        let capped = self.gateway.slots.is_some();
        let has_room = |model: &ModelName, tier: Tier| {
            snapshot
                .pools
                .get(model)
                .is_some_and(|p| p.has_room_for(tier))
        };
        let asked = Instant::now();
        let mut turn: Option<Turn> = None;
        loop {
            let must_wait = !slots_free()
                || !pool.has_room_for(tier)
                || queue.has_waiters_for(&pool.model, tier, capped, has_room);
            // With shedding, a turn whose room a report took before the request took it is
            // judged again as an arrival would be: shed, unless room is freeing fast enough.
            let room_gone = turn.is_some() && queue.sheds() && pool.over_ceilings(tier).is_some();
            let go = (turn.is_some() && !room_gone) || !must_wait;
            if go && self.take_slot(decided, queue) {
                if turn.is_none() {
                    queue.went_direct(tier);
                }
                return Ok(turn);
            }
            // A turn whose slot another request took is given back before the request waits
            // again (the dispatcher would wait for it otherwise).
            drop(turn.take());
            let mut asker = self.asker(decided, pool, &slots_free, asked);
            if queue.sheds() {
                asker.over_ceilings = pool.over_ceilings(tier);
            }
            let called = queue
                .wait_turn(asker)
                .await
                .inspect_err(|e| self.count_rejected(ctx, e))?;
            turn = Some(called);
        }
    }

    /// What the queue needs to know of the request `decided` waiting for `pool`.
    fn asker(
        &self,
        decided: &Decided,
        pool: &crate::fleet::Pool,
        slots_free: &impl Fn() -> bool,
        asked: Instant,
    ) -> Asker {
        let tier = decided.tier;
        // Room for an interactive request is room within the reserve: while the reserve holds
        // for this tier, only the reserve keeps it waiting then.
        let reserved = pool.reserve_for(tier) > 0.0;
        let hold = if reserved && slots_free() && pool.has_room_for(Tier::Interactive) {
            Hold::Reserve
        } else {
            Hold::Full
        };
        Asker {
            tier,
            tenant: decided
                .tenant
                .clone()
                .unwrap_or_else(|| sluice_core::TenantId::new(DEFAULT_TENANT)),
            weight: decided.weight,
            cost: decided.cost,
            model: pool.model.clone(),
            deadline: decided.client_deadline,
            counters: decided.counters.clone(),
            hold,
            over_ceilings: None,
            asked,
        }
    }

    /// Whether the client's deadline can still be met on `pool`: the expected time to a first
    /// token on its best worker must fit in what is left (seed 003's deadline-aware dropping).
    /// Refused with 504 `deadline_exceeded` before any engine sees the request.
    fn feasible(
        &self,
        ctx: &RequestContext,
        decided: &Decided,
        pool: &crate::fleet::Pool,
        prompt_tokens: u64,
    ) -> Result<(), AdmitError> {
        let Some(due) = decided.client_deadline else {
            return Ok(());
        };
        let expected = Expected {
            ttft: pool.expected_ttft(prompt_tokens).unwrap_or_default(),
            per_token: None,
        };
        if feasible(Instant::now(), due, expected, 0) {
            return Ok(());
        }
        let error = AdmitError::from(Expired::DeadlineExceeded {
            budget: due.saturating_duration_since(ctx.started),
        });
        self.count_rejected(ctx, &error);
        Err(error)
    }

    /// A gateway slot, if the cap leaves one (always true without the cap).
    fn take_slot(&self, decided: &mut Decided, queue: &Arc<GatewayQueue>) -> bool {
        match &self.gateway.slots {
            None => true,
            Some((Slots::Local(slots), _)) => match slots.clone().try_acquire_owned() {
                Ok(permit) => {
                    decided
                        .grants
                        .hold(Box::new(GatewaySlot(permit, Some(queue.clone()))));
                    true
                }
                Err(_) => false,
            },
            Some((Slots::Shared(slots), _)) => {
                // Redis away with --redis-fail-open off: no slot, the request waits (its
                // deadline, or CoDel, ends the wait).
                if slots.try_enter().unwrap_or(false) {
                    decided.grants.hold(Box::new(SharedGatewaySlot(
                        slots.clone(),
                        Some(queue.clone()),
                    )));
                    return true;
                }
                false
            }
        }
    }

    /// Counts a request placed (on its way to a worker) under its tenant as admitted: only
    /// then, so one the gateway queue refuses later is counted once, as rejected.
    pub(crate) fn count_admitted(&self, ctx: &RequestContext) {
        if let Some(counters) = &ctx.admission.counters {
            counters.count(ctx.admission.tier.unwrap_or(Tier::Agent), true);
        }
    }

    /// Counts a refusal in `sluice_admission_rejected_total` (by the request's tier and the
    /// error's code), and under its tenant as rejected.
    pub(crate) fn count_rejected(&self, ctx: &RequestContext, error: &AdmitError) {
        let tier = ctx.admission.tier.unwrap_or(Tier::Agent);
        if let Some(counters) = &ctx.admission.counters {
            counters.count(tier, false);
        }
        self.metrics
            .rejected
            .get_or_create(&RejectedLabels {
                tier: tier.name(),
                reason: error.code(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests;
