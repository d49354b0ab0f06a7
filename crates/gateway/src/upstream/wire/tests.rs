use std::future::poll_fn;

use axum::http::Request;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::limits::STALL;
use super::*;

/// A connection to a worker that is a socket the test writes to: `answer` in pieces of `cut`
/// bytes (each flushed on its own), then, with `close`, the end of the connection.
async fn scripted(answer: &'static [u8], cut: usize, close: bool) -> Conn {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        socket.set_nodelay(true).unwrap();
        for piece in answer.chunks(cut) {
            if socket.write_all(piece).await.is_err() {
                return;
            }
        }
        if !close {
            // Held open until the test's side closes it.
            let mut sink = [0u8; 64];
            while matches!(socket.read(&mut sink).await, Ok(n) if n > 0) {}
        }
    });
    Conn::new(TcpStream::connect(addr).await.unwrap())
}

async fn body_of(body: &mut Body) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::new();
    while let Some(data) = poll_fn(|cx| body.poll_data(cx)).await {
        out.extend_from_slice(&data?);
    }
    Ok(out)
}

async fn exchange(
    answer: &'static [u8],
    cut: usize,
    close: bool,
) -> (Response<()>, Result<Vec<u8>, WireError>, Body) {
    let mut conn = scripted(answer, cut, close).await;
    let head = conn.read_head(&Method::POST).await.unwrap();
    let (response, mut body) = head.body(conn, false);
    let read = body_of(&mut body).await;
    (response, read, body)
}

#[tokio::test]
async fn a_chunked_stream_read_a_byte_at_a_time_comes_whole_and_frees_its_connection() {
    const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
        transfer-encoding: chunked\r\n\r\n\
        f\r\ndata: {\"a\":1}\n\n\r\ne\r\ndata: [DONE]\n\n\r\n0\r\n\r\n";
    let (response, read, mut body) = exchange(ANSWER, 1, false).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.version(), Version::HTTP_11);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    assert_eq!(read.unwrap(), b"data: {\"a\":1}\n\ndata: [DONE]\n\n");
    assert!(body.take_reusable().is_some());
}

#[tokio::test]
async fn a_head_and_body_in_one_read_with_a_length() {
    const ANSWER: &[u8] =
        b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\nx-a: 1\r\nx-a: 2\r\n\r\nhello world";
    let (response, read, mut body) = exchange(ANSWER, ANSWER.len(), false).await;
    assert_eq!(read.unwrap(), b"hello world");
    let repeated: Vec<_> = response.headers().get_all("x-a").iter().collect();
    assert_eq!(repeated, ["1", "2"]);
    assert!(body.take_reusable().is_some());
}

#[tokio::test]
async fn informational_answers_are_skipped() {
    const ANSWER: &[u8] =
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok";
    let (response, read, _) = exchange(ANSWER, 7, false).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(read.unwrap(), b"ok");
}

