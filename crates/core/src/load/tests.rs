//! The parsers on hand-made payloads and on the wire-conformance fixtures (`fixtures/engines/`,
//! each written from the engine's source: see its `index.toml`).

use super::*;

/// A fixture's text, by its path under `fixtures/engines/`.
fn fixture(path: &str) -> String {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/engines/");
    std::fs::read_to_string(format!("{root}{path}"))
        .unwrap_or_else(|e| panic!("fixture {path}: {e}"))
}

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
    assert_eq!(r.stepping().map(|s| s.tokens), Some(124110.0 + 5000.0));
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
    let r =
        parse_sglang_loads(br#"{"loads":[{"num_waiting_reqs":-3,"token_usage":7.5}]}"#).unwrap();
    assert_eq!((r.ranks[0].waiting, r.ranks[0].kv_usage), (0, 1.0));
    let v =
        parse_vllm_metrics("vllm:num_requests_waiting -2\nvllm:kv_cache_usage_perc NaN\n").unwrap();
    assert_eq!((v.ranks[0].waiting, v.ranks[0].kv_usage), (0, 0.0));
}

#[test]
fn vllm_pd_decode_waits_for_capacity_apart_from_its_deferred_requests() {
    let r = parse_vllm_metrics(&fixture("vllm/metrics-pd-decode.prom")).unwrap();
    let r0 = &r.ranks[0];
    assert_eq!((r0.waiting, r0.deferred, r0.running), (2, 12, 24));
    assert_eq!(r.waiting(), 2, "the ceiling reads the capacity queue");
    assert_eq!(
        r.in_hand(),
        38,
        "the deferred ones are in hand all the same"
    );
    assert_eq!(
        r0.preemptions,
        Some(3.0),
        "the counter, not its _created series"
    );
    assert!(!r.asleep());
    assert_eq!(r0.kv_capacity, Some(29205));
}

#[test]
fn vllm_without_reasons_waits_with_everything_it_reports() {
    let text = "vllm:num_requests_waiting{engine=\"0\"} 7\n";
    let r = parse_vllm_metrics(text).unwrap();
    assert_eq!((r.waiting(), r.ranks[0].deferred), (7, 0));
    let deferred_only =
        "vllm:num_requests_waiting 7\nvllm:num_requests_waiting_by_reason{reason=\"deferred\"} 5\n";
    let r = parse_vllm_metrics(deferred_only).unwrap();
    assert_eq!((r.waiting(), r.ranks[0].deferred), (2, 5));
}

#[test]
fn vllm_asleep_is_read_from_the_awake_series() {
    let r = parse_vllm_metrics(&fixture("vllm/metrics-asleep.prom")).unwrap();
    assert!(r.asleep());
    assert_eq!((r.running(), r.waiting()), (0, 0), "it looks idle");
    let awake = parse_vllm_metrics(&fixture("vllm/metrics-pd-decode.prom")).unwrap();
    assert!(!awake.asleep());
}

#[test]
fn vllm_long_prefill_moves_the_kv_usage_while_the_counters_stand() {
    let first = parse_vllm_metrics(&fixture("vllm/metrics-long-prefill-1.prom")).unwrap();
    let second = parse_vllm_metrics(&fixture("vllm/metrics-long-prefill-2.prom")).unwrap();
    let (a, b) = (first.stepping().unwrap(), second.stepping().unwrap());
    assert_eq!(
        a.tokens, b.tokens,
        "no token counted until the prefill ends"
    );
    assert_ne!(a, b, "the scheduler stepped: its KV usage grew");
    assert_eq!(
        first.stepping(),
        first.clone().stepping(),
        "the same report: no step"
    );
}

