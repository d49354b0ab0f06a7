//! LoRA adapters through the picker: a request for an adapter no worker lists is placed where
//! the worker's spec lets the gateway load it, and handed to the data plane once it is loaded,
//! as `sluice serve` would send it.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use sluice_gateway::fleet::WorkerSpec;
use sluice_sim::lora::{LoraSettings, FAST_LOAD};

#[tokio::test]
async fn an_adapter_is_loaded_before_the_request_is_handed_over() {
    let mut engine = timed(Flavor::Vllm, 1.0);
    let mut lora = LoraSettings::serving(&["sql"], FAST_LOAD);
    lora.runtime_updates = true;
    engine.lora = Some(lora);
    let s = start(2, engine, |config, _| {
        for spec in &mut config.workers {
            let json = serde_json::json!({"url": spec.url,
                "lora": {"modules": ["med=/adapters/med"]}});
            *spec = WorkerSpec::parse(json.to_string().as_bytes()).unwrap();
        }
    })
    .await;
    let mut plane = s.data_plane().await;
    let body = serde_json::json!({"model": "med", "max_tokens": 1,
        "messages": [{"role": "user", "content": "hello"}]});
    let answer = plane.chat(&body.to_string(), &[]).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let Decision::Routed { endpoint } = &answer.decision else {
        panic!("not routed: {answer:?}");
    };
    let urls = s.sims.urls();
    let at = urls
        .iter()
        .position(|u| &address_of(u) == endpoint)
        .unwrap();
    let listed = get(&client(), &format!("{}/v1/models", urls[at]))
        .await
        .json();
    let ids: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert!(ids.contains(&"med"), "{ids:?}");
}
