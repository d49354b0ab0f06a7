//! Each request's hold on a worker (`Lease`): the one thing that moves the worker's `Traffic`
//! counts, its breaker permit and its liveness signals for a request.

use std::sync::Arc;

use axum::http::HeaderValue;
use sluice_core::breaker::Outcome;
use tokio::time::Instant;

use super::breaker::Permit;
use super::pd::DecodeRooms;
use super::worker::Worker;

/// One request's hold on a worker: counts it in flight and holds its breaker permit until an
/// outcome is settled. Dropped without an outcome (the client left), it hands the permit back.
///
/// A request asking for `n` choices counts `n` times in the worker's load (in flight, waiting for
/// a first byte): the engine runs it as `n` sequences and reports them so.
#[derive(Debug)]
pub(crate) struct Lease {
    worker: Arc<Worker>,
    permit: Option<Permit>,
    /// The request's `n`: how many sequences it is on the worker.
    weight: u64,
    /// The request's id, named in the log line of a circuit transition it causes.
    request: Option<HeaderValue>,
    /// Prompt tokens counted in the worker's pending prefill until the first byte.
    prefill: u64,
    /// Counted in the worker's pending requests until the first byte.
    pending: bool,
    /// Counted in the worker's pile of streams.
    streaming: bool,
    /// A decode worker's rooms in its admission window, freed with the lease.
    rooms: Option<Box<DecodeRooms>>,
    /// The LoRA adapter the request names, counted on the worker until the lease ends.
    adapter: Option<Arc<str>>,
    /// Its prompt tokens the prefix scores claimed the worker holds cached when it was chosen,
    /// for a policy that scores prefixes (taken at the worker's credit for such claims).
    claimed: Option<u64>,
    /// Where it stood on the worker when it was sent: what its first token teaches the
    /// worker's latency model.
    situation: Option<sluice_core::latency::Situation>,
    /// Its prompt's place in the worker's prefill backlog until the first byte.
    backlog: Option<u64>,
}

impl Lease {
    /// A hold on `worker` for a request of `weight` (its `n`): a place under its adaptive limit,
    /// then a permit from its circuit; `None` when either refuses.
    pub(crate) fn acquire(worker: &Arc<Worker>, weight: u64) -> Option<Self> {
        let weight = weight.max(1);
        if !worker.traffic.enter(weight, &worker.adaptive) {
            return None;
        }
        let Some(permit) = worker.breaker.try_admit() else {
            worker.traffic.leave(weight);
            return None;
        };
        Some(Self {
            worker: worker.clone(),
            permit: Some(permit),
            weight,
            request: None,
            prefill: 0,
            pending: false,
            streaming: false,
            rooms: None,
            adapter: None,
            claimed: None,
            situation: None,
            backlog: None,
        })
    }

    /// Holds `rooms` of the worker's decode window until the lease ends.
    pub(crate) fn hold_rooms(&mut self, rooms: DecodeRooms) {
        self.rooms = Some(Box::new(rooms));
    }

    /// The LoRA adapter the request names, once counted (`for_adapter`).
    pub(crate) fn adapter(&self) -> Option<&Arc<str>> {
        self.adapter.as_ref()
    }

    /// Counts the request under `adapter` on the worker until the lease ends.
    pub(crate) fn for_adapter(&mut self, adapter: &Arc<str>) {
        if self.adapter.is_none() {
            self.worker.adapters.enter(adapter);
            self.adapter = Some(adapter.clone());
        }
    }

    /// Of its prompt, the prefix scores claim the worker holds `tokens` cached.
    pub(crate) fn claimed(&mut self, tokens: u64) {
        self.claimed = Some(tokens);
    }

    /// Of a prompt of `prompt_tokens`, what the worker must still prefill: all of it but the
    /// claimed cached prefix, taken at the worker's credit for claims.
    fn uncached(&self, prompt_tokens: u64) -> u64 {
        self.claimed.map_or(prompt_tokens, |claimed| {
            self.worker.latency.uncached(prompt_tokens, claimed)
        })
    }

    /// What a request of `prompt_tokens` should expect on the worker now, counted in flight
    /// there (of its prompt, the part believed not cached).
    pub(crate) fn predicted(&self, prompt_tokens: u64) -> Option<sluice_core::latency::Prediction> {
        self.worker.predict(self.uncached(prompt_tokens), 0)
    }

