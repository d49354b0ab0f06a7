//! The route stage: from an admitted request to its first worker, and the chooser that finds it
//! another on a retry.
//!
//! It takes admission's hand-off (`admit::Admitted`: the pool the request was admitted to, its
//! tier, its turn out of the gateway queue) by value and returns its own (`Placement`): the
//! first worker's lease, and the request's `Chooser`, which the forward stage owns from then on
//! and asks for a worker on each retry, so a retry is routed by the same rules as the first try.
//! The turn is given back the moment the first worker is leased: the room it was sent for is
//! then counted on that worker.
//!
//! Vetoed workers (overloaded, busy, at capacity, unreachable, wedged: see `fleet::Vetoes`) are
//! not candidates while any unvetoed one remains — for every policy, hash-based ones included.
//! When none remains, `sluice_core::overload::when_all_vetoed` decides: steer to the least loaded
//! vetoed worker (the default), shed (`--worker-overload-shed`), or 503 no_available_workers. A
//! worker at its adaptive concurrency limit (`--adaptive-concurrency`) is out of the choice
//! altogether, never a fallback: its limit is a cap.
//!
//! With an interactive reserve set, an interactive request is placed among the candidates
//! where it starts at once (`Worker::starts_now`) when some would and some would not: the room
//! the reserve keeps is of no use to it on another worker, behind an engine's queue.
//!
//! A request for a LoRA adapter (its pool's `adapter`) is placed by adapter before the policy
//! chooses: among the unvetoed candidates, where the adapter runs, then where a slot is free,
//! then where it would wait (`sluice_core::lora`).
//!
//! Where a pool's engines publish KV events, the cache-aware policy scores by the blocks they
//! hold (`held`); elsewhere by where prompts were sent.
//!
//! The `predicted` policy places a request where its objectives (`RouteRequest::objectives`)
//! are predicted to be met with the most headroom (`predicted`); when none is predicted to
//! give its first token in time, the request is refused (`RouteError::PredictedLate`, with a
//! Retry-After of how late it would be) instead of sent to be late — unless the gateway queue
//! called it, for room it judged by the same predictions.
//!
//! ## Layout
//!
//! - `request` — what the chooser reads of a request (`Wants`, `RouteRequest`).
//! - `chooser` — a request's chooser, and the pick: candidates, the policy, the breaker's
//!   permit, the all-vetoed rule.
//! - `held` — the prompt in the blocks engines' KV events name.
//! - `predicted` — each candidate's predicted latency for the request, and the placement by it.

mod chooser;
mod held;
mod predicted;
mod refusal;
mod request;

use std::sync::Arc;

use axum::http::{HeaderName, HeaderValue};
use bytes::Bytes;
use sluice_core::admission::Tier;
use sluice_core::latency::{objectives, Objectives};
use sluice_core::overload::Projection;
use sluice_core::policy::Policy;
use sluice_core::slo::Slos;
use tokio::time::Instant;

pub(crate) use chooser::Chooser;
pub(crate) use held::HeldKeys;
pub(crate) use refusal::RouteError;
pub(crate) use request::{RouteRequest, Wants};

use crate::admit::{Admitted, Terms};
use crate::fleet::{Lease, Pool};
use crate::metrics::Metrics;
use crate::request::{ApiRoute, Asked};
use crate::tokens::{PromptJson, SharedTokens};
use chooser::{Lateness, Rules};

/// The route stage, shared by every request.
#[derive(Debug)]
pub(crate) struct RouteStage {
    /// The policies and the shedding rule every request's chooser picks by.
    rules: Arc<Rules>,
    /// The model's tokens, to cut prompts into the blocks engines' events name.
    tokens: SharedTokens,
    /// `--routing-key-headers`: what hash policies hash, the first present one, before the
    /// `user` field.
    routing_key_headers: Vec<HeaderName>,
}

/// The route stage's hand-off to the forward stage: where the request goes first, how it may be
/// retried, and what admission decided that still binds it.
#[derive(Debug)]
pub(crate) struct Placement {
    /// Admission's terms (tier, deadlines, metering), which the forward and stream-back
    /// stages keep.
    pub(crate) terms: Terms,
    /// The body the worker gets, as admission left it.
    pub(crate) body: Bytes,
    /// The first worker's hold (a disaggregated model's first decode worker's, which the
    /// forward stage still asks for room in its running window): its in-flight count and
    /// breaker permit, from now.
    pub(crate) lease: Lease,
    /// Picks the next worker after a failure, never one tried (decode workers, for a
    /// disaggregated model).
    pub(crate) chooser: Chooser,
    /// A disaggregated model's prefill side, which picks each pair's prefill worker. Boxed: the
    /// rare path, which every placement would carry, and move hand-off by hand-off, otherwise.
    pub(crate) prefill: Option<Box<Chooser>>,
}

/// How the route stage picks, built from its flags and taken whole by `RouteStage::new`.
#[derive(Debug, Clone)]
pub struct RouteConfig {
    /// `--policy`: how a worker is picked among those that may take the request.
    pub policy: Policy,
    /// `--prefill-policy`: a disaggregated model's prefill side (`--policy` when not given).
    pub prefill_policy: Policy,
    /// `--decode-policy`: its decode side (`--policy` when not given).
    pub(crate) decode_policy: Policy,
    /// `--routing-key-headers`, in order of precedence: the key `consistent_hash` reads.
    pub routing_key_headers: Vec<HeaderName>,
    /// When every worker a request could use is overloaded: steer it or shed it.
    pub shedding: Shedding,
    /// Where a LoRA adapter runs orders the candidates for its requests (on unless
    /// `--disable-adapter-routing`).
    pub by_adapter: bool,
    /// The tiers' objectives (`--slo-*`): what `predicted` places each request by.
    pub slos: Slos,
}

