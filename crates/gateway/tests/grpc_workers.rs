//! `grpc://` workers, black-box: the gateway on loopback in front of simulated engines serving
//! SMG's gRPC protocol (`sluice sim --grpc`), with the simulated model's tokenizer and chat
//! template as the model's files. The gateway registers them from `GetModelInfo`, probes them
//! with `HealthCheck`, tokenizes and templates each chat, and answers in OpenAI's shape.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::model::{grpc_setup, grpc_setup_with, ModelDir};
use common::{bounded, chat_body, serve, Setup};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use sluice_gateway::config::Config;
use sluice_sim::testkit::{instant, post, sse_events, timed};
use sluice_sim::vocab::token_text;
use sluice_sim::{Flavor, FleetConfig, GrpcConfig, SimFleet};

/// A poll so rare it never comes in a test: what the gateway knows of the load is pushed.
fn poll_rarely(c: &mut Config) {
    c.control.load.interval = Duration::from_secs(3600);
}

/// Reads `/loads` until worker 0's report came from `source`.
async fn until_load_from(s: &Setup, source: &str) -> Value {
    let view = common::until_view(&s.gateway, &s.client, source, "/loads", |v| {
        v["workers"][0]["load"]["source"] == source
    })
    .await;
    view["workers"][0].clone()
}

/// The words a choice of `tokens` tokens says, its end-of-turn (a stop) decoding to nothing.
fn said(tokens: u64, finish: &str) -> String {
    let words = if finish == "stop" { tokens - 1 } else { tokens };
    (0..words as u32).map(|i| token_text(0, i)).collect()
}

#[tokio::test]
async fn a_chat_is_tokenized_sent_as_ids_and_answered_in_openais_shape() {
    let model = ModelDir::new("chat");
    let s = grpc_setup(2, instant(Flavor::Sglang), &model).await;
    let workers = s.workers().await;
    assert!(
        workers.iter().all(|w| w["flavor"] == "sglang"),
        "registered from GetModelInfo: {workers:?}"
    );
    let answer = s
        .chat(&chat_body("test-model", "Hello there", 8, false))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let body = answer.json();
    assert_eq!(body["object"], "chat.completion");
    let tokens = body["usage"]["completion_tokens"].as_u64().unwrap();
    let finish = body["choices"][0]["finish_reason"].as_str().unwrap();
    assert_eq!(
        body["choices"][0]["message"]["content"],
        said(tokens, finish)
    );
    let prompt = model
        .tokens()
        .chat_ids(&[sluice_gateway::tokens::ChatMessage {
            role: "user".into(),
            content: "Hello there".into(),
        }])
        .unwrap();
    assert_eq!(
        body["usage"]["prompt_tokens"],
        prompt.len(),
        "the templated prompt's ids"
    );

    let mut streamed: Value =
        serde_json::from_str(&chat_body("test-model", "Hello there", 4096, true)).unwrap();
    streamed["stream_options"] = json!({"include_usage": true});
    let answer = s.chat(&streamed.to_string()).await;
    assert_eq!(answer.status, 200);
    let events = sse_events(&answer.text());
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    let usage = &chunks.last().unwrap()["usage"];
    let tokens = usage["completion_tokens"].as_u64().unwrap();
    assert_eq!(
        text,
        said(tokens, "stop"),
        "a free answer ends on its end of turn"
    );
}

