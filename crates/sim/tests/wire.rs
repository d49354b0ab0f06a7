#![allow(clippy::unwrap_used)] // test support: a failed step is the test failing
//! The simulated engine on the wire: what vLLM and SGLang clients and gateways see.

mod common;

use common::*;
use serde_json::{json, Value};
use sluice_sim::Flavor;

#[tokio::test]
async fn a_chat_stream_parses_as_sse_and_ends_with_done() {
    let fleet = fleet(instant(Flavor::Vllm)).await;
    let url = format!("{}/v1/chat/completions", fleet.urls()[0]);
    let body = json!({
        "model": "test-model", "messages": [{"role": "user", "content": "hello there"}],
        "stream": true, "stream_options": {"include_usage": true}, "max_tokens": 12,
    });
    let answer = post(&client(), &url, &body.to_string()).await;
    assert_eq!(answer.status, 200);
    assert!(answer.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let events = answer.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let content: Vec<&Value> = chunks
        .iter()
        .filter(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|t| !t.is_empty())
        })
        .collect();
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(chunks.last().unwrap()["choices"], json!([]));
    assert_eq!(
        usage["completion_tokens"].as_u64().unwrap(),
        content.len() as u64
    );
    assert!(content.len() <= 12);
    let finish = &chunks[chunks.len() - 2]["choices"][0]["finish_reason"];
    assert!(finish == "stop" || finish == "length");
    // "user" + 11 bytes of content = 15 bytes = 4 tokens, + 4 for the message + 3 to prime.
    assert_eq!(usage["prompt_tokens"], 11);
}

#[tokio::test]
async fn completions_stream_one_chunk_per_token_and_honour_ignore_eos() {
    let fleet = fleet(instant(Flavor::Sglang)).await;
    let url = format!("{}/v1/completions", fleet.urls()[0]);
    let body = json!({"model": "test-model", "prompt": [1, 2, 3], "stream": true,
                      "max_tokens": 9, "ignore_eos": true});
    let events = post(&client(), &url, &body.to_string()).await.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let tokens = events
        .iter()
        .filter(|e| e.contains("\"finish_reason\":null"))
        .count();
    assert_eq!(tokens, 9);
    let last: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(last["object"], "text_completion");
    assert_eq!(last["choices"][0]["finish_reason"], "length");
}

#[tokio::test]
async fn a_non_streaming_answer_has_every_choice_and_its_usage() {
    let fleet = fleet(instant(Flavor::Vllm)).await;
    let url = format!("{}/v1/completions", fleet.urls()[0]);
    let body =
        json!({"model": "test-model", "prompt": ["abcd", "abcdefgh"], "n": 2, "max_tokens": 5});
    let answer = post(&client(), &url, &body.to_string()).await.json();
    let choices = answer["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4, "two prompts, two choices each");
    let indexes: Vec<u64> = choices
        .iter()
        .map(|c| c["index"].as_u64().unwrap())
        .collect();
    assert_eq!(indexes, vec![0, 1, 2, 3]);
    assert_eq!(answer["usage"]["prompt_tokens"], 2 * (1 + 2));
    assert!(answer["id"].as_str().unwrap().starts_with("cmpl-"));
    let same = post(&client(), &url, &body.to_string()).await.json();
    assert_eq!(
        same["choices"], answer["choices"],
        "answers are reproducible"
    );
}

#[tokio::test]
async fn models_name_the_owner_each_gateway_detects() {
    for (flavor, owner) in [(Flavor::Vllm, "vllm"), (Flavor::Sglang, "sglang")] {
        let fleet = fleet(instant(flavor)).await;
        let models = get(&client(), &format!("{}/v1/models", fleet.urls()[0]))
            .await
            .json();
        assert_eq!(models["object"], "list");
        assert_eq!(models["data"][0]["id"], "test-model");
        assert_eq!(models["data"][0]["owned_by"], owner);
        assert_eq!(models["data"][0]["max_model_len"], 32768);
    }
}

use sluice_core::prom_text::{self, Exposition};

fn parse_metrics(text: &str) -> Exposition {
    prom_text::parse(text).unwrap_or_else(|e| panic!("not Prometheus text ({e}):\n{text}"))
}

/// The value of the sample of `name` whose `label` is `value`.
fn value_of(metrics: &Exposition, name: &str, label: &str, value: &str) -> Option<f64> {
    metrics
        .named(name)
        .find(|s| s.label(label) == Some(value))
        .map(|s| s.value)
}

#[tokio::test]
async fn vllm_metrics_parse_and_carry_one_series_per_rank() {
    let mut cfg = instant(Flavor::Vllm);
    cfg.dp_size = 2;
    let fleet = fleet(cfg).await;
    let base = &fleet.urls()[0];
    let c = client();
    post(
        &c,
        &format!("{base}/v1/completions"),
        r#"{"model":"test-model","prompt":"hi","max_tokens":3,"ignore_eos":true}"#,
    )
    .await;
    let text = get(&c, &format!("{base}/metrics")).await.text();
    let metrics = parse_metrics(&text);
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:cache_config_info",
    ] {
        for engine in ["0", "1"] {
            assert!(
                value_of(&metrics, name, "engine", engine).is_some(),
                "{name} for engine {engine}"
            );
        }
    }
    let generated: f64 = ["0", "1"]
        .iter()
        .filter_map(|e| value_of(&metrics, "vllm:generation_tokens_total", "engine", e))
        .sum();
    assert_eq!(generated, 3.0);
    assert_eq!(
        value_of(&metrics, "vllm:cache_config_info", "block_size", "16"),
        Some(1.0)
    );
    assert_eq!(
        value_of(
            &metrics,
            "vllm:cache_config_info",
            "num_gpu_blocks",
            "4000000"
        ),
        Some(1.0)
    );
    assert!(value_of(
        &metrics,
        "vllm:num_requests_running",
        "model_name",
        "test-model"
    )
    .is_some());
    for histogram in [
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
    ] {
        assert_eq!(
            metrics.types.get(histogram),
            Some(&prom_text::MetricType::Histogram)
        );
        let bucket = format!("{histogram}_bucket");
        let inf = metrics
            .named(&bucket)
            .find(|s| s.label("le") == Some("+Inf"));
        assert!(inf.is_some(), "{histogram} has its +Inf bucket");
    }
    assert_eq!(
        value_of(
            &metrics,
            "vllm:request_success_total",
            "finished_reason",
            "length"
        ),
        Some(1.0)
    );
}

