#![allow(clippy::unwrap_used)] // test support: a failed step is the test failing
//! Prefill/decode disaggregation (`--pd-role`), SGLang's way: the two halves of one request
//! meet in a bootstrap room, the prefill's deadline runs from its landing, and the decode
//! engine admits within its running window.

mod common;

use std::sync::Arc;

use common::*;
use serde_json::{json, Value};
use sluice_sim::{EngineConfig, Fault, Flavor, FleetConfig, PdRole, SimFleet};

fn role(mut cfg: EngineConfig, role: PdRole) -> EngineConfig {
    cfg.pd_role = Some(role);
    cfg
}

/// One prefill engine (engine 0) and one decode engine (engine 1).
async fn pair(prefill: EngineConfig, decode: EngineConfig) -> SimFleet {
    let prefill = role(prefill, PdRole::Prefill);
    let decode = role(decode, PdRole::Decode);
    SimFleet::start(FleetConfig::local(1, prefill).also(1, decode))
        .await
        .unwrap()
}

fn half(fleet: &SimFleet, room: u64, max_tokens: u32, stream: bool) -> String {
    let bootstrap = fleet.engine(0).unwrap().bootstrap_addr().unwrap();
    json!({"model": "test-model", "prompt": "x".repeat(4000), "max_tokens": max_tokens,
           "ignore_eos": true, "stream": stream,
           "bootstrap_host": bootstrap.ip().to_string(), "bootstrap_port": bootstrap.port(),
           "bootstrap_room": room})
    .to_string()
}

/// Sends both halves at once, as a gateway does; returns (prefill's answer, decode's answer).
async fn both(fleet: &SimFleet, room: u64, max_tokens: u32, stream: bool) -> (Answer, Answer) {
    let c = client();
    let body = half(fleet, room, max_tokens, stream);
    let prefill = format!("{}/v1/completions", fleet.engine(0).unwrap().url());
    let decode = format!("{}/v1/completions", fleet.engine(1).unwrap().url());
    tokio::join!(post(&c, &prefill, &body), post(&c, &decode, &body))
}

#[tokio::test]
async fn the_halves_meet_in_their_room_and_the_decode_engine_does_not_prefill() {
    let fleet = pair(instant(Flavor::Sglang), instant(Flavor::Sglang)).await;
    let (prefill, decode) = both(&fleet, 42, 20, false).await;
    assert_eq!(prefill.status, 200, "{}", prefill.text());
    assert_eq!(decode.status, 200, "{}", decode.text());
    assert_eq!(prefill.json()["usage"]["completion_tokens"], 1);
    assert_eq!(decode.json()["usage"]["completion_tokens"], 20);
    let (p, d) = (
        fleet.engine(0).unwrap().state(),
        fleet.engine(1).unwrap().state(),
    );
    assert_eq!(
        p.prompt_tokens_computed, 1000,
        "the prefill computes the prompt"
    );
    assert_eq!(
        d.prompt_tokens_computed, 1,
        "the decode engine only its last token"
    );
    assert_eq!(
        (p.pd_role, d.pd_role),
        (Some(PdRole::Prefill), Some(PdRole::Decode))
    );

    let (prefill, decode) = both(&fleet, 43, 5, true).await;
    assert_eq!(prefill.events().last().unwrap(), "[DONE]");
    let tokens = decode
        .events()
        .iter()
        .filter(|e| e.contains("\"text\":\"") && !e.contains("\"text\":\"\""))
        .count();
    assert_eq!(tokens, 5, "{}", decode.text());
}

#[tokio::test]
async fn a_prefill_no_decode_engine_claims_fails_at_its_deadline_and_so_does_a_late_claim() {
    let mut prefill = instant(Flavor::Sglang);
    prefill.bootstrap_timeout_secs = 0.2;
    let fleet = pair(prefill, instant(Flavor::Sglang)).await;
    let c = client();
    let body = half(&fleet, 7, 5, false);
    let alone = post(
        &c,
        &format!("{}/v1/completions", fleet.engine(0).unwrap().url()),
        &body,
    )
    .await;
    assert_eq!(alone.status, 500);
    assert!(
        alone.json()["message"]
            .as_str()
            .unwrap()
            .contains("bootstrap deadline"),
        "{}",
        alone.text()
    );
    assert_eq!(fleet.engine(0).unwrap().state().bootstrap_timeouts, 1);

    let late = post(
        &c,
        &format!("{}/v1/completions", fleet.engine(1).unwrap().url()),
        &body,
    )
    .await;
    assert_eq!(late.status, 500, "{}", late.text());
    assert_eq!(fleet.engine(1).unwrap().state().transfer_failures, 1);
}

