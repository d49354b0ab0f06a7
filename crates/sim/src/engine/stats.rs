//! What an engine knows about itself, readable without locks.
//!
//! Each rank's loop is the only writer of its `RankGauges`; HTTP handlers (load endpoints, metrics,
//! the control listener's `/state`) read them. `Totals` outlive an engine's crash and restart, so a
//! benchmark reading ground truth at the end of a run sees everything the engine slot ever did.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use crate::scheduler::Counters;

/// The live state of one data-parallel rank, published after every step.
#[derive(Debug, Default)]
pub struct RankGauges {
    pub running: AtomicU64,
    pub waiting: AtomicU64,
    pub swapped: AtomicU64,
    pub kv_blocks_used: AtomicU64,
    pub kv_blocks_total: AtomicU64,
    /// Prompt tokens not yet prefilled (waiting or running).
    pub pending_prefill_tokens: AtomicU64,
    /// Compute spent on the live sequences (lost if the process dies now).
    pub work_in_flight: AtomicU64,
    /// Tokens generated per second over the last second, as an f64's bits.
    pub gen_throughput_bits: AtomicU64,
    /// Share of recently admitted prompt tokens found in the prefix cache, as an f64's bits.
    pub cache_hit_rate_bits: AtomicU64,
    /// Running requests part-way through a chunked prefill.
    pub chunked: AtomicU64,
    /// Requests preempted since the last stats log (SGLang's `num_retracted_reqs`).
    pub retracted: AtomicU64,
}

/// A consistent-enough copy of one rank's gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct RankView {
    pub running: u64,
    pub waiting: u64,
    pub swapped: u64,
    pub kv_blocks_used: u64,
    pub kv_blocks_total: u64,
    pub pending_prefill_tokens: u64,
    pub work_in_flight: u64,
    pub gen_throughput: f64,
    /// SGLang's `cache_hit_rate`: of the prompt tokens admitted lately, the share found cached.
    pub cache_hit_rate: f64,
    /// Running requests part-way through a chunked prefill (SGLang's `chunked_req`, in neither
    /// of its counts; vLLM counts it running).
    pub chunked: u64,
    /// Requests preempted since the engine's last stats log (SGLang logs every 40 decode steps
    /// and resets the count).
    pub retracted: u64,
    /// Of `waiting`, a decode engine's requests waiting for a running slot (SGLang's prealloc
    /// queue; vLLM's waiting for capacity)...
    pub prealloc: u64,
    /// ...and those whose KV is on its way from the prefill engine (SGLang's transfer queue;
    /// vLLM's `deferred` reason).
    pub transfer: u64,
}

impl RankView {
    /// Requests in the scheduler's own waiting queue.
    pub fn queued(&self) -> u64 {
        self.waiting.saturating_sub(self.prealloc + self.transfer)
    }

    pub fn kv_usage(&self) -> f64 {
        if self.kv_blocks_total == 0 {
            0.0
        } else {
            self.kv_blocks_used as f64 / self.kv_blocks_total as f64
        }
    }
}

impl RankGauges {
    pub fn view(&self) -> RankView {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RankView {
            running: load(&self.running),
            waiting: load(&self.waiting),
            swapped: load(&self.swapped),
            kv_blocks_used: load(&self.kv_blocks_used),
            kv_blocks_total: load(&self.kv_blocks_total),
            pending_prefill_tokens: load(&self.pending_prefill_tokens),
            work_in_flight: load(&self.work_in_flight),
            gen_throughput: f64::from_bits(load(&self.gen_throughput_bits)),
            cache_hit_rate: f64::from_bits(load(&self.cache_hit_rate_bits)),
            chunked: load(&self.chunked),
            retracted: load(&self.retracted),
            prealloc: 0,
            transfer: 0,
        }
    }

    pub fn publish(&self, view: RankView) {
        let store = |a: &AtomicU64, v| a.store(v, Ordering::Relaxed);
        store(&self.running, view.running);
        store(&self.waiting, view.waiting);
        store(&self.swapped, view.swapped);
        store(&self.kv_blocks_used, view.kv_blocks_used);
        store(&self.kv_blocks_total, view.kv_blocks_total);
        store(&self.pending_prefill_tokens, view.pending_prefill_tokens);
        store(&self.work_in_flight, view.work_in_flight);
        store(&self.gen_throughput_bits, view.gen_throughput.to_bits());
        store(&self.cache_hit_rate_bits, view.cache_hit_rate.to_bits());
        store(&self.chunked, view.chunked);
        store(&self.retracted, view.retracted);
    }
}

