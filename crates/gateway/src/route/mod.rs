//! The chooser: from a model name to one worker. It sits below the request path's stages and
//! imports none of them: the admit stage asks it for a request's pool (placement), the forward
//! stage for a worker on each attempt.
//!
//! The pool is the model's workers in the current snapshot; candidates are those a request could
//! use now (Ready, circuit not open) and that this request has not already tried. The policy
//! (`sluice_core::policy::choose`) picks among them; the pick must then get a permit from its
//! circuit breaker (a half-open circuit lets only a few trials through), and if it cannot, the
//! next pick is made without it.
//!
//! A worker at its adaptive concurrency limit (`--adaptive-concurrency`) is out of the choice
//! altogether, never a fallback: its limit is a cap. A pool whose every worker is at its limit
//! answers 503 no_available_workers (with a gateway queue, the request waits there instead).
//!
//! Vetoed workers (overloaded, busy, at capacity, unreachable, wedged: see `fleet::Vetoes`) are
//! not candidates while any unvetoed one remains — for every policy, hash-based ones included.
//! When none remains, `sluice_core::overload::when_all_vetoed` decides: steer to the least loaded
//! vetoed worker (the default), shed (`--worker-overload-shed`), or 503 no_available_workers.
//!
//! With an interactive reserve set, an interactive request is placed among the candidates
//! where it starts at once (`Worker::starts_now`) when some would and some would not: the room
//! the reserve keeps is of no use to it on another worker, behind an engine's queue.
//!
//! Where a pool's engines publish KV events, the cache-aware policy scores by the blocks they
//! hold (`held`); elsewhere by where prompts were sent.
//!
//! `RouteStage` holds the policies and the shedding rule, shared by every request. A request's
//! placement (`admit::Placement`) holds its pool and its `RouteRequest`; the forward stage makes
//! a `Routed` of them and asks it for a worker per attempt, so a retry is routed by the same
//! rules as the first try.

mod held;

use std::sync::Arc;

pub use held::HeldKeys;
use sluice_core::admission::Tier;
use sluice_core::overload::{when_all_vetoed, AllVetoed, Projection, VetoClass, Vetoed};
use sluice_core::policy::{choose, Candidate, Draw, Policy, RouteInput};
use sluice_core::prefix::block_hashes;
use sluice_core::ModelName;

use crate::error::{reflected, GatewayError};
use sluice_core::health::HealthState;

use crate::fleet::{Lease, Pool, Snapshot, Worker};
use crate::metrics::{Metrics, StageLabel};
use crate::tokens::{PromptJson, SharedTokens};

/// The route stage, shared by every request.
#[derive(Debug)]
pub struct RouteStage {
    policy: Policy,
    /// `--prefill-policy`, `--decode-policy`: each side of a disaggregated model (the main
    /// policy when not given).
    prefill_policy: Policy,
    decode_policy: Policy,
    shedding: Shedding,
    /// How a worker's queue is projected between reports: warily with a gateway queue, whose
    /// requests are released many at once (`Projection::Wary`).
    projection: Projection,
    /// `--model-alias`: extra client-facing names, each for a served model.
    aliases: std::collections::HashMap<String, ModelName>,
    /// The model's tokens, to cut prompts into the blocks engines' events name.
    tokens: SharedTokens,
    metrics: Arc<Metrics>,
}

/// What the route stage reads of a request (the front stage parsed it).
#[derive(Debug, Clone, Copy)]
pub struct Wants<'a> {
    /// `model`, when the request names one.
    pub model: Option<&'a str>,
    /// The routing-key header, else the `user` field: what hash policies hash.
    pub routing_key: Option<&'a [u8]>,
    /// The raw JSON of the prompt, hashed into prefix blocks for the cache-aware policy.
    pub prompt: &'a [u8],
    /// The same, for a chat or a completion: what can be tokenized as its engine will.
    pub prompt_json: Option<PromptJson<'a>>,
    pub prompt_tokens: u64,
    pub stream: bool,
    /// `n`: the sequences it asks the engine for, each counted in the worker's load.
    pub n: u64,
    /// Its tier: a less urgent one leaves the interactive reserve alone (`Pool::reserve_for`).
    pub tier: Tier,
}

/// One request routed: its pool, and what the policy reads of it.
#[derive(Debug)]
pub struct Routed<'s> {
    pub pool: &'s Pool,
    pub request: &'s RouteRequest,
    stage: &'s RouteStage,
    policy: &'s Policy,
}

