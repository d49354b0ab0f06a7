//! Every row of the bad-input table, against the real gateway: each answer is the OpenAI error
//! object with the right status, code and param, and nothing reaches a worker.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn setup() -> Setup {
    start(1, instant(Flavor::Vllm), |c| {
        c.front.intake.max_payload = 4096;
        c.listener.header_read_timeout = Duration::from_millis(300);
    })
    .await
}

fn assert_error(a: &Answer, status: u16, code_: &str, param: Option<&str>) {
    assert_eq!(a.status, status, "{}", a.text());
    assert_eq!(code(a).as_deref(), Some(code_));
    let e = &a.json()["error"];
    assert_eq!(e["code"], code_);
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()));
    assert!(e["type"].is_string());
    assert_eq!(e["param"].as_str(), param);
}

#[tokio::test]
async fn malformed_and_mistyped_bodies() {
    let s = setup().await;
    let url = s.url("/v1/chat/completions");
    let cases: &[(&str, &str, Option<&str>)] = &[
        (
            r#"{"model":"test-model","messages":["#,
            "invalid_json",
            None,
        ),
        (r#"["not", "an", "object"]"#, "invalid_type", None),
        (
            r#"{"model":7,"messages":[]}"#,
            "invalid_type",
            Some("model"),
        ),
        (
            r#"{"model":"test-model","messages":"hi"}"#,
            "invalid_type",
            Some("messages"),
        ),
        (
            r#"{"model":"test-model","messages":[],"stream":"yes"}"#,
            "invalid_type",
            Some("stream"),
        ),
        (
            r#"{"model":"test-model","messages":[],"max_tokens":"9"}"#,
            "invalid_type",
            Some("max_tokens"),
        ),
        (
            r#"{"model":"test-model"}"#,
            "missing_required_parameter",
            Some("messages"),
        ),
    ];
    for (body, code_, param) in cases {
        let a = post(&s.client, &url, body).await;
        assert_error(&a, 400, code_, *param);
    }
    let a = post(
        &s.client,
        &s.url("/v1/completions"),
        r#"{"model":"test-model"}"#,
    )
    .await;
    assert_error(&a, 400, "missing_required_parameter", Some("prompt"));
    assert_eq!(s.received(), vec![0], "nothing reached the worker");
}

#[tokio::test]
async fn models_unknown_missing_and_defaulted() {
    let s = setup().await;
    let a = s.chat(&chat_body("no-such-model", "hi", 4, false)).await;
    assert_error(&a, 404, "model_not_found", Some("model"));
    // One model served: a request without `model` goes to it.
    let a = s
        .chat(r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":3}"#)
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert!(code(&a).is_none());

    // Two models served: `model` is required.
    let other = SimFleet::start(FleetConfig::local(
        1,
        EngineConfig::new(
            Flavor::Sglang,
            "other-model",
            sluice_sim::Profile::named("instant").unwrap(),
        ),
    ))
    .await
    .unwrap();
    let mut urls = s.sims.urls();
    urls.extend(other.urls());
    let gateway = Gateway::start(Config::local(&urls)).await.unwrap();
    until_workers(&gateway, &s.client, "ready", all_ready).await;
    let a = post(
        &s.client,
        &format!("{}/v1/chat/completions", gateway.url()),
        r#"{"messages":[{"role":"user","content":"hi"}]}"#,
    )
    .await;
    assert_error(&a, 400, "missing_required_parameter", Some("model"));
}

#[tokio::test]
async fn oversized_bodies_plain_and_chunked() {
    let s = setup().await;
    let big = chat_body("test-model", &"x".repeat(5000), 4, false);
    let a = s.chat(&big).await;
    assert_error(&a, 413, "request_body_too_large", None);

    // Chunked, no length declared: cut off at the limit all the same.
    let mut tcp = TcpStream::connect(s.gateway.addr()).await.unwrap();
    tcp.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
          transfer-encoding: chunked\r\n\r\n",
    )
    .await
    .unwrap();
    for _ in 0..6 {
        let chunk = format!("400\r\n{}\r\n", "y".repeat(1024));
        if tcp.write_all(chunk.as_bytes()).await.is_err() {
            break;
        }
    }
    let mut answer = vec![0u8; 4096];
    let n = bounded("413", tcp.read(&mut answer)).await.unwrap();
    let head = String::from_utf8_lossy(&answer[..n]);
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    assert!(
        head.contains("x-sluice-error-code: request_body_too_large"),
        "{head}"
    );
    assert_eq!(s.received(), vec![0]);
}

#[tokio::test]
async fn routes_methods_and_content_types() {
    let s = setup().await;
    let a = get(&s.client, &s.url("/v1/nothing")).await;
    assert_error(&a, 404, "unknown_url", None);
    let a = get(&s.client, &s.url("/v1/chat/completions")).await;
    assert_error(&a, 405, "method_not_allowed", None);
    assert_eq!(a.headers["allow"], "POST");
    let a = send(
        &s.client,
        "POST",
        &s.url("/v1/chat/completions"),
        None,
        &[("content-type", "application/x-www-form-urlencoded")],
    )
    .await;
    assert_error(&a, 415, "unsupported_media_type", None);
    let a = send(
        &s.client,
        "POST",
        &s.url("/v1/chat/completions"),
        Some("\u{1f}\u{8b}not really gzip"),
        &[
            ("content-type", "application/json"),
            ("content-encoding", "gzip"),
        ],
    )
    .await;
    assert_error(&a, 415, "unsupported_content_encoding", None);
    assert!(a.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("gzip"));
}

#[tokio::test]
async fn a_client_that_sends_headers_too_slowly_is_cut_off() {
    let s = setup().await;
    let mut tcp = TcpStream::connect(s.gateway.addr()).await.unwrap();
    tcp.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    // The header-read timeout is 300 ms: the gateway closes the connection (408 or a bare close).
    let mut rest = Vec::new();
    let read = bounded("the cut", tcp.read_to_end(&mut rest)).await;
    let text = String::from_utf8_lossy(&rest);
    assert!(
        read.is_err() || rest.is_empty() || text.starts_with("HTTP/1.1 408"),
        "{text}"
    );
}

#[tokio::test]
async fn data_plane_keys_are_enforced() {
    let s = start(1, instant(Flavor::Vllm), |c| {
        c.access.keys.client = vec!["k-1".into(), "k-2".into()]
    })
    .await;
    let body = chat_body("test-model", "hi", 2, false);
    let url = s.url("/v1/chat/completions");
    let a = post(&s.client, &url, &body).await;
    assert_error(&a, 401, "invalid_api_key", None);
    let a = send(
        &s.client,
        "POST",
        &url,
        Some(&body),
        &[("authorization", "Bearer k-3")],
    )
    .await;
    assert_error(&a, 401, "invalid_api_key", None);
    let a = send(
        &s.client,
        "POST",
        &url,
        Some(&body),
        &[("authorization", "Bearer k-2")],
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
}

#[tokio::test]
async fn a_null_model_with_one_model_served_is_replaced_not_repeated() {
    let s = setup().await;
    let a = s
        .chat(r#"{"model":null,"messages":[{"role":"user","content":"hi"}],"max_tokens":2}"#)
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json()["model"], "test-model");
}

#[tokio::test]
async fn a_huge_model_name_is_not_echoed_whole() {
    let s = start(1, instant(Flavor::Vllm), |_| {}).await;
    let name = "m".repeat(1 << 20);
    let a = s.chat(&chat_body(&name, "hi", 1, false)).await;
    assert_error(&a, 404, "model_not_found", Some("model"));
    assert!(a.body.len() < 1024, "{} bytes echoed", a.body.len());
}

/// Writes a whole request, head and body, before reading anything — as Python's http.client,
/// requests and urllib3 do — and returns the answer.
async fn write_whole_then_read(s: &Setup, head: &str, body_len: usize) -> String {
    let mut tcp = TcpStream::connect(s.gateway.addr()).await.unwrap();
    let mut request = head.replace("{len}", &body_len.to_string()).into_bytes();
    request.resize(request.len() + body_len, b'x');
    bounded("the whole request written", tcp.write_all(&request))
        .await
        .expect("the gateway took the whole body");
    let mut answer = Vec::new();
    bounded("the answer", tcp.read_to_end(&mut answer))
        .await
        .expect("an answer, not a reset");
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn an_early_refusal_reaches_a_client_that_writes_its_whole_body_first() {
    let s = setup().await;
    let cases = [
        // Too large by its declared length: refused before a byte of it is read.
        (
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\
             content-type: application/json\r\ncontent-length: {len}\r\n\r\n",
            "413",
            "request_body_too_large",
        ),
        (
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\
             content-type: text/plain\r\ncontent-length: {len}\r\n\r\n",
            "415",
            "unsupported_media_type",
        ),
        (
            "POST /workers HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\
             content-length: {len}\r\n\r\n",
            "403",
            "admin_api_disabled",
        ),
    ];
    for (head, status, code_) in cases {
        let answer = write_whole_then_read(&s, head, 16 << 20).await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "{answer}"
        );
        assert!(
            answer.contains(&format!("\"code\":\"{code_}\"")),
            "{answer}"
        );
    }
    assert_eq!(s.received(), vec![0]);
}

#[tokio::test]
async fn n_and_max_tokens_are_bounded_naming_the_field() {
    let s = start(1, instant(Flavor::Vllm), |c| {
        c.front.intake.limits.max_tokens = Some(100);
    })
    .await;
    let chat = |extra: &str| {
        format!(r#"{{"model":"test-model","messages":[{{"role":"user","content":"hi"}}]{extra}}}"#)
    };
    let cases: &[(&str, u16, &str, &str)] = &[
        (r#","n":1000"#, 400, "integer_above_max_value", "n"),
        (r#","n":0"#, 400, "integer_below_min_value", "n"),
        (r#","n":"2""#, 400, "invalid_type", "n"),
        (
            r#","max_tokens":101"#,
            400,
            "integer_above_max_value",
            "max_tokens",
        ),
        (
            r#","max_completion_tokens":101,"max_tokens":5"#,
            400,
            "integer_above_max_value",
            "max_completion_tokens",
        ),
    ];
    for (extra, status, code_, param) in cases {
        let a = s.chat(&chat(extra)).await;
        assert_error(&a, *status, code_, Some(param));
    }
    let a = s.chat(&chat(r#","n":128,"max_tokens":100"#)).await;
    assert_eq!(a.status, 200, "at the limits: {}", a.text());
    assert_eq!(s.received(), vec![1], "nothing refused reached the engine");
}

#[tokio::test]
async fn request_bodies_held_at_once_are_bounded() {
    let s = start(1, instant(Flavor::Vllm), |c| {
        c.front.intake.max_payload = 8192;
        c.front.intake.max_buffered = 10_000;
    })
    .await;
    let engine = s.sims.engine(0).unwrap();
    engine.fault(Fault::Pause).await.unwrap();
    let body = chat_body("test-model", &"x".repeat(6000), 1, false);
    let (client, url, held_body) = (
        s.client.clone(),
        s.url("/v1/chat/completions"),
        body.clone(),
    );
    let held = tokio::spawn(async move { post(&client, &url, &held_body).await });
    bounded(
        "the first one at the engine",
        engine.until(|st| st.waiting + st.running >= 1),
    )
    .await;

    let refused = bounded("the refusal", s.chat(&body)).await;
    assert_error(&refused, 503, "request_buffers_full", None);
    assert_eq!(refused.headers["retry-after"], "1");

    engine.fault(Fault::Clear).await.unwrap();
    assert_eq!(bounded("the held one", held).await.unwrap().status, 200);
    assert_eq!(s.chat(&body).await.status, 200, "its bytes were given back");
}

#[tokio::test]
async fn a_long_url_or_too_many_headers_get_the_openai_error_shape() {
    let s = setup().await;
    let long = s.url(&format!("/v1/models?q={}", "x".repeat(10 * 1024)));
    let a = get(&s.client, &long).await;
    assert_error(&a, 414, "uri_too_long", None);

    let names: Vec<String> = (0..150).map(|i| format!("x-extra-{i}")).collect();
    let headers: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "1")).collect();
    let a = send(&s.client, "GET", &s.url("/v1/models"), None, &headers).await;
    assert_error(&a, 431, "request_headers_too_large", None);

    let big = "y".repeat(100 * 1024);
    let a = send(
        &s.client,
        "GET",
        &s.url("/v1/models"),
        None,
        &[("x-big", big.as_str())],
    )
    .await;
    assert_error(&a, 431, "request_headers_too_large", None);
}

/// Sends `raw` on a fresh connection and reads the answer to its end.
async fn raw_exchange(s: &Setup, raw: &[u8]) -> String {
    let mut tcp = TcpStream::connect(s.gateway.addr()).await.unwrap();
    let _ = tcp.write_all(raw).await;
    let mut answer = Vec::new();
    let _ = bounded("the answer", tcp.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn what_hyper_refuses_by_itself_still_gets_the_openai_error_shape() {
    let s = setup().await;
    let garbage = raw_exchange(&s, b"this is not http\r\n\r\n").await;
    assert!(garbage.starts_with("HTTP/1.1 400"), "{garbage}");
    assert!(
        garbage.contains("x-sluice-error-code: invalid_request"),
        "{garbage}"
    );
    assert!(
        garbage.contains("\"code\":\"invalid_request\""),
        "{garbage}"
    );

    let mut huge = b"GET /v1/models HTTP/1.1\r\nhost: x\r\nx-big: ".to_vec();
    huge.resize(huge.len() + 600 * 1024, b'z');
    huge.extend_from_slice(b"\r\n\r\n");
    let too_large = raw_exchange(&s, &huge).await;
    assert!(
        too_large.starts_with("HTTP/1.1 431"),
        "{}",
        &too_large[..too_large.len().min(300)]
    );
    assert!(
        too_large.contains("\"code\":\"request_headers_too_large\""),
        "{too_large}"
    );
}
