use super::*;
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

/// How the test worker treats a connection after its first answer.
#[derive(Clone, Copy, PartialEq)]
enum After {
    /// Answers every request on it.
    KeepAlive,
    /// Closes it without saying so (as a worker's keep-alive timeout does).
    Close,
    /// Reads the next request and closes with nothing answered: the keep-alive race, the
    /// close crossing the request.
    CloseUnderRequest,
}

/// A worker answering request heads with `ANSWER`, each connection's first at least, and
/// the rest as `after` says. Each accepted connection is reported on the channel.
async fn worker(close: bool) -> (Authority, mpsc::UnboundedReceiver<()>) {
    worker_that(if close {
        After::Close
    } else {
        After::KeepAlive
    })
    .await
}

async fn worker_that(after: After) -> (Authority, mpsc::UnboundedReceiver<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let authority = Authority::try_from(listener.local_addr().unwrap().to_string()).unwrap();
    let (accepted, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let _ = accepted.send(());
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = [0u8; 1024];
                let mut answered = false;
                while let Ok(n) = socket.read(&mut buf).await {
                    if n == 0 {
                        return;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                        seen.drain(..end + 4);
                        if answered && after == After::CloseUnderRequest {
                            return;
                        }
                        if socket.write_all(ANSWER).await.is_err() || after == After::Close {
                            return;
                        }
                        answered = true;
                    }
                }
            });
        }
    });
    (authority, rx)
}

fn request(authority: &Authority) -> UpstreamRequest {
    axum::http::Request::get(format!("http://{authority}/health"))
        .body(Bytes::new())
        .unwrap()
}

async fn ask(pool: &Arc<Http1Pool>, authority: &Authority) -> Bytes {
    let response = pool.send(authority, request(authority)).await.unwrap();
    response.into_body().collect().await.unwrap().to_bytes()
}

/// The worker accepted exactly one connection (for every request sent so far).
async fn only_one_connection(accepted: &mut mpsc::UnboundedReceiver<()>) {
    accepted.recv().await.unwrap();
    assert!(
        accepted.try_recv().is_err(),
        "one connection for every request"
    );
}

fn pool() -> Arc<Http1Pool> {
    let secs = Duration::from_secs;
    Arc::new(Http1Pool::new(secs(5), secs(30), secs(60)))
}

#[tokio::test]
async fn a_connection_read_to_the_end_is_used_again() {
    let (authority, mut accepted) = worker(false).await;
    let pool = pool();
    for _ in 0..3 {
        assert_eq!(ask(&pool, &authority).await, "ok");
    }
    only_one_connection(&mut accepted).await;
}

#[tokio::test]
async fn a_body_read_to_its_known_length_frees_its_connection_without_its_end() {
    let (authority, mut accepted) = worker(false).await;
    let pool = pool();
    for _ in 0..3 {
        let mut body = pool
            .send(&authority, request(&authority))
            .await
            .unwrap()
            .into_body();
        // As hyper's server writes a body of known length: frames until it says it ended.
        while !body.is_end_stream() {
            body.frame().await.unwrap().unwrap();
        }
    }
    only_one_connection(&mut accepted).await;
}

#[tokio::test]
async fn a_connection_the_worker_closed_while_idle_is_not_used() {
    let (authority, mut accepted) = worker(true).await;
    let pool = pool();
    for _ in 0..3 {
        assert_eq!(ask(&pool, &authority).await, "ok");
    }
    for _ in 0..3 {
        accepted.recv().await.unwrap();
    }
}

#[tokio::test]
async fn a_body_dropped_before_its_end_takes_its_connection_with_it() {
    let (authority, mut accepted) = worker(false).await;
    let pool = pool();
    let unread = pool.send(&authority, request(&authority)).await.unwrap();
    drop(unread);
    assert_eq!(ask(&pool, &authority).await, "ok");
    accepted.recv().await.unwrap();
    accepted.recv().await.unwrap();
}

#[tokio::test]
async fn with_no_idle_time_nothing_is_kept() {
    let (authority, mut accepted) = worker(false).await;
    let pool = Arc::new(Http1Pool::new(
        Duration::from_secs(5),
        Duration::from_secs(30),
        Duration::ZERO,
    ));
    for _ in 0..2 {
        assert_eq!(ask(&pool, &authority).await, "ok");
    }
    accepted.recv().await.unwrap();
    accepted.recv().await.unwrap();
}

#[tokio::test]
async fn a_connection_closed_under_the_request_is_a_race_sent_once_more_on_a_fresh_one() {
    let (authority, mut accepted) = worker_that(After::CloseUnderRequest).await;
    let pool = pool();
    assert_eq!(ask(&pool, &authority).await, "ok");
    assert_eq!(pool.keepalive_resends(), 0);
    // The idle connection passes the pool's look; the worker closes it on the request.
    assert_eq!(ask(&pool, &authority).await, "ok");
    assert_eq!(pool.keepalive_resends(), 1);
    for _ in 0..2 {
        accepted.recv().await.unwrap();
    }
    assert!(
        accepted.try_recv().is_err(),
        "one fresh connection for the race"
    );
}

#[tokio::test]
async fn a_fresh_connection_closed_before_an_answer_is_the_worker_s_failure() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let authority = Authority::try_from(listener.local_addr().unwrap().to_string()).unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut buf = [0u8; 1024];
            let _ = socket.read(&mut buf).await;
        }
    });
    let pool = pool();
    let failed = pool
        .send(&authority, request(&authority))
        .await
        .unwrap_err();
    assert!(matches!(
        failed,
        SendError::Exchange(ExchangeError::Wire(WireError::ClosedBeforeAnswer))
    ));
    assert_eq!(pool.keepalive_resends(), 0);
}

#[tokio::test]
async fn a_worker_that_is_not_listening_is_a_connect_failure() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let authority = Authority::try_from(listener.local_addr().unwrap().to_string()).unwrap();
    drop(listener);
    let failed = pool().send(&authority, request(&authority)).await;
    assert!(failed.unwrap_err().is_connect());
}
