#![allow(clippy::unwrap_used)] // test support: a failed step is the test failing
//! Faults, cancellation and the engine's own admission limits, seen from outside.

mod common;

use std::time::Duration;

use common::*;
use http_body_util::BodyExt;
use serde_json::json;
use sluice_sim::{Fault, Flavor, LoadEndpointMode, WedgedPolls};

fn completion(max_tokens: u32, stream: bool) -> String {
    json!({"model": "test-model", "prompt": "hello", "max_tokens": max_tokens,
           "ignore_eos": true, "stream": stream})
    .to_string()
}

/// Starts a streaming request and returns its response once the headers are in.
async fn open_stream(
    c: &HttpClient,
    base: &str,
    max_tokens: u32,
) -> http::Response<hyper::body::Incoming> {
    let request = http::Request::post(format!("{base}/v1/completions"))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(completion(
            max_tokens, true,
        ))))
        .unwrap();
    c.request(request).await.unwrap()
}

/// The value of the sample of `name` (with the test engine's labels) in a `/metrics` text.
fn gauge(metrics: &str, name: &str) -> f64 {
    let prefix = format!("{name}{{model_name=\"test-model\",engine=\"0\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {metrics}"))
}

/// A whole answer of `max_tokens`, asked of the engine at `base` in the background.
fn send_whole(
    c: &HttpClient,
    base: &str,
    max_tokens: u32,
) -> tokio::task::JoinHandle<sluice_sim::testkit::Answer> {
    let (c, url) = (c.clone(), format!("{base}/v1/completions"));
    tokio::spawn(async move { post(&c, &url, &completion(max_tokens, false)).await })
}

/// Wedges the engine, its loads answered as `polls` says.
async fn wedge(slot: &sluice_sim::EngineSlot, polls: WedgedPolls) {
    slot.fault(Fault::Wedge { polls }).await.unwrap();
}

#[tokio::test]
async fn a_wedged_vllm_engine_core_idle_reports_nothing_held_while_requests_pile_up() {
    let fleet = fleet(instant(Flavor::Vllm)).await;
    let slot = fleet.engine(0).unwrap();
    let base = slot.url();
    let c = client();
    wedge(slot, WedgedPolls::Stale).await;
    let (first, second) = (send_whole(&c, &base, 4), send_whole(&c, &base, 4));
    slot.until(|s| s.requests_received == 2).await;
    let metrics = get(&c, &format!("{base}/metrics")).await.text();
    assert_eq!(
        gauge(&metrics, "vllm:num_requests_waiting"),
        0.0,
        "the last step's"
    );
    assert_eq!(gauge(&metrics, "vllm:num_requests_running"), 0.0);
    assert_eq!(
        get(&c, &format!("{base}/health")).await.status,
        200,
        "vLLM's health cannot see a wedge (vllm-project/vllm#39863)"
    );
    assert_eq!(
        get(&c, &format!("{base}/load")).await.json()["server_load"],
        2,
        "the API process counts what it holds"
    );
    slot.fault(Fault::Clear).await.unwrap();
    for answer in [first.await.unwrap(), second.await.unwrap()] {
        assert_eq!(answer.status, 200, "what waited is served once it steps");
        assert_eq!(answer.json()["usage"]["completion_tokens"], 4);
    }
}

#[tokio::test]
async fn a_wedged_engine_under_load_reports_the_last_steps_figures() {
    let fleet = fleet(timed(Flavor::Vllm, 1.0)).await;
    let slot = fleet.engine(0).unwrap();
    let base = slot.url();
    let c = client();
    let mut streams = Vec::new();
    for _ in 0..3 {
        let mut body = open_stream(&c, &base, 4000).await.into_body();
        body.frame().await.unwrap().unwrap();
        streams.push(body);
    }
    slot.until(|s| s.running == 3).await;
    wedge(slot, WedgedPolls::Stale).await;
    let generated = slot.state().tokens_generated;
    let late = open_stream(&c, &base, 4).await;
    assert_eq!(
        late.status(),
        200,
        "a stream's head is sent before the engine is asked"
    );
    slot.until(|s| s.requests_received == 4).await;
    let metrics = get(&c, &format!("{base}/metrics")).await.text();
    assert_eq!(gauge(&metrics, "vllm:num_requests_running"), 3.0);
    assert_eq!(gauge(&metrics, "vllm:num_requests_waiting"), 0.0);
    assert_eq!(slot.state().tokens_generated, generated, "no step since");
    slot.fault(Fault::Clear).await.unwrap();
    let answer = late.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&answer).ends_with("data: [DONE]\n\n"));
    assert!(slot.state().tokens_generated > generated);
}

