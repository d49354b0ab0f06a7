//! A request's chooser: owned by the request from its placement to its last attempt, it picks a
//! worker of the request's pool (or of one side of a disaggregated pool) each time it is asked,
//! never one it has already been told was tried.
//!
//! Candidates are the workers a request could use now (Ready, circuit not open, under their
//! adaptive limit) that it has not tried. Those without a veto come first; the policy
//! (`sluice_core::policy::choose`) picks among them, and the pick must get a permit from its
//! circuit breaker (a half-open circuit lets only a few trials through), else the next pick is
//! made without it. When every candidate is vetoed, `sluice_core::overload::when_all_vetoed`
//! decides: steer to the least loaded, shed, or no worker at all.

use std::sync::Arc;

use sluice_core::health::HealthState;
use sluice_core::lora;
use sluice_core::overload::{when_all_vetoed, AllVetoed, Projection, VetoClass, Vetoed};
use sluice_core::policy::{choose, Candidate, Draw, Policy};
use sluice_core::ModelName;

use super::RouteError;
use super::{held, predicted, RouteRequest, Shedding};
use crate::fleet::{Lease, Pool, Worker};
use crate::metrics::{Metrics, StageLabel};

/// How every chooser judges: the policies, the shedding rule and the projection, shared by all
/// of them (one `Arc` per request, not a copy).
#[derive(Debug, Clone)]
pub(super) struct Rules {
    /// `--policy`: the pick among a whole pool's candidates.
    pub(crate) policy: Policy,
    /// `--prefill-policy`, `--decode-policy`: each side of a disaggregated model (the main
    /// policy when not given).
    pub(crate) prefill_policy: Policy,
    pub(crate) decode_policy: Policy,
    /// What a request gets when every worker it could use is overloaded.
    pub(crate) shedding: Shedding,
    /// How a worker's queue is projected between reports: warily with a gateway queue, whose
    /// requests are released many at once (`Projection::Wary`).
    pub(crate) projection: Projection,
    /// Where fallbacks onto vetoed workers and sheds are counted.
    pub(crate) metrics: Arc<Metrics>,
    /// A LoRA adapter's requests tried where it runs, then where a slot is free, before the
    /// policy chooses (off: `--disable-adapter-routing`).
    pub(crate) by_adapter: bool,
    /// The tiers' objectives, which `predicted` places by.
    pub(crate) slos: sluice_core::slo::Slos,
}

impl Rules {
    /// Whether a policy routes by prompt prefix, so prompts must be hashed.
    pub(crate) fn wants_prefix(&self) -> bool {
        [self.policy, self.prefill_policy, self.decode_policy]
            .iter()
            .any(Policy::wants_prefix)
    }

    fn count_shed(&self, stage: &'static str) {
        self.metrics
            .overload_sheds
            .get_or_create(&StageLabel { stage })
            .inc();
    }
}

/// Which of a pool's workers a chooser picks among.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Whole,
    Prefill,
    Decode,
}

/// One request's chooser: its pool as the fleet was when it was admitted, what the policy reads
/// of it, and the workers it has tried (or may not use).
#[derive(Debug)]
pub(crate) struct Chooser {
    /// The rules it picks by, shared with the route stage.
    rules: Arc<Rules>,
    /// The pool it was admitted to (the whole one, for either side of a disaggregated model).
    pool: Arc<Pool>,
    /// The part of the pool it picks among.
    side: Side,
    /// What the policy reads of the request.
    request: RouteRequest,
    /// Workers (by key) never to pick again: tried already, or out of the request's reach.
    tried: Vec<u64>,
}

impl Chooser {
    /// A chooser over the whole of `pool`, never picking a worker in `excluded`.
    pub(super) fn new(
        rules: Arc<Rules>,
        pool: Arc<Pool>,
        request: RouteRequest,
        excluded: Vec<u64>,
    ) -> Self {
        Self {
            rules,
            pool,
            side: Side::Whole,
            request,
            tried: excluded,
        }
    }

    /// For a disaggregated model, the prefill side's chooser, this one becoming the decode
    /// side's (each side picked by its own policy); `None`, and this one unchanged, for a pool
    /// that is not disaggregated. Boxed: only a pair has it.
    pub(super) fn split_prefill(&mut self) -> Option<Box<Chooser>> {
        self.pool.pd.as_ref()?;
        self.side = Side::Decode;
        Some(Box::new(Chooser {
            rules: self.rules.clone(),
            pool: self.pool.clone(),
            side: Side::Prefill,
            request: self.request.clone(),
            tried: self.tried.clone(),
        }))
    }