#[tokio::test]
async fn sglang_reports_load_per_rank_and_its_server_info() {
    let mut cfg = instant(Flavor::Sglang);
    cfg.dp_size = 2;
    let fleet = fleet(cfg).await;
    let base = &fleet.urls()[0];
    let c = client();
    let loads = get(&c, &format!("{base}/v1/loads?include=core"))
        .await
        .json();
    let ranks = loads["loads"].as_array().unwrap();
    assert_eq!(ranks.len(), 2);
    for (i, rank) in ranks.iter().enumerate() {
        assert_eq!(rank["dp_rank"], i);
        for field in [
            "num_running_reqs",
            "num_waiting_reqs",
            "num_used_tokens",
            "max_total_num_tokens",
            "token_usage",
        ] {
            assert!(rank[field].is_number(), "{field}");
        }
    }
    assert!(loads["aggregate"]["total_waiting_reqs"].is_number());
    let legacy = get(&c, &format!("{base}/get_load")).await.json();
    assert_eq!(legacy.as_array().unwrap().len(), 2);
    assert!(legacy[1]["num_reqs"].is_number());
    let info = get(&c, &format!("{base}/server_info")).await.json();
    assert_eq!(info["dp_size"], 2);
    assert!(info["max_running_requests"].is_number());
    let metrics = parse_metrics(&get(&c, &format!("{base}/metrics")).await.text());
    assert_eq!(
        value_of(&metrics, "sglang:num_queue_reqs", "engine", "1"),
        Some(0.0)
    );
    assert_eq!(
        metrics.types.get("sglang:token_usage"),
        Some(&prom_text::MetricType::Gauge)
    );
}

#[tokio::test]
async fn vllm_answers_load_version_and_health() {
    let fleet = fleet(instant(Flavor::Vllm)).await;
    let base = &fleet.urls()[0];
    let c = client();
    assert_eq!(
        get(&c, &format!("{base}/load")).await.json(),
        json!({"server_load": 0})
    );
    assert!(get(&c, &format!("{base}/version")).await.json()["version"].is_string());
    let health = get(&c, &format!("{base}/health")).await;
    assert_eq!((health.status, health.body.len()), (200, 0));
}