/// What a request gets when every worker it could use is overloaded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shedding {
    /// `--worker-overload-shed`: refuse it; otherwise steer it to the least loaded.
    pub enabled: bool,
    /// The load-monitor interval, in whole seconds: a vetoed worker is not re-judged sooner.
    pub retry_after: std::time::Duration,
}

impl RouteStage {
    pub fn new(config: &RouteConfig, metrics: Arc<Metrics>) -> Self {
        Self {
            rules: Arc::new(Rules {
                policy: config.policy,
                prefill_policy: config.prefill_policy,
                decode_policy: config.decode_policy,
                shedding: config.shedding,
                projection: Projection::Hopeful,
                metrics,
                by_adapter: config.by_adapter,
                slos: config.slos,
            }),
            tokens: SharedTokens::default(),
            routing_key_headers: config.routing_key_headers.clone(),
        }
    }

    /// With the model's tokens (`--model-path`, or fetched from a gRPC worker): prompts can be
    /// matched against what engines' KV events say they hold.
    pub(crate) fn with_tokens(mut self, tokens: SharedTokens) -> Self {
        self.tokens = tokens;
        self
    }

    /// With a gateway queue: room is judged as the queue judges it (`Pool::has_room`), so a
    /// request it releases goes where the room it was released for is.
    pub(crate) fn with_projection(mut self, projection: Projection) -> Self {
        Arc::make_mut(&mut self.rules).projection = projection;
        self
    }

    /// Whether a policy of this stage routes by prompt prefix, so prompts must be hashed.
    fn wants_prefix(&self) -> bool {
        self.rules.wants_prefix()
    }

    /// Places an admitted request: its first worker (never one in `excluded`) leased, the turn
    /// out of the gateway queue given back, and its chooser for retries.
    pub(crate) async fn place(
        &self,
        asked: &Asked<'_>,
        admitted: Admitted,
        excluded: Vec<u64>,
    ) -> Result<Placement, RouteError> {
        // Its grants are not the route stage's: the front stage gave them to the request's
        // context, which gives them back with the request's ending.
        let Admitted {
            terms,
            pool,
            body,
            mut turn,
            ..
        } = admitted;
        let wants = self.wants(asked, terms.tier);
        let held = self.held_keys(&pool, &wants).await;
        let mut request = self.request(&pool, &wants, held);
        request.objectives = self.objectives(asked.arrival.started, &terms);
        let mut chooser = Chooser::new(self.rules.clone(), pool, request, excluded);
        let prefill = chooser.split_prefill();
        // Predicted late everywhere: refused now, its worker's place handed back, rather than
        // sent to be late. Not once it waited in the gateway queue: the queue called it for
        // room predicted in time by its tier's objective, and bounded its wait by it.
        let lateness = if turn.called() {
            Lateness::Sent
        } else {
            Lateness::Refused
        };
        let lease = chooser.first(lateness)?;
        turn.taken();
        Ok(Placement {
            terms,
            body,
            lease,
            chooser,
            prefill,
        })
    }

    /// The request's objectives now, `started` being its arrival: its tier's, less the time
    /// since, and no later than its client's deadline (`latency::objectives`).
    fn objectives(&self, started: Instant, terms: &Terms) -> Option<Objectives> {
        let slo = self.rules.slos.of(terms.tier);
        let now = Instant::now();
        objectives(
            slo.ttft,
            slo.tpot,
            now.saturating_duration_since(started),
            terms
                .client_deadline
                .map(|due| due.saturating_duration_since(now)),
        )
    }

    /// What the chooser reads of `asked`, in `tier`.
    fn wants<'a>(&self, asked: &Asked<'a>, tier: Tier) -> Wants<'a> {
        let facts = asked.facts;
        Wants {
            routing_key: self
                .routing_key_headers
                .iter()
                .find_map(|name| asked.parts.headers.get(name))
                .map(HeaderValue::as_bytes)
                .or(facts.user.as_deref().map(str::as_bytes)),
            prompt: facts.prompt,
            prompt_json: match asked.arrival.route {
                ApiRoute::Chat => Some(PromptJson::Messages(facts.prompt)),
                ApiRoute::Completions => Some(PromptJson::Completion(facts.prompt)),
                _ => None,
            },
            prompt_tokens: asked.prompt_tokens(),
            stream: facts.stream,
            n: facts.n,
            tier,
        }
    }

    /// What the policy reads of a request that goes to `pool`, with its prompt's block keys
    /// where the pool's engines publish what they hold (`held_keys`).
    fn request(&self, pool: &Pool, wants: &Wants<'_>, held: Option<HeldKeys>) -> RouteRequest {
        let mut request = RouteRequest::new(self.wants_prefix(), wants);
        request.held = held;
        request.reserve = pool.reserve_for(wants.tier);
        request.seeks_room = pool.seeks_room(wants.tier);
        request
    }
}