    /// The workers it picks among.
    pub fn pool(&self) -> &Pool {
        match (self.side, self.pool.pd.as_deref()) {
            (Side::Prefill, Some(pd)) => &pd.prefill,
            (Side::Decode, Some(pd)) => &pd.decode,
            _ => &self.pool,
        }
    }

    fn policy(&self) -> &Policy {
        match self.side {
            Side::Whole => &self.rules.policy,
            Side::Prefill => &self.rules.prefill_policy,
            Side::Decode => &self.rules.decode_policy,
        }
    }

    /// The model its pool serves.
    pub(crate) fn model(&self) -> &ModelName {
        &self.pool.model
    }

    /// What the policy reads of the request, which each attempt's lease counts on its worker.
    pub(crate) fn request(&self) -> &RouteRequest {
        &self.request
    }

    /// `worker` was tried: it is not picked again.
    pub(crate) fn tried(&mut self, worker: u64) {
        self.tried.push(worker);
    }

    /// A worker for the next attempt: the policy's pick with its breaker permit, or the
    /// all-vetoed rule's answer.
    pub(crate) fn next(&self) -> Result<Lease, RouteError> {
        self.pick_skipping(&self.tried, Lateness::Sent)
    }

    /// The request's first worker, as `next`; with `lateness` `Refused` and `predicted`, refused
    /// (`PredictedLate`) when its first token is predicted late there.
    pub(crate) fn first(&self, lateness: Lateness) -> Result<Lease, RouteError> {
        self.pick_skipping(&self.tried, lateness)
    }

    /// The same as `next`, skipping the workers in `skip` too (a decode worker whose window is
    /// full).
    pub(crate) fn next_except(&self, skip: &[u64]) -> Result<Lease, RouteError> {
        let mut skipped = self.tried.clone();
        skipped.extend_from_slice(skip);
        self.pick_skipping(&skipped, Lateness::Sent)
    }

    fn pick_skipping(&self, skipped: &[u64], lateness: Lateness) -> Result<Lease, RouteError> {
        let rules = &*self.rules;
        let pool = self.pool();
        let selected = match select(rules, self.policy(), pool, &self.request, skipped) {
            Ok(selected) => selected,
            Err(e) => {
                if matches!(e, RouteError::WorkerOverloadShed { .. }) {
                    rules.count_shed("select");
                }
                return Err(e);
            }
        };
        match selected.fallback {
            Some(VetoClass::Overload) => {
                rules.metrics.overload_fallbacks.inc();
            }
            Some(VetoClass::Liveness) => {
                rules.metrics.liveness_fallbacks.inc();
            }
            // Room within the reserve is room: not a fallback onto a vetoed worker.
            Some(VetoClass::Reserve) | None => {}
        }
        let mut selected = selected;
        if let Some(adapter) = &pool.adapter {
            selected.lease.for_adapter(adapter);
        }
        let worker = selected.lease.worker();
        if rules.shedding.enabled
            && worker.veto_class_by(rules.projection) == Some(VetoClass::Overload)
        {
            // Flagged between selection and dispatch: shed rather than pick again.
            rules.count_shed("dispatch");
            return Err(RouteError::OverloadedBeforeDispatch {
                worker: worker.id.clone(),
                model: pool.model.clone(),
                retry_after: rules.shedding.retry_after,
            });
        }
        if lateness == Lateness::Refused {
            self.in_time(&selected.lease)?;
        }
        self.record(&selected.lease);
        Ok(selected.lease)
    }

    /// The pick goes out: counted on its worker and, for a policy by prefix, its prompt kept in
    /// the pool's index as sent there. Only now, so a request shed or refused after its pick
    /// (its lease dropped) leaves no selection and no prefix the worker never saw.
    fn record(&self, lease: &Lease) {
        let worker = lease.worker();
        if self.policy().wants_prefix() && !self.request.blocks.is_empty() {
            let pool = self.pool();
            pool.state
                .prefix
                .lock()
                .insert(&self.request.blocks, worker.key);
        }
        worker.metrics.selections.inc();
    }

    /// With `predicted`, whether the worker `lease` holds is predicted to give the request's
    /// first token within its objective: `PredictedLate`, with a Retry-After of how late, when
    /// not (the request is refused; its lease is dropped).
    fn in_time(&self, lease: &Lease) -> Result<(), RouteError> {
        if self.side != Side::Whole || !self.policy().predicts() {
            return Ok(());
        }
        let Some((objective, predicted)) = predicted::late(lease, &self.request) else {
            return Ok(());
        };
        self.rules.count_shed("predicted");
        Err(RouteError::PredictedLate {
            model: self.pool.model.clone(),
            objective,
            predicted,
            retry_after: predicted::retry_after(predicted - objective),
        })
    }

