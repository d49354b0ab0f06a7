//! Requests naming a LoRA adapter go where the adapter runs, then where a slot is free, before
//! the policy chooses: seen from the engines' own request counts.
#![allow(clippy::unwrap_used)]

mod common;

use common::pinned::fast_load;
use common::*;
use sluice_core::policy::Policy;
use sluice_gateway::fleet::WorkerSpec;
use sluice_sim::lora::{LoraSettings, FAST_LOAD};

/// A vLLM-shaped engine serving `sql` and `med` with one adapter slot (vLLM's default).
fn serving_adapters() -> EngineConfig {
    let mut engine = timed(Flavor::Vllm, 1.0);
    engine.lora = Some(LoraSettings::serving(&["sql", "med"], FAST_LOAD));
    engine
}

fn engine_running(s: &Setup) -> usize {
    let running: Vec<usize> = (0..2)
        .filter(|&i| s.sims.engines()[i].state().running > 0)
        .collect();
    assert_eq!(running.len(), 1, "one stream, one engine");
    running[0]
}

/// Round robin over two engines serving `sql` and `med` (`by_adapter`: routing by adapter on),
/// a `sql` stream held on one of them, then six more `sql` requests: the setup, the held stream,
/// the engine running `sql`, and how many of the six reached it.
async fn six_sql_requests(
    by_adapter: bool,
) -> (Setup, hyper::Response<hyper::body::Incoming>, usize, u64) {
    let s = start(2, serving_adapters(), |c| {
        c.route.policy = Policy::RoundRobin;
        c.route.by_adapter = by_adapter;
    })
    .await;
    let body = chat_body("sql", "a long answer", 4000, true);
    let held = open_stream_with(&s.client, &s.gateway, body, &[]).await;
    let runs_sql = engine_running(&s);
    let before = s.received();
    for i in 0..6 {
        let a = s.chat(&chat_body("sql", &format!("q{i}"), 1, false)).await;
        assert_eq!(a.status, 200, "{}", a.text());
    }
    let joined = s.received()[runs_sql] - before[runs_sql];
    (s, held, runs_sql, joined)
}

#[tokio::test]
async fn an_adapters_requests_join_it_where_it_runs_and_another_adapter_goes_where_a_slot_is_free()
{
    let (s, held, runs_sql, joined) = six_sql_requests(true).await;
    assert_eq!(joined, 6, "round robin would have split them");
    let after = s.received();
    let other = 1 - runs_sql;
    for i in 0..4 {
        let a = s.chat(&chat_body("med", &format!("m{i}"), 1, false)).await;
        assert_eq!(a.status, 200, "{}", a.text());
    }
    let last = s.received();
    assert_eq!(
        last[other] - after[other],
        4,
        "the engine whose one slot holds sql would make med wait: {after:?} -> {last:?}"
    );
    let base = s.chat(&chat_body("test-model", "base", 1, false)).await;
    assert_eq!(base.status, 200, "the base model is routed as before");
    drop(held);
}

#[tokio::test]
async fn workers_and_metrics_show_each_workers_adapters_and_slots() {
    let s = start(2, serving_adapters(), |c| {
        fast_load(c);
        c.route.policy = Policy::RoundRobin
    })
    .await;
    let body = chat_body("med", "a long answer", 4000, true);
    let held = open_stream_with(&s.client, &s.gateway, body, &[]).await;
    let runs = engine_running(&s);
    let workers = get_admin(&s.client, &s.url("/workers")).await.json();
    let shown: Vec<serde_json::Value> = workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["adapters_in_flight"].clone())
        .collect();
    assert_eq!(
        shown.iter().filter(|a| a["med"] == 1).count(),
        1,
        "{shown:?}"
    );
    let id = s.worker_id(runs).await;
    let view = s
        .until_worker(&id, "the engine reports med running", |w| {
            w["engine_load"]["adapters"]["running"] == serde_json::json!(["med"])
        })
        .await;
    assert_eq!(
        view["engine_load"]["adapters"]["max"], 1,
        "vLLM's --max-loras default"
    );
    for (series, value) in [
        (
            format!("sluice_worker_adapter_in_flight{{worker=\"{id}\",adapter=\"med\"}}"),
            1.0,
        ),
        (
            format!(
                "sluice_worker_lora_adapter{{worker=\"{id}\",adapter=\"med\",state=\"running\"}}"
            ),
            1.0,
        ),
        (format!("sluice_worker_lora_slots{{worker=\"{id}\"}}"), 1.0),
        (
            format!("sluice_worker_lora_slots_taken{{worker=\"{id}\"}}"),
            1.0,
        ),
    ] {
        assert_eq!(s.metric(&series).await, Some(value), "{series}");
    }
    drop(held);
}

