//! Engine load reports: what vLLM's `/metrics` and SGLang's `/v1/loads` (or `/get_load`) say
//! about each data-parallel rank, parsed into one shape.
//!
//! A field an engine leaves out reads as 0 (so a signal it does not report never trips a
//! ceiling); a payload with no rank at all is `LoadError::Empty`, which the overload check treats
//! as no opinion.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::prom_text;

/// One data-parallel rank's load.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RankLoad {
    pub rank: u32,
    /// Requests in the engine's waiting queue.
    pub waiting: u64,
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
    /// Tokens generated since the engine started (vLLM `generation_tokens_total`): two reports
    /// with requests in hand and the same count (prompt tokens included) mean the engine made no
    /// progress.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation_tokens: Option<f64>,
    /// Prompt tokens processed since the engine started (vLLM `prompt_tokens_total`), so a long
    /// prefill, which generates nothing, still counts as progress.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<f64>,
    /// Tokens per second, when the engine reports it (SGLang `gen_throughput`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gen_throughput: Option<f64>,
}

/// One report: every rank of one worker, ordered by rank.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LoadReport {
    pub ranks: Vec<RankLoad>,
}

impl LoadReport {
    /// Waiting requests summed over ranks (the queue signal).
    pub fn waiting(&self) -> u64 {
        self.ranks.iter().map(|r| r.waiting).sum()
    }

