//! # sluice-core: the gateway's decisions, with no I/O
//!
//! Everything that decides lives here as plain code over plain data, so it can be tested
//! exhaustively without a network or a runtime. Time is always a parameter (`tokio::time::Instant`
//! values passed in, never read), so the gateway can drive a decision from a timer and tests can
//! drive it on paused time.
//!
//! ## Layout
//!
//! - `ids` — `WorkerId`, `ModelName`, `TenantId`.
//! - `admission` — edge admission: tiers, token buckets, the fair gateway queue, deadlines.
//! - `adaptive` — limits learned from latency: per-worker AIMD concurrency, CoDel on the queue.
//! - `hash` — the specified hash (SipHash-1-3, pinned by test vectors) behind worker ids,
//!   consistent hashing and prefix blocks.
//! - `liveness` — unreachable, stale and wedged vetoes judged from what the gateway observed.
//! - `load` — engine load reports (vLLM `/metrics`, SGLang `/v1/loads` and `/get_load`) in one
//!   per-rank shape.
//! - `latency` — each worker's latency model: predicted time to first token and per output
//!   token, learned online from its answers, and the predictions' error.
//! - `lora` — LoRA adapters: where a request naming one stands on each worker (its adapter
//!   running there, a slot free, or a wait).
//! - `overload` — overload ceilings, busy ranks, and the one rule for a pool whose every
//!   candidate is vetoed (steer to the least loaded, or shed).
//! - `policy` — the load-balancing policies (round robin, random, least load, power of two,
//!   cache aware, consistent hash) as one pure `choose` over a pool's candidates.
//! - `prefix` — prompt prefix blocks and the bounded index of which workers were sent them, for
//!   the cache-aware policy.
//! - `held_blocks` — the KV blocks one engine holds, learned from its KV events and keyed by the
//!   gateway's hash of their token ids, for precise prefix routing.
//! - `kv_events` — the KV events vLLM and SGLang publish over ZMQ, decoded from MessagePack.
//! - `engine_cache` — one worker's held blocks across its ranks and event streams: batch
//!   numbers, gaps and lost streams, the media and cache groups that count.
//! - `breaker` — the per-worker circuit breaker state machine.
//! - `pd_window` — prefill/decode disaggregation's decode admission window: dispatch, wait or
//!   shed, and which waiter a freed room goes to.
//! - `engine_error` — what an engine's error answer (an error event in a stream, a 503 body)
//!   means for its worker: its failure, the client's mistake, or backpressure.
//! - `discovery` — what a discovery source's new listing changes in the fleet (add, replace,
//!   remove).
//! - `degrade` — the degradation ladder: the pressure level and each step's rewrite of a body.
//! - `health` — the worker health state machine (Pending / Ready / NotReady / Failed /
//!   Draining) that probes drive.
//! - `retry` — which failed attempts may be retried, and the backoff before each retry.
//! - `room` — how many client connections the open-file limit leaves room for.
//! - `slo` — per-tier objectives (time to first token, time per output token) and whether an
//!   answer met them.
//! - `status` — what the status page shows of a worker at a glance (its card's state).
//! - `histogram` — quantiles of cumulative bucketed histograms, as PromQL reads them.
//! - `sse` — server-sent events parsed incrementally, as the HTML standard reads them.
//! - `prom_text` — the Prometheus text format engines serve on `/metrics` (vLLM's `vllm:*` names
//!   included), parsed strictly.

// Functions stay under 60 lines (clippy.toml), test code excepted: `cargo clippy` holds it.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod adaptive;
pub mod admission;
pub mod breaker;
pub mod degrade;
pub mod discovery;
pub mod engine_cache;
pub mod engine_error;
pub mod hash;
pub mod health;
pub mod held_blocks;
pub mod histogram;
pub mod ids;
pub mod kv_events;
pub mod latency;
pub mod liveness;
pub mod load;
pub mod lora;
pub mod overload;
pub mod pd_window;
pub mod policy;
pub mod prefix;
pub mod prom_text;
pub mod retry;
pub mod room;
pub mod slo;
pub mod sse;
pub mod status;

pub use ids::{ModelName, TenantId, WorkerId};
