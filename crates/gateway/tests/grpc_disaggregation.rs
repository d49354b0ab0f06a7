//! Prefill/decode disaggregation over gRPC, black-box: the gateway on loopback in front of
//! simulated SGLang prefill and decode engines behind SMG's protocol (`sluice sim --grpc
//! --pd-role`). Both legs meet in the bootstrap room the gateway names in each `Generate`'s
//! `disaggregated_params`; the decode worker's running window (from its pushed or polled load)
//! gates dispatch, hands a freed room to the longest waiter and sheds when none frees in time;
//! a client that leaves aborts both legs; a frozen prefill leg fails over within the wedge
//! bound.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::model::ModelDir;
use common::*;
use sluice_core::policy::Policy;
use sluice_gateway::fleet::{WorkerSpec, WorkerType};
use sluice_sim::{GrpcConfig, PdRole};

/// `prefills` gRPC prefill engines then `decodes` gRPC decode engines, and a gateway with the
/// model's files over them that polls their loads every 50 ms.
async fn pd_grpc(
    model: &ModelDir,
    prefills: usize,
    mut prefill: EngineConfig,
    decodes: usize,
    mut decode: EngineConfig,
    tune: impl FnOnce(&mut Config),
) -> Setup {
    for (engine, role) in [
        (&mut prefill, PdRole::Prefill),
        (&mut decode, PdRole::Decode),
    ] {
        engine.pd_role = Some(role);
        engine.grpc = Some(GrpcConfig::default());
    }
    let sims = SimFleet::start(FleetConfig::local(prefills, prefill).also(decodes, decode))
        .await
        .unwrap();
    let mut config = Config::local(&[]);
    for slot in sims.engines() {
        assert!(slot.url().starts_with("grpc://"));
        let mut spec = WorkerSpec::from_url(&slot.url(), None).unwrap();
        match slot.bootstrap_addr() {
            Some(bootstrap) => {
                spec.worker_type = WorkerType::Prefill;
                spec.bootstrap_port = Some(bootstrap.port());
            }
            None => spec.worker_type = WorkerType::Decode,
        }
        config.workers.push(spec);
    }
    config.upstream.tokens = sluice_gateway::tokens::SharedTokens::new(Some(model.tokens()));
    config.control.load.interval = Duration::from_millis(50);
    config.control.load.min_interval = Duration::from_millis(10);
    config.access.keys.admin = Some(ADMIN_KEY.into());
    config.route.shedding.retry_after = Duration::from_secs(7);
    tune(&mut config);
    serve(sims, config).await
}

fn sglang() -> EngineConfig {
    instant(Flavor::Sglang)
}

/// No health probes: a gRPC worker's probe is a one-token generation, which the engines'
/// counts would show beside the requests'.
fn unprobed(c: &mut Config) {
    c.control.health.disabled = true;
}

/// A decode engine that runs one request at a time, at an H100's pace.
fn one_slot_decode() -> EngineConfig {
    let mut decode = timed(Flavor::Sglang, 1.0);
    decode.max_num_seqs = 1;
    decode
}

/// A chat request that generates exactly `tokens` tokens.
fn exact(content: &str, tokens: u32, stream: bool) -> String {
    serde_json::json!({"model": "test-model", "messages": [{"role": "user", "content": content}],
                       "max_tokens": tokens, "ignore_eos": true, "stream": stream})
    .to_string()
}

/// A streaming request that holds its decode slot for seconds, returned once its first chunk
/// has arrived.
async fn hold(s: &Setup, content: &str) -> hyper::Response<hyper::body::Incoming> {
    open_stream_with(&s.client, &s.gateway, exact(content, 4000, true), &[]).await
}

/// Waits until the decode worker's window (as `/workers` shows it) satisfies `done`.
async fn until_window(s: &Setup, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let workers = s
        .until_workers(what, |ws| {
            ws.iter()
                .any(|w| w["role"] == "decode" && done(&w["decode_window"]))
        })
        .await;
    workers.into_iter().find(|w| w["role"] == "decode").unwrap()["decode_window"].clone()
}

