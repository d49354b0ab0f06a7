//! Traces (`--enable-trace`) against an OTLP receiver served here from `opentelemetry-proto`'s
//! types, over gRPC and over HTTP/protobuf: a request's spans, their parents and attributes; the
//! client's trace followed and the worker given the attempt's `traceparent`; sampling; a request
//! refused before admission traced too; and with the collector down or silent, every answer as
//! it would be without traces, the spans that could not go counted as dropped.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::otlp::{attribute, hex, Receiver};
use common::*;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::Span;
use sluice_gateway::trace::{Protocol, TraceConfig};

const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

async fn traced(receiver: &Receiver, protocol: Protocol, ratio: f64) -> Setup {
    traced_with(
        receiver,
        TraceConfig::new(receiver.endpoint(), protocol, ratio),
    )
    .await
}

async fn traced_with(_receiver: &Receiver, trace: TraceConfig) -> Setup {
    start(1, instant(Flavor::Vllm), |c| {
        c.telemetry.trace = Some(trace)
    })
    .await
}

fn named<'a>(spans: &'a [Span], name: &str) -> &'a Span {
    spans
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no span {name}: {:?}", names(spans)))
}

fn names(spans: &[Span]) -> Vec<&str> {
    spans.iter().map(|s| s.name.as_str()).collect()
}

fn has_event(span: &Span, name: &str) -> bool {
    span.events.iter().any(|e| e.name == name)
}