/// `/v1/models` of the gateway lists `name`.
fn lists(models: &Value, name: &str) -> bool {
    model_ids(models).iter().any(|id| id == name)
}

#[tokio::test]
async fn an_adapter_loaded_or_unloaded_after_registration_is_routed_by_what_the_worker_lists_now() {
    let mut engine = timed(Flavor::Vllm, 1.0);
    let mut lora = LoraSettings::serving(&["sql"], FAST_LOAD);
    lora.runtime_updates = true;
    engine.lora = Some(lora);
    let s = start(2, engine, |c| {
        c.control.models_refresh = Some(std::time::Duration::from_millis(50))
    })
    .await;
    let missing = s.chat(&chat_body("med", "q", 1, false)).await;
    assert_eq!(code(&missing).as_deref(), Some("model_not_found"));

    let engine_url = |path: &str| format!("{}{path}", s.sims.urls()[1]);
    let load = r#"{"lora_name":"med","lora_path":"/adapters/med"}"#;
    let loaded = send(
        &s.client,
        "POST",
        &engine_url("/v1/load_lora_adapter"),
        Some(load),
        &[],
    )
    .await;
    assert_eq!(loaded.status, 200, "{}", loaded.text());
    until_view(&s.gateway, &s.client, "med listed", "/v1/models", |m| {
        lists(m, "med")
    })
    .await;
    let before = s.received();
    for i in 0..3 {
        let a = s.chat(&chat_body("med", &format!("q{i}"), 1, false)).await;
        assert_eq!(a.status, 200, "{}", a.text());
    }
    let after = s.received();
    assert_eq!(after[1] - before[1], 3, "{before:?} -> {after:?}");

    let unload = r#"{"lora_name":"med"}"#;
    let unloaded = send(
        &s.client,
        "POST",
        &engine_url("/v1/unload_lora_adapter"),
        Some(unload),
        &[],
    )
    .await;
    assert_eq!(unloaded.status, 200, "{}", unloaded.text());
    until_view(&s.gateway, &s.client, "med gone", "/v1/models", |m| {
        !lists(m, "med")
    })
    .await;
    let gone = s.chat(&chat_body("med", "q", 1, false)).await;
    assert_eq!(code(&gone).as_deref(), Some("model_not_found"));
}

#[tokio::test]
async fn with_adapter_routing_disabled_the_policy_alone_chooses() {
    let (_s, held, _, joined) = six_sql_requests(false).await;
    assert_eq!(joined, 3, "round robin, blind to where sql runs");
    drop(held);
}

/// vLLM-shaped engines serving `sql`, loading adapters at run time when asked
/// (`VLLM_ALLOW_RUNTIME_LORA_UPDATING`), each worker's spec letting the gateway load `med` and
/// `ops` and hold `max_loaded` adapters.
async fn loading_fleet(runtime_updates: bool, max_loaded: u32) -> Setup {
    let mut engine = timed(Flavor::Vllm, 1.0);
    let mut lora = LoraSettings::serving(&["sql"], FAST_LOAD);
    lora.runtime_updates = runtime_updates;
    engine.lora = Some(lora);
    let sims = SimFleet::start(FleetConfig::local(2, engine))
        .await
        .unwrap();
    let mut config = Config::local(&sims.urls());
    config.workers = sims
        .urls()
        .iter()
        .map(|url| {
            let spec = serde_json::json!({"url": url, "lora": {
                "modules": ["med=/adapters/med", {"name": "ops", "path": "/adapters/ops"}],
                "max_loaded": max_loaded}});
            WorkerSpec::parse(spec.to_string().as_bytes()).unwrap()
        })
        .collect();
    serve(sims, config).await
}

/// What engine `i` lists in its own `/v1/models`.
async fn engine_lists(s: &Setup, i: usize) -> Vec<String> {
    let url = format!("{}/v1/models", s.sims.urls()[i]);
    model_ids(&get(&s.client, &url).await.json())
}