#[test]
fn preemptions_are_the_rise_of_vllm_counter_or_sglang_retracted_requests() {
    let before = parse_vllm_metrics("vllm:num_preemptions_total 3\n").unwrap();
    let after = parse_vllm_metrics("vllm:num_preemptions_total 5\n").unwrap();
    assert_eq!(after.preempted_since(Some(&before)), 2);
    assert_eq!(after.preempted_since(Some(&after)), 0);
    assert_eq!(
        after.preempted_since(None),
        0,
        "a first report says nothing"
    );
    let retracting =
        parse_sglang_loads(fixture("sglang/v1-loads-retracting.json").as_bytes()).unwrap();
    assert_eq!(retracting.preempted_since(None), 4);
}

/// vLLM's two prefix-cache counters on two data-parallel ranks (`vllm:prefix_cache_queries`
/// and `vllm:prefix_cache_hits`, vllm/v1/metrics/loggers.py, counters with the engine label).
fn vllm_prefix(queries: [f64; 2], hits: [f64; 2]) -> LoadReport {
    let text = format!(
        "vllm:prefix_cache_queries_total{{engine=\"0\"}} {}\n\
         vllm:prefix_cache_queries_total{{engine=\"1\"}} {}\n\
         vllm:prefix_cache_hits_total{{engine=\"0\"}} {}\n\
         vllm:prefix_cache_hits_total{{engine=\"1\"}} {}\n",
        queries[0], queries[1], hits[0], hits[1]
    );
    parse_vllm_metrics(&text).unwrap()
}

#[test]
fn what_the_engine_found_in_its_prefix_cache_is_the_move_of_its_counters_or_its_rate() {
    let before = vllm_prefix([1000.0, 500.0], [100.0, 0.0]);
    let after = vllm_prefix([3000.0, 1500.0], [700.0, 300.0]);
    assert_eq!(before.ranks[1].prefix_queries, Some(500.0));
    assert_eq!(
        after.prefix_found_since(Some(&before)),
        Some(crate::latency::EngineHits {
            tokens: Some(3000.0),
            share: 900.0 / 3000.0
        })
    );
    assert_eq!(
        after.prefix_found_since(None),
        None,
        "a first report says nothing"
    );
    assert_eq!(
        after.prefix_found_since(Some(&after)),
        None,
        "nothing looked up"
    );
    assert_eq!(
        before.prefix_found_since(Some(&after)),
        None,
        "counters that went back: a restart"
    );
    let retracting =
        parse_sglang_loads(fixture("sglang/v1-loads-retracting.json").as_bytes()).unwrap();
    let found = retracting.prefix_found_since(None).unwrap();
    assert_eq!((found.tokens, found.share), (None, 0.2));
    let none = parse_vllm_metrics("vllm:num_requests_running 1\n").unwrap();
    assert_eq!(none.prefix_found_since(Some(&none)), None);
}

#[test]
fn sglang_decode_waits_in_its_own_queue_apart_from_the_transfer_queues() {
    let r = parse_sglang_loads(fixture("sglang/v1-loads-decode.json").as_bytes()).unwrap();
    let r0 = &r.ranks[0];
    assert_eq!((r0.waiting, r0.deferred, r0.running), (3, 37, 96));
    assert_eq!(r.in_hand(), 136);
    assert!(r.dropped.is_empty(), "{:?}", r.dropped);
    let without_sections = br#"{"loads":[{"dp_rank":0,"num_running_reqs":96,"num_waiting_reqs":40,"queues":{"waiting":3}}]}"#;
    let r = parse_sglang_loads(without_sections).unwrap();
    assert_eq!(
        (r.waiting(), r.ranks[0].deferred),
        (3, 37),
        "from queues.waiting alone"
    );
}

#[test]
fn sglang_chunked_prefill_is_in_hand_though_in_neither_count() {
    let r = parse_sglang_loads(fixture("sglang/v1-loads-chunked-prefill.json").as_bytes()).unwrap();
    assert_eq!((r.running(), r.waiting()), (0, 0));
    assert_eq!(r.ranks[0].pending_prefill_tokens, Some(112_640));
    assert_eq!(r.in_hand(), 1, "the request in chunked prefill");
}

