//! What crosses the gateway, byte for byte: streams relayed untouched, headers filtered, request
//! ids echoed, a worker's death mid-stream reported without `[DONE]`, and a client's departure
//! reaching the engine as an abort.
#![allow(clippy::unwrap_used)]

mod common;

use axum::body::Body;
use axum::http::HeaderMap;
use axum::routing;
use axum::Router;
use bytes::Bytes;
use common::*;
use futures_util::stream;

/// The SSE chunks the fake engine sends, exactly.
const CHUNKS: [&str; 4] = [
    "data: {\"id\":\"c1\",\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n",
    "data: {\"id\":\"c1\",\"choices\":[{\"delta\":{\"content\":\"lo \\u00e9\"}}]}\n\n",
    ": a comment line engines may send\n\ndata: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"total_tokens\":3}}\n\n",
    "data: [DONE]\n\n",
];

/// A body that yields between chunks, so each goes out as its own frame.
fn chunked(chunks: Vec<Result<Bytes, std::io::Error>>) -> Body {
    Body::from_stream(stream::unfold(chunks.into_iter(), |mut rest| async move {
        tokio::task::yield_now().await;
        rest.next().map(|c| (c, rest))
    }))
}

fn sse(body: Body) -> axum::response::Response {
    axum::response::Response::builder()
        .header("content-type", "text/event-stream")
        .header("x-sluice-error-code", "forged-by-worker")
        .header("x-engine", "fake")
        .body(body)
        .unwrap()
}

/// A fake engine's model list: one model, `fake`, owned by `vllm`.
fn fake_models() -> Router {
    Router::new().route(
        "/v1/models",
        routing::get(|| async {
            axum::Json(serde_json::json!({"data":[{"id":"fake","owned_by":"vllm"}]}))
        }),
    )
}

/// Serves a fake engine on a free loopback port; its base URL.
async fn serve_fake(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

/// A fake engine: a known stream, a header echo, and a stream that dies.
async fn fake_engine() -> String {
    let app = fake_models()
        .route(
            "/v1/chat/completions",
            routing::post(|| async {
                sse(chunked(
                    CHUNKS.iter().map(|c| Ok(Bytes::from(*c))).collect(),
                ))
            }),
        )
        .route(
            "/v1/completions",
            routing::post(|headers: HeaderMap, body: Bytes| async move {
                let seen: serde_json::Map<String, serde_json::Value> = headers
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_str().unwrap().into()))
                    .collect();
                axum::Json(
                    serde_json::json!({"headers": seen, "body": String::from_utf8_lossy(&body)}),
                )
            }),
        )
        .route(
            "/v1/embeddings",
            routing::post(|| async {
                sse(chunked(vec![
                    Ok(Bytes::from(CHUNKS[0])),
                    Err(std::io::Error::other("engine died")),
                ]))
            }),
        )
        .route(
            "/v1/responses",
            routing::post(|| async {
                // One event, then a line that never ends: 5 MiB in 64 KiB chunks, past the
                // parser's 4 MiB cap (and then the stream ends, so a gateway without the cap
                // still ends the test).
                let mut chunks = vec![Ok(Bytes::from(CHUNKS[0])), Ok(Bytes::from("data: "))];
                let endless = Bytes::from(vec![b'a'; 64 << 10]);
                chunks.extend((0..80).map(|_| Ok(endless.clone())));
                sse(chunked(chunks))
            }),
        );
    serve_fake(app).await
}

