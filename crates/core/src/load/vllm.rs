//! vLLM's `/metrics` (Prometheus text): one rank per `engine` label (a series without it is
//! rank 0); series of several served models on one rank are summed.
//!
//! Read in vLLM's source (vllm/v1/metrics/loggers.py, `PrometheusStatLogger`):
//! `num_requests_waiting` is the waiting queue plus the "skipped" one, and recent releases split
//! it in `num_requests_waiting_by_reason{reason="capacity"|"deferred"}` — deferred being a
//! request held by a transient constraint (remote KV in a disaggregated decode, a LoRA budget),
//! not by a full batch. `engine_sleep_state` has one series per `sleep_state` label; `awake` 0
//! means asleep. `prefix_cache_queries` and `prefix_cache_hits` count prompt tokens looked up in
//! the prefix cache at admission and those found (vllm/v1/core/kv_cache_manager.py; the older
//! `gpu_prefix_cache_*` pair they replaced is not read). `lora_requests_info` is set to the current time at every step with the step's
//! adapters in its labels, and every label combination it ever had stays a series: the newest
//! value is the current one.

use std::collections::BTreeMap;

use super::{fraction, non_empty, LoadError, LoadReport, RankLoad};
use crate::lora::AdapterSlots;
use crate::prom_text;

/// What one rank's series said, before the waiting queue is settled.
#[derive(Default)]
struct Seen {
    load: RankLoad,
    /// `num_requests_waiting`, everything waiting.
    all_waiting: u64,
    /// `num_requests_waiting_by_reason{reason="capacity"}`, when served.
    capacity: Option<u64>,
    deferred: Option<u64>,
    /// `kv_cache_usage_perc` seen (it wins over the older `gpu_cache_usage_perc`).
    kv_current: bool,
}

/// vLLM `/metrics`.
pub fn parse_vllm_metrics(text: &str) -> Result<LoadReport, LoadError> {
    let exposition = prom_text::parse(text)?;
    let mut ranks: BTreeMap<u32, Seen> = BTreeMap::new();
    let mut adapters: Option<(f64, AdapterSlots)> = None;
    for s in &exposition.samples {
        let Some(field) = s.name.strip_prefix("vllm:") else {
            continue;
        };
        if field == "lora_requests_info" {
            if adapters.as_ref().is_none_or(|(at, _)| s.value > *at) {
                adapters = Some((s.value, adapter_slots(s)));
            }
            continue;
        }
        if !KNOWN.contains(&field) {
            continue;
        }
        let rank = s.label("engine").and_then(|e| e.parse().ok()).unwrap_or(0);
        let value = if s.value.is_finite() {
            s.value.max(0.0)
        } else {
            0.0
        };
        let seen = ranks.entry(rank).or_default();
        seen.load.rank = rank;
        let r = &mut seen.load;
        match field {
            "num_requests_waiting" => seen.all_waiting += value as u64,
            "num_requests_waiting_by_reason" => match s.label("reason") {
                Some("capacity") => *seen.capacity.get_or_insert(0) += value as u64,
                Some("deferred") => *seen.deferred.get_or_insert(0) += value as u64,
                _ => {}
            },
            "num_requests_running" => r.running += value as u64,
            "kv_cache_usage_perc" => {
                r.kv_usage = fraction(value);
                seen.kv_current = true;
            }
            "gpu_cache_usage_perc" if !seen.kv_current => r.kv_usage = fraction(value),
            "cache_config_info" => {
                r.kv_capacity = s.label("num_gpu_blocks").and_then(|b| b.parse().ok());
            }
            "generation_tokens_total" => *r.generation_tokens.get_or_insert(0.0) += value,
            "prompt_tokens_total" => *r.prompt_tokens.get_or_insert(0.0) += value,
            "num_preemptions_total" => *r.preemptions.get_or_insert(0.0) += value,
            "prefix_cache_queries_total" => *r.prefix_queries.get_or_insert(0.0) += value,
            "prefix_cache_hits_total" => *r.prefix_hits.get_or_insert(0.0) += value,
            "engine_sleep_state" if s.label("sleep_state") == Some("awake") => {
                r.asleep = value == 0.0;
            }
            _ => {}
        }
    }
    let ranks = ranks.into_values().map(settle).collect();
    let mut report = non_empty(ranks, Vec::new())?;
    report.adapters = adapters.map(|(_, slots)| slots);
    Ok(report)
}

/// One `lora_requests_info` series: the names are joined by commas, an empty label none.
fn adapter_slots(s: &prom_text::Sample) -> AdapterSlots {
    let names = |label| -> Vec<String> {
        s.label(label)
            .unwrap_or("")
            .split(',')
            .filter(|n| !n.is_empty())
            .map(str::to_string)
            .collect()
    };
    AdapterSlots {
        max: s.label("max_lora").and_then(|m| m.parse().ok()),
        running: names("running_lora_adapters"),
        waiting: names("waiting_lora_adapters"),
        used: None,
    }
}

const KNOWN: &[&str] = &[
    "num_requests_waiting",
    "num_requests_waiting_by_reason",
    "num_requests_running",
    "kv_cache_usage_perc",
    "gpu_cache_usage_perc",
    "cache_config_info",
    "generation_tokens_total",
    "prompt_tokens_total",
    "num_preemptions_total",
    "prefix_cache_queries_total",
    "prefix_cache_hits_total",
    "engine_sleep_state",
];

/// The waiting queue that means overload: the `capacity` reason where the engine splits its
/// queue, else all of it (older releases have no deferred requests to tell apart).
fn settle(seen: Seen) -> RankLoad {
    let mut load = seen.load;
    match (seen.capacity, seen.deferred) {
        (Some(capacity), deferred) => {
            load.waiting = capacity;
            load.deferred = deferred.unwrap_or(0);
        }
        (None, Some(deferred)) => {
            load.deferred = deferred;
            load.waiting = seen.all_waiting.saturating_sub(deferred);
        }
        (None, None) => load.waiting = seen.all_waiting,
    }
    load
}