#[tokio::test]
async fn a_request_is_a_server_span_over_its_admission_and_attempt_in_the_clients_trace() {
    let mut receiver = Receiver::grpc().await;
    let log = std::env::temp_dir().join(format!("sluice-traces-{}.log", std::process::id()));
    let trace = TraceConfig::new(receiver.endpoint(), Protocol::Grpc, 1.0);
    let s = start(1, instant(Flavor::Vllm), |c| {
        c.telemetry.trace = Some(trace);
        c.telemetry.access_log = Some(log.clone());
    })
    .await;
    let traceparent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let url = s.url("/v1/chat/completions");
    let body = serde_json::json!({
        "model": "test-model",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 4,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
    .to_string();
    let answer = send(
        &s.client,
        "POST",
        &url,
        Some(&body),
        &[("traceparent", &traceparent), ("x-request-id", "t-1")],
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());

    let spans = bounded("three spans", receiver.take(3)).await;
    let request = named(&spans, "POST /v1/chat/completions");
    let admission = named(&spans, "admission");
    let attempt = named(&spans, "chat test-model");
    for span in [request, admission, attempt] {
        assert_eq!(hex(&span.trace_id), CLIENT_TRACE, "one trace, the client's");
    }
    assert_eq!(
        hex(&request.parent_span_id),
        CLIENT_SPAN,
        "under the client's span"
    );
    assert_eq!(request.kind, SpanKind::Server as i32);
    assert_eq!(admission.parent_span_id, request.span_id);
    assert_eq!(attempt.parent_span_id, request.span_id);
    assert_eq!(attempt.kind, SpanKind::Client as i32);

    for (key, want) in [
        ("http.route", "/v1/chat/completions"),
        ("http.request.method", "POST"),
        ("http.response.status_code", "200"),
        ("gen_ai.operation.name", "chat"),
        ("gen_ai.request.model", "test-model"),
        ("gen_ai.request.stream", "true"),
        ("sluice.request_id", "t-1"),
        ("sluice.tier", "interactive"),
        ("sluice.attempts", "1"),
    ] {
        assert_eq!(attribute(request, key).as_deref(), Some(want), "{key}");
    }
    for key in [
        "gen_ai.usage.output_tokens",
        "gen_ai.response.time_to_first_chunk",
        "sluice.ttft_ms",
        "sluice.tpot_ms",
        "sluice.worker",
    ] {
        assert!(
            attribute(request, key).is_some(),
            "{key} on the request span"
        );
    }
    assert!(has_event(request, "first byte") && has_event(request, "end"));
    assert_eq!(
        attribute(admission, "sluice.admission.decision").as_deref(),
        Some("admitted")
    );
    assert_eq!(
        attribute(attempt, "sluice.attempt.outcome").as_deref(),
        Some("answered")
    );
    assert_eq!(
        attribute(attempt, "gen_ai.request.model").as_deref(),
        Some("test-model")
    );

    // The engine was told the attempt's span as its parent, in the same trace.
    let seen = s.sims.engines()[0].engine().unwrap().last_trace_context();
    assert_eq!(
        seen,
        Some(format!("00-{CLIENT_TRACE}-{}-01", hex(&attempt.span_id)))
    );
    // The request's access-log line leads to its trace.
    s.gateway.shutdown().await;
    let lines = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_file(&log);
    let line: Value = lines
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|l| l["request_id"] == "t-1")
        .unwrap();
    assert_eq!(line["trace_id"], CLIENT_TRACE);
}

#[tokio::test]
async fn over_http_a_new_trace_starts_and_a_refused_request_is_traced_too() {
    let mut receiver = Receiver::http().await;
    let s = traced(&receiver, Protocol::Http, 1.0).await;
    let ok = s.chat(&chat_body("test-model", "hi", 2, false)).await;
    assert_eq!(ok.status, 200);
    let spans = bounded("the request's spans", receiver.take(3)).await;
    let request = named(&spans, "POST /v1/chat/completions");
    assert!(request.parent_span_id.is_empty(), "a trace of its own");
    assert_eq!(request.trace_id.len(), 16);
    assert!(spans.iter().all(|s| s.trace_id == request.trace_id));

    // A malformed traceparent is not a parent: a trace of its own.
    let malformed = send(
        &s.client,
        "POST",
        &s.url("/v1/chat/completions"),
        Some(&chat_body("test-model", "hi", 2, false)),
        &[("traceparent", "00-not-a-trace-01")],
    )
    .await;
    assert_eq!(malformed.status, 200);
    let spans = bounded("the malformed one's spans", receiver.take(3)).await;
    let request = named(&spans, "POST /v1/chat/completions");
    assert!(
        request.parent_span_id.is_empty(),
        "no parent from a malformed header"
    );
    assert_eq!(request.trace_id.len(), 16);

    // Bad input never reaches admission: one span, with the error.
    let bad = post(&s.client, &s.url("/v1/chat/completions"), "{not json").await;
    assert_eq!(bad.status, 400);
    let spans = bounded("the refusal's span", receiver.take(1)).await;
    let refused = &spans[0];
    assert_eq!(refused.name, "POST /v1/chat/completions");
    assert_eq!(
        attribute(refused, "http.response.status_code").as_deref(),
        Some("400")
    );
    assert!(attribute(refused, "error.type").is_some(), "{refused:?}");
    s.gateway.shutdown().await;
}

#[tokio::test]
async fn the_sample_ratio_decides_for_new_traces_and_the_clients_flag_for_its_own() {
    let mut receiver = Receiver::grpc().await;
    let s = traced(&receiver, Protocol::Grpc, 0.0).await;
    let url = s.url("/v1/chat/completions");
    let body = chat_body("test-model", "hi", 2, false);
    // Not sampled: no spans, but the worker is still told where the request came from.
    let unsampled = send(&s.client, "POST", &url, Some(&body), &[]).await;
    assert_eq!(unsampled.status, 200);
    let told = s.sims.engines()[0]
        .engine()
        .unwrap()
        .last_trace_context()
        .unwrap();
    assert!(told.starts_with("00-") && told.ends_with("-00"), "{told}");
    // The client's sampled trace is recorded whatever the ratio.
    let traceparent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let sampled = send(
        &s.client,
        "POST",
        &url,
        Some(&body),
        &[("traceparent", &traceparent)],
    )
    .await;
    assert_eq!(sampled.status, 200);
    // Spans leave in the order requests end: had the first been recorded, it would come first.
    let spans = bounded("the sampled request's spans", receiver.take(3)).await;
    assert!(
        spans.iter().all(|s| hex(&s.trace_id) == CLIENT_TRACE),
        "{:?}",
        names(&spans)
    );
    s.gateway.shutdown().await;
}

#[tokio::test]
async fn with_the_collector_down_or_silent_answers_are_unchanged_and_drops_are_counted() {
    // Down: nothing listens on the endpoint.
    let down = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().to_string()
    };
    let silent = Receiver::silent().await;
    for (what, endpoint) in [("down", down), ("silent", silent.endpoint())] {
        let mut trace = TraceConfig::new(endpoint, Protocol::Grpc, 1.0);
        trace.export_timeout = Duration::from_millis(300);
        // One request's spans wait at most: the rest are dropped while an export hangs.
        trace.queue = 1;
        let s = traced_with(&silent, trace).await;
        let mut stats = s.gateway.trace_exports().unwrap();
        for i in 0..4 {
            let answer = s
                .chat(&chat_body("test-model", &format!("q{i}"), 2, i % 2 == 0))
                .await;
            assert_eq!(answer.status, 200, "{what}: {}", answer.text());
        }
        let counted = bounded(
            "the spans counted as dropped",
            stats.wait_for(|s| s.dropped >= 3),
        )
        .await
        .unwrap()
        .dropped;
        assert!(counted >= 3, "{what}");
        let text = get(&s.client, &s.url("/metrics")).await.text();
        let dropped: f64 = text
            .lines()
            .filter(|l| l.starts_with("sluice_trace_spans_dropped_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        assert!(dropped >= 3.0, "{what}: {text}");
        s.gateway.shutdown().await;
    }
}

#[tokio::test]
async fn a_retried_attempt_says_why_and_the_next_one_answers() {
    let mut receiver = Receiver::grpc().await;
    let trace = TraceConfig::new(receiver.endpoint(), Protocol::Grpc, 1.0);
    let s = start(2, instant(Flavor::Vllm), |c| {
        c.telemetry.trace = Some(trace);
        c.route.policy = sluice_core::policy::Policy::RoundRobin;
    })
    .await;
    s.fault(0, Fault::ErrorRate { rate: 1.0 }).await;
    // Round robin: one of two requests starts on the failing engine and is retried.
    for i in 0..2 {
        let answer = s
            .chat(&chat_body("test-model", &format!("q{i}"), 1, false))
            .await;
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    let mut spans = Vec::new();
    let retried = bounded("the retried request's span", async {
        loop {
            let span = receiver.take(1).await.remove(0);
            let done = attribute(&span, "sluice.attempts").as_deref() == Some("2");
            let trace_id = span.trace_id.clone();
            spans.push(span);
            if done {
                return trace_id;
            }
        }
    })
    .await;
    let attempts: Vec<&Span> = spans
        .iter()
        .filter(|s| s.trace_id == retried && s.kind == SpanKind::Client as i32)
        .collect();
    let outcomes: Vec<(Option<String>, Option<String>)> = attempts
        .iter()
        .map(|s| {
            (
                attribute(s, "sluice.attempt.outcome"),
                attribute(s, "sluice.retry.cause"),
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        [
            (Some("retried".into()), Some("status".into())),
            (Some("answered".into()), None)
        ]
    );
    assert_ne!(
        attribute(attempts[0], "sluice.worker"),
        attribute(attempts[1], "sluice.worker")
    );
    s.gateway.shutdown().await;
}