#[tokio::test]
async fn an_adapter_no_worker_serves_is_loaded_onto_one_its_spec_allows_once_and_in_its_allowance()
{
    let s = loading_fleet(true, 1).await;
    let models = get_admin(&s.client, &s.url("/v1/models")).await.json();
    assert!(
        lists(&models, "med"),
        "a loadable adapter is listed: {models}"
    );
    let before = s.received();
    let bodies: Vec<String> = (0..3)
        .map(|i| chat_body("med", &format!("q{i}"), 1, false))
        .collect();
    let asks = bodies.iter().map(|body| s.chat(body));
    for answer in futures_util::future::join_all(asks).await {
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    let after = s.received();
    let took: Vec<usize> = (0..2).filter(|&i| after[i] > before[i]).collect();
    assert_eq!(
        took.len(),
        1,
        "one engine loads it, the others wait there: {before:?} -> {after:?}"
    );
    let loaded = engine_lists(&s, took[0]).await;
    assert!(loaded.contains(&"med".to_string()), "{loaded:?}");
    assert!(
        !loaded.contains(&"sql".to_string()),
        "max_loaded 1: sql, idle, was unloaded to make room: {loaded:?}"
    );
    let other = engine_lists(&s, 1 - took[0]).await;
    assert!(!other.contains(&"med".to_string()), "{other:?}");
    // Read again after the load, before the request was sent on: the pools follow at once.
    let id = s.worker_id(took[0]).await;
    let view = s.until_worker(&id, "its models", |_| true).await;
    assert_eq!(
        view["models"],
        serde_json::json!(["test-model", "med"]),
        "{view}"
    );
    let sql = s.chat(&chat_body("sql", "still served", 1, false)).await;
    assert_eq!(
        sql.status,
        200,
        "the other engine still holds sql: {}",
        sql.text()
    );
}

#[tokio::test]
async fn a_load_the_engine_refuses_is_a_worker_failure_and_the_client_gets_a_clear_error() {
    let s = loading_fleet(false, 4).await;
    let answer = s.chat(&chat_body("med", "q", 1, false)).await;
    assert_eq!(answer.status, 502, "{}", answer.text());
    assert_eq!(code(&answer).as_deref(), Some("adapter_load_failed"));
    let text = answer.text();
    for url in s.sims.urls() {
        let port = url.rsplit(':').next().unwrap();
        assert!(!text.contains(port), "no worker address in {text}");
    }
    let id = s.worker_id(0).await;
    let series = format!("sluice_upstream_errors_total{{worker=\"{id}\",kind=\"adapter_load\"}}");
    assert_eq!(
        s.metric(&series).await,
        Some(1.0),
        "tried once on each worker"
    );
    let sql = s.chat(&chat_body("sql", "q", 1, false)).await;
    assert_eq!(sql.status, 200, "{}", sql.text());
}

/// A chat naming `model`, with SGLang's `lora_path` when given.
fn sglang_chat(
    model: &str,
    lora_path: Option<&str>,
    content: &str,
    max_tokens: u32,
    stream: bool,
) -> String {
    let mut body: Value =
        serde_json::from_str(&chat_body(model, content, max_tokens, stream)).unwrap();
    if let Some(path) = lora_path {
        body["lora_path"] = path.into();
    }
    body.to_string()
}

#[tokio::test]
async fn an_adapter_named_as_sglang_takes_it_is_routed_by_adapter_and_sent_as_written() {
    let mut engine = timed(Flavor::Sglang, 1.0);
    engine.lora = Some(LoraSettings::serving(&["sql", "med"], FAST_LOAD));
    let s = start(2, engine, |c| c.route.policy = Policy::RoundRobin).await;
    let body = sglang_chat("test-model:sql", None, "a long answer", 4000, true);
    let held = open_stream_with(&s.client, &s.gateway, body, &[]).await;
    let runs_sql = engine_running(&s);
    let before = s.received();
    for i in 0..4 {
        let named = sglang_chat("test-model:sql", None, &format!("q{i}"), 1, false);
        let by_path = sglang_chat("test-model", Some("sql"), &format!("p{i}"), 1, false);
        for body in [named, by_path] {
            let answer = s.chat(&body).await;
            assert_eq!(
                answer.status,
                200,
                "the engine read the adapter: {}",
                answer.text()
            );
        }
    }
    let after = s.received();
    assert_eq!(
        after[runs_sql] - before[runs_sql],
        8,
        "where sql runs: {before:?} -> {after:?}"
    );
    let unknown = s
        .chat(&sglang_chat("test-model:nope", None, "q", 1, false))
        .await;
    assert_eq!(
        code(&unknown).as_deref(),
        Some("model_not_found"),
        "{}",
        unknown.text()
    );
    drop(held);
}