/// The answer's content pieces: one per token the engine generated.
fn content_tokens(answer: &Answer) -> usize {
    answer
        .events()
        .iter()
        .filter(|e| e.contains(r#""content":""#) && !e.contains(r#""content":"""#))
        .count()
}

#[tokio::test]
async fn both_grpc_legs_meet_in_one_room_and_the_answer_comes_from_the_decode_engine() {
    let model = ModelDir::new("pd-meet");
    let s = pd_grpc(&model, 1, sglang(), 1, sglang(), unprobed).await;
    let workers = s.workers().await;
    let roles: Vec<&str> = workers
        .iter()
        .map(|w| w["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["prefill", "decode"]);

    let streamed = s.chat(&exact(&"hi ".repeat(200), 12, true)).await;
    assert_eq!(streamed.status, 200, "{}", streamed.text());
    // The prefill engine answers one token; twelve came, so they are the decode engine's.
    assert_eq!(content_tokens(&streamed), 12, "{}", streamed.text());
    assert_eq!(streamed.events().last().unwrap(), "[DONE]");
    let whole = s.chat(&exact("hello", 7, false)).await;
    assert_eq!(whole.status, 200, "{}", whole.text());
    assert_eq!(whole.json()["usage"]["completion_tokens"], 7);

    // The engines met in a room (a decode engine that cannot claim its room fails), and the
    // decode engine computed no prompt but its last token.
    let (prefill, decode) = (s.sims.engines()[0].state(), s.sims.engines()[1].state());
    assert_eq!(
        (prefill.requests_received, decode.requests_received),
        (2, 2)
    );
    assert_eq!(
        (prefill.transfer_failures, decode.transfer_failures),
        (0, 0)
    );
    assert_eq!(decode.prompt_tokens_computed, 2);
    assert!(prefill.prompt_tokens_computed > 150);
}

#[tokio::test]
async fn a_grpc_decode_workers_window_holds_the_next_request_until_a_room_frees() {
    let model = ModelDir::new("pd-window");
    let s = pd_grpc(&model, 1, sglang(), 1, one_slot_decode(), |_| {}).await;
    until_window(&s, "the window reported", |w| w["size"] == 1).await;
    let first = hold(&s, "first").await;
    let s = Arc::new(s);
    let second = tokio::spawn({
        let s = s.clone();
        async move { hold(&s, "second").await }
    });
    let window = until_window(&s, "the second waits", |w| w["waiting"] == 1).await;
    assert_eq!(window["in_flight"], 1, "never more than the window");
    assert_eq!(s.sims.engines()[1].state().requests_received, 1);

    drop(first);
    drop(bounded("the waiter dispatched", second).await.unwrap());
    let waits = s.metric("sluice_pd_admission_waits_total").await;
    assert_eq!(waits, Some(1.0));
}

#[tokio::test]
async fn no_room_on_a_grpc_decode_worker_within_the_wait_is_shed_with_the_overload_answer() {
    let model = ModelDir::new("pd-shed");
    let s = pd_grpc(&model, 1, sglang(), 1, one_slot_decode(), |c| {
        c.forward.pd.admission_wait = Duration::from_millis(300);
    })
    .await;
    until_window(&s, "the window reported", |w| w["size"] == 1).await;
    let _holding = hold(&s, "first").await;
    let shed = s.chat(&chat_body("test-model", "second", 5, false)).await;
    assert_eq!(shed.status, 503, "{}", shed.text());
    assert_eq!(code(&shed).as_deref(), Some("worker_overload_shed"));
    assert_eq!(shed.headers["retry-after"], "7");
    assert_eq!(s.metric("sluice_pd_admission_sheds_total").await, Some(1.0));
    assert_eq!(
        s.sims.engines()[0].state().requests_received,
        1,
        "never sent"
    );
}

#[tokio::test]
async fn a_client_that_leaves_aborts_both_grpc_legs_and_frees_their_kv() {
    // The prompt is prefilled in chunks of 64 tokens, each step twenty times slower than an
    // H100's: the request is still in prefill when its client leaves.
    let model = ModelDir::new("pd-leave");
    let mut prefill = timed(Flavor::Sglang, 1.0);
    prefill.max_num_batched_tokens = 64;
    let s = pd_grpc(&model, 1, prefill, 1, sglang(), unprobed).await;
    let (prefill, decode) = (s.sims.engines()[0].clone(), s.sims.engines()[1].clone());
    prefill.fault(Fault::Slow { factor: 20.0 }).await.unwrap();
    let s = Arc::new(s);
    let asking = tokio::spawn({
        let s = s.clone();
        async move {
            s.chat(&chat_body(
                "test-model",
                &"long prompt ".repeat(400),
                50,
                true,
            ))
            .await
        }
    });
    bounded("the prefill computing", prefill.until(|e| e.running == 1)).await;
    asking.abort();
    let p = bounded(
        "the prefill leg aborted, its KV freed",
        prefill.until(|e| e.aborted == 1 && e.kv_blocks_used == 0 && e.running == 0),
    )
    .await;
    assert_eq!(p.finished, 0);
    let d = bounded("the decode leg aborted", decode.until(|e| e.aborted == 1)).await;
    assert_eq!((d.running, d.kv_blocks_used, d.finished), (0, 0, 0));
}

#[tokio::test]
async fn a_frozen_grpc_prefill_fails_over_to_a_new_pair_within_the_wedge_bound() {
    let model = ModelDir::new("pd-frozen");
    let s = pd_grpc(&model, 2, sglang(), 1, sglang(), |c| {
        c.route.prefill_policy = Policy::RoundRobin;
        c.forward.pd.wedge = Duration::from_secs(1);
        unprobed(c);
    })
    .await;
    s.sims.engines()[0].fault(Fault::Pause).await.unwrap();
    for i in 0..2 {
        let answer = bounded(
            "an answer",
            s.chat(&exact(&format!("question {i}"), 5, true)),
        )
        .await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(content_tokens(&answer), 5);
    }
    // Round robin takes the frozen prefill engine in turn; each time, the request went on to
    // the other one, in a new room.
    let frozen = s.sims.engines()[0].state();
    assert!(frozen.requests_received >= 1);
    assert_eq!(frozen.finished, 0);
    assert_eq!(s.sims.engines()[1].state().requests_received, 2);
    let retried = s
        .metric("sluice_retries_total{reason=\"unresponsive\"}")
        .await;
    assert_eq!(retried, Some(frozen.requests_received as f64));
}
