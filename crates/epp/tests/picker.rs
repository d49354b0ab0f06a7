//! The endpoint picker, black-box: a data plane speaking ext_proc in full-duplex streamed mode
//! (the test's own, `common::DataPlane`) in front of simulated engines. What a request gets
//! through the picker is what `sluice serve` would have given it; where the Gateway API's
//! protocol asks for something else (429 for a shed, 503 for no endpoint), that.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;

#[tokio::test]
async fn a_stream_goes_to_a_ready_worker_and_comes_back_through_the_picker() {
    let s = start(2, instant(Flavor::Vllm), |_, _| {}).await;
    let mut plane = s.data_plane().await;
    let answer = plane
        .chat(
            &chat_body("hello", 4, true),
            &[
                ("authorization", "Bearer client-secret"),
                ("x-request-id", "r-1"),
            ],
        )
        .await;
    let Decision::Routed { endpoint } = &answer.decision else {
        panic!("not routed: {answer:?}");
    };
    let engines: Vec<String> = s.sims.urls().iter().map(|u| address_of(u)).collect();
    assert!(
        engines.contains(endpoint),
        "{endpoint} is one of {engines:?}"
    );
    assert_eq!(answer.status, 200);
    let events = sse_events(&answer.text());
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    assert!(events.len() > 2, "tokens came through: {events:?}");
    assert_eq!(answer.headers["x-request-id"], "r-1");
    assert!(
        !answer.sent_headers.contains_key("authorization"),
        "the client's key never reaches a worker"
    );
    assert_eq!(answer.sent_headers["x-request-id"], "r-1");
    let text = metrics(&s.picker).await;
    assert!(
        text.lines()
            .any(|l| l.starts_with("sluice_slo_attained_total{tier=\"interactive\"} 1")),
        "the answer was judged against its tier's objectives: {text}"
    );
}

#[tokio::test]
async fn bad_input_is_answered_by_the_picker_in_the_openai_shape() {
    let s = start(1, instant(Flavor::Vllm), |_, _| {}).await;
    let mut plane = s.data_plane().await;
    let answer = plane.chat("{not json", &[]).await;
    assert_eq!(answer.decision, Decision::Immediate);
    assert_eq!(answer.status, 400);
    assert_eq!(answer.code(), Some("invalid_json"));
    assert_eq!(answer.json()["error"]["code"], "invalid_json");
    let models = plane
        .exchange(&[(":method", "GET"), (":path", "/v1/models")], None)
        .await;
    assert_eq!(models.decision, Decision::Immediate);
    assert_eq!(models.status, 200);
    assert_eq!(models.json()["data"][0]["id"], "test-model");
}

#[tokio::test]
async fn a_request_shed_for_load_is_429_with_the_gateways_code_and_retry_after() {
    let s = start(1, instant(Flavor::Vllm), |c, _| {
        // One request admitted, then none for a long while; nothing waits.
        c.admission.max_concurrent = Some(1);
        c.admission.request_rate = Some(0.001);
        c.admission.queue = None;
    })
    .await;
    let mut plane = s.data_plane().await;
    let first = plane.chat(&chat_body("one", 2, false), &[]).await;
    assert_eq!(first.status, 200);
    let shed = plane.chat(&chat_body("two", 2, false), &[]).await;
    assert_eq!(shed.decision, Decision::Immediate);
    assert_eq!(
        shed.status, 429,
        "the Inference Extension's status for a shed"
    );
    assert_eq!(shed.code(), Some("queue_full"), "sluice's own code stays");
    assert!(shed.headers.contains_key("retry-after"));
}

#[tokio::test]
async fn the_data_planes_subset_hint_is_honoured() {
    let s = start(2, instant(Flavor::Vllm), |_, _| {}).await;
    let mut plane = s.data_plane().await;
    let only = address_of(&s.sims.urls()[1]);
    let head = [
        (":method", "POST"),
        (":path", "/v1/chat/completions"),
        ("content-type", "application/json"),
    ];
    for n in 0..4 {
        let body = chat_body(&format!("n{n}"), 2, false);
        let answer = plane
            .exchange_with(
                &head,
                Some(body.as_bytes()),
                Some(subset_hint(std::slice::from_ref(&only))),
            )
            .await;
        assert_eq!(
            answer.decision,
            Decision::Routed {
                endpoint: only.clone()
            }
        );
    }
    let body = chat_body("none", 2, false);
    let none = plane
        .exchange_with(&head, Some(body.as_bytes()), Some(subset_hint(&[])))
        .await;
    assert_eq!(none.decision, Decision::Immediate);
    assert_eq!(none.status, 503, "no endpoint in the subset can serve");
    assert_eq!(none.code(), Some("no_available_workers"));
}

#[tokio::test]
async fn an_inference_objectives_priority_sets_the_tier() {
    let s = start(1, instant(Flavor::Vllm), |_, epp| {
        epp.inference_objectives = vec!["batch-sheddable=-1".into()];
    })
    .await;
    let mut plane = s.data_plane().await;
    let answer = plane
        .chat(
            &chat_body("later", 2, true),
            &[("x-gateway-inference-objective", "batch-sheddable")],
        )
        .await;
    assert_eq!(answer.status, 200);
    let text = metrics(&s.picker).await;
    assert!(
        text.lines()
            .any(|l| l.starts_with("sluice_slo_attained_total{tier=\"batch\"} 1")),
        "served as batch: {text}"
    );
}

#[tokio::test]
async fn a_body_the_gateway_changes_is_sent_back_changed_and_any_other_as_it_came() {
    let s = start(1, instant(Flavor::Vllm), |_, _| {}).await;
    let mut plane = s.data_plane().await;
    // No model named: the one the fleet serves is spliced in, as sluice serve does.
    let unnamed = r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}"#;
    let answer = plane.chat(unnamed, &[]).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let sent: serde_json::Value = serde_json::from_slice(&answer.sent_body).unwrap();
    assert_eq!(sent["model"], "test-model");
    assert_eq!(
        answer.sent_headers["content-length"],
        answer.sent_body.len().to_string().as_str()
    );
    let named = chat_body("as it came", 2, false);
    let answer = plane.chat(&named, &[]).await;
    assert_eq!(answer.sent_body, named.as_bytes(), "byte for byte");
}

#[tokio::test]
async fn a_deadline_that_cannot_be_met_is_answered_by_the_picker_and_one_that_runs_out_ends_the_stream(
) {
    let s = start(1, timed(Flavor::Vllm, 1.0), |_, _| {}).await;
    let mut plane = s.data_plane().await;
    let gone = plane
        .chat(
            &chat_body("too late", 2, false),
            &[("x-request-deadline-ms", "0")],
        )
        .await;
    assert_eq!(gone.decision, Decision::Immediate);
    assert_eq!(gone.status, 504);
    assert_eq!(gone.code(), Some("deadline_exceeded"));
    assert_eq!(s.received(), [0], "it never reached the engine");

    // A long answer with 1.5 s to live: cut by the picker with the client's reason, no [DONE].
    let cut = plane
        .chat(
            &chat_body("a long answer", 4000, true),
            &[("x-request-deadline-ms", "1500")],
        )
        .await;
    assert_eq!(cut.status, 200);
    let events = sse_events(&cut.text());
    let last = events.last().unwrap();
    assert!(last.contains("deadline_exceeded"), "{last}");
    assert!(!events.iter().any(|e| e == "[DONE]"));
}