#[tokio::test]
async fn a_wedged_sglang_scheduler_answers_its_loads_stale_or_not_at_all() {
    let fleet = fleet(instant(Flavor::Sglang)).await;
    let slot = fleet.engine(0).unwrap();
    let base = slot.url();
    let c = client();
    wedge(slot, WedgedPolls::Stale).await;
    let pending = send_whole(&c, &base, 4);
    slot.until(|s| s.requests_received == 1).await;
    let loads = get(&c, &format!("{base}/v1/loads")).await.json();
    assert_eq!(
        loads["loads"][0]["num_waiting_reqs"], 0,
        "the last snapshot"
    );
    assert_eq!(
        get(&c, &format!("{base}/get_load")).await.json()[0]["num_waiting_reqs"],
        0
    );
    // A release whose tokenizer manager asks the scheduler gets no answer.
    wedge(slot, WedgedPolls::Unanswered).await;
    for path in ["/v1/loads", "/get_load"] {
        let url = format!("{base}{path}");
        let poll = tokio::time::timeout(Duration::from_millis(300), get(&c, &url)).await;
        assert!(
            poll.is_err(),
            "{path} answered a wedged scheduler's release"
        );
    }
    let metrics = get(&c, &format!("{base}/metrics")).await;
    assert_eq!(
        metrics.status, 200,
        "its metrics are the collector's, stale"
    );
    slot.fault(Fault::Clear).await.unwrap();
    assert_eq!(pending.await.unwrap().status, 200);
}

#[tokio::test]
async fn a_paused_scheduler_takes_requests_in_and_reports_them_but_runs_none() {
    let fleet = fleet(instant(Flavor::Sglang)).await;
    let slot = fleet.engine(0).unwrap();
    let base = slot.url();
    let c = client();
    slot.fault(Fault::Pause).await.unwrap();
    let pending = send_whole(&c, &base, 4);
    let state = slot.until(|s| s.waiting == 1).await;
    assert_eq!(state.tokens_generated, 0);
    let loads = get(&c, &format!("{base}/v1/loads")).await.json();
    assert_eq!(loads["loads"][0]["num_waiting_reqs"], 1);
    slot.fault(Fault::Clear).await.unwrap();
    let answer = pending.await.unwrap();
    assert_eq!(answer.status, 200);
    assert_eq!(answer.json()["usage"]["completion_tokens"], 4);
}

#[tokio::test]
async fn sglang_health_fails_when_the_engine_makes_no_progress() {
    let mut cfg = timed(Flavor::Sglang, 1000.0); // 20 s of silence is 20 ms here
    cfg.dp_size = 1;
    let fleet = fleet(cfg).await;
    let slot = fleet.engine(0).unwrap();
    let c = client();
    let health = format!("{}/health", slot.url());
    assert_eq!(
        get(&c, &health).await.status,
        200,
        "an idle engine can still generate"
    );
    slot.fault(Fault::Pause).await.unwrap();
    assert_eq!(get(&c, &health).await.status, 503);
    slot.fault(Fault::Clear).await.unwrap();
    assert_eq!(get(&c, &health).await.status, 200);
}

#[tokio::test]
async fn a_crash_resets_connections_and_a_restart_comes_back_on_the_same_port() {
    let fleet = fleet(timed(Flavor::Vllm, 1.0)).await;
    let slot = fleet.engine(0).unwrap();
    let base = slot.url();
    let c = client();
    let response = open_stream(&c, &base, 2000).await;
    let mut body = response.into_body();
    body.frame().await.unwrap().unwrap(); // the first token is in: the request is running
    slot.fault(Fault::Crash).await.unwrap();
    let mut ended_cleanly = false;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                let data = frame.into_data().unwrap_or_default();
                ended_cleanly |= String::from_utf8_lossy(&data).contains("[DONE]");
            }
            Err(_) => break,
        }
    }
    assert!(
        !ended_cleanly,
        "a crashed engine does not finish its streams"
    );
    assert!(
        tokio::net::TcpStream::connect(slot.addr()).await.is_err(),
        "the port is closed"
    );
    let crashed = slot.state();
    assert!(!crashed.up);
    assert!(
        crashed.wasted_tokens > 0,
        "the crash threw away the running request's work"
    );

    slot.fault(Fault::Restart).await.unwrap();
    let fresh = client();
    assert_eq!(get(&fresh, &format!("{base}/health")).await.status, 200);
    let state = slot.state();
    assert!(state.up);
    assert_eq!((state.running, state.waiting), (0, 0), "restarted empty");
    assert_eq!(
        state.requests_received, 1,
        "ground truth outlives the crash"
    );
}