    /// Names the request this lease is for, in what its outcome logs.
    pub(crate) fn for_request(&mut self, id: &HeaderValue) {
        self.request = Some(id.clone());
    }

    /// Counts the request in the worker's pile of streams until the lease ends.
    pub(crate) fn streaming(&mut self) {
        if !self.streaming {
            self.streaming = true;
            self.worker.signals.stream_started(Instant::now());
        }
    }

    /// Counts the request, and its prompt, as waiting for prefill on the worker until
    /// `first_byte`.
    pub(crate) fn prefilling(&mut self, prompt_tokens: u64) {
        self.first_byte();
        self.pending = true;
        let before = self.worker.traffic.pending_added(self.weight);
        self.worker
            .vetoes
            .pending_rose(before, before + self.weight);
        if before == 0 {
            self.worker.signals.sent(Instant::now());
        }
        self.prefill = prompt_tokens;
        if let Some(claimed) = self.claimed {
            self.worker.latency.claimed(prompt_tokens, claimed);
        }
        // Counted in flight since it was leased: it joins as itself.
        let uncached = self.uncached(prompt_tokens);
        let (key, ahead) = self.worker.latency.sent(uncached);
        self.backlog = Some(key);
        self.situation = Some(self.worker.situation_behind(ahead, uncached, 0));
        self.worker.traffic.prefill_added(prompt_tokens);
    }

    /// The first byte came `ttft` after the request was sent: what the worker's latency model
    /// learns its prefill rate from, and the prompt is no longer waiting.
    pub(crate) fn first_byte_after(&mut self, ttft: std::time::Duration) {
        if let Some(situation) = &self.situation {
            self.worker.latency.first_token(situation, ttft);
        }
        if let Some(still) = self.no_longer_pending() {
            self.worker.signals.answered(Instant::now(), still);
        }
        self.first_byte();
    }

    /// The stream's output tokens came `tpot` apart: the pace of the batch it joined.
    pub(crate) fn paced(&self, tpot: std::time::Duration) {
        if let Some(situation) = &self.situation {
            self.worker.latency.paced(situation.batch, tpot);
        }
    }

    /// The worker answered with something other than its output (a refusal, an error status):
    /// a byte from it, but no prefill-rate sample.
    pub fn answered(&mut self) {
        if let Some(still) = self.no_longer_pending() {
            self.worker.signals.answered(Instant::now(), still);
        }
        self.first_byte();
    }

    /// The request stopped waiting for its first byte (it was answered, or it ended): the prompt
    /// is no longer waiting for prefill. Ended without a byte, it leaves the worker's silence
    /// running (`Signals::abandoned`).
    pub(crate) fn first_byte(&mut self) {
        if self.no_longer_pending() == Some(0) {
            self.worker.signals.abandoned(Instant::now());
        }
        let tokens = std::mem::take(&mut self.prefill);
        if tokens > 0 {
            self.worker.traffic.prefill_removed(tokens);
        }
        if let Some(key) = self.backlog.take() {
            self.worker.latency.answered(key);
        }
    }

    /// Takes the request out of the worker's pending count, if it was in it: how many remain.
    fn no_longer_pending(&mut self) -> Option<u64> {
        if !std::mem::take(&mut self.pending) {
            return None;
        }
        let before = self.worker.traffic.pending_removed(self.weight);
        Some(before.saturating_sub(self.weight))
    }

    pub fn worker(&self) -> &Arc<Worker> {
        &self.worker
    }

    /// The client left a stream owed its next token since `last_token`: the wait goes on into
    /// the worker's silence (`Silence::stream_left`).
    pub(crate) fn stream_left(&self, last_token: Instant) {
        self.worker.signals.stream_left(last_token, Instant::now());
    }

    /// Counts the request's outcome in the worker's breaker (once; later calls do nothing).
    pub(crate) fn settle(&mut self, outcome: Outcome) {
        if let Some(permit) = self.permit.take() {
            self.worker
                .breaker
                .record(permit, outcome, self.request.as_ref());
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.first_byte();
        if self.streaming {
            self.worker.signals.stream_ended();
        }
        if let Some(permit) = self.permit.take() {
            self.worker.breaker.release(permit);
        }
        if let Some(adapter) = self.adapter.take() {
            self.worker.adapters.leave(&adapter);
        }
        // A request of `n` counted `n` times in flight.
        self.worker.traffic.leave(self.weight);
        self.worker.vetoes.request_ended();
    }
}