    /// The overload answer for its pool (`--overload-status-code`, Retry-After): what the
    /// decode admission window sheds with.
    pub(crate) fn shed(&self) -> RouteError {
        self.rules.count_shed("pd_window");
        RouteError::WorkerOverloadShed {
            model: self.pool().model.clone(),
            retry_after: self.rules.shedding.retry_after,
        }
    }

    /// Whether a retry has somewhere to go: a routable worker other than `current` and those
    /// tried.
    pub(crate) fn has_another(&self, current: u64) -> bool {
        self.pool()
            .workers
            .iter()
            .any(|w| w.key != current && !self.tried.contains(&w.key) && w.is_routable())
    }
}

/// What a request predicted late on its pick gets (`predicted` only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lateness {
    /// Refused now rather than sent to be late: a request placed on arrival.
    Refused,
    /// Sent all the same: a retry, or a request the gateway queue released for room predicted
    /// in time by its tier's objective (its wait bounded by it).
    Sent,
}

/// The worker chosen for one attempt.
#[derive(Debug)]
struct Selected {
    lease: Lease,
    /// Set when every candidate was vetoed and this one was steered to anyway.
    fallback: Option<VetoClass>,
}

/// Picks a worker of `pool` for a request, skipping the workers (by key) in `tried`: the policy
/// chooses among candidates without a veto; when there is none, the all-vetoed rule decides.
fn select(
    rules: &Rules,
    policy: &Policy,
    pool: &Pool,
    request: &RouteRequest,
    tried: &[u64],
) -> Result<Selected, RouteError> {
    // A worker at its adaptive limit is neither a candidate nor a fallback: the limit is a cap.
    let (free, vetoed): (Vec<&Arc<Worker>>, Vec<&Arc<Worker>>) = pool
        .workers
        .iter()
        .filter(|w| w.is_routable() && !tried.contains(&w.key) && !w.at_limit(request.weight))
        .partition(|w| {
            w.veto_class_for(rules.projection, request.reserve)
                .is_none()
        });
    for group in by_adapter(pool, free, rules.by_adapter) {
        if let Some(lease) = pick_where_it_starts(policy, pool, request, group) {
            return Ok(Selected {
                lease,
                fallback: None,
            });
        }
    }
    let others_out = pool
        .workers
        .iter()
        .any(|w| !w.is_routable() && !tried.contains(&w.key));
    fall_back(rules, pool, request, tried, vetoed, others_out)
}

/// `workers` in the order a request for its pool's LoRA adapter tries them: those that hold it
/// (list it, or have a request for it in flight, which a load waits under) before those it would
/// be loaded onto (their spec's `lora` block); within each, with `aware` (unless
/// `--disable-adapter-routing`), those where it runs, then those with a free slot, then those
/// where it would wait (`sluice_core::lora`). One group for any other model.
fn by_adapter<'w>(
    pool: &Pool,
    workers: Vec<&'w Arc<Worker>>,
    aware: bool,
) -> Vec<Vec<&'w Arc<Worker>>> {
    let Some(adapter) = &pool.adapter else {
        return vec![workers];
    };
    let order = |workers: Vec<&'w Arc<Worker>>| {
        if aware {
            lora::groups(
                workers
                    .into_iter()
                    .map(|w| (w.adapter_affinity(adapter), w))
                    .collect(),
            )
        } else {
            vec![workers]
        }
    };
    let (holding, loadable): (Vec<_>, Vec<_>) = workers
        .into_iter()
        .partition(|w| !w.may_load(&pool.model) || w.adapters.has(adapter));
    let mut groups = order(holding);
    groups.extend(order(loadable));
    groups
}

/// The policy's pick among `workers`; for a request that seeks room, among those where it
/// starts at once first, when some would and some would not.
fn pick_where_it_starts(
    policy: &Policy,
    pool: &Pool,
    request: &RouteRequest,
    workers: Vec<&Arc<Worker>>,
) -> Option<Lease> {
    if request.seeks_room {
        let (starting, queueing): (Vec<&Arc<Worker>>, Vec<&Arc<Worker>>) =
            workers.iter().partition(|w| w.starts_now());
        if !starting.is_empty() && !queueing.is_empty() {
            return pick(policy, pool, request, starting)
                .or_else(|| pick(policy, pool, request, queueing));
        }
    }
    pick(policy, pool, request, workers)
}

