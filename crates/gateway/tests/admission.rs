//! Admission at the edge, black-box: tenants found by their keys, their budgets refused with
//! OpenAI's headers and settled against what responses used, concurrency caps, client deadlines.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use tokio::time::Instant;

/// A chat request with `headers`, answered in full.
async fn chat_as(s: &Setup, body: &str, headers: &[(&str, &str)]) -> Answer {
    send(
        &s.client,
        "POST",
        &s.url("/v1/chat/completions"),
        Some(body),
        headers,
    )
    .await
}

fn header(a: &Answer, name: &str) -> u64 {
    a.headers[name].to_str().unwrap().parse().unwrap()
}

#[tokio::test]
async fn a_tenants_token_budget_is_refused_with_openais_headers_and_settled_by_usage() {
    let s = start(1, instant(Flavor::Vllm), |c| {
        let mut t = tenant("acme", "acme-key");
        t.tokens_per_minute = Some(600);
        t.requests_per_minute = Some(100);
        c.admission.tenants = vec![t];
    })
    .await;
    let engine = s.sims.engine(0).unwrap();
    let auth = [("authorization", "Bearer acme-key")];

    let started = Instant::now();
    let first = chat_as(&s, &chat_body("test-model", "hi", 20, false), &auth).await;
    assert_eq!(first.status, 200, "{}", first.text());
    for name in [
        "x-ratelimit-limit-requests",
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-requests",
        "x-ratelimit-reset-tokens",
    ] {
        assert!(
            first.headers.contains_key(name),
            "{name}: {:?}",
            first.headers
        );
    }
    assert_eq!(header(&first, "x-ratelimit-limit-tokens"), 600);
    assert_eq!(header(&first, "x-ratelimit-remaining-requests"), 99);
    let usage = &first.json()["usage"];
    let used =
        usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap();

    // Settled against what it used: the budget shows 600 less the usage (and what refilled
    // meanwhile, at 10 a second).
    let view = get_admin(&s.client, &s.url("/admission")).await.json();
    let acme = &view["tenants"][0];
    assert_eq!(acme["name"], "acme");
    let remaining = acme["tokens_per_minute"]["remaining"].as_u64().unwrap();
    let refilled = (started.elapsed().as_secs_f64() * 10.0).ceil() as u64;
    assert!(
        (600 - used..=600 - used + refilled).contains(&remaining),
        "{remaining} left after using {used}"
    );

    // More than the whole budget: refused at once, and the engine never sees it.
    let before = engine.state().requests_received;
    let huge = chat_as(&s, &chat_body("test-model", "hi", 5000, false), &auth).await;
    assert_eq!(huge.status, 429);
    assert_eq!(code(&huge).as_deref(), Some("rate_limit_exceeded"));
    assert!(
        huge.headers.get("retry-after").is_none(),
        "waiting cannot help"
    );
    assert!(
        huge.text().contains("more than its limit of 600"),
        "{}",
        huge.text()
    );

    // Spent: 429 with Retry-After and the budget's headers (598 tokens asked, about 580 left).
    let big = chat_body("test-model", "hi", 590, false);
    let spent = chat_as(&s, &big, &auth).await;
    assert_eq!(spent.status, 429, "{}", spent.text());
    assert_eq!(code(&spent).as_deref(), Some("rate_limit_exceeded"));
    assert!(header(&spent, "retry-after") >= 1);
    assert!(header(&spent, "x-ratelimit-remaining-tokens") < 598);
    assert_eq!(
        engine.state().requests_received,
        before,
        "refused before any engine"
    );

    let metrics = get(&s.client, &s.url("/metrics")).await.text();
    let prompt = usage["prompt_tokens"].as_u64().unwrap();
    assert!(
        metrics.contains(&format!(
            r#"sluice_tenant_tokens_total{{tenant="acme",kind="prompt"}} {prompt}"#
        )),
        "{metrics}"
    );
    assert!(metrics.contains(
        r#"sluice_admission_rejected_total{tier="agent",reason="rate_limit_exceeded"} 2"#
    ));
}

#[tokio::test]
async fn a_tenant_at_its_concurrency_waits_its_turn_others_do_not() {
    let s = start(1, timed(Flavor::Vllm, 1.0), |c| {
        let mut t = tenant("one-at-a-time", "k1");
        t.max_concurrent = Some(1);
        c.admission.tenants = vec![t];
        c.access.keys.client = vec!["shared".into()];
    })
    .await;
    let mine = [("authorization", "Bearer k1")];
    let stream = open_stream_as(&s, "a long answer", 4000, &mine).await;
    let second = chat_as(&s, &chat_body("test-model", "hi", 2, false), &mine).await;
    assert_eq!(second.status, 429);
    assert_eq!(
        code(&second).as_deref(),
        Some("tenant_concurrency_exceeded")
    );
    assert_eq!(second.headers["retry-after"], "1");
    let other = chat_as(
        &s,
        &chat_body("test-model", "hi", 2, false),
        &[("authorization", "Bearer shared")],
    )
    .await;
    assert_eq!(other.status, 200, "another tenant is not held back");
    let unkeyed = chat_as(&s, &chat_body("test-model", "hi", 2, false), &[]).await;
    assert_eq!(
        unkeyed.status, 401,
        "a tenant's key turns authentication on"
    );

    drop(stream);
    let engine = s.sims.engine(0).unwrap();
    bounded("the abort", engine.until(|st| st.aborted == 1)).await;
    let view = get_admin(&s.client, &s.url("/admission")).await.json();
    assert_eq!(view["tenants"][0]["in_flight"], 0, "the slot came back");
    let third = chat_as(&s, &chat_body("test-model", "hi", 2, false), &mine).await;
    assert_eq!(third.status, 200, "{}", third.text());
}

