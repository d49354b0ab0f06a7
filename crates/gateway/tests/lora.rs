//! Requests naming a LoRA adapter go where the adapter runs, then where a slot is free, before
//! the policy chooses: seen from the engines' own request counts.
#![allow(clippy::unwrap_used)]

mod common;

use common::pinned::fast_load;
use common::*;
use sluice_core::policy::Policy;
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

#[tokio::test]
async fn an_adapters_requests_join_it_where_it_runs_and_another_adapter_goes_where_a_slot_is_free()
{
    let s = start(2, serving_adapters(), |c| {
        c.route.policy = Policy::RoundRobin
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
    let after = s.received();
    assert_eq!(
        after[runs_sql] - before[runs_sql],
        6,
        "round robin would have split them: {before:?} -> {after:?}"
    );
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
    let s = start(2, serving_adapters(), |c| {
        c.route.policy = Policy::RoundRobin;
        c.route.by_adapter = false;
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
    let after = s.received();
    assert_eq!(
        after[runs_sql] - before[runs_sql],
        3,
        "round robin, blind to where sql runs: {before:?} -> {after:?}"
    );
    drop(held);
}