/// Bad input to each flavor, and the shape of its answer.
#[tokio::test]
async fn bad_input_gets_each_flavors_error_shape() {
    for flavor in [Flavor::Vllm, Flavor::Sglang] {
        let mut cfg = instant(flavor);
        cfg.max_model_len = 100;
        let fleet = fleet(cfg).await;
        let base = &fleet.urls()[0];
        let c = client();
        let chat = format!("{base}/v1/chat/completions");
        let error = |answer: &Answer| -> Value {
            let body = answer.json();
            match flavor {
                Flavor::Vllm => body["error"].clone(),
                Flavor::Sglang => {
                    assert_eq!(body["object"], "error");
                    body
                }
            }
        };
        let cases = [
            ("{not json", 400),
            (
                r#"{"model":"other","messages":[{"role":"user","content":"x"}]}"#,
                404,
            ),
            (r#"{"model":"test-model"}"#, 400),
        ];
        for (body, status) in cases {
            let answer = post(&c, &chat, body).await;
            assert_eq!(answer.status, status, "{flavor:?} {body}");
            let e = error(&answer);
            assert_eq!(e["code"], status, "{flavor:?} {body}");
            assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()));
            assert!(e["type"].is_string());
        }
        let long = json!({"model": "test-model", "prompt": "x".repeat(4 * 200)});
        let answer = post(&c, &format!("{base}/v1/completions"), &long.to_string()).await;
        assert_eq!(answer.status, 400);
        let message = error(&answer)["message"].as_str().unwrap().to_string();
        assert!(message.contains("context length"), "{message}");

        let unknown = get(&c, &format!("{base}/v2/nothing")).await;
        assert_eq!(
            (unknown.status, unknown.json()),
            (404, json!({"detail": "Not Found"}))
        );
        let wrong_method = get(&c, &chat).await;
        assert_eq!(wrong_method.status, 405);
    }
}

#[tokio::test]
async fn an_api_key_guards_the_openai_routes_only() {
    let mut cfg = instant(Flavor::Vllm);
    cfg.api_key = Some("sekret".into());
    let fleet = fleet(cfg).await;
    let base = &fleet.urls()[0];
    let c = client();
    let body = r#"{"model":"test-model","prompt":"hi","max_tokens":1}"#;
    let url = format!("{base}/v1/completions");
    let denied = post(&c, &url, body).await;
    assert_eq!(
        (denied.status, denied.json()),
        (401, json!({"error": "Unauthorized"}))
    );
    let allowed = send(
        &c,
        "POST",
        &url,
        Some(body),
        &[("authorization", "Bearer sekret")],
    )
    .await;
    assert_eq!(allowed.status, 200);
    assert_eq!(get(&c, &format!("{base}/health")).await.status, 200);
    assert_eq!(get(&c, &format!("{base}/metrics")).await.status, 200);
}

#[tokio::test]
async fn a_reasoning_model_streams_its_thought_before_its_answer_unless_switched_off() {
    let mut cfg = instant(Flavor::Vllm);
    cfg.reasoning = Some(40);
    let fleet = fleet(cfg).await;
    let url = format!("{}/v1/chat/completions", fleet.urls()[0]);
    let ask = |extra: Value| {
        let mut body = json!({
            "model": "test-model", "messages": [{"role": "user", "content": "think"}],
            "stream": true, "stream_options": {"include_usage": true}, "max_tokens": 4000,
        });
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body.to_string()
    };
    let deltas = |answer: &Answer| -> Vec<&'static str> {
        answer
            .events()
            .iter()
            .filter_map(|e| serde_json::from_str::<Value>(e).ok())
            .filter_map(|c| {
                let delta = &c["choices"][0]["delta"];
                if delta["reasoning_content"].is_string() {
                    Some("thought")
                } else if delta["content"].as_str().is_some_and(|t| !t.is_empty()) {
                    Some("answer")
                } else {
                    None
                }
            })
            .collect()
    };
    let thinking = post(&client(), &url, &ask(json!({}))).await;
    let kinds = deltas(&thinking);
    let first_answer = kinds.iter().position(|k| *k == "answer").unwrap();
    assert!(first_answer > 0, "thought first: {kinds:?}");
    assert!(kinds[first_answer..].iter().all(|k| *k == "answer"));
    let off = post(
        &client(),
        &url,
        &ask(json!({"chat_template_kwargs": {"enable_thinking": false}})),
    )
    .await;
    assert!(
        deltas(&off).iter().all(|k| *k == "answer"),
        "enable_thinking=false: no thought"
    );
    let whole = post(
        &client(),
        &url,
        &json!({"model": "test-model", "messages": [{"role": "user", "content": "think"}]})
            .to_string(),
    )
    .await
    .json();
    assert!(whole["choices"][0]["message"]["reasoning_content"].is_string());
}