impl RouteStage {
    pub fn new(policy: Policy, shedding: Shedding, metrics: Arc<Metrics>) -> Self {
        Self {
            policy,
            prefill_policy: policy,
            decode_policy: policy,
            shedding,
            projection: Projection::Hopeful,
            aliases: std::collections::HashMap::new(),
            tokens: SharedTokens::default(),
            metrics,
        }
    }

    /// With the model's tokens (`--model-path`, or fetched from a gRPC worker): prompts can be
    /// matched against what engines' KV events say they hold.
    pub fn with_tokens(mut self, tokens: SharedTokens) -> Self {
        self.tokens = tokens;
        self
    }

    /// With a gateway queue: room is judged as the queue judges it (`Pool::has_room`), so a
    /// request it releases goes where the room it was released for is.
    pub fn with_projection(mut self, projection: Projection) -> Self {
        self.projection = projection;
        self
    }

    /// With `--prefill-policy` and `--decode-policy`.
    pub fn with_pd_policies(mut self, prefill: Policy, decode: Policy) -> Self {
        self.prefill_policy = prefill;
        self.decode_policy = decode;
        self
    }

    /// Whether a policy of this stage routes by prompt prefix, so prompts must be hashed.
    fn wants_prefix(&self) -> bool {
        [self.policy, self.prefill_policy, self.decode_policy]
            .iter()
            .any(Policy::wants_prefix)
    }

    /// With `--model-alias` names: a request for an alias is served by its model's pool.
    pub fn with_aliases(mut self, aliases: std::collections::HashMap<String, ModelName>) -> Self {
        self.aliases = aliases;
        self
    }

    /// The aliases, for `/v1/models`.
    pub fn aliases(&self) -> &std::collections::HashMap<String, ModelName> {
        &self.aliases
    }

    /// The pool serving what the request wants (its model, or the model an alias names), or
    /// the answer for why there is none.
    pub fn pool(&self, snapshot: &Snapshot, wants: &Wants<'_>) -> Result<Arc<Pool>, GatewayError> {
        let model = wants
            .model
            .map(|m| self.aliases.get(m).map_or(m, ModelName::as_str));
        pool(snapshot, model).cloned()
    }

    /// What the policy reads of a request that goes to `pool`, with its prompt's block keys
    /// where the pool's engines publish what they hold (`held_keys`).
    pub fn request(&self, pool: &Pool, wants: &Wants<'_>, held: Option<HeldKeys>) -> RouteRequest {
        let mut request = RouteRequest::new(self.wants_prefix(), wants);
        request.held = held;
        request.reserve = pool.reserve_for(wants.tier);
        request.seeks_room = pool.seeks_room(wants.tier);
        request
    }

    /// `request` on `pool`: what the forward stage asks for a worker on each attempt.
    pub fn routed<'s>(&'s self, pool: &'s Pool, request: &'s RouteRequest) -> Routed<'s> {
        Routed {
            pool,
            request,
            stage: self,
            policy: &self.policy,
        }
    }

    fn count_shed(&self, stage: &'static str) {
        self.metrics
            .overload_sheds
            .get_or_create(&StageLabel { stage })
            .inc();
    }
}

impl<'s> Routed<'s> {
    /// A disaggregated model's two sides, each routed by its own policy: (prefill, decode).
    pub fn pd(&self) -> Option<(Routed<'s>, Routed<'s>)> {
        let pd = self.pool.pd.as_deref()?;
        let side = |pool, policy| Routed {
            pool,
            request: self.request,
            stage: self.stage,
            policy,
        };
        Some((
            side(&pd.prefill, &self.stage.prefill_policy),
            side(&pd.decode, &self.stage.decode_policy),
        ))
    }

    /// A worker for the next attempt, none of those in `tried`: the policy's pick with its
    /// breaker permit, or the all-vetoed rule's answer.
    pub fn select(&self, tried: &[u64]) -> Result<Lease, GatewayError> {
        let stage = self.stage;
        let selected = match select(stage, self.policy, self.pool, self.request, tried) {
            Ok(selected) => selected,
            Err(e) => {
                if matches!(e, GatewayError::WorkerOverloadShed { .. }) {
                    stage.count_shed("select");
                }
                return Err(e);
            }
        };
        match selected.fallback {
            Some(VetoClass::Overload) => {
                stage.metrics.overload_fallbacks.inc();
            }
            Some(VetoClass::Liveness) => {
                stage.metrics.liveness_fallbacks.inc();
            }
            // Room within the reserve is room: not a fallback onto a vetoed worker.
            Some(VetoClass::Reserve) | None => {}
        }
        let worker = selected.lease.worker();
        if stage.shedding.enabled
            && worker.veto_class_by(stage.projection) == Some(VetoClass::Overload)
        {
            // Flagged between selection and dispatch: shed rather than pick again.
            stage.count_shed("dispatch");
            return Err(GatewayError::OverloadedBeforeDispatch {
                worker: worker.id.clone(),
                model: self.pool.model.clone(),
                status: stage.shedding.status,
                retry_after: stage.shedding.retry_after,
            });
        }
        Ok(selected.lease)
    }

