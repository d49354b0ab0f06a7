#![allow(clippy::unwrap_used)] // test support: a failed step is the test failing
//! LoRA adapters on the wire: the model list, requests naming an adapter, loading and unloading
//! at run time, each as the flavor does it.

mod common;

use common::*;
use serde_json::{json, Value};
use sluice_sim::lora::{LoraSettings, FAST_LOAD};
use sluice_sim::{EngineConfig, Flavor};

fn with_adapters(flavor: Flavor, names: &[&str]) -> EngineConfig {
    let mut cfg = instant(flavor);
    cfg.lora = Some(LoraSettings {
        runtime_updates: true,
        ..LoraSettings::serving(names, FAST_LOAD)
    });
    cfg
}

fn chat(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
}

async fn models(base: &str) -> Vec<Value> {
    let answer = get(&client(), &format!("{base}/v1/models")).await;
    assert_eq!(answer.status, 200);
    answer.json()["data"].as_array().unwrap().clone()
}

#[tokio::test]
async fn vllm_lists_its_adapters_after_the_base_model_with_parent_and_root() {
    let fleet = fleet(with_adapters(Flavor::Vllm, &["sql", "med"])).await;
    let data = models(&fleet.urls()[0]).await;
    let ids: Vec<&str> = data.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["test-model", "sql", "med"]);
    assert_eq!(data[1]["parent"], "test-model");
    assert_eq!(data[1]["root"], "/adapters/sql");
    assert_eq!(data[1]["max_model_len"], Value::Null);
    assert_eq!(data[0]["parent"], Value::Null);
}

#[tokio::test]
async fn vllm_serves_an_adapter_named_as_the_model_and_refuses_an_unknown_one() {
    let fleet = fleet(with_adapters(Flavor::Vllm, &["sql"])).await;
    let url = format!("{}/v1/chat/completions", fleet.urls()[0]);
    let served = post(&client(), &url, &chat("sql").to_string()).await;
    assert_eq!(served.status, 200, "{}", served.text());
    assert_eq!(served.json()["model"], "sql");
    let unknown = post(&client(), &url, &chat("med").to_string()).await;
    assert_eq!(unknown.status, 404);
    assert_eq!(
        unknown.json()["error"]["message"],
        "The model `med` does not exist."
    );
}

#[tokio::test]
async fn vllm_loads_and_unloads_an_adapter_at_run_time() {
    let fleet = fleet(with_adapters(Flavor::Vllm, &[])).await;
    let base = &fleet.urls()[0];
    let c = client();
    let load = json!({"lora_name": "sql", "lora_path": "/adapters/sql"}).to_string();
    let loaded = post(&c, &format!("{base}/v1/load_lora_adapter"), &load).await;
    assert_eq!(loaded.status, 200);
    assert_eq!(
        loaded.text(),
        "Success: LoRA adapter 'sql' added successfully."
    );
    let again = post(&c, &format!("{base}/v1/load_lora_adapter"), &load).await;
    assert_eq!(again.status, 400);
    assert_eq!(again.json()["error"]["type"], "InvalidUserInput");
    assert_eq!(models(base).await.len(), 2);
    let served = post(
        &c,
        &format!("{base}/v1/chat/completions"),
        &chat("sql").to_string(),
    )
    .await;
    assert_eq!(served.status, 200);
    let unload = json!({"lora_name": "sql"}).to_string();
    let gone = post(&c, &format!("{base}/v1/unload_lora_adapter"), &unload).await;
    assert_eq!(
        gone.text(),
        "Success: LoRA adapter 'sql' removed successfully."
    );
    let missing = post(&c, &format!("{base}/v1/unload_lora_adapter"), &unload).await;
    assert_eq!(missing.status, 404);
    assert_eq!(models(base).await.len(), 1);
}

