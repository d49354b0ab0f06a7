//! What the gateway does with a worker's answer that breaks HTTP/1.1 or the worker client's
//! bounds (a bad answer), and with a kept-alive connection the worker closes under a request
//! (a keep-alive race): the worker here is a raw socket writing bytes no HTTP library would.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::over::{chat, ids, metric, worker_view};
use common::raw::{Generation, RawWorker};
use common::wire::{Scripted, WireEngine};
use common::*;
use sluice_core::breaker::BreakerConfig;
use sluice_core::policy::Policy;

/// A gateway over `urls`, round robin, its circuits opening at the first failure.
async fn gateway_over(urls: &[&str]) -> Gateway {
    let urls: Vec<String> = urls.iter().map(|u| u.to_string()).collect();
    let mut config = Config::local(&urls);
    config.route.policy = Policy::RoundRobin;
    config.fleet.breaker = Some(BreakerConfig {
        failure_threshold: 1,
        success_threshold: 1,
        open_timeout: Duration::from_secs(60),
        half_open_trials: 1,
        failure_rate: None,
    });
    let gateway = Gateway::start(config).await.unwrap();
    until_workers(&gateway, &client(), "workers ready", all_ready).await;
    gateway
}

async fn circuit(gateway: &Gateway, id: &str) -> Value {
    worker_view(gateway, id).await["circuit"]["state"].clone()
}

const SIGNED_LENGTH: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: +5\r\n\r\nhello";

#[tokio::test]
async fn a_malformed_answer_is_a_502_that_leaks_nothing_and_the_worker_s_failure() {
    let worker = RawWorker::start(Generation::Writes(SIGNED_LENGTH)).await;
    let gateway = gateway_over(&[&worker.url]).await;
    let id = ids(&gateway).await.remove(0);

    let answer = chat(&gateway, false).await;
    assert_eq!(answer.status, 502);
    assert_eq!(
        answer.headers["x-sluice-error-code"],
        "upstream_bad_response"
    );
    let error = &answer.json()["error"];
    assert_eq!(error["code"], "upstream_bad_response");
    assert_eq!(error["type"], "server_error");
    let port = worker.url.rsplit(':').next().unwrap();
    assert!(!answer.text().contains(port), "{}", answer.text());
    assert!(!answer.text().contains("+5"), "{}", answer.text());
    assert_eq!(worker.generations(), 1);
    assert_eq!(circuit(&gateway, &id).await, "open");
    let series = format!("sluice_upstream_errors_total{{worker=\"{id}\",kind=\"bad_answer\"}}");
    assert_eq!(metric(&gateway, &series).await, 1.0);
    let reset = format!("sluice_upstream_errors_total{{worker=\"{id}\",kind=\"reset\"}}");
    assert_eq!(metric(&gateway, &reset).await, 0.0);
}

#[tokio::test]
async fn a_malformed_answer_is_retried_on_another_worker() {
    let bad = RawWorker::start(Generation::Writes(SIGNED_LENGTH)).await;
    let good = WireEngine::start("vllm", Scripted::ok_stream()).await;
    let gateway = gateway_over(&[&bad.url, &good.url]).await;

    for stream in [true, false, true, false] {
        let answer = chat(&gateway, stream).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    assert_eq!(bad.generations(), 1, "its circuit opened at the first");
    assert_eq!(good.received(), 4);
    let retried = metric(&gateway, "sluice_retries_total{reason=\"bad_answer\"}").await;
    assert_eq!(retried, 1.0);
}

#[tokio::test]
async fn a_stream_whose_framing_breaks_after_its_first_event_ends_with_an_error_event() {
    const BROKEN: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
        transfer-encoding: chunked\r\n\r\n\
        9e\r\ndata: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"test-model\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hello\"},\"finish_reason\":null}]}\n\n\r\n\
        zz\r\ndata: [DONE]\n\n\r\n0\r\n\r\n";
    let worker = RawWorker::start(Generation::Writes(BROKEN)).await;
    let gateway = gateway_over(&[&worker.url]).await;
    let id = ids(&gateway).await.remove(0);

    let answer = chat(&gateway, true).await;
    assert_eq!(answer.status, 200);
    let text = answer.text();
    assert!(text.contains("\"content\":\"hello\""), "{text}");
    assert!(text.contains("upstream_stream_interrupted"), "{text}");
    assert!(!text.contains("[DONE]"), "{text}");
    let series = format!("sluice_upstream_errors_total{{worker=\"{id}\",kind=\"bad_answer\"}}");
    assert_eq!(metric(&gateway, &series).await, 1.0);
    assert_eq!(circuit(&gateway, &id).await, "open");
}

#[tokio::test]
async fn a_keep_alive_race_is_sent_again_on_a_fresh_connection_and_charged_to_no_one() {
    const OK: &[u8] =
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
    let worker = RawWorker::start(Generation::RacesWith(OK)).await;
    let gateway = gateway_over(&[&worker.url]).await;
    let id = ids(&gateway).await.remove(0);

    for _ in 0..4 {
        let answer = chat(&gateway, false).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    assert!(
        worker.dropped() >= 3,
        "every request after the first met a race"
    );
    let resends = metric(&gateway, "sluice_upstream_keepalive_resends_total").await;
    assert_eq!(resends, worker.dropped() as f64);
    assert_eq!(worker.generations(), 4 + worker.dropped());
    assert_eq!(circuit(&gateway, &id).await, "closed");
    for kind in ["reset", "bad_answer", "connect"] {
        let series = format!("sluice_upstream_errors_total{{worker=\"{id}\",kind=\"{kind}\"}}");
        assert_eq!(metric(&gateway, &series).await, 0.0, "{kind}");
    }
    assert_eq!(
        metric(&gateway, "sluice_retries_total{reason=\"dropped\"}").await,
        0.0
    );
}