#[tokio::test]
async fn a_hung_engine_answers_nothing_until_it_runs_again_then_serves_what_waited() {
    let fleet = fleet(instant(Flavor::Vllm)).await;
    let slot = fleet.engine(0).unwrap();
    // A connection kept alive from before the hang, and fresh ones during it.
    let kept = client();
    assert_eq!(
        get(&kept, &format!("{}/health", slot.url())).await.status,
        200
    );
    slot.fault(Fault::Hang).await.unwrap();
    let health = format!("{}/health", slot.url());
    let answer = tokio::time::timeout(Duration::from_millis(300), get(&client(), &health)).await;
    assert!(answer.is_err(), "no answer while hung");
    let url = format!("{}/v1/completions", slot.url());
    let sent: Vec<_> = [client(), kept]
        .into_iter()
        .map(|c| {
            let url = url.clone();
            tokio::spawn(async move { post(&c, &url, &completion(4, false)).await })
        })
        .collect();
    let state = slot.until(|s| s.requests_received == 2).await;
    assert_eq!(
        state.finished, 0,
        "counted as they reached the port, never run"
    );
    slot.fault(Fault::Clear).await.unwrap();
    for request in sent {
        let answer = request.await.unwrap();
        assert_eq!(answer.status, 200, "served once it runs again");
    }
    let state = slot.until(|s| s.finished == 2).await;
    assert_eq!(state.requests_received, 2, "each counted once");
    assert_eq!(get(&client(), &health).await.status, 200);
}

#[tokio::test]
async fn a_hung_api_process_holds_streams_in_flight_while_the_engine_runs_on() {
    let fleet = fleet(timed(Flavor::Vllm, 1.0)).await;
    let slot = fleet.engine(0).unwrap();
    let c = client();
    let mut body = open_stream(&c, &slot.url(), 40).await.into_body();
    body.frame().await.unwrap().unwrap();
    slot.fault(Fault::Hang).await.unwrap();
    let finished = slot.until(|s| s.finished == 1).await;
    assert_eq!(finished.tokens_generated, 40, "the engine finished it");
    // What was on its way before the hang may still come; the end may not.
    let mut relayed = String::new();
    while let Ok(Some(Ok(frame))) =
        tokio::time::timeout(Duration::from_millis(300), body.frame()).await
    {
        relayed.push_str(&String::from_utf8_lossy(
            &frame.into_data().unwrap_or_default(),
        ));
    }
    assert!(!relayed.contains("[DONE]"), "relayed while hung: {relayed}");
    slot.fault(Fault::Clear).await.unwrap();
    let rest = body.collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&rest).ends_with("data: [DONE]\n\n"));
}

#[tokio::test]
async fn a_pinned_report_changes_what_is_reported_not_what_is_done() {
    let mut cfg = instant(Flavor::Sglang);
    cfg.dp_size = 2;
    let fleet = fleet(cfg).await;
    let slot = fleet.engine(0).unwrap();
    slot.fault(Fault::Report {
        rank: Some(1),
        waiting: Some(7),
        running: None,
        kv_usage: Some(0.95),
    })
    .await
    .unwrap();
    let c = client();
    let loads = get(&c, &format!("{}/v1/loads", slot.url())).await.json();
    assert_eq!(loads["loads"][0]["num_waiting_reqs"], 0);
    assert_eq!(loads["loads"][1]["num_waiting_reqs"], 7);
    assert_eq!(loads["loads"][1]["token_usage"], 0.95);
    assert_eq!(slot.state().waiting, 0, "the engine itself is idle");
    let answer = post(
        &c,
        &format!("{}/v1/completions", slot.url()),
        &completion(2, false),
    )
    .await;
    assert_eq!(answer.status, 200, "and still serves");
}