#[tokio::test]
async fn a_burst_wider_than_the_decode_window_waits_in_the_decode_queue_until_its_bootstrap_expires(
) {
    let mut prefill = timed(Flavor::Sglang, 1.0);
    prefill.bootstrap_timeout_secs = 1.0;
    let mut decode = timed(Flavor::Sglang, 1.0);
    decode.max_num_seqs = 1;
    let fleet = Arc::new(pair(prefill, decode).await);
    // The first holds the decode window's one slot for 400 tokens (about 3 s at 8B/H100 speed).
    let first = tokio::spawn({
        let fleet = fleet.clone();
        async move { both(&fleet, 1, 400, false).await }
    });
    let decode = fleet.engine(1).unwrap();
    decode.until(|s| s.running == 1).await;
    let (prefill, second) = both(&fleet, 2, 5, false).await;
    assert_eq!(
        prefill.status, 500,
        "the second's prefill waited past its deadline"
    );
    assert_eq!(second.status, 500, "and its decode half has no KV");
    assert_eq!(fleet.engine(0).unwrap().state().bootstrap_timeouts, 1);
    let (prefill, first) = first.await.unwrap();
    assert_eq!((prefill.status, first.status), (200, 200));
}

#[tokio::test]
async fn a_decode_half_whose_client_leaves_aborts_the_prefill_computing_for_it() {
    // The prompt is prefilled in chunks of 64 tokens, each step twenty times slower than an
    // H100's: the half is still computing when it is left.
    let mut slow_prefill = timed(Flavor::Sglang, 1.0);
    slow_prefill.max_num_batched_tokens = 64;
    let fleet = Arc::new(pair(slow_prefill, instant(Flavor::Sglang)).await);
    let prefill = fleet.engine(0).unwrap().clone();
    let decode = fleet.engine(1).unwrap().clone();
    prefill.fault(Fault::Slow { factor: 20.0 }).await.unwrap();
    let body = half(&fleet, 9, 5, false);
    let c = client();
    let prefill_half = tokio::spawn({
        let (c, url, body) = (
            c.clone(),
            format!("{}/v1/completions", prefill.url()),
            body.clone(),
        );
        async move { post(&c, &url, &body).await }
    });
    let decode_half = tokio::spawn({
        let url = format!("{}/v1/completions", decode.url());
        async move { post(&c, &url, &body).await }
    });
    // Both halves are in: the prefill holds the prompt's blocks, the decode engine its slot.
    prefill.until(|s| s.running == 1).await;
    decode_half.abort();
    let answer = prefill_half.await.unwrap();
    assert_eq!(answer.status, 500);
    let reason: Value = answer.json();
    assert!(
        reason["message"]
            .as_str()
            .unwrap()
            .contains("decode engine left"),
        "{reason}"
    );
    let p = prefill
        .until(|s| s.aborted == 1 && s.kv_blocks_used == 0)
        .await;
    assert_eq!(p.running, 0);
    decode.until(|s| s.aborted == 1).await;
}

#[tokio::test]
async fn vllms_exchange_prefills_first_and_the_decode_engine_pulls_what_its_answer_names() {
    let fleet = pair(instant(Flavor::Vllm), instant(Flavor::Vllm)).await;
    let c = client();
    let asked = json!({"model": "test-model", "prompt": "x".repeat(4000), "max_tokens": 9,
                       "ignore_eos": true});
    let mut to_prefill = asked.clone();
    to_prefill["max_tokens"] = json!(1);
    to_prefill["kv_transfer_params"] =
        json!({"do_remote_decode": true, "do_remote_prefill": false});
    let prefill_url = format!("{}/v1/completions", fleet.engine(0).unwrap().url());
    let prefilled = post(&c, &prefill_url, &to_prefill.to_string()).await;
    assert_eq!(prefilled.status, 200, "{}", prefilled.text());
    let handed = prefilled.json()["kv_transfer_params"].clone();
    assert_eq!(handed["do_remote_prefill"], true, "{handed}");
    let bootstrap = fleet.engine(0).unwrap().bootstrap_addr().unwrap();
    assert_eq!(handed["remote_port"], bootstrap.port());

    let mut to_decode = asked;
    to_decode["kv_transfer_params"] = handed;
    let decode_url = format!("{}/v1/completions", fleet.engine(1).unwrap().url());
    let decoded = post(&c, &decode_url, &to_decode.to_string()).await;
    assert_eq!(decoded.status, 200, "{}", decoded.text());
    assert_eq!(decoded.json()["usage"]["completion_tokens"], 9);
    assert_eq!(fleet.engine(1).unwrap().state().prompt_tokens_computed, 1);
    // The room is the engine's: pulled twice, the second finds it taken.
    let again = post(&c, &decode_url, &to_decode.to_string()).await;
    assert_eq!(again.status, 500, "{}", again.text());
}