/// An engine that spells its streams differently from the simulator, as the SSE standard allows:
/// `data:[DONE]` with no space and CRLF line ends, cut mid-word (chat); and a stream sent with a
/// Content-Length (completions).
async fn other_spelling_engine() -> String {
    const CUT: [&str; 4] = [
        "data:{\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\r\n\r\n",
        "data:[DO",
        "NE]\r",
        "\n\r\n",
    ];
    let whole: String = CHUNKS.concat();
    let app = fake_models()
        .route(
            "/v1/chat/completions",
            routing::post(|| async {
                sse(chunked(CUT.iter().map(|c| Ok(Bytes::from(*c))).collect()))
            }),
        )
        .route(
            "/v1/completions",
            routing::post(move || {
                let whole = whole.clone();
                async move {
                    axum::response::Response::builder()
                        .header("content-type", "text/event-stream")
                        .header("content-length", whole.len())
                        .body(Body::from(whole))
                        .unwrap()
                }
            }),
        );
    serve_fake(app).await
}

async fn gateway_over(url: String, tune: impl FnOnce(&mut Config)) -> Gateway {
    let mut config = Config::local(&[url]);
    config.workers[0].api_key = Some("worker-secret".into());
    tune(&mut config);
    let gateway = Gateway::start(config).await.unwrap();
    until_workers(&gateway, &client(), "ready", all_ready).await;
    gateway
}