#[tokio::test]
async fn load_endpoint_faults_break_only_the_load_endpoints() {
    let fleet = fleet(instant(Flavor::Vllm)).await;
    let slot = fleet.engine(0).unwrap();
    let c = client();
    let metrics = format!("{}/metrics", slot.url());
    slot.fault(Fault::LoadEndpoint {
        mode: LoadEndpointMode::Error,
    })
    .await
    .unwrap();
    assert_eq!(get(&c, &metrics).await.status, 500);
    assert_eq!(get(&c, &format!("{}/load", slot.url())).await.status, 500);
    slot.fault(Fault::LoadEndpoint {
        mode: LoadEndpointMode::Empty,
    })
    .await
    .unwrap();
    let empty = get(&c, &metrics).await;
    assert_eq!((empty.status, empty.body.len()), (200, 0));
    slot.fault(Fault::LoadEndpoint {
        mode: LoadEndpointMode::Timeout,
    })
    .await
    .unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(300), get(&c, &metrics))
            .await
            .is_err()
    );
    let served = post(
        &c,
        &format!("{}/v1/completions", slot.url()),
        &completion(1, false),
    )
    .await;
    assert_eq!(served.status, 200);
}

#[tokio::test]
async fn an_error_rate_of_one_fails_every_request_with_a_500() {
    let fleet = fleet(instant(Flavor::Vllm)).await;
    let slot = fleet.engine(0).unwrap();
    slot.fault(Fault::ErrorRate { rate: 1.0 }).await.unwrap();
    let answer = post(
        &client(),
        &format!("{}/v1/completions", slot.url()),
        &completion(1, false),
    )
    .await;
    assert_eq!(answer.status, 500);
    assert_eq!(answer.json()["error"]["code"], 500);
    assert_eq!(slot.state().rejected, 1);
}

#[tokio::test]
async fn cut_streams_end_mid_way_without_done() {
    let fleet = fleet(instant(Flavor::Vllm)).await;
    let slot = fleet.engine(0).unwrap();
    slot.fault(Fault::CutStreams).await.unwrap();
    let response = open_stream(&client(), &slot.url(), 10).await;
    let mut body = response.into_body();
    let mut text = String::new();
    let mut broken = false;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => text.push_str(&String::from_utf8_lossy(
                &frame.into_data().unwrap_or_default(),
            )),
            Err(_) => {
                broken = true;
                break;
            }
        }
    }
    assert!(broken, "the stream ends with a transport error");
    assert!(!text.contains("[DONE]"));
    assert_eq!(
        text.matches("\"finish_reason\":null").count(),
        5,
        "half of the 10 tokens"
    );
}

#[tokio::test]
async fn a_client_that_leaves_aborts_its_request_and_frees_its_blocks() {
    let fleet = fleet(timed(Flavor::Vllm, 1.0)).await;
    let slot = fleet.engine(0).unwrap();
    let response = open_stream(&client(), &slot.url(), 2000).await;
    let mut body = response.into_body();
    body.frame().await.unwrap().unwrap();
    assert!(slot.state().kv_blocks_used > 0);
    drop(body);
    let state = slot.until(|s| s.aborted == 1).await;
    assert_eq!((state.running, state.kv_blocks_used), (0, 0));
    assert!(state.wasted_tokens > 0);
}

#[tokio::test]
async fn the_worker_side_cap_admits_exactly_n_plus_q_then_answers_529() {
    let mut cfg = instant(Flavor::Vllm);
    cfg.engine_request_limit = Some(1);
    cfg.request_queue_limit = 2;
    let fleet = fleet(cfg).await;
    let slot = fleet.engine(0).unwrap();
    slot.fault(Fault::Pause).await.unwrap();
    let c = client();
    let url = format!("{}/v1/completions", slot.url());
    let held: Vec<_> = (0..3)
        .map(|_| {
            let (c, url) = (c.clone(), url.clone());
            tokio::spawn(async move { post(&c, &url, &completion(1, false)).await })
        })
        .collect();
    let state = slot
        .until(|s| s.engine_requests == Some(1) && s.queued_requests == Some(2))
        .await;
    assert_eq!(state.waiting, 1, "only N requests reach the engine");
    let refused = post(&c, &url, &completion(1, false)).await;
    assert_eq!(refused.status, 529);
    assert_eq!(
        refused.json()["error"]["message"],
        "Server overloaded: worker at capacity"
    );
    slot.fault(Fault::Clear).await.unwrap();
    for request in held {
        assert_eq!(request.await.unwrap().status, 200);
    }
}

