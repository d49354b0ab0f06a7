//! Engine load reports: what vLLM's `/metrics` and SGLang's `/v1/loads` (or `/get_load`) say
//! about each data-parallel rank, parsed into one shape.
//!
//! A field an engine leaves out reads as 0 (so a signal it does not report never trips a
//! ceiling); a payload with no rank at all is `LoadError::Empty`, which the overload check treats
//! as no opinion. SGLang's JSON is read field by field: a field of the wrong type is dropped
//! (and named in `LoadReport::dropped`), never the whole report — a report thrown away silently
//! turns overload protection off for its worker.
//!
//! What each engine means by its numbers was read in its source; the fixtures under
//! `fixtures/engines/` (with `index.toml` naming the file and version behind each) are what the
//! parsers are tested on.
//!
//! ## Layout
//!
//! - `vllm` — the Prometheus text of vLLM's `/metrics`.
//! - `sglang` — SGLang's `/v1/loads` and the older `/get_load`.

mod sglang;
mod vllm;

use serde::Serialize;

use crate::latency::EngineHits;
use crate::lora::AdapterSlots;
use crate::prom_text;

pub use sglang::{parse_sglang_get_load, parse_sglang_loads, SGLANG_LOADS_QUERY};
pub use vllm::parse_vllm_metrics;

/// One data-parallel rank's load.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RankLoad {
    pub rank: u32,
    /// Requests waiting for room in the running batch: the queue that means overload (vLLM's
    /// `capacity` reason where it is reported, SGLang's own waiting queue where it is reported).
    pub waiting: u64,
    /// Requests waiting for something other than room — remote KV on a disaggregated decode
    /// engine (vLLM's `deferred` reason, SGLang's prealloc and transfer queues), a prefill's
    /// bootstrap — which a healthy PD fleet always has: in hand, but not overload.
    pub deferred: u64,
    /// Requests in the running batch.
    pub running: u64,
    /// Share of the KV cache in use, 0..=1.
    pub kv_usage: f64,
    /// KV cache size in blocks (vLLM `cache_config_info`) or tokens (SGLang), when reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_capacity: Option<u64>,
    /// The running window (`max_running_requests`), when reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_running: Option<u64>,
    /// Tokens generated since the engine started (vLLM `generation_tokens_total`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation_tokens: Option<f64>,
    /// Prompt tokens since the engine started (vLLM `prompt_tokens_total`); vLLM counts a
    /// prompt only when its prefill ends.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<f64>,
    /// Tokens per second, when the engine reports it (SGLang `gen_throughput`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gen_throughput: Option<f64>,
    /// Preemptions since the engine started (vLLM `num_preemptions_total`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preemptions: Option<f64>,
    /// Requests retracted (preempted) to wait again since the engine's previous stats log, a
    /// few dozen steps (SGLang `queues.retracted`: the scheduler's count, reset at each log).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retracted: Option<u64>,
    /// KV tokens in use (SGLang `num_used_tokens`): moves with every step that allocates.
    pub used_tokens: Option<u64>,
    /// Prompt tokens waiting for prefill compute, the request in chunked prefill included
    /// (SGLang `num_waiting_uncached_tokens`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending_prefill_tokens: Option<u64>,
    /// Prompt tokens looked up in the prefix cache since the engine started, and those found
    /// (vLLM `prefix_cache_queries_total`, `prefix_cache_hits_total`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix_queries: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix_hits: Option<f64>,
    /// The share of its recent prompt tokens found cached (SGLang `cache_hit_rate`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_hit_rate: Option<f64>,
    /// Put to sleep (vLLM `engine_sleep_state{sleep_state="awake"}` 0): it looks idle and serves
    /// nothing.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub asleep: bool,
}

/// One report: every rank of one worker, ordered by rank.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LoadReport {
    pub ranks: Vec<RankLoad>,
    /// Fields the parser dropped as malformed (the rest of the report stands).
    #[serde(skip)]
    pub dropped: Vec<&'static str>,
    /// Its LoRA adapter slots, when it serves adapters (`lora`), over all ranks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adapters: Option<AdapterSlots>,
}

/// What a report says of the engine's own stepping, compared between reports: when nothing in
/// it moved while the engine held requests, the engine did not step.
///
/// vLLM republishes its scheduler's gauges after every step, and a chunked prefill allocates
/// KV blocks for every chunk, so the KV usage moves during a long prefill while the token
/// counters (a prompt is counted when its prefill ends) stand still. SGLang's scheduler
/// publishes its load snapshot after every batch (`load_inquirer.py`, `get_loads`): the KV
/// tokens in use grow with every prefill chunk and decode step, and the prompt tokens still to
/// prefill (`num_waiting_uncached_tokens`, the chunked request's remainder) fall with every chunk.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stepping {
    /// Generated plus prompt tokens (vLLM), or KV tokens in use plus prompt tokens still to
    /// prefill (SGLang), over all ranks.
    pub tokens: f64,
    /// KV usage, rank by rank as a sum (a change on any rank moves it).
    pub kv_usage: f64,
}

impl LoadReport {
    /// Waiting requests summed over ranks (the queue signal): those waiting for room.
    pub fn waiting(&self) -> u64 {
        self.ranks.iter().map(|r| r.waiting).sum()
    }

    pub fn running(&self) -> u64 {
        self.ranks.iter().map(|r| r.running).sum()
    }

    /// Requests waiting for anything but room, summed over ranks (not a queue signal).
    pub fn deferred(&self) -> u64 {
        self.ranks.iter().map(|r| r.deferred).sum()
    }