/// The policy's pick among `workers`, which must then get a permit from its circuit.
fn pick(
    policy: &Policy,
    pool: &Pool,
    request: &RouteRequest,
    mut workers: Vec<&Arc<Worker>>,
) -> Option<Lease> {
    let mut candidates: Vec<Candidate> = workers
        .iter()
        .map(|w| Candidate {
            key: w.key,
            load: w.load_everywhere(),
            prefix_match: 0,
        })
        .collect();
    if policy.wants_prefix() && !request.blocks.is_empty() {
        pool.state
            .prefix
            .lock()
            .annotate(&request.blocks, &mut candidates);
    }
    let precise = policy
        .wants_prefix()
        .then(|| held::score(&workers, request, &mut candidates))
        .flatten();
    let input = precise.unwrap_or(request.input);
    let mut claimed = policy
        .wants_prefix()
        .then(|| predicted::claimed_on(request, &candidates, &input, precise.is_some()));
    while !candidates.is_empty() {
        let by_prediction = claimed
            .as_deref()
            .filter(|_| policy.predicts())
            .and_then(|tokens| predicted::placed(&workers, request, tokens));
        let i = match by_prediction {
            Some(i) => i,
            None => {
                let draw = Draw {
                    ticket: pool
                        .state
                        .ticket
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                    random: rand::random(),
                };
                choose(policy, &candidates, &input, draw)?
            }
        };
        let worker = workers[i];
        if let Some(mut lease) = Lease::acquire(worker, request.weight) {
            if let Some(tokens) = &claimed {
                lease.claimed(tokens[i]);
            }
            return Some(lease);
        }
        // Its half-open trial is taken (or it just opened), or another request took its last
        // place under its limit: choose among the others.
        candidates.swap_remove(i);
        workers.swap_remove(i);
        if let Some(tokens) = &mut claimed {
            tokens.swap_remove(i);
        }
    }
    None
}

/// No candidate without a veto: steer to the least loaded vetoed one, shed, or give up.
fn fall_back(
    rules: &Rules,
    pool: &Pool,
    request: &RouteRequest,
    tried: &[u64],
    mut vetoed: Vec<&Arc<Worker>>,
    others_out: bool,
) -> Result<Selected, RouteError> {
    loop {
        let candidates: Vec<Vetoed> = vetoed
            .iter()
            .map(|w| {
                let load = w.vetoes.load();
                Vetoed {
                    class: w
                        .veto_class_for(rules.projection, request.reserve)
                        .unwrap_or(VetoClass::Overload),
                    waiting: w.projected_waiting(rules.projection),
                    kv_usage: load.as_ref().map_or(0.0, |l| l.report.mean_kv_usage()),
                    in_flight: w.load_everywhere(),
                }
            })
            .collect();
        let shedding = &rules.shedding;
        match when_all_vetoed(&candidates, shedding.enabled, others_out) {
            AllVetoed::Steer(i, class) => {
                let worker = vetoed[i];
                if let Some(lease) = Lease::acquire(worker, request.weight) {
                    return Ok(Selected {
                        lease,
                        fallback: Some(class),
                    });
                }
                vetoed.swap_remove(i);
            }
            AllVetoed::Shed => {
                return Err(RouteError::WorkerOverloadShed {
                    model: pool.model.clone(),
                    retry_after: shedding.retry_after,
                })
            }
            AllVetoed::Unavailable => return Err(no_workers(pool, tried)),
        }
    }
}

fn no_workers(pool: &Pool, tried: &[u64]) -> RouteError {
    let (mut pending, mut unhealthy, mut draining, mut open, mut failed) = (0, 0, 0, 0, 0);
    let (mut full, mut doubted, mut limited) = (0, 0, 0);
    for w in &pool.workers {
        if tried.contains(&w.key) {
            failed += 1;
            continue;
        }
        if w.is_routable() {
            if w.at_limit(1) {
                limited += 1;
                continue;
            }
            match w.veto_class() {
                Some(VetoClass::Liveness) => doubted += 1,
                _ => full += 1,
            }
            continue;
        }
        match w.status() {
            HealthState::Pending => pending += 1,
            HealthState::NotReady | HealthState::Failed => unhealthy += 1,
            HealthState::Draining => draining += 1,
            HealthState::Ready => open += 1,
        }
    }
    let reasons: Vec<String> = [
        (pending, "not reached yet"),
        (unhealthy, "failing health checks"),
        (draining, "draining"),
        (open, "circuit open"),
        (full, "overloaded"),
        (doubted, "unreachable or wedged"),
        (limited, "at their concurrency limit"),
        (failed, "already tried"),
    ]
    .iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, why)| format!("{n} {why}"))
    .collect();
    RouteError::NoAvailableWorkers {
        model: pool.model.clone(),
        detail: if reasons.is_empty() {
            String::new()
        } else {
            format!(" ({})", reasons.join(", "))
        },
    }
}