/// Ground truth for benchmarks, summed over ranks and over every incarnation of an engine.
#[derive(Debug, Default)]
pub struct Totals {
    pub requests_received: AtomicU64,
    /// Requests a gateway marked as liveness trials (`X-Sluice-Liveness-Trial`), kept out of
    /// `requests_received` so that a benchmark counts its clients' traffic alone.
    pub trials_received: AtomicU64,
    /// When the last of `requests_received` came, in microseconds since the Unix epoch (0:
    /// none yet): a benchmark tells an arrival just before a gateway's logged decision from one
    /// just after it.
    pub last_arrival_unix_us: AtomicU64,
    pub steps: AtomicU64,
    pub preemptions: AtomicU64,
    pub aborted: AtomicU64,
    pub finished: AtomicU64,
    pub prompt_tokens_computed: AtomicU64,
    pub tokens_generated: AtomicU64,
    /// Tokens handed to a client that was still listening.
    pub tokens_delivered: AtomicU64,
    pub wasted_tokens: AtomicU64,
    /// Prompt tokens looked up in the prefix cache at admission, and those found there.
    pub prefix_queries: AtomicU64,
    pub prefix_hits: AtomicU64,
    /// Requests refused by the engine itself (queue full, at capacity, injected errors).
    pub rejected: AtomicU64,
    /// Steps the engine loop started later than the modelled clock wanted by more than a
    /// millisecond: when this grows, the host CPU, not the model, is setting the pace.
    pub late_steps: AtomicU64,
    /// Prefill halves failed because no decode engine claimed their room in time.
    pub bootstrap_timeouts: AtomicU64,
    /// Decode halves failed because their KV never came (the prefill failed, was aborted or
    /// could not be reached).
    pub transfer_failures: AtomicU64,
    /// `GetTokenizer` calls answered (`--grpc`).
    pub tokenizer_fetches: AtomicU64,
    /// Connections open on the engine's port now (not a total: closing one takes it off).
    pub open_connections: AtomicU64,
}

/// The header by which a gateway marks a liveness trial (sluice's `control/trial.rs`).
pub const TRIAL_HEADER: &str = "x-sluice-liveness-trial";
/// Set by the engine itself on a request it counted when it reached the port of a hung API
/// process, and served once the process ran again: not counted twice.
pub(crate) const COUNTED_WHILE_HUNG: &str = "x-sim-counted-while-hung";

impl Totals {
    /// A generation request arrived with `headers`: counted as a client's, or as a trial.
    pub fn arrival(&self, headers: &axum::http::HeaderMap) {
        if !headers.contains_key(COUNTED_WHILE_HUNG) {
            self.count_arrival(headers.contains_key(TRIAL_HEADER));
        }
    }

    /// Counts one request that reached the engine: a liveness trial apart, anything else in
    /// `requests_received`, stamped.
    pub fn count_arrival(&self, trial: bool) {
        if trial {
            self.trials_received.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        self.requests_received.fetch_add(1, Ordering::Relaxed);
        self.last_arrival_unix_us.fetch_max(now, Ordering::Relaxed);
    }

    /// Adds what the scheduler did since `before`.
    pub fn add_progress(&self, before: &Counters, now: &Counters) {
        let add = |a: &AtomicU64, n: u64, b: u64| {
            if n > b {
                a.fetch_add(n - b, Ordering::Relaxed);
            }
        };
        add(&self.steps, now.steps, before.steps);
        add(&self.preemptions, now.preemptions, before.preemptions);
        add(&self.aborted, now.aborted, before.aborted);
        add(&self.finished, now.finished, before.finished);
        add(
            &self.prompt_tokens_computed,
            now.prompt_tokens_computed,
            before.prompt_tokens_computed,
        );
        add(
            &self.tokens_generated,
            now.tokens_generated,
            before.tokens_generated,
        );
        add(&self.wasted_tokens, now.wasted_tokens, before.wasted_tokens);
        add(
            &self.prefix_queries,
            now.prefix_queries,
            before.prefix_queries,
        );
        add(&self.prefix_hits, now.prefix_hits, before.prefix_hits);
    }
}