#[tokio::test]
async fn what_the_grpc_path_cannot_honour_is_a_400_naming_the_field() {
    let model = ModelDir::new("refused");
    let s = grpc_setup(1, instant(Flavor::Sglang), &model).await;
    let mut body: Value = serde_json::from_str(&chat_body("test-model", "hi", 8, false)).unwrap();
    body["tools"] = json!([{"type": "function", "function": {"name": "f"}}]);
    let answer = s.chat(&body.to_string()).await;
    assert_eq!(answer.status, 400);
    assert_eq!(
        common::code(&answer).as_deref(),
        Some("unsupported_parameter")
    );
    let error = &answer.json()["error"];
    assert_eq!(
        error["param"], "tools",
        "the OpenAI error shape names the field: {error}"
    );
    assert_eq!(error["type"], "invalid_request_error");
    assert!(
        error["message"].as_str().unwrap().contains("`tools`"),
        "{error}"
    );
    body.as_object_mut().unwrap().remove("tools");
    body["logprobs"] = json!(true);
    let answer = s.chat(&body.to_string()).await;
    assert_eq!(answer.status, 400);
    assert!(answer.text().contains("`logprobs`"), "{}", answer.text());
    assert_eq!(s.received(), [0], "nothing refused reached the engine");
}

#[tokio::test]
async fn a_stop_sequence_ends_the_answer_and_the_engines_work() {
    let model = ModelDir::new("stop");
    let s = grpc_setup(1, timed(Flavor::Sglang, 1.0), &model).await;
    let mut body: Value =
        serde_json::from_str(&chat_body("test-model", "hi", 100_000, false)).unwrap();
    body["ignore_eos"] = json!(true);
    body["stop"] = json!(" simulated");
    let answer = bounded("the stopped answer", s.chat(&body.to_string())).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let answer = answer.json();
    assert_eq!(
        answer["choices"][0]["message"]["content"],
        " the engine answers with"
    );
    assert_eq!(answer["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        answer["usage"]["completion_tokens"], 5,
        "the engine stopped at the token that completed the stop sequence"
    );
}

#[tokio::test]
async fn a_client_that_leaves_aborts_the_generation_in_the_engine() {
    let model = ModelDir::new("leave");
    let s = grpc_setup(1, timed(Flavor::Sglang, 1.0), &model).await;
    let mut body: Value =
        serde_json::from_str(&chat_body("test-model", "hi", 100_000, true)).unwrap();
    body["ignore_eos"] = json!(true);
    let url = s.url("/v1/chat/completions");
    let request = http::Request::post(url)
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            body.to_string(),
        )))
        .unwrap();
    let mut response = s.client.request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    bounded("a first chunk", response.body_mut().frame())
        .await
        .unwrap()
        .unwrap();
    drop(response);
    let engine = s.sims.engine(0).unwrap();
    let state = bounded("the abort", engine.until(|st| st.aborted == 1)).await;
    assert_eq!(state.running, 0, "the engine freed the request");
}