    /// The overload answer for this pool (`--overload-status-code`, Retry-After): what the
    /// decode admission window sheds with.
    pub fn shed(&self) -> GatewayError {
        self.stage.count_shed("pd_window");
        GatewayError::WorkerOverloadShed {
            model: self.pool.model.clone(),
            status: self.stage.shedding.status,
            retry_after: self.stage.shedding.retry_after,
        }
    }

    /// Whether a retry has somewhere to go: a routable worker of the pool other than `current`
    /// and those in `tried`.
    pub fn has_another(&self, current: u64, tried: &[u64]) -> bool {
        self.pool
            .workers
            .iter()
            .any(|w| w.key != current && !tried.contains(&w.key) && w.is_routable())
    }
}

/// Where the admit stage placed a request: its pool (as the fleet was then), what the chooser
/// reads of it, and its turn out of the gateway queue. The forward stage consumes it.
pub struct Placement<'s> {
    pub pool: Arc<Pool>,
    pub request: RouteRequest,
    pub stage: &'s RouteStage,
    pub turn: Turn,
}

/// A request's turn out of the gateway queue, held from its dispatch until it has its worker.
/// While it is held the dispatcher sends no one else (so the room it was sent for is not
/// promised twice); `taken` when the request's first worker is leased, or dropped with the
/// request, whichever comes first — and the dispatcher waits `admit::TURN_BOUND` at most.
#[derive(Debug, Default)]
pub struct Turn(Option<tokio::sync::oneshot::Sender<()>>);

impl Turn {
    /// A turn the queue's dispatcher waits on until `ack` is sent or dropped.
    pub fn new(ack: tokio::sync::oneshot::Sender<()>) -> Self {
        Self(Some(ack))
    }

    /// The request has its worker: the dispatcher may look for the next waiter.
    pub fn taken(&mut self) {
        if let Some(ack) = self.0.take() {
            let _ = ack.send(());
        }
    }
}

/// What a request gets when every worker it could use is overloaded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shedding {
    /// `--worker-overload-shed`: refuse it; otherwise steer it to the least loaded.
    pub enabled: bool,
    /// `--overload-status-code`.
    pub status: u16,
    /// The load-monitor interval, in whole seconds: a vetoed worker is not re-judged sooner.
    pub retry_after: std::time::Duration,
}

/// Bytes per prefix block: about 16 tokens, an engine's KV block.
const PREFIX_BLOCK_BYTES: usize = 64;
/// Prefix blocks hashed per request at most (32 KiB of prompt): enough to tell conversations
/// apart without hashing whole documents.
const PREFIX_MAX_BLOCKS: usize = 512;

/// What the route stage knows about one request.
#[derive(Debug, Clone, Default)]
pub struct RouteRequest {
    pub input: RouteInput,
    /// Prefix block hashes, only when the policy uses them.
    pub blocks: Vec<u64>,
    /// The prompt's keys in its engines' blocks, where their KV events flow.
    pub held: Option<HeldKeys>,
    /// The prompt's estimated size, counted as waiting for prefill on the chosen worker.
    pub prompt_tokens: u64,
    /// A streaming request, counted in the chosen worker's pile of streams.
    pub stream: bool,
    /// Its `n`, the weight of its lease.
    pub weight: u64,
    /// The share of a worker's capacity it leaves to the interactive tier (`Pool::reserve_for`):
    /// a worker that could start no more than that is full for it.
    pub reserve: f64,
    /// It goes where it starts at once when such a worker exists (`Pool::seeks_room`).
    pub seeks_room: bool,
}

impl RouteRequest {
    /// `prefix`: a policy routes by prompt prefix, so the prompt is hashed.
    pub fn new(prefix: bool, wants: &Wants<'_>) -> Self {
        let blocks = if prefix {
            block_hashes(wants.prompt, PREFIX_BLOCK_BYTES, PREFIX_MAX_BLOCKS)
        } else {
            Vec::new()
        };
        Self {
            input: RouteInput {
                routing_key: wants.routing_key.map(sluice_core::policy::key_of),
                prefix_blocks: blocks.len() as u32,
            },
            blocks,
            held: None,
            prompt_tokens: wants.prompt_tokens,
            stream: wants.stream,
            weight: wants.n.max(1),
            reserve: 0.0,
            seeks_room: false,
        }
    }
}