#[tokio::test]
async fn max_queued_requests_refuses_with_503_once_the_queue_is_full() {
    let mut cfg = instant(Flavor::Vllm);
    cfg.max_queued_requests = Some(1);
    let fleet = fleet(cfg).await;
    let slot = fleet.engine(0).unwrap();
    slot.fault(Fault::Pause).await.unwrap();
    let c = client();
    let url = format!("{}/v1/completions", slot.url());
    let queued = tokio::spawn({
        let (c, url) = (c.clone(), url.clone());
        async move { post(&c, &url, &completion(1, false)).await }
    });
    slot.until(|s| s.waiting == 1).await;
    let refused = post(&c, &url, &completion(1, false)).await;
    assert_eq!(refused.status, 503);
    slot.fault(Fault::Clear).await.unwrap();
    assert_eq!(queued.await.unwrap().status, 200);
}

#[tokio::test]
async fn the_control_listener_lists_faults_and_reports_state() {
    let fleet = std::sync::Arc::new(
        sluice_sim::SimFleet::start(sluice_sim::FleetConfig::local(2, instant(Flavor::Vllm)))
            .await
            .unwrap(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let control = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        axum::serve(listener, sluice_sim::control::router(fleet))
            .await
            .unwrap();
    });
    let c = client();
    let list = get(&c, &format!("{control}/engines")).await.json();
    assert_eq!(list["engines"].as_array().unwrap().len(), 2);
    let faulted = post(
        &c,
        &format!("{control}/engines/1/fault"),
        r#"{"kind":"slow","factor":4}"#,
    )
    .await;
    assert_eq!(faulted.status, 200);
    assert_eq!(faulted.json()["faults"]["slow_factor"], 4.0);
    let bad = post(
        &c,
        &format!("{control}/engines/1/fault"),
        r#"{"kind":"slow","factor":0}"#,
    )
    .await;
    assert_eq!(bad.status, 400);
    assert_eq!(
        post(
            &c,
            &format!("{control}/engines/7/fault"),
            r#"{"kind":"pause"}"#
        )
        .await
        .status,
        404
    );
    let state = get(&c, &format!("{control}/engines/0/state")).await.json();
    for field in [
        "requests_received",
        "running",
        "waiting",
        "kv_blocks_used",
        "kv_blocks_total",
        "preemptions",
        "aborted",
        "tokens_delivered",
        "wasted_tokens",
    ] {
        assert!(state[field].is_number(), "{field}");
    }
    server.abort();
}

#[tokio::test]
async fn a_slow_start_answers_sglang_health_503_and_keeps_a_vllm_port_closed_until_ready() {
    let sglang = fleet(instant(Flavor::Sglang)).await;
    let slot = sglang.engine(0).unwrap();
    let c = client();
    let health = format!("{}/health", slot.url());
    assert_eq!(get(&c, &health).await.status, 200);
    slot.fault(Fault::SlowStart { secs: 3600.0 }).await.unwrap();
    assert_eq!(get(&c, &health).await.status, 503, "starting");
    slot.fault(Fault::Restart).await.unwrap();
    assert_eq!(get(&c, &health).await.status, 200, "started");

    let vllm = fleet(instant(Flavor::Vllm)).await;
    let slot = vllm.engine(0).unwrap().clone();
    let starting = tokio::spawn({
        let slot = slot.clone();
        async move { slot.fault(Fault::SlowStart { secs: 3600.0 }).await }
    });
    slot.until(|s| !s.up).await;
    assert!(
        tokio::net::TcpStream::connect(slot.addr()).await.is_err(),
        "vLLM binds its socket but listens only once it serves"
    );
    starting.abort();
    slot.fault(Fault::Restart).await.unwrap();
    assert_eq!(get(&c, &format!("{}/health", slot.url())).await.status, 200);
}

#[tokio::test]
async fn over_a_one_way_link_the_request_runs_and_its_answer_waits_for_the_link() {
    let fleet = fleet(instant(Flavor::Vllm)).await;
    let slot = fleet.engine(0).unwrap();
    let base = slot.url();
    let c = client();
    slot.fault(Fault::OneWay).await.unwrap();
    let waiting = tokio::spawn({
        let c = c.clone();
        let url = format!("{base}/v1/completions");
        async move { post(&c, &url, &completion(4, false)).await }
    });
    let state = slot.until(|s| s.finished >= 1).await;
    assert_eq!(
        state.requests_received, 1,
        "the request reached the engine and ran"
    );
    assert!(!waiting.is_finished(), "its answer did not come back");
    slot.fault(Fault::Clear).await.unwrap();
    let answer = waiting.await.unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
}