#[tokio::test]
async fn a_full_engine_queue_is_at_capacity_and_the_request_goes_to_another_worker() {
    let model = ModelDir::new("full");
    let mut full = instant(Flavor::Sglang);
    full.grpc = Some(GrpcConfig::default());
    // A queue limit of 0: the engine refuses every request as SGLang's full queue does.
    full.max_queued_requests = Some(0);
    let mut open = full.clone();
    open.max_queued_requests = None;
    let sims = SimFleet::start(FleetConfig::local(1, full).also(1, open))
        .await
        .unwrap();
    let mut config = Config::local(&sims.urls());
    config.route.policy = sluice_core::policy::Policy::RoundRobin;
    config.upstream.tokens = sluice_gateway::tokens::SharedTokens::new(Some(model.tokens()));
    let s = serve(sims, config).await;
    for _ in 0..4 {
        let answer = s.chat(&chat_body("test-model", "hi", 4, false)).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    let full = s.sims.engine(0).unwrap().state();
    assert!(
        full.rejected >= 1,
        "round robin asked the full engine: {full:?}"
    );
    assert_eq!(full.finished, 0);
    let served = s.sims.engine(1).unwrap().state();
    // Its health probes are one-token generations too.
    assert!(
        served.finished >= 4,
        "every request served there: {served:?}"
    );
}

#[tokio::test]
async fn the_load_comes_pushed_on_the_event_stream_and_the_poll_steps_aside() {
    let model = ModelDir::new("pushed");
    let s = grpc_setup_with(1, instant(Flavor::Sglang), &model, poll_rarely).await;
    // The engine's first batch of KV events carries its load record.
    let answer = s
        .chat(&chat_body(
            "test-model",
            "Hello there, how are you?",
            4,
            false,
        ))
        .await;
    assert_eq!(answer.status, 200);
    let worker = until_load_from(&s, "pushed").await;
    let engine = s.sims.engine(0).unwrap().config().clone();
    let capacity = u64::from(engine.num_gpu_blocks) * u64::from(engine.block_size);
    assert_eq!(
        worker["load"]["ranks"][0]["kv_capacity"], capacity,
        "{worker}"
    );
    assert_eq!(
        worker["load"]["ranks"][0]["max_running"],
        engine.max_num_seqs
    );
}

#[tokio::test]
async fn a_worker_that_pushed_and_then_answers_nothing_is_excluded_as_unreachable() {
    let model = ModelDir::new("stale");
    let s = grpc_setup_with(2, instant(Flavor::Sglang), &model, |c| {
        poll_rarely(c);
        c.control.health.interval = Duration::from_secs(3600);
        c.control.liveness.as_mut().expect("on by default").stale = Duration::from_secs(1);
    })
    .await;
    for _ in 0..2 {
        let answer = s
            .chat(&chat_body(
                "test-model",
                "Hello there, how are you?",
                4,
                false,
            ))
            .await;
        assert_eq!(answer.status, 200);
    }
    until_load_from(&s, "pushed").await;
    let id = s.worker_id(0).await;
    // Nothing comes back from it now: no records, no heartbeats, no answers.
    s.fault(0, sluice_sim::Fault::OneWay).await;
    let view = s
        .until_worker(&id, "the stale veto", |w| {
            w["vetoes"]["liveness"] == "stale" || w["vetoes"]["liveness"] == "unreachable"
        })
        .await;
    assert_eq!(view["status"], "ready", "health is untouched: {view}");
    // Any contact lifts it: the link carries again, the held heartbeats arrive.
    s.fault(0, sluice_sim::Fault::Clear).await;
    s.until_worker(&id, "contact again", |w| w["vetoes"]["liveness"].is_null())
        .await;
}

#[tokio::test]
async fn a_stopped_event_stream_alone_is_not_staleness_while_polls_answer() {
    let model = ModelDir::new("polled");
    let s = grpc_setup_with(1, instant(Flavor::Sglang), &model, |c| {
        c.control.load.interval = Duration::from_millis(200);
        c.control.load.min_interval = Duration::from_millis(50);
        c.control.liveness.as_mut().expect("on by default").stale = Duration::from_secs(1);
    })
    .await;
    let answer = s
        .chat(&chat_body(
            "test-model",
            "Hello there, how are you?",
            4,
            false,
        ))
        .await;
    assert_eq!(answer.status, 200);
    until_load_from(&s, "pushed").await;
    s.fault(0, sluice_sim::Fault::EventsStop).await;
    // The records stop; the poll takes over and its answers are contact.
    let worker = until_load_from(&s, "GetLoads").await;
    assert!(worker["vetoes"]["liveness"].is_null(), "{worker}");
    let id = s.worker_id(0).await;
    let view = s
        .until_worker(&id, "a poll after the stale bound", |w| {
            w["engine_load"]["age_secs"]
                .as_f64()
                .is_some_and(|a| a < 0.5)
        })
        .await;
    assert!(
        view["vetoes"]["liveness"].is_null(),
        "polled, so not stale: {view}"
    );
}

#[tokio::test]
async fn a_frozen_grpc_engine_under_a_deep_pile_of_streams_is_wedged_until_it_resumes() {
    let model = ModelDir::new("pile");
    let s = grpc_setup_with(2, timed(Flavor::Sglang, 1.0), &model, |c| {
        c.route.policy = sluice_core::policy::Policy::RoundRobin;
        c.control.liveness.as_mut().expect("on by default").wedge = Duration::from_millis(300);
    })
    .await;
    let id = s.worker_id(0).await;
    s.fault(0, sluice_sim::Fault::Pause).await;
    // Its reports show no queue (pinned), so only the pile of streams that get no token tells;
    // the heartbeats still come (the servicer is alive), so it is not stale either.
    s.fault(
        0,
        sluice_sim::Fault::Report {
            rank: None,
            waiting: Some(0),
            running: Some(0),
            kv_usage: None,
        },
    )
    .await;
    // Round robin puts four of eight on it: a pile four deep.
    let mut held = Vec::new();
    for _ in 0..8 {
        let client = s.client.clone();
        let url = s.url("/v1/chat/completions");
        let body = chat_body("test-model", "Hello there", 64, true);
        held.push(tokio::spawn(
            async move { post(&client, &url, &body).await },
        ));
    }
    let view = s
        .until_worker(&id, "the pile's veto", |w| {
            w["vetoes"]["liveness"] == "wedged_pile"
        })
        .await;
    assert_eq!(view["status"], "ready", "{view}");
    s.fault(0, sluice_sim::Fault::Clear).await;
    s.until_worker(&id, "progress again", |w| w["vetoes"]["liveness"].is_null())
        .await;
    for request in held {
        let answer = bounded("a held stream", request).await.unwrap();
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
}

#[tokio::test]
async fn the_health_rpc_demotes_a_frozen_grpc_engine_and_passes_once_it_produces_again() {
    let model = ModelDir::new("health");
    // SGLang's 20 s probe wait is 0.2 s at 100x.
    let s = grpc_setup_with(1, timed(Flavor::Sglang, 100.0), &model, |c| {
        c.control.health.interval = Duration::from_millis(100);
        c.control.health.timeout = Duration::from_secs(5);
        c.control.health.thresholds.failure = 1;
        c.control.health.thresholds.success = 1;
    })
    .await;
    let id = s.worker_id(0).await;
    s.fault(0, sluice_sim::Fault::Pause).await;
    let view = s.until_status(&id, "not_ready").await;
    assert!(
        view["health"]["last_probe"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("Health check timeout")),
        "the servicer's own verdict: {view}"
    );
    s.fault(0, sluice_sim::Fault::Clear).await;
    s.until_status(&id, "ready").await;
}

#[tokio::test]
async fn an_engine_that_reports_its_own_silence_is_caught_holding_a_single_stream() {
    let model = ModelDir::new("silence");
    let mut engine = timed(Flavor::Sglang, 1.0);
    engine.grpc = Some(GrpcConfig {
        report_silence: true,
        ..GrpcConfig::default()
    });
    let s = grpc_setup_with(1, engine, &model, |c| {
        poll_rarely(c);
        c.control.liveness.as_mut().expect("on by default").wedge = Duration::from_millis(300);
    })
    .await;
    // A first answer measures the worker's prefill rate: on SGLang's wire (token batches only)
    // the engine's silence passes no verdict before.
    let answer = s
        .chat(&chat_body("test-model", "Hello there", 4, false))
        .await;
    assert_eq!(answer.status, 200);
    let id = s.worker_id(0).await;
    s.fault(0, sluice_sim::Fault::Pause).await;
    // One stream, no queue (pinned): neither a pile nor a queue tells; the engine's record does.
    s.fault(
        0,
        sluice_sim::Fault::Report {
            rank: None,
            waiting: Some(0),
            running: None,
            kv_usage: None,
        },
    )
    .await;
    let client = s.client.clone();
    let url = s.url("/v1/chat/completions");
    let body = chat_body("test-model", "Hello again", 64, true);
    let held = tokio::spawn(async move { post(&client, &url, &body).await });
    s.until_worker(&id, "the engine's own silence", |w| {
        w["vetoes"]["liveness"] == "engine_silent"
    })
    .await;
    s.fault(0, sluice_sim::Fault::Clear).await;
    s.until_worker(&id, "output again", |w| w["vetoes"]["liveness"].is_null())
        .await;
    let answer = bounded("the held stream", held).await.unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
}

#[tokio::test]
async fn without_a_model_directory_the_tokenizer_comes_from_the_worker() {
    let mut engine = instant(Flavor::Sglang);
    engine.grpc = Some(GrpcConfig::default());
    // Workers registering at once each ask for the tokenizer: one fetch must not spoil another.
    let sims = SimFleet::start(FleetConfig::local(4, engine))
        .await
        .unwrap();
    // No --model-path: the gateway asks the worker (GetTokenizer), as SMG does.
    let mut config = Config::local(&sims.urls());
    config.route.policy = sluice_core::policy::Policy::RoundRobin;
    assert!(!config.upstream.tokens.is_set());
    let s = serve(sims, config).await;
    for _ in 0..4 {
        let answer = s
            .chat(&chat_body("test-model", "Hello there", 8, false))
            .await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        let body = answer.json();
        let tokens = body["usage"]["completion_tokens"].as_u64().unwrap();
        let finish = body["choices"][0]["finish_reason"].as_str().unwrap();
        assert_eq!(
            body["choices"][0]["message"]["content"],
            said(tokens, finish)
        );
    }
    assert_eq!(s.received(), [1, 1, 1, 1]);
    let fetches: u64 = s
        .sims
        .engines()
        .iter()
        .map(|e| e.state().tokenizer_fetches)
        .sum();
    assert_eq!(fetches, 1, "one fetch; the other workers found it loaded");
}

#[tokio::test]
async fn a_client_that_leaves_a_whole_answer_aborts_it_in_the_engine_too() {
    let model = ModelDir::new("leave-whole");
    let s = grpc_setup(1, timed(Flavor::Sglang, 1.0), &model).await;
    let mut body: Value =
        serde_json::from_str(&chat_body("test-model", "hi", 100_000, false)).unwrap();
    body["ignore_eos"] = json!(true);
    let client = s.client.clone();
    let url = s.url("/v1/chat/completions");
    let asked = tokio::spawn(async move { post(&client, &url, &body.to_string()).await });
    let engine = s.sims.engine(0).unwrap();
    bounded("the request running", engine.until(|st| st.running == 1)).await;
    asked.abort();
    let state = bounded("the abort", engine.until(|st| st.aborted == 1)).await;
    assert_eq!(state.running, 0, "the engine freed the request");
}

#[tokio::test]
async fn a_tokenizer_no_worker_could_serve_at_registration_is_asked_for_again() {
    let mut engine = instant(Flavor::Sglang);
    engine.grpc = Some(GrpcConfig::default());
    let mut fleet = FleetConfig::local(1, engine);
    // A servicer started without a tokenizer path refuses GetTokenizer.
    fleet.faults.push((None, sluice_sim::Fault::NoTokenizer));
    let sims = SimFleet::start(fleet).await.unwrap();
    let mut config = Config::local(&sims.urls());
    config.control.health.interval = Duration::from_millis(100);
    let s = serve(sims, config).await;
    let refused = s.chat(&chat_body("test-model", "hi", 4, false)).await;
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(
        common::code(&refused).as_deref(),
        Some("tokenizer_unavailable")
    );

    s.fault(0, sluice_sim::Fault::Clear).await;
    let engine = s.sims.engine(0).unwrap();
    bounded(
        "the tokenizer asked for again",
        engine.until(|st| st.tokenizer_fetches == 1),
    )
    .await;
    let answer = bounded("an answer", async {
        loop {
            let answer = s.chat(&chat_body("test-model", "hi", 4, false)).await;
            if answer.status != 503 {
                break answer;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
}