#[tokio::test]
async fn vllm_without_runtime_updates_has_no_load_endpoint() {
    let mut cfg = with_adapters(Flavor::Vllm, &["sql"]);
    cfg.lora.as_mut().unwrap().runtime_updates = false;
    let fleet = fleet(cfg).await;
    let body = json!({"lora_name": "x", "lora_path": "/x"}).to_string();
    let answer = post(
        &client(),
        &format!("{}/v1/load_lora_adapter", fleet.urls()[0]),
        &body,
    )
    .await;
    assert_eq!(answer.status, 404);
}

#[tokio::test]
async fn sglang_reads_the_adapter_from_base_colon_adapter_or_lora_path() {
    let fleet = fleet(with_adapters(Flavor::Sglang, &["sql"])).await;
    let url = format!("{}/v1/chat/completions", fleet.urls()[0]);
    let c = client();
    let colon = post(&c, &url, &chat("test-model:sql").to_string()).await;
    assert_eq!(colon.status, 200, "{}", colon.text());
    let mut by_field = chat("test-model");
    by_field["lora_path"] = json!("sql");
    assert_eq!(post(&c, &url, &by_field.to_string()).await.status, 200);
    let unknown = post(&c, &url, &chat("test-model:med").to_string()).await;
    assert_eq!(unknown.status, 400);
    assert_eq!(
        unknown.json()["message"],
        "The following requested LoRA adapters are not loaded: med\nLoaded adapters: odict_keys(['sql'])."
    );
    assert_eq!(
        post(&c, &url, &chat("other:sql").to_string()).await.status,
        404
    );
}

#[tokio::test]
async fn sglang_answers_a_load_with_the_adapters_loaded() {
    let fleet = fleet(with_adapters(Flavor::Sglang, &["sql"])).await;
    let base = &fleet.urls()[0];
    let body = json!({"lora_name": "med", "lora_path": "/adapters/med"}).to_string();
    let loaded = post(&client(), &format!("{base}/load_lora_adapter"), &body).await;
    assert_eq!(loaded.status, 200);
    assert_eq!(
        loaded.json(),
        json!({"success": true, "error_message": "",
               "loaded_adapters": {"sql": "/adapters/sql", "med": "/adapters/med"}})
    );
    let again = post(&client(), &format!("{base}/load_lora_adapter"), &body).await;
    assert_eq!(again.status, 400);
    assert_eq!(again.json()["success"], false);
    let ids: Vec<Value> = models(base).await.iter().map(|m| m["id"].clone()).collect();
    assert_eq!(ids, [json!("test-model"), json!("sql"), json!("med")]);
}

#[tokio::test]
async fn vllm_reports_the_adapters_its_requests_ran_under() {
    let fleet = fleet(with_adapters(Flavor::Vllm, &["sql"])).await;
    let base = &fleet.urls()[0];
    let url = format!("{base}/v1/chat/completions");
    assert_eq!(
        post(&client(), &url, &chat("sql").to_string()).await.status,
        200
    );
    let text = get(&client(), &format!("{base}/metrics")).await.text();
    assert!(
        text.contains("vllm:lora_requests_info{max_lora=\"1\",waiting_lora_adapters=\"\",running_lora_adapters=\"sql\"}"),
        "{text}"
    );
}

#[tokio::test]
async fn sglang_reports_its_slots_in_metrics_and_loads() {
    let fleet = fleet(with_adapters(Flavor::Sglang, &["sql"])).await;
    let base = &fleet.urls()[0];
    let url = format!("{base}/v1/chat/completions");
    assert_eq!(
        post(&client(), &url, &chat("test-model:sql").to_string())
            .await
            .status,
        200
    );
    let text = get(&client(), &format!("{base}/metrics")).await.text();
    assert!(
        text.contains("sglang:lora_pool_slots_total{model_name=\"test-model\",engine=\"0\"} 8"),
        "{text}"
    );
    let loads = get(&client(), &format!("{base}/v1/loads?include=lora"))
        .await
        .json();
    assert_eq!(loads["loads"][0]["lora"]["slots_total"], 8);
    assert_eq!(
        loads["loads"][0]["lora"]["slots_used"], 0,
        "nothing runs now"
    );
    let core = get(&client(), &format!("{base}/v1/loads")).await.json();
    assert_eq!(core["loads"][0].get("lora"), None);
}