    /// Requests the engine says it holds in any state: running, waiting for room or for
    /// anything else, and (SGLang) the one request per rank in chunked prefill, which is in
    /// neither of its counts but shows in its pending prefill tokens.
    pub fn in_hand(&self) -> u64 {
        self.ranks
            .iter()
            .map(|r| {
                // At most one request per rank is in chunked prefill; pending tokens may also be
                // the waiting queue's, and then this counts one too many, which only spares it.
                let chunked = r.pending_prefill_tokens.is_some_and(|t| t > 0);
                r.running + r.waiting + r.deferred + u64::from(chunked)
            })
            .sum()
    }

    /// The running window over all ranks, when every rank reports its own (SGLang).
    pub fn max_running(&self) -> Option<u64> {
        if self.ranks.is_empty() {
            return None;
        }
        self.ranks.iter().map(|r| r.max_running).sum()
    }

    /// KV usage averaged over ranks (the token-usage signal): one saturated rank vetoes the
    /// worker only if it lifts the mean to the ceiling.
    pub fn mean_kv_usage(&self) -> f64 {
        if self.ranks.is_empty() {
            return 0.0;
        }
        self.ranks.iter().map(|r| r.kv_usage).sum::<f64>() / self.ranks.len() as f64
    }

    /// Generated tokens summed over ranks, when every rank reports the counter.
    pub fn generation_tokens(&self) -> Option<f64> {
        self.ranks.iter().map(|r| r.generation_tokens).sum()
    }

    /// The engine's stepping as this report shows it, when it reports a token counter on every
    /// rank (vLLM) or its KV tokens in use on every rank (SGLang's `/v1/loads`); `None` for an
    /// engine that gives no such signal (SGLang's older `/get_load`).
    pub fn stepping(&self) -> Option<Stepping> {
        let kv_usage = self.ranks.iter().map(|r| r.kv_usage).sum();
        if let Some(generated) = self.generation_tokens() {
            let prompt: f64 = self.ranks.iter().filter_map(|r| r.prompt_tokens).sum();
            return Some(Stepping {
                tokens: generated + prompt,
                kv_usage,
            });
        }
        let used: Option<u64> = self.ranks.iter().map(|r| r.used_tokens).sum();
        let to_prefill: u64 = self
            .ranks
            .iter()
            .filter_map(|r| r.pending_prefill_tokens)
            .sum();
        used.map(|used| Stepping {
            tokens: (used + to_prefill) as f64,
            kv_usage,
        })
    }

    /// Every rank is asleep: the engine serves nothing until woken.
    pub fn asleep(&self) -> bool {
        !self.ranks.is_empty() && self.ranks.iter().all(|r| r.asleep)
    }

    /// Requests preempted since `previous` (vLLM's counter rose), or retracted lately (SGLang):
    /// the engine admitted more than its KV cache holds.
    pub fn preempted_since(&self, previous: Option<&LoadReport>) -> u64 {
        let retracted: u64 = self.ranks.iter().filter_map(|r| r.retracted).sum();
        let counted = |r: &LoadReport| -> Option<f64> {
            r.ranks.iter().map(|x| x.preemptions).sum::<Option<f64>>()
        };
        let rose = match (counted(self), previous.and_then(counted)) {
            (Some(now), Some(before)) if now > before => (now - before) as u64,
            _ => 0,
        };
        retracted + rose
    }

    /// What the engine found in its prefix cache since `previous`: its counters' moves (vLLM),
    /// else its own recent rate averaged over the ranks that report one (SGLang); `None` when
    /// it reports neither, looked nothing up, or its counters went back (a restart).
    pub fn prefix_found_since(&self, previous: Option<&LoadReport>) -> Option<EngineHits> {
        let counted = |r: &LoadReport| -> Option<(f64, f64)> {
            let sum = |f: fn(&RankLoad) -> Option<f64>| r.ranks.iter().map(f).sum::<Option<f64>>();
            Some((sum(|x| x.prefix_queries)?, sum(|x| x.prefix_hits)?))
        };
        if let Some((queries, hits)) = counted(self) {
            let (q0, h0) = previous.and_then(counted)?;
            let (looked_up, found) = (queries - q0, hits - h0);
            return (looked_up > 0.0 && found >= 0.0).then(|| EngineHits {
                tokens: Some(looked_up),
                share: (found / looked_up).clamp(0.0, 1.0),
            });
        }
        let rates: Vec<f64> = self.ranks.iter().filter_map(|r| r.cache_hit_rate).collect();
        (!rates.is_empty()).then(|| EngineHits {
            tokens: None,
            share: fraction(rates.iter().sum::<f64>() / rates.len() as f64),
        })
    }
}

/// Why a payload gave no report.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LoadError {
    #[error("not Prometheus text: {0}")]
    Metrics(#[from] prom_text::ParseError),
    #[error("not a load report: {0}")]
    Json(String),
    #[error("the report has no rank")]
    Empty,
}

fn count(x: f64) -> u64 {
    if x.is_finite() && x > 0.0 {
        x as u64
    } else {
        0
    }
}

fn fraction(x: f64) -> f64 {
    if x.is_finite() {
        x.clamp(0.0, 1.0)
    } else {
        0.0
    }
}

fn non_empty(
    mut ranks: Vec<RankLoad>,
    dropped: Vec<&'static str>,
) -> Result<LoadReport, LoadError> {
    if ranks.is_empty() {
        return Err(LoadError::Empty);
    }
    ranks.sort_by_key(|r| r.rank);
    let mut dropped = dropped;
    dropped.sort_unstable();
    dropped.dedup();
    Ok(LoadReport {
        ranks,
        dropped,
        adapters: None,
    })
}

#[cfg(test)]
mod tests;