#[tokio::test]
async fn one_fleet_serves_two_models_of_different_profiles() {
    let big = {
        let mut cfg = instant(Flavor::Vllm);
        cfg.model = "big".into();
        cfg
    };
    let mut small = sluice_sim::EngineConfig::new(
        Flavor::Vllm,
        "small",
        sluice_sim::profile::Profile::named("llama3-8b-h100").unwrap(),
    );
    small.time_scale = 1000.0;
    let fleet = sluice_sim::SimFleet::start(sluice_sim::FleetConfig::local(1, big).also(2, small))
        .await
        .unwrap();
    let urls = fleet.urls();
    assert_eq!(urls.len(), 3);
    let served: Vec<String> = futures_util::future::join_all(urls.iter().map(|url| async move {
        let models = get(&client(), &format!("{url}/v1/models")).await.json();
        models["data"][0]["id"].as_str().unwrap().to_string()
    }))
    .await;
    assert_eq!(served, ["big", "small", "small"]);
    assert_eq!(fleet.engines()[2].config().profile.name, "llama3-8b-h100");
}

/// Two chats with the same long system prompt and different questions.
async fn two_chats_sharing_a_system_prompt(c: &HttpClient, base: &str) {
    let system = "You are a careful assistant. ".repeat(40);
    for question in ["What is a KV cache?", "Why share a prefix?"] {
        let body = json!({"model": "test-model", "max_tokens": 2, "messages": [
            {"role": "system", "content": system}, {"role": "user", "content": question}]});
        let answer = post(c, &format!("{base}/v1/chat/completions"), &body.to_string()).await;
        assert_eq!(answer.status, 200);
    }
}

#[tokio::test]
async fn vllm_counts_prefix_cache_queries_and_hits_in_tokens() {
    let fleet = fleet(instant(Flavor::Vllm)).await;
    let base = &fleet.urls()[0];
    let c = client();
    two_chats_sharing_a_system_prompt(&c, base).await;
    let metrics = parse_metrics(&get(&c, &format!("{base}/metrics")).await.text());
    let queries = value_of(&metrics, "vllm:prefix_cache_queries_total", "engine", "0").unwrap();
    let hits = value_of(&metrics, "vllm:prefix_cache_hits_total", "engine", "0").unwrap();
    // "system" + 1,160 bytes = 292 tokens after 2 of template: 18 full blocks of 16 are shared.
    assert_eq!(hits, 18.0 * 16.0);
    assert!(
        queries > 2.0 * 294.0,
        "both prompts are looked up whole: {queries}"
    );
    assert_eq!(
        value_of(
            &metrics,
            "vllm:cache_config_info",
            "enable_prefix_caching",
            "True"
        ),
        Some(1.0)
    );
}

#[tokio::test]
async fn sglang_reports_its_cache_hit_rate_and_an_engine_without_prefix_caching_hits_nothing() {
    let sglang = fleet(instant(Flavor::Sglang)).await;
    let base = &sglang.urls()[0];
    let c = client();
    two_chats_sharing_a_system_prompt(&c, base).await;
    let loads = get(&c, &format!("{base}/v1/loads")).await.json();
    let rate = loads["loads"][0]["cache_hit_rate"].as_f64().unwrap();
    assert!(
        rate > 0.4 && rate < 0.5,
        "288 of about 600 prompt tokens: {rate}"
    );
    let legacy = get(&c, &format!("{base}/get_load")).await.json();
    assert!(
        legacy[0]["dp_rank"].is_null() && legacy[0].get("cache_hit_rate").is_none(),
        "the older shape names no rank when there is one, and has no hit rate: {legacy}"
    );
    let metrics = parse_metrics(&get(&c, &format!("{base}/metrics")).await.text());
    assert_eq!(
        value_of(&metrics, "sglang:cache_hit_rate", "engine", "0"),
        Some(rate)
    );

    let mut cfg = instant(Flavor::Vllm);
    cfg.prefix_caching = false;
    let off = fleet(cfg).await;
    let base = &off.urls()[0];
    two_chats_sharing_a_system_prompt(&c, base).await;
    let metrics = parse_metrics(&get(&c, &format!("{base}/metrics")).await.text());
    assert_eq!(
        value_of(&metrics, "vllm:prefix_cache_hits_total", "engine", "0"),
        Some(0.0)
    );
    assert_eq!(
        value_of(
            &metrics,
            "vllm:cache_config_info",
            "enable_prefix_caching",
            "False"
        ),
        Some(1.0)
    );
}
