//! Each worker's latency model learns from this gateway's requests to it, and `/workers` shows
//! what it learned.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;

#[tokio::test]
async fn a_workers_prefill_rate_is_learned_from_its_first_tokens() {
    let s = start(1, timed(Flavor::Vllm, 1.0), |_| {}).await;
    let before = &s.workers().await[0]["latency"];
    assert_eq!(
        before["prefill_rate"],
        Value::Null,
        "nothing learned yet: {before}"
    );
    let prompt = "word ".repeat(2000);
    for _ in 0..3 {
        let answer = s.chat(&chat_body("test-model", &prompt, 1, false)).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    let after = &s.workers().await[0]["latency"];
    let rate = after["prefill_rate"].as_f64().unwrap_or(0.0);
    assert!(rate > 0.0, "{after}");
}

#[tokio::test]
async fn a_workers_pace_is_learned_from_its_streams_and_each_prediction_judged() {
    let s = start(1, timed(Flavor::Vllm, 1.0), |_| {}).await;
    for i in 0..3 {
        let body = chat_body("test-model", &format!("count to {i}"), 12, true);
        let answer = s.chat(&body).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    let latency = &s.workers().await[0]["latency"];
    assert_eq!(
        latency["tpot_judged"], 2,
        "every stream after the first: {latency}"
    );
    let error = latency["tpot_error"].as_f64().unwrap();
    assert!(
        (0.0..1.0).contains(&error),
        "one engine, one pace: {latency}"
    );
    let id = s.worker_id(0).await;
    let series = format!("sluice_worker_prediction_error{{worker=\"{id}\",kind=\"tpot\"}}");
    assert_eq!(s.metric(&series).await, Some(error), "the view's figure");
}