#[test]
fn sglang_long_prefill_moves_its_kv_tokens_and_its_tokens_to_prefill_with_every_chunk() {
    let first = parse_sglang_loads(fixture("sglang/v1-loads-chunked-prefill.json").as_bytes());
    let second = parse_sglang_loads(fixture("sglang/v1-loads-chunked-prefill-2.json").as_bytes());
    let (first, second) = (first.unwrap(), second.unwrap());
    let (a, b) = (first.stepping().unwrap(), second.stepping().unwrap());
    assert_ne!(a, b, "the scheduler stepped");
    assert_eq!(
        first.stepping(),
        first.clone().stepping(),
        "a snapshot that stands"
    );
    let old = parse_sglang_get_load(br#"[{"dp_rank":0,"num_reqs":3,"num_waiting_reqs":1}]"#);
    assert_eq!(
        old.unwrap().stepping(),
        None,
        "/get_load gives no such signal"
    );
}

#[test]
fn sglang_a_malformed_field_is_dropped_and_the_report_stands() {
    let r = parse_sglang_loads(fixture("sglang/v1-loads-malformed-field.json").as_bytes()).unwrap();
    assert_eq!(r.waiting(), 50, "the queue still counts");
    assert_eq!(
        r.ranks[0].kv_usage, 0.0,
        "the spoiled field reads as unreported"
    );
    assert_eq!(
        r.ranks[0].gen_throughput, None,
        "null is unreported, not malformed"
    );
    assert_eq!(r.dropped, ["token_usage"]);
}

#[test]
fn sglang_get_load_with_a_null_rank_is_read() {
    let r = parse_sglang_get_load(fixture("sglang/get-load-dp-null.json").as_bytes()).unwrap();
    assert_eq!((r.ranks[0].rank, r.waiting(), r.running()), (0, 50, 5));
    assert!(r.dropped.is_empty());
    let spoiled =
        parse_sglang_get_load(br#"[{"dp_rank":"x","num_reqs":3,"num_waiting_reqs":1}]"#).unwrap();
    assert_eq!((spoiled.ranks[0].rank, spoiled.waiting()), (0, 1));
    assert_eq!(spoiled.dropped, ["dp_rank"]);
}

#[test]
fn every_fixture_names_its_source() {
    let index = fixture("index.toml");
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/engines");
    for engine in ["vllm", "sglang"] {
        for entry in std::fs::read_dir(format!("{root}/{engine}")).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            let listed = format!("file = \"{engine}/{name}\"");
            assert!(
                index.contains(&listed),
                "{engine}/{name} is not in index.toml"
            );
        }
    }
}

#[test]
fn vllm_lora_info_is_read_from_its_newest_series() {
    let r = parse_vllm_metrics(&fixture("vllm/metrics-lora.prom")).unwrap();
    let slots = r.adapters.expect("adapter slots");
    assert_eq!(slots.max, Some(2));
    assert_eq!(slots.running, vec!["sql".to_string(), "med".to_string()]);
    assert_eq!(slots.waiting, vec!["law".to_string()]);
    assert_eq!(slots.used, None);
    assert_eq!(r.ranks[0].running, 5);
}

#[test]
fn an_engine_without_adapters_reports_no_slots() {
    assert_eq!(parse_vllm_metrics(VLLM_DP2).unwrap().adapters, None);
    let r = parse_sglang_loads(fixture("sglang/v1-loads-decode.json").as_bytes()).unwrap();
    assert_eq!(r.adapters, None);
}

#[test]
fn sglang_adapter_slots_are_summed_over_ranks() {
    let r = parse_sglang_loads(fixture("sglang/v1-loads-lora.json").as_bytes()).unwrap();
    let slots = r.adapters.expect("adapter slots");
    assert_eq!(slots.max, Some(8));
    assert_eq!(slots.used, Some(7));
    assert!(slots.running.is_empty());
    assert_eq!(r.ranks.len(), 2);
}