#[tokio::test]
async fn connections_that_cannot_carry_another_exchange_are_not_given_back() {
    for answer in [
        &b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok"[..],
        b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok",
        // Bytes after the answer's end: the framing is not agreed on.
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokEXTRA",
    ] {
        let mut conn = scripted(answer.to_vec().leak(), answer.len(), false).await;
        let head = conn.read_head(&Method::POST).await.unwrap();
        let (_, mut body) = head.body(conn, false);
        assert_eq!(body_of(&mut body).await.unwrap(), b"ok");
        assert!(body.take_reusable().is_none(), "{answer:?}");
    }
    // The request asked for the close.
    let mut conn = scripted(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", 64, false).await;
    let head = conn.read_head(&Method::POST).await.unwrap();
    let (_, mut body) = head.body(conn, true);
    assert_eq!(body_of(&mut body).await.unwrap(), b"ok");
    assert!(body.take_reusable().is_none());
}

#[tokio::test]
async fn an_answer_with_a_length_and_chunks_is_read_by_its_chunks_and_loses_the_length() {
    const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\
        transfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n";
    let (response, read, mut body) = exchange(ANSWER, 64, false).await;
    assert_eq!(read.unwrap(), b"ok");
    assert!(!response.headers().contains_key("content-length"));
    assert!(body.take_reusable().is_none(), "not trusted again");
}

#[tokio::test]
async fn a_body_without_length_runs_to_the_close() {
    const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\n\r\nevery byte until the end";
    let (_, read, mut body) = exchange(ANSWER, 5, true).await;
    assert_eq!(read.unwrap(), b"every byte until the end");
    assert!(body.take_reusable().is_none());
}

#[tokio::test]
async fn a_body_cut_by_the_worker_is_an_error() {
    const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nnot all";
    let (_, read, mut body) = exchange(ANSWER, 64, true).await;
    assert!(matches!(read, Err(WireError::Truncated)));
    assert!(body.take_reusable().is_none());
    let done = poll_fn(|cx| body.poll_data(cx)).await;
    assert!(done.is_none(), "nothing after the error");
}

#[tokio::test]
async fn bad_heads_are_errors() {
    async fn head_of(answer: &'static [u8]) -> Result<Head, WireError> {
        scripted(answer, 64, true)
            .await
            .read_head(&Method::GET)
            .await
    }
    assert!(matches!(
        head_of(b"").await,
        Err(WireError::ClosedBeforeAnswer)
    ));
    assert!(matches!(
        head_of(b"HTTP/1.1 200 OK\r\ncontent-").await,
        Err(WireError::Truncated)
    ));
    assert!(matches!(
        head_of(b"SMTP ready\r\n\r\n").await,
        Err(WireError::MalformedHead(_))
    ));
    assert!(matches!(
        head_of(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\n\r\n").await,
        Err(WireError::Upgrade)
    ));
    assert!(matches!(
        head_of(b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n").await,
        Err(WireError::BadLength)
    ));
    assert!(matches!(
        head_of(b"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n")
            .await,
        Err(WireError::TransferEncodingOn10)
    ));
    let endless: &'static [u8] = [&b"HTTP/1.1 200 OK\r\n"[..], &[b'x'; MAX_HEAD + 10]]
        .concat()
        .leak();
    assert!(matches!(
        head_of(endless).await,
        Err(WireError::HeadTooLarge)
    ));
}

#[tokio::test]
async fn a_closed_idle_connection_is_seen_closed_and_an_open_one_is_not() {
    let open = scripted(b"", 1, false).await;
    let closed = scripted(b"", 1, true).await;
    // The close is seen once the socket reads its end.
    let probe = closed;
    poll_fn(|cx| probe.stream.poll_read_ready(cx))
        .await
        .unwrap();
    assert!(probe.is_closed());
    assert!(!open.is_closed());
}

fn parts(request: Request<()>) -> request::Parts {
    request.into_parts().0
}

#[test]
fn a_request_head_is_written_in_origin_form_with_its_own_length() {
    let request = Request::post("/v1/chat/completions?x=1")
        .header("host", "10.0.0.1:8000")
        .header("content-length", "999")
        .header("transfer-encoding", "chunked")
        .header("x-request-id", "abc")
        .body(())
        .unwrap();
    let (head, close) = request_head(&parts(request), "10.9.9.9:1", 12);
    assert_eq!(
        String::from_utf8(head).unwrap(),
        "POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: 10.0.0.1:8000\r\n\
         x-request-id: abc\r\ncontent-length: 12\r\n\r\n"
    );
    assert!(!close);
}

#[test]
fn a_get_has_no_length_and_an_empty_post_says_zero() {
    let (get, _) = request_head(&parts(Request::get("/health").body(()).unwrap()), "w:80", 0);
    assert_eq!(get, b"GET /health HTTP/1.1\r\nhost: w:80\r\n\r\n");
    let (post, _) = request_head(&parts(Request::post("/x").body(()).unwrap()), "w:80", 0);
    assert_eq!(
        post,
        b"POST /x HTTP/1.1\r\nhost: w:80\r\ncontent-length: 0\r\n\r\n"
    );
    let (long, _) = request_head(
        &parts(Request::post("/x").body(()).unwrap()),
        "w:80",
        1_048_576,
    );
    assert!(long.ends_with(b"content-length: 1048576\r\n\r\n"));
    let closing = Request::get("/")
        .header("connection", "Close")
        .body(())
        .unwrap();
    assert!(request_head(&parts(closing), "w:80", 0).1);
}

/// A connection whose worker writes what the test hands it, when it hands it, and never reads.
async fn driven() -> (Conn, tokio::sync::mpsc::UnboundedSender<&'static [u8]>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<&'static [u8]>();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        while let Some(bytes) = rx.recv().await {
            if socket.write_all(bytes).await.is_err() {
                return;
            }
        }
    });
    (Conn::new(TcpStream::connect(addr).await.unwrap()), tx)
}

#[tokio::test(start_paused = true)]
async fn a_head_that_stops_halfway_is_given_up_after_the_stall_bound() {
    let (mut conn, worker) = driven().await;
    worker.send(b"HTTP/1.1 200 OK\r\ncontent-").unwrap();
    let start = tokio::time::Instant::now();
    let head = conn.read_head(&Method::POST).await;
    assert!(matches!(head, Err(WireError::Stalled)));
    assert!(head.is_err_and(|e| e.is_bad_answer()));
    assert_eq!(start.elapsed(), STALL);
}

#[tokio::test(start_paused = true)]
async fn the_wait_for_an_answer_and_between_chunks_is_liveness_s_not_the_client_s() {
    let (mut conn, worker) = driven().await;
    let reading = tokio::spawn(async move {
        let head = conn.read_head(&Method::POST).await.unwrap();
        let (_, mut body) = head.body(conn, false);
        body_of(&mut body).await
    });
    // Minutes before the first byte (a long prefill), then between two chunks.
    tokio::time::sleep(STALL * 30).await;
    assert!(!reading.is_finished());
    worker
        .send(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
        .unwrap();
    tokio::time::sleep(STALL * 30).await;
    assert!(!reading.is_finished());
    worker.send(b"0\r\n\r\n").unwrap();
    assert_eq!(reading.await.unwrap().unwrap(), b"hello");
}

#[tokio::test(start_paused = true)]
async fn a_chunk_line_that_stops_halfway_is_given_up_after_the_stall_bound() {
    for rest in [&b"1"[..], b"5;ext", b"0\r\nx-t: 1\r\n", b"0\r\n"] {
        let (mut conn, worker) = driven().await;
        worker
            .send(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
            .unwrap();
        let head = conn.read_head(&Method::POST).await.unwrap();
        let (_, mut body) = head.body(conn, false);
        let first = poll_fn(|cx| body.poll_data(cx)).await.unwrap().unwrap();
        assert_eq!(first, "hello");
        worker.send(rest).unwrap();
        let start = tokio::time::Instant::now();
        let stalled = body_of(&mut body).await;
        assert!(matches!(stalled, Err(WireError::Stalled)), "{rest:?}");
        assert_eq!(start.elapsed(), STALL, "{rest:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_request_the_worker_does_not_read_is_given_up_after_the_stall_bound() {
    let (mut conn, _worker) = driven().await;
    let body = vec![b'x'; 64 << 20];
    let start = tokio::time::Instant::now();
    let written = conn.write(
        b"POST / HTTP/1.1\r\ncontent-length: 67108864\r\n\r\n",
        &body,
    );
    assert!(matches!(written.await, Err(WireError::Stalled)));
    assert!(start.elapsed() >= STALL);
}

#[tokio::test]
async fn an_answer_before_the_request_was_taken_whole_is_read() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        // The head only, then a refusal and the close, as a server refusing a large body does.
        let mut seen = Vec::new();
        let mut buf = [0u8; 1024];
        while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = socket.read(&mut buf).await.unwrap();
            seen.extend_from_slice(&buf[..n]);
        }
        let refusal = b"HTTP/1.1 413 Payload Too Large\r\nconnection: close\r\ncontent-length: 8\r\n\r\ntoo long";
        socket.write_all(refusal).await.unwrap();
    });
    let mut conn = Conn::new(TcpStream::connect(addr).await.unwrap());
    let body = vec![b'x'; 64 << 20];
    let head = b"POST / HTTP/1.1\r\ncontent-length: 67108864\r\n\r\n";
    assert_eq!(
        conn.write(head, &body).await.unwrap(),
        Written::AnsweredEarly
    );
    let answer = conn.read_head(&Method::POST).await.unwrap();
    assert_eq!(answer.response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let (_, mut body) = answer.body(conn, true);
    assert_eq!(body_of(&mut body).await.unwrap(), b"too long");
    assert!(body.take_reusable().is_none());
}

#[tokio::test]
async fn more_informational_answers_than_the_bound_are_a_bad_answer() {
    let answer: &'static [u8] = [
        b"HTTP/1.1 102 Processing\r\n\r\n".repeat(MAX_INFORMATIONAL + 1),
        b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n".to_vec(),
    ]
    .concat()
    .leak();
    let mut conn = scripted(answer, 5, false).await;
    let head = conn.read_head(&Method::POST).await;
    assert!(matches!(head, Err(WireError::TooManyInformational)));
}

#[tokio::test]
async fn a_connection_closed_or_reset_before_any_byte_is_closed_before_answer() {
    let mut conn = scripted(b"", 1, true).await;
    let head = conn.read_head(&Method::POST).await;
    assert!(matches!(head, Err(WireError::ClosedBeforeAnswer)));
    assert!(head.is_err_and(|e| !e.is_bad_answer()));
    // After an informational answer something was read: the close cuts an answer.
    let mut conn = scripted(b"HTTP/1.1 100 Continue\r\n\r\n", 64, true).await;
    let head = conn.read_head(&Method::POST).await;
    assert!(matches!(head, Err(WireError::Truncated)));
}