#[tokio::test]
async fn a_stream_arrives_byte_for_byte() {
    let gateway = gateway_over(fake_engine().await, |_| {}).await;
    let c = client();
    let a = post(
        &c,
        &format!("{}/v1/chat/completions", gateway.url()),
        r#"{"model":"fake","messages":[],"stream":true}"#,
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(a.body, Bytes::from(CHUNKS.concat()));
    assert_eq!(a.headers["x-engine"], "fake");
    assert!(
        a.headers.get("x-sluice-error-code").is_none(),
        "a worker cannot forge the gateway's code"
    );
    assert_eq!(
        a.headers["x-request-id"].len(),
        32,
        "an id is made when the client sends none"
    );
}

#[tokio::test]
async fn headers_cross_filtered_and_the_request_id_round_trips() {
    let gateway = gateway_over(fake_engine().await, |c| {
        c.access.keys.client = vec!["client-key".into()]
    })
    .await;
    let c = client();
    let body = r#"{"model":"fake","prompt":"p",  "temperature": 0.70}"#;
    let a = send(
        &c,
        "POST",
        &format!("{}/v1/completions", gateway.url()),
        Some(body),
        &[
            ("authorization", "Bearer client-key"),
            ("cookie", "session=1"),
            ("x-request-id", "trace-abc-123"),
            ("x-session-id", "s-9"),
            ("connection", "keep-alive"),
        ],
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.headers["x-request-id"], "trace-abc-123");
    let seen = a.json();
    let h = &seen["headers"];
    assert_eq!(
        h["authorization"], "Bearer worker-secret",
        "the worker's key, not the client's"
    );
    assert_eq!(h["x-request-id"], "trace-abc-123");
    assert_eq!(h["x-session-id"], "s-9");
    assert!(h.get("cookie").is_none());
    assert_eq!(
        seen["body"], body,
        "the body is forwarded unchanged, spacing and all"
    );
}

#[tokio::test]
async fn done_without_a_space_cut_anywhere_ends_a_stream_normally() {
    let gateway = gateway_over(other_spelling_engine().await, |_| {}).await;
    let c = client();
    // Ten of them: before the parser, each got an error event and counted against the worker,
    // and the tenth opened its circuit.
    for _ in 0..10 {
        let a = post(
            &c,
            &format!("{}/v1/chat/completions", gateway.url()),
            r#"{"model":"fake","messages":[]}"#,
        )
        .await;
        assert_eq!(a.status, 200);
        let text = a.text();
        assert!(text.ends_with("data:[DONE]\r\n\r\n"), "{text:?}");
        assert!(!text.contains("error"), "{text:?}");
    }
    let workers = until_workers(&gateway, &c, "listed", |_| true).await;
    assert_eq!(workers[0]["circuit"]["state"], "closed");
    assert_eq!(workers[0]["circuit"]["consecutive_failures"], 0);
}

#[tokio::test]
async fn an_event_stream_with_a_content_length_is_relayed_whole_and_not_counted_as_cancelled() {
    let gateway = gateway_over(other_spelling_engine().await, |_| {}).await;
    let c = client();
    let a = post(
        &c,
        &format!("{}/v1/completions", gateway.url()),
        r#"{"model":"fake","prompt":"x"}"#,
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(a.text(), CHUNKS.concat());
    assert!(a.headers.get("content-length").is_none(), "sent chunked");
    let metrics = get(&c, &format!("{}/metrics", gateway.url())).await.text();
    assert!(
        metrics.contains(
            r#"sluice_client_cancellations_total{route="/v1/completions",stage="streaming"} 0"#
        ),
        "not a cancellation: {metrics}"
    );
    assert!(metrics
        .contains(r#"sluice_requests_total{route="/v1/completions",status="200",code="none"} 1"#));
}

#[tokio::test]
async fn a_worker_dying_mid_stream_gets_an_error_event_and_no_done() {
    let gateway = gateway_over(fake_engine().await, |_| {}).await;
    let c = client();
    let a = post(
        &c,
        &format!("{}/v1/embeddings", gateway.url()),
        r#"{"model":"fake","input":"x"}"#,
    )
    .await;
    assert_eq!(a.status, 200);
    let events = a.events();
    assert_eq!(events.len(), 2, "{events:?}");
    let error: serde_json::Value = serde_json::from_str(&events[1]).unwrap();
    assert_eq!(error["error"]["code"], "upstream_stream_interrupted");
    assert_eq!(error["error"]["type"], "server_error");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        !message.contains("127.0.0.1"),
        "no worker URL in what a client sees: {message}"
    );
    assert!(!a.text().contains("[DONE]"));
}

/// A worker whose event stream never ends a line is cut at the parser's cap: the client gets the
/// events before it, a blank line, and an error event of its own (no `[DONE]`), and the worker
/// is charged a failure.
#[tokio::test]
async fn a_line_past_the_cap_ends_the_stream_with_an_error_and_charges_the_worker() {
    let gateway = gateway_over(fake_engine().await, |_| {}).await;
    let c = client();
    let a = post(
        &c,
        &format!("{}/v1/responses", gateway.url()),
        r#"{"model":"fake","input":"x","stream":true}"#,
    )
    .await;
    assert_eq!(a.status, 200);
    // The unending line is relayed as it comes, up to the cap and not past it (how much of it
    // depends on how the reads cut it), then the error event on a line of its own.
    let longest = a.text().split('\n').map(str::len).max().unwrap();
    assert!(
        longest <= 4 << 20,
        "nothing past the cap relayed: a line of {longest} bytes"
    );
    let events = a.events();
    let error: serde_json::Value = serde_json::from_str(events.last().unwrap()).unwrap();
    assert_eq!(
        error["error"]["code"], "upstream_event_too_large",
        "{error}"
    );
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("4194304 bytes"), "{message}");
    assert!(!message.contains("127.0.0.1"), "{message}");
    assert!(!a.text().contains("[DONE]"));
    let workers = until_workers(&gateway, &c, "ready", all_ready).await;
    let id = workers[0]["id"].as_str().unwrap();
    let series =
        format!("sluice_upstream_errors_total{{worker=\"{id}\",kind=\"event_too_large\"}} 1");
    let metrics = get(&c, &format!("{}/metrics", gateway.url())).await.text();
    assert!(metrics.contains(&series), "{series}");
}

#[tokio::test]
async fn a_stream_cut_short_without_done_is_reported() {
    let s = start(1, instant(Flavor::Vllm), |_| {}).await;
    s.sims
        .engine(0)
        .unwrap()
        .fault(Fault::CutStreams)
        .await
        .unwrap();
    let a = s.chat(&chat_body("test-model", "hi", 40, true)).await;
    let events = a.events();
    let last: serde_json::Value = serde_json::from_str(events.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "upstream_stream_interrupted");
    assert!(!a.text().contains("[DONE]"));
}

#[tokio::test]
async fn the_gateways_own_timeout_ending_a_stream_says_so_and_spares_the_worker() {
    // 3 s for the first byte (generous on a loaded machine); the answer takes far longer.
    let s = start(1, timed(Flavor::Vllm, 1.0), |c| {
        c.admission.request_timeout = std::time::Duration::from_secs(3);
    })
    .await;
    let body = r#"{"model":"test-model","messages":[{"role":"user","content":"hi"}],"max_tokens":4000,"ignore_eos":true,"stream":true}"#;
    let a = s.chat(body).await;
    assert_eq!(a.status, 200);
    let events = a.events();
    let last: serde_json::Value = serde_json::from_str(events.last().unwrap())
        .unwrap_or_else(|_| panic!("{} events, ending {:?}", events.len(), events.last()));
    assert_eq!(last["error"]["code"], "request_timeout", "{last}");
    assert!(
        last["error"]["message"]
            .as_str()
            .unwrap()
            .contains("request timeout"),
        "{last}"
    );
    assert!(!a.text().contains("[DONE]"));
    let worker = &s.workers().await[0];
    assert_eq!(
        worker["circuit"]["consecutive_failures"], 0,
        "not the worker's failure"
    );
}

#[tokio::test]
async fn sim_streams_end_with_usage_and_done() {
    let s = start(2, instant(Flavor::Sglang), |_| {}).await;
    let body = r#"{"model":"test-model","messages":[{"role":"user","content":"hi"}],"max_tokens":12,"stream":true,"stream_options":{"include_usage":true}}"#;
    let a = s.chat(body).await;
    let events = a.events();
    assert_eq!(events.last().unwrap(), "[DONE]");
    let usage: serde_json::Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 12);
}

#[tokio::test]
async fn a_client_leaving_a_stream_aborts_it_in_the_engine() {
    let s = start(1, timed(Flavor::Vllm, 1.0), |_| {}).await;
    let response = open_stream(&s, "hi", 4000).await;
    drop(response);
    let engine = s.sims.engine(0).unwrap();
    let state = bounded("the abort", engine.until(|st| st.aborted == 1)).await;
    assert_eq!(state.running, 0);
    assert_eq!(state.kv_blocks_used, 0, "its KV cache is free");
}

#[tokio::test]
async fn a_client_leaving_before_the_answer_aborts_it_too() {
    let s = start(1, timed(Flavor::Vllm, 1.0), |_| {}).await;
    let client = s.client.clone();
    let url = s.url("/v1/chat/completions");
    let waiting = tokio::spawn(async move {
        post(&client, &url, &chat_body("test-model", "hi", 4000, false)).await
    });
    let engine = s.sims.engine(0).unwrap();
    bounded("running", engine.until(|st| st.running == 1)).await;
    waiting.abort();
    bounded("the abort", engine.until(|st| st.aborted == 1)).await;
    bounded("no longer in flight", async {
        while s.gateway.in_flight() > 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let metrics = get(&s.client, &s.url("/metrics")).await.text();
    assert!(
        metrics.contains(
            r#"sluice_client_cancellations_total{route="/v1/chat/completions",stage="waiting"} 1"#
        ),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_request_id_is_read_from_the_configured_headers() {
    let gateway = gateway_over(fake_engine().await, |c| {
        c.front.request_id_headers = vec![
            http::HeaderName::from_static("x-correlation-id"),
            http::HeaderName::from_static("x-request-id"),
        ];
    })
    .await;
    let c = client();
    let a = send(
        &c,
        "POST",
        &format!("{}/v1/completions", gateway.url()),
        Some(r#"{"model":"fake","prompt":"x"}"#),
        &[("x-correlation-id", "corr-7")],
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(a.headers["x-request-id"], "corr-7", "back to the client");
    assert_eq!(
        a.json()["headers"]["x-request-id"],
        "corr-7",
        "on to the worker"
    );
}