/// The pool serving `model`, or the answer for why there is none.
fn pool<'s>(snapshot: &'s Snapshot, model: Option<&str>) -> Result<&'s Arc<Pool>, GatewayError> {
    let Some(model) = model else {
        let mut pools = snapshot.pools.values();
        return match (pools.next(), pools.next()) {
            (Some(only), None) if snapshot.unresolved == 0 => Ok(only),
            _ => Err(GatewayError::ModelRequired {
                served: snapshot.pools.len().max(1),
            }),
        };
    };
    if let Some(pool) = snapshot.pools.get(model) {
        return Ok(pool);
    }
    if snapshot.unresolved > 0 {
        // A worker that has not answered yet may serve it: not a 404.
        return Err(GatewayError::NoAvailableWorkers {
            model: ModelName::new(reflected(model)),
            detail: format!(
                " ({} registered worker(s) have not answered yet)",
                snapshot.unresolved
            ),
        });
    }
    Err(GatewayError::ModelNotFound {
        model: reflected(model),
    })
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
    stage: &RouteStage,
    policy: &Policy,
    pool: &Pool,
    request: &RouteRequest,
    tried: &[u64],
) -> Result<Selected, GatewayError> {
    // A worker at its adaptive limit is neither a candidate nor a fallback: the limit is a cap.
    let (free, vetoed): (Vec<&Arc<Worker>>, Vec<&Arc<Worker>>) = pool
        .workers
        .iter()
        .filter(|w| w.is_routable() && !tried.contains(&w.key) && !w.at_limit(request.weight))
        .partition(|w| {
            w.veto_class_for(stage.projection, request.reserve)
                .is_none()
        });
    if let Some(lease) = pick_where_it_starts(policy, pool, request, free) {
        return Ok(Selected {
            lease,
            fallback: None,
        });
    }
    let others_out = pool
        .workers
        .iter()
        .any(|w| !w.is_routable() && !tried.contains(&w.key));
    fall_back(stage, pool, request, tried, vetoed, others_out)
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
    while !candidates.is_empty() {
        let draw = Draw {
            ticket: pool
                .state
                .ticket
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            random: rand::random(),
        };
        let i = choose(policy, &candidates, &input, draw)?;
        let worker = workers[i];
        if let Some(lease) = Lease::acquire(worker, request.weight) {
            if policy.wants_prefix() && !request.blocks.is_empty() {
                pool.state.prefix.lock().insert(&request.blocks, worker.key);
            }
            worker.metrics.selections.inc();
            return Some(lease);
        }
        // Its half-open trial is taken (or it just opened), or another request took its last
        // place under its limit: choose among the others.
        candidates.swap_remove(i);
        workers.swap_remove(i);
    }
    None
}

/// No candidate without a veto: steer to the least loaded vetoed one, shed, or give up.
fn fall_back(
    stage: &RouteStage,
    pool: &Pool,
    request: &RouteRequest,
    tried: &[u64],
    mut vetoed: Vec<&Arc<Worker>>,
    others_out: bool,
) -> Result<Selected, GatewayError> {
    loop {
        let candidates: Vec<Vetoed> = vetoed
            .iter()
            .map(|w| {
                let load = w.vetoes.load();
                Vetoed {
                    class: w
                        .veto_class_for(stage.projection, request.reserve)
                        .unwrap_or(VetoClass::Overload),
                    waiting: w.projected_waiting(stage.projection),
                    kv_usage: load.as_ref().map_or(0.0, |l| l.report.mean_kv_usage()),
                    in_flight: w.load_everywhere(),
                }
            })
            .collect();
        let shedding = &stage.shedding;
        match when_all_vetoed(&candidates, shedding.enabled, others_out) {
            AllVetoed::Steer(i, class) => {
                let worker = vetoed[i];
                if let Some(lease) = Lease::acquire(worker, request.weight) {
                    worker.metrics.selections.inc();
                    return Ok(Selected {
                        lease,
                        fallback: Some(class),
                    });
                }
                vetoed.swap_remove(i);
            }
            AllVetoed::Shed => {
                return Err(GatewayError::WorkerOverloadShed {
                    model: pool.model.clone(),
                    status: shedding.status,
                    retry_after: shedding.retry_after,
                })
            }
            AllVetoed::Unavailable => return Err(no_workers(pool, tried)),
        }
    }
}

fn no_workers(pool: &Pool, tried: &[u64]) -> GatewayError {
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
    GatewayError::NoAvailableWorkers {
        model: pool.model.clone(),
        detail: if reasons.is_empty() {
            String::new()
        } else {
            format!(" ({})", reasons.join(", "))
        },
    }
}