    pub fn running(&self) -> u64 {
        self.ranks.iter().map(|r| r.running).sum()
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

    /// Tokens processed (generated, plus prompt tokens where reported), when every rank
    /// reports generation: the engine's own progress counter.
    pub fn progress_tokens(&self) -> Option<f64> {
        let prompt: f64 = self.ranks.iter().filter_map(|r| r.prompt_tokens).sum();
        self.generation_tokens().map(|g| g + prompt)
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

/// vLLM `/metrics`: one rank per `engine` label (a series without it is rank 0). Series of
/// several served models on one rank are summed.
pub fn parse_vllm_metrics(text: &str) -> Result<LoadReport, LoadError> {
    let exposition = prom_text::parse(text)?;
    let mut ranks: BTreeMap<u32, RankLoad> = BTreeMap::new();
    let mut kv_seen: BTreeMap<u32, bool> = BTreeMap::new();
    for s in &exposition.samples {
        let Some(field) = s.name.strip_prefix("vllm:") else {
            continue;
        };
        let rank = s.label("engine").and_then(|e| e.parse().ok()).unwrap_or(0);
        let value = if s.value.is_finite() {
            s.value.max(0.0)
        } else {
            0.0
        };
        let known = matches!(
            field,
            "num_requests_waiting"
                | "num_requests_running"
                | "kv_cache_usage_perc"
                | "gpu_cache_usage_perc"
                | "cache_config_info"
                | "generation_tokens_total"
                | "prompt_tokens_total"
        );
        if !known {
            continue;
        }
        let r = ranks.entry(rank).or_insert_with(|| RankLoad {
            rank,
            ..RankLoad::default()
        });
        match field {
            "num_requests_waiting" => r.waiting += value as u64,
            "num_requests_running" => r.running += value as u64,
            // The newer name wins over the older one when an engine serves both.
            "kv_cache_usage_perc" => {
                r.kv_usage = value.min(1.0);
                kv_seen.insert(rank, true);
            }
            "gpu_cache_usage_perc" if !kv_seen.get(&rank).copied().unwrap_or(false) => {
                r.kv_usage = value.min(1.0);
            }
            "cache_config_info" => {
                r.kv_capacity = s.label("num_gpu_blocks").and_then(|b| b.parse().ok());
            }
            "generation_tokens_total" => {
                *r.generation_tokens.get_or_insert(0.0) += value;
            }
            "prompt_tokens_total" => {
                *r.prompt_tokens.get_or_insert(0.0) += value;
            }
            _ => {}
        }
    }
    non_empty(ranks.into_values().collect())
}

#[derive(Deserialize)]
struct SglangLoads {
    loads: Vec<SglangRank>,
}

#[derive(Deserialize)]
struct SglangRank {
    #[serde(default)]
    dp_rank: u32,
    #[serde(default)]
    num_running_reqs: f64,
    #[serde(default)]
    num_waiting_reqs: f64,
    #[serde(default)]
    token_usage: f64,
    #[serde(default)]
    max_total_num_tokens: Option<f64>,
    #[serde(default)]
    max_running_requests: Option<f64>,
    #[serde(default)]
    gen_throughput: Option<f64>,
}

/// SGLang `GET /v1/loads`: one entry per rank under `loads` (an `aggregate` object is ignored;
/// the ranks say the same).
pub fn parse_sglang_loads(body: &[u8]) -> Result<LoadReport, LoadError> {
    let loads: SglangLoads =
        serde_json::from_slice(body).map_err(|e| LoadError::Json(e.to_string()))?;
    let ranks = loads
        .loads
        .into_iter()
        .map(|l| RankLoad {
            rank: l.dp_rank,
            waiting: count(l.num_waiting_reqs),
            running: count(l.num_running_reqs),
            kv_usage: fraction(l.token_usage),
            kv_capacity: l.max_total_num_tokens.map(count),
            max_running: l.max_running_requests.map(count),
            generation_tokens: None,
            prompt_tokens: None,
            gen_throughput: l.gen_throughput.filter(|t| t.is_finite()),
        })
        .collect();
    non_empty(sorted(ranks))
}

#[derive(Deserialize)]
#[serde(untagged)]
enum SglangGetLoad {
    Ranks(Vec<SglangGetLoadRank>),
    Total { load: f64 },
}

#[derive(Deserialize)]
struct SglangGetLoadRank {
    #[serde(default)]
    dp_rank: u32,
    /// Running plus waiting.
    #[serde(default)]
    num_reqs: f64,
    #[serde(default)]
    num_waiting_reqs: f64,
}

/// SGLang `GET /get_load`, the older endpoint: per rank `num_reqs` (running + waiting) and
/// `num_waiting_reqs`, or in its oldest form one `{"load": N}` of requests in flight. No KV usage.
pub fn parse_sglang_get_load(body: &[u8]) -> Result<LoadReport, LoadError> {
    let parsed: SglangGetLoad =
        serde_json::from_slice(body).map_err(|e| LoadError::Json(e.to_string()))?;
    let ranks = match parsed {
        SglangGetLoad::Ranks(ranks) => ranks
            .into_iter()
            .map(|r| {
                let waiting = count(r.num_waiting_reqs);
                RankLoad {
                    rank: r.dp_rank,
                    waiting,
                    running: count(r.num_reqs).saturating_sub(waiting),
                    ..RankLoad::default()
                }
            })
            .collect(),
        SglangGetLoad::Total { load } => vec![RankLoad {
            running: count(load),
            ..RankLoad::default()
        }],
    };
    non_empty(sorted(ranks))
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

fn sorted(mut ranks: Vec<RankLoad>) -> Vec<RankLoad> {
    ranks.sort_by_key(|r| r.rank);
    ranks
}

fn non_empty(ranks: Vec<RankLoad>) -> Result<LoadReport, LoadError> {
    if ranks.is_empty() {
        Err(LoadError::Empty)
    } else {
        Ok(LoadReport { ranks })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shaped like a data-parallel vLLM 0.11 `/metrics` (HELP/TYPE lines, `_created` series,
    /// histograms and other families around the ones that matter).
    const VLLM_DP2: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 8.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 6.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.42
vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.9
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 123456.0
vllm:generation_tokens_total{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 654.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 5000.0
# HELP vllm:generation_tokens_created Number of generation tokens processed.
# TYPE vllm:generation_tokens_created gauge
vllm:generation_tokens_created{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.7e9
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_gpu_blocks="29205"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="1",gpu_memory_utilization="0.9",num_gpu_blocks="29205"} 1.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 42.0
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 1234.0
"#;

    #[test]
    fn vllm_ranks_come_from_the_engine_label() {
        let r = parse_vllm_metrics(VLLM_DP2).unwrap();
        assert_eq!(r.ranks.len(), 2);
        let r0 = &r.ranks[0];
        assert_eq!(
            (r0.rank, r0.waiting, r0.running, r0.kv_usage),
            (0, 3, 8, 0.42)
        );
        assert_eq!(r0.kv_capacity, Some(29205));
        assert_eq!(r0.generation_tokens, Some(123456.0));
        assert_eq!(r.waiting(), 3);
        assert_eq!(r.running(), 14);
        assert!((r.mean_kv_usage() - 0.66).abs() < 1e-9);
        assert_eq!(r.generation_tokens(), Some(124110.0));
        assert_eq!(r.progress_tokens(), Some(124110.0 + 5000.0));
    }

    #[test]
    fn older_vllm_names_and_missing_fields() {
        let old = "vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.5\nvllm:num_requests_waiting{model_name=\"m\"} 2\n";
        let r = parse_vllm_metrics(old).unwrap();
        assert_eq!(r.ranks.len(), 1);
        assert_eq!(
            (r.ranks[0].kv_usage, r.ranks[0].waiting, r.ranks[0].running),
            (0.5, 2, 0)
        );
        assert_eq!(
            r.generation_tokens(),
            None,
            "not reported: no silence signal"
        );
        let both = "vllm:kv_cache_usage_perc 0.25\nvllm:gpu_cache_usage_perc 0.75\n";
        assert_eq!(
            parse_vllm_metrics(both).unwrap().ranks[0].kv_usage,
            0.25,
            "the newer name wins"
        );
        let both_reversed = "vllm:gpu_cache_usage_perc 0.75\nvllm:kv_cache_usage_perc 0.25\n";
        assert_eq!(
            parse_vllm_metrics(both_reversed).unwrap().ranks[0].kv_usage,
            0.25
        );
    }

    #[test]
    fn a_vllm_payload_without_engine_metrics_is_empty() {
        assert_eq!(parse_vllm_metrics("python_info 1\n"), Err(LoadError::Empty));
        assert_eq!(parse_vllm_metrics(""), Err(LoadError::Empty));
        assert!(matches!(
            parse_vllm_metrics("{not metrics"),
            Err(LoadError::Metrics(_))
        ));
    }

    #[test]
    fn sglang_v1_loads_per_rank() {
        let body = br#"{"timestamp":"2026-11-30T01:43:20.861Z","version":"0.5.4","dp_rank_count":2,
            "loads":[{"dp_rank":1,"num_running_reqs":5,"num_waiting_reqs":2,"num_used_tokens":41000,"num_total_tokens":45000,"max_total_num_tokens":500000,"token_usage":0.082,"gen_throughput":1800.0,"cache_hit_rate":0.31,"max_running_requests":128},
                     {"dp_rank":0,"num_running_reqs":1,"num_waiting_reqs":0,"token_usage":0.5}],
            "aggregate":{"total_running_reqs":6,"total_waiting_reqs":2,"avg_token_usage":0.291}}"#;
        let r = parse_sglang_loads(body).unwrap();
        assert_eq!(r.ranks.iter().map(|r| r.rank).collect::<Vec<_>>(), [0, 1]);
        let r1 = &r.ranks[1];
        assert_eq!((r1.waiting, r1.running, r1.kv_usage), (2, 5, 0.082));
        assert_eq!(
            (r1.kv_capacity, r1.max_running, r1.gen_throughput),
            (Some(500000), Some(128), Some(1800.0))
        );
        assert_eq!(r.waiting(), 2);
        assert!((r.mean_kv_usage() - 0.291).abs() < 1e-9);
        assert_eq!(
            parse_sglang_loads(br#"{"loads":[]}"#),
            Err(LoadError::Empty)
        );
        assert!(matches!(
            parse_sglang_loads(b"<html>"),
            Err(LoadError::Json(_))
        ));
    }

    #[test]
    fn sglang_get_load_both_forms() {
        let r = parse_sglang_get_load(
            br#"[{"dp_rank":0,"num_reqs":7,"num_waiting_reqs":2,"num_tokens":45000}]"#,
        )
        .unwrap();
        assert_eq!(
            (r.ranks[0].running, r.ranks[0].waiting, r.ranks[0].kv_usage),
            (5, 2, 0.0)
        );
        let oldest = parse_sglang_get_load(br#"{"load": 4}"#).unwrap();
        assert_eq!((oldest.running(), oldest.waiting()), (4, 0));
        assert_eq!(parse_sglang_get_load(b"[]"), Err(LoadError::Empty));
    }

    #[test]
    fn nonsense_values_are_clamped() {
        let r = parse_sglang_loads(br#"{"loads":[{"num_waiting_reqs":-3,"token_usage":7.5}]}"#)
            .unwrap();
        assert_eq!((r.ranks[0].waiting, r.ranks[0].kv_usage), (0, 1.0));
        let v = parse_vllm_metrics("vllm:num_requests_waiting -2\nvllm:kv_cache_usage_perc NaN\n")
            .unwrap();
        assert_eq!((v.ranks[0].waiting, v.ranks[0].kv_usage), (0, 0.0));
    }
}
