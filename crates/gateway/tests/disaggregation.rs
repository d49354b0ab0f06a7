//! Prefill/decode disaggregation against simulated SGLang prefill and decode engines
//! (`sluice sim --pd-role`): both legs of a request meet in one bootstrap room, the answer comes
//! from the decode engine, the decode admission window holds, hands out and sheds (seed 000), a
//! client that leaves aborts both legs (seed 003), and a frozen prefill fails over.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use sluice_core::policy::Policy;
use sluice_gateway::fleet::{WorkerSpec, WorkerType};
use sluice_sim::PdRole;

/// `prefills` prefill engines then `decodes` decode engines, and a gateway over them that
/// polls their loads every 50 ms.
async fn pd(
    prefills: usize,
    mut prefill: EngineConfig,
    decodes: usize,
    mut decode: EngineConfig,
    tune: impl FnOnce(&mut Config),
) -> Setup {
    prefill.pd_role = Some(PdRole::Prefill);
    decode.pd_role = Some(PdRole::Decode);
    let sims = SimFleet::start(FleetConfig::local(prefills, prefill).also(decodes, decode))
        .await
        .unwrap();
    let mut config = Config::local(&[]);
    for slot in sims.engines() {
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

/// A decode engine that runs one request at a time, at an H100's pace (a long answer holds
/// its one slot for seconds).
fn one_slot_decode() -> EngineConfig {
    let mut decode = timed(Flavor::Sglang, 1.0);
    decode.max_num_seqs = 1;
    decode
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

/// A request no engine takes (more tokens than the model's length) gets the engines' own 400.
async fn engines_refusal_is_relayed(s: &Setup) {
    let refused = s.chat(&exact("hello", 40_000, false)).await;
    assert_eq!(
        refused.status,
        400,
        "the engines' own answer: {}",
        refused.text()
    );
}

fn content_tokens(answer: &Answer) -> usize {
    answer
        .events()
        .iter()
        .filter(|e| e.contains(r#""content":""#) && !e.contains(r#""content":"""#))
        .count()
}

#[tokio::test]
async fn both_legs_meet_in_one_room_and_the_answer_streams_from_the_decode_engine() {
    let s = pd(1, sglang(), 1, sglang(), |_| {}).await;
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
    engines_refusal_is_relayed(&s).await;
    let whole = s.chat(&exact("hello", 7, false)).await;
    assert_eq!(whole.status, 200, "{}", whole.text());
    assert_eq!(whole.json()["usage"]["completion_tokens"], 7);

    // The engines met in a room (a decode engine that cannot claim its room fails), and the
    // decode engine computed no prompt but its last token.
    let (prefill, decode) = (s.sims.engines()[0].state(), s.sims.engines()[1].state());
    assert_eq!(
        (prefill.requests_received, decode.requests_received),
        (3, 3)
    );
    assert_eq!(
        (prefill.transfer_failures, decode.transfer_failures),
        (0, 0)
    );
    assert_eq!(decode.prompt_tokens_computed, 2);
    assert!(prefill.prompt_tokens_computed > 150);
}

#[tokio::test]
async fn with_traces_on_both_legs_carry_the_attempts_traceparent() {
    let mut receiver = common::otlp::Receiver::grpc().await;
    let trace = sluice_gateway::trace::TraceConfig::new(
        receiver.endpoint(),
        sluice_gateway::trace::Protocol::Grpc,
        1.0,
    );
    let s = pd(1, sglang(), 1, sglang(), |c| {
        c.telemetry.trace = Some(trace)
    })
    .await;
    let answer = s.chat(&exact("hello", 3, false)).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let spans = bounded("the pair's spans", receiver.take(3)).await;
    let attempt = spans
        .iter()
        .find(|s| s.kind == opentelemetry_proto::tonic::trace::v1::span::SpanKind::Client as i32)
        .unwrap();
    let want = format!(
        "00-{}-{}-01",
        common::otlp::hex(&attempt.trace_id),
        common::otlp::hex(&attempt.span_id)
    );
    for (leg, slot) in ["prefill", "decode"].iter().zip(s.sims.engines()) {
        let told = slot.engine().unwrap().last_trace_context();
        assert_eq!(told.as_deref(), Some(want.as_str()), "the {leg} leg");
    }
}

#[tokio::test]
async fn the_window_holds_the_next_request_until_a_room_frees_and_gives_it_to_the_longest_waiter() {
    let s = pd(1, sglang(), 1, one_slot_decode(), |_| {}).await;
    until_window(&s, "the window reported", |w| w["size"] == 1).await;
    let first = hold(&s, "first").await;
    let s = Arc::new(s);
    let second = tokio::spawn({
        let s = s.clone();
        async move { hold(&s, "second").await }
    });
    until_window(&s, "the second waits", |w| w["waiting"] == 1).await;
    let third = tokio::spawn({
        let s = s.clone();
        async move { hold(&s, "third").await }
    });
    let window = until_window(&s, "the third waits", |w| w["waiting"] == 2).await;
    assert_eq!(window["in_flight"], 1, "never more than the window");
    assert_eq!(s.sims.engines()[1].state().requests_received, 1);

    drop(first);
    let second = bounded("the longest waiter dispatched", second)
        .await
        .unwrap();
    let window = until_window(&s, "one waiting", |w| w["waiting"] == 1).await;
    assert_eq!(window["in_flight"], 1);
    assert!(!third.is_finished(), "the third still waits");
    drop(second);
    drop(bounded("the third dispatched", third).await.unwrap());
    let waits = s.metric("sluice_pd_admission_waits_total").await;
    assert_eq!(waits, Some(2.0));
}

#[tokio::test]
async fn waiters_spread_over_the_decode_workers_whose_windows_are_full() {
    let s = pd(1, sglang(), 2, one_slot_decode(), |_| {}).await;
    let sized = |ws: &[Value]| {
        ws.iter()
            .filter(|w| w["role"] == "decode" && w["decode_window"]["size"] == 1)
            .count()
            == 2
    };
    s.until_workers("both windows reported", sized).await;
    let _first = hold(&s, "first").await;
    let _second = hold(&s, "second").await;
    let s = Arc::new(s);
    let waiters: Vec<_> = ["third", "fourth"]
        .into_iter()
        .map(|content| {
            let s = s.clone();
            tokio::spawn(async move { hold(&s, content).await })
        })
        .collect();
    let each_one = |ws: &[Value]| {
        ws.iter()
            .filter(|w| w["role"] == "decode")
            .all(|w| w["decode_window"]["waiting"] == 1 && w["decode_window"]["in_flight"] == 1)
    };
    s.until_workers("one waiter on each decode worker", each_one)
        .await;
    for waiter in waiters {
        waiter.abort();
    }
}

#[tokio::test]
async fn no_room_within_the_wait_is_shed_with_the_overload_answer() {
    let s = pd(1, sglang(), 1, one_slot_decode(), |c| {
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
async fn waiting_off_or_a_request_wider_than_the_window_is_shed_at_once() {
    let s = pd(1, sglang(), 1, one_slot_decode(), |c| {
        c.forward.pd.admission_wait = Duration::ZERO;
    })
    .await;
    until_window(&s, "the window reported", |w| w["size"] == 1).await;
    let body = serde_json::json!({"model": "test-model", "prompt": "p", "n": 2, "max_tokens": 3});
    let wide = post(&s.client, &s.url("/v1/completions"), &body.to_string()).await;
    assert_eq!(wide.status, 503, "{}", wide.text());
    let _holding = hold(&s, "first").await;
    let full = s.chat(&chat_body("test-model", "second", 5, false)).await;
    assert_eq!(full.status, 503, "{}", full.text());
    assert_eq!(s.metric("sluice_pd_admission_sheds_total").await, Some(2.0));
    assert_eq!(s.metric("sluice_pd_admission_waits_total").await, Some(0.0));
}

#[tokio::test]
async fn a_client_that_leaves_aborts_both_legs_and_frees_their_kv() {
    // The prompt is prefilled in chunks of 64 tokens, each step twenty times slower than an
    // H100's: the request is still in prefill when its client leaves.
    let mut prefill = timed(Flavor::Sglang, 1.0);
    prefill.max_num_batched_tokens = 64;
    let s = pd(1, prefill, 1, sglang(), |_| {}).await;
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
async fn a_frozen_prefill_fails_over_to_a_new_pair_within_the_wedge_bound() {
    let s = pd(2, sglang(), 1, sglang(), |c| {
        c.route.prefill_policy = Policy::RoundRobin;
        c.forward.pd.wedge = Duration::from_secs(1);
    })
    .await;
    s.sims.engines()[0].fault(Fault::Pause).await.unwrap();
    for i in 0..2 {
        let answer = bounded(
            "an answer",
            s.chat(&chat_body("test-model", &format!("question {i}"), 5, true)),
        )
        .await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(content_tokens(&answer), 5);
    }
    // Round robin takes the frozen prefill engine in turn; each time, the request went on to
    // the other one.
    let frozen = s.sims.engines()[0].state();
    assert!(frozen.requests_received >= 1);
    assert_eq!(frozen.finished, 0);
    assert_eq!(s.sims.engines()[1].state().requests_received, 2);
    let retried = s
        .metric("sluice_retries_total{reason=\"unresponsive\"}")
        .await;
    assert_eq!(retried, Some(frozen.requests_received as f64));
}

#[tokio::test]
async fn vllm_workers_get_the_prefill_first_and_the_decode_leg_what_it_answered() {
    let s = pd(1, instant(Flavor::Vllm), 1, instant(Flavor::Vllm), |_| {}).await;
    let streamed = s.chat(&exact(&"hi ".repeat(200), 12, true)).await;
    assert_eq!(streamed.status, 200, "{}", streamed.text());
    assert_eq!(content_tokens(&streamed), 12, "{}", streamed.text());
    let (prefill, decode) = (s.sims.engines()[0].state(), s.sims.engines()[1].state());
    assert_eq!(
        prefill.tokens_generated, 1,
        "the prefill was asked for one token"
    );
    assert!(prefill.prompt_tokens_computed > 150);
    assert_eq!(
        decode.prompt_tokens_computed, 1,
        "the decode engine pulled the KV"
    );
    assert_eq!(decode.tokens_generated, 12);
    engines_refusal_is_relayed(&s).await;
}

/// The queue's depth over every tier, as `/admission` shows it.
async fn queued(s: &Setup) -> u64 {
    let view = get_admin(&s.client, &s.url("/admission")).await.json();
    view["queue"]["tiers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["depth"].as_u64().unwrap())
        .sum()
}

async fn until_queued(s: &Setup, n: u64) {
    bounded("the queue's depth", async {
        while queued(s).await != n {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

#[tokio::test]
async fn a_request_waiting_for_decode_room_does_not_stop_the_gateway_queue_for_other_models() {
    // A disaggregated model (one prefill, one one-slot decode engine) and another model, behind
    // the gateway queue with three places; a wait for decode room far longer than the test.
    let mut prefill = sglang();
    prefill.pd_role = Some(PdRole::Prefill);
    let mut decode = one_slot_decode();
    decode.pd_role = Some(PdRole::Decode);
    let mut other = timed(Flavor::Sglang, 1.0);
    other.model = "other-model".into();
    let sims = SimFleet::start(
        FleetConfig::local(1, prefill)
            .also(1, decode)
            .also(1, other),
    )
    .await
    .unwrap();
    let mut config = Config::local(&[]);
    for (i, slot) in sims.engines().iter().enumerate() {
        let mut spec = WorkerSpec::from_url(&slot.url(), None).unwrap();
        match i {
            0 => {
                spec.worker_type = WorkerType::Prefill;
                spec.bootstrap_port = slot.bootstrap_addr().map(|a| a.port());
            }
            1 => spec.worker_type = WorkerType::Decode,
            _ => {}
        }
        config.workers.push(spec);
    }
    config.control.load.interval = Duration::from_millis(50);
    config.control.load.min_interval = Duration::from_millis(10);
    config.access.keys.admin = Some(ADMIN_KEY.into());
    config.forward.pd.admission_wait = Duration::from_secs(120);
    config.admission.max_concurrent = Some(3);
    config.admission.queue = Some(sluice_gateway::admit::QueueConfig {
        size: 10,
        timeouts: [Duration::from_secs(120); 3],
        shed: false,
        shed_retry_after: Duration::from_secs(10),
        codel: None,
    });
    let s = Arc::new(serve(sims, config).await);
    until_window(&s, "the window reported", |w| w["size"] == 1).await;
    let other_stream = || {
        let body = chat_body("other-model", "a long answer", 4000, true);
        open_stream_with(&s.client, &s.gateway, body, &[])
    };

    // The decode slot and the gateway's three places taken.
    let first = hold(&s, "first").await;
    let filler = other_stream().await;
    let filler_too = other_stream().await;
    let second = tokio::spawn({
        let s = s.clone();
        async move { hold(&s, "second").await }
    });
    until_queued(&s, 1).await;
    let third = tokio::spawn({
        let s = s.clone();
        async move { s.chat(&chat_body("other-model", "short", 2, false)).await }
    });
    until_queued(&s, 2).await;

    // A place frees: the disaggregated request, first in the queue, goes and waits for decode
    // room; the next place to free goes to the other model's request at once.
    drop(filler);
    until_window(&s, "the second waits for decode room", |w| {
        w["waiting"] == 1
    })
    .await;
    drop(filler_too);
    let third = bounded("the other model's request answered", third)
        .await
        .unwrap();
    assert_eq!(third.status, 200, "{}", third.text());
    assert!(
        !second.is_finished(),
        "the second still waits for decode room"
    );

    drop(first);
    drop(bounded("the second dispatched", second).await.unwrap());
}
