//! Hostile sockets: every phase of a connection is bounded, and a flood of silent ones neither
//! holds its slots forever nor reaches the probe port.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads until the gateway closes the connection; what it said before closing.
async fn until_closed(mut tcp: TcpStream) -> String {
    let mut got = Vec::new();
    let _ = tcp.read_to_end(&mut got).await;
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test]
async fn silent_sockets_filling_the_cap_are_cut_and_the_probe_port_answers_throughout() {
    let s = start(1, instant(Flavor::Vllm), |c| {
        c.listener.max_connections = 12;
        c.listener.header_read_timeout = Duration::from_secs(1);
        c.listener.health = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    let main = s.gateway.addr();
    let mut silent = Vec::new();
    for i in 0..12 {
        let mut tcp = TcpStream::connect(main).await.unwrap();
        match i % 3 {
            0 => {}
            1 => tcp.write_all(b"P").await.unwrap(),
            _ => tcp
                .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
                .await
                .unwrap(),
        }
        silent.push(tcp);
    }
    // The probe port has its own listener and runtime: it answers while the main port is full.
    let probes = format!("http://{}/readiness", s.gateway.health_addr().unwrap());
    let ready = bounded("readiness on the probe port", get(&client(), &probes)).await;
    assert_eq!(ready.status, 200);

    // A request now waits for a slot, which the first-request timeout frees.
    let c = client();
    let a = bounded(
        "a request through the full port",
        post(
            &c,
            &s.url("/v1/chat/completions"),
            &chat_body("test-model", "hi", 1, false),
        ),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    for tcp in silent {
        let said = bounded("the silent socket cut", until_closed(tcp)).await;
        assert!(!said.starts_with("HTTP/1.1 200"), "{said}");
    }
}

#[tokio::test]
async fn a_dripping_body_is_cut_with_408() {
    let s = start(1, instant(Flavor::Vllm), |c| {
        c.front.intake.body_read_timeout = Duration::from_secs(1);
    })
    .await;
    let mut tcp = TcpStream::connect(s.gateway.addr()).await.unwrap();
    tcp.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
          content-length: 100\r\n\r\n{\"model\":",
    )
    .await
    .unwrap();
    let said = bounded("the cut", until_closed(tcp)).await;
    assert!(said.starts_with("HTTP/1.1 408"), "{said}");
    assert!(said.contains("\"code\":\"body_read_timeout\""), "{said}");
    assert_eq!(s.received(), vec![0]);
}

#[tokio::test]
async fn an_idle_http2_connection_is_closed_but_not_while_a_stream_runs() {
    use http_body_util::BodyExt;
    let s = start(1, timed(Flavor::Vllm, 1.0), |c| {
        c.listener.header_read_timeout = Duration::from_secs(1);
    })
    .await;
    let tcp = TcpStream::connect(s.gateway.addr()).await.unwrap();
    let (mut send, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    let connection = tokio::spawn(connection);
    // About three seconds of tokens: longer than the idle bound, and not cut by it.
    let body = r#"{"model":"test-model","messages":[{"role":"user","content":"hi"}],"max_tokens":300,"ignore_eos":true,"stream":true}"#;
    let request = http::Request::post(s.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .unwrap();
    let response = bounded("the answer", send.send_request(request))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let text = bounded("the stream", response.into_body().collect())
        .await
        .unwrap()
        .to_bytes();
    assert!(
        String::from_utf8_lossy(&text).ends_with("data: [DONE]\n\n"),
        "the stream ran to its end"
    );
    assert!(!connection.is_finished(), "open while the stream ran");
    let closed = bounded("the idle connection closed", connection)
        .await
        .unwrap();
    assert!(closed.is_ok(), "closed with a GOAWAY, not cut: {closed:?}");
}