#[tokio::test]
async fn a_deadline_that_cannot_be_met_never_reaches_an_engine_and_one_that_runs_out_ends_the_stream(
) {
    let s = start(1, timed(Flavor::Vllm, 1.0), |_| {}).await;
    let engine = s.sims.engine(0).unwrap();
    let gone = chat_as(
        &s,
        &chat_body("test-model", "hi", 2, false),
        &[("x-request-deadline-ms", "0")],
    )
    .await;
    assert_eq!(gone.status, 504);
    assert_eq!(code(&gone).as_deref(), Some("deadline_exceeded"));
    assert_eq!(engine.state().requests_received, 0);

    let bad = chat_as(
        &s,
        &chat_body("test-model", "hi", 2, false),
        &[("x-request-deadline-ms", "soon")],
    )
    .await;
    assert_eq!(bad.status, 400);
    assert_eq!(bad.json()["error"]["param"], "x-request-deadline-ms");

    // A long answer with 1.5 s to live: cut with the client's reason, and no [DONE].
    let cut = chat_as(
        &s,
        &chat_body("test-model", "a long answer", 4000, true),
        &[("x-request-deadline-ms", "1500")],
    )
    .await;
    assert_eq!(cut.status, 200);
    let events = cut.events();
    let last = events.last().unwrap();
    assert!(last.contains("deadline_exceeded"), "{last}");
    assert!(!events.iter().any(|e| e == "[DONE]"));
    bounded("the abort", engine.until(|st| st.aborted == 1)).await;
}

/// An engine that answers every chat request with the headers it was sent.
async fn header_echo() -> String {
    use axum::{routing, Router};
    let app = Router::new()
        .route(
            "/v1/models",
            routing::get(|| async {
                axum::Json(serde_json::json!({"data":[{"id":"test-model","owned_by":"vllm"}]}))
            }),
        )
        .route(
            "/v1/chat/completions",
            routing::post(|headers: http::HeaderMap| async move {
                let seen: serde_json::Map<String, Value> = headers
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_str().unwrap().into()))
                    .collect();
                axum::Json(serde_json::json!({ "headers": seen }))
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

#[tokio::test]
async fn the_worker_is_told_what_is_left_of_the_clients_deadline() {
    let gateway = Gateway::start(Config::local(&[header_echo().await]))
        .await
        .unwrap();
    let http = client();
    until_workers(&gateway, &http, "ready", all_ready).await;
    let url = format!("{}/v1/chat/completions", gateway.url());
    let sent_at = Instant::now();
    let a = send(
        &http,
        "POST",
        &url,
        Some(&chat_body("test-model", "hi", 2, false)),
        &[
            ("x-request-deadline-ms", "60000"),
            ("x-sluice-priority", "batch"),
        ],
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    let left: u64 = a.json()["headers"]["x-request-deadline-ms"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    // At most the time this request took, rounded up, was spent before the worker was told.
    let spent = sent_at.elapsed().as_millis() as u64 + 1;
    assert!(
        (60_000 - spent..60_000).contains(&left),
        "{left} ms left after {spent} ms"
    );
    let metrics = get(&http, &format!("{}/metrics", gateway.url()))
        .await
        .text();
    assert!(
        metrics.contains(
            r#"sluice_tenant_requests_total{tenant="default",tier="batch",outcome="admitted"} 1"#
        ),
        "{metrics}"
    );
    let bad = send(
        &http,
        "POST",
        &url,
        Some(&chat_body("test-model", "hi", 2, false)),
        &[("x-sluice-priority", "urgent")],
    )
    .await;
    assert_eq!(bad.status, 400);
    assert_eq!(code(&bad).as_deref(), Some("invalid_header"));
}

#[tokio::test]
async fn a_deadline_shorter_than_the_expected_first_token_is_refused_before_any_engine() {
    let s = start(1, timed(Flavor::Vllm, 1.0), |_| {}).await;
    let engine = s.sims.engine(0).unwrap();
    let prompt = "lorem ipsum ".repeat(2000);
    // A first long prompt teaches the gateway this worker's prefill rate.
    let started = Instant::now();
    let warm = s.chat(&chat_body("test-model", &prompt, 1, false)).await;
    assert_eq!(warm.status, 200, "{}", warm.text());
    let prefill = started.elapsed();
    let seen = engine.state().requests_received;

    // The same prompt with a quarter of that time to live cannot get its first token in time.
    let budget = (prefill.as_millis() / 4).max(1).to_string();
    let hopeless = chat_as(
        &s,
        &chat_body("test-model", &prompt, 1, false),
        &[("x-request-deadline-ms", budget.as_str())],
    )
    .await;
    assert_eq!(hopeless.status, 504, "{}", hopeless.text());
    assert_eq!(code(&hopeless).as_deref(), Some("deadline_exceeded"));
    assert_eq!(engine.state().requests_received, seen, "never forwarded");

    // A short prompt with the same budget fits.
    let short = chat_as(
        &s,
        &chat_body("test-model", "hi", 1, false),
        &[("x-request-deadline-ms", "60000")],
    )
    .await;
    assert_eq!(short.status, 200, "{}", short.text());
}
