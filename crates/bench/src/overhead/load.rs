//! A closed-loop HTTP/1.1 load generator: each connection sends its next request as soon as the
//! previous answer has been read to the end.
//!
//! It is kept lean on purpose (one hyper connection per task, no pool, no body parsing beyond
//! counting SSE event ends) because it shares a core with the engines, and the figure being
//! measured is the gateway's.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HOST};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// What every request of a run looks like.
#[derive(Clone, Debug)]
pub struct Shot {
    pub path: &'static str,
    pub body: Bytes,
}

impl Shot {
    pub(crate) fn request(&self, host: &str) -> Option<Request<Full<Bytes>>> {
        Request::post(self.path)
            .header(HOST, host)
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(self.body.clone()))
            .ok()
    }
}

/// What one run observed.
#[derive(Debug, Default)]
pub struct Tally {
    /// Wall time from the first request to the last answer.
    pub elapsed: Duration,
    /// End-to-end latency of every successful request, in microseconds.
    pub latencies_us: Vec<u32>,
    /// Requests answered with something other than 200, or whose connection failed.
    pub failed: u64,
    /// Times the server closed an idle keep-alive connection and a new one was opened.
    pub reconnects: u64,
    /// SSE events received (ends of events, i.e. blank lines), over all answers.
    pub events: u64,
    /// Response body bytes received.
    pub bytes: u64,
}

impl Tally {
    pub fn completed(&self) -> u64 {
        self.latencies_us.len() as u64
    }

    fn absorb(&mut self, other: Tally) {
        self.latencies_us.extend(other.latencies_us);
        self.failed += other.failed;
        self.reconnects += other.reconnects;
        self.events += other.events;
        self.bytes += other.bytes;
    }
}

/// Why a run could not produce figures.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("could not connect to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("HTTP handshake with {addr} failed: {source}")]
    Handshake {
        addr: SocketAddr,
        source: hyper::Error,
    },
}

/// When a connection's loop ends.
#[derive(Clone, Copy, Debug)]
enum Until {
    Deadline(Instant),
    /// After this many requests (answered or failed).
    Sent(u64),
}

impl Until {
    fn more(self, sent: u64) -> bool {
        match self {
            Until::Deadline(deadline) => Instant::now() < deadline,
            Until::Sent(total) => sent < total,
        }
    }
}

/// Runs `connections` closed loops for `duration`, spreading connections over `targets`.
pub async fn closed_loop(
    targets: &[SocketAddr],
    connections: usize,
    shot: &Shot,
    duration: Duration,
) -> Result<Tally, LoadError> {
    let deadline = Instant::now() + duration;
    run_loops(targets, connections, shot, |_| Until::Deadline(deadline)).await
}

/// Sends `requests` in all over `connections` closed loops (as evenly as they divide), for a
/// figure counted per request rather than per second.
pub async fn counted_loop(
    targets: &[SocketAddr],
    connections: usize,
    shot: &Shot,
    requests: u64,
) -> Result<Tally, LoadError> {
    let connections = connections.max(1);
    let each = requests / connections as u64;
    let extra = requests % connections as u64;
    run_loops(targets, connections, shot, |i| {
        Until::Sent(each + u64::from((i as u64) < extra))
    })
    .await
}

async fn run_loops(
    targets: &[SocketAddr],
    connections: usize,
    shot: &Shot,
    until: impl Fn(usize) -> Until,
) -> Result<Tally, LoadError> {
    let start = Instant::now();
    let mut loops = JoinSet::new();
    for i in 0..connections {
        let addr = targets[i % targets.len()];
        let shot = shot.clone();
        loops.spawn(connection_loop(addr, shot, until(i)));
    }
    let mut tally = Tally::default();
    while let Some(done) = loops.join_next().await {
        if let Ok(result) = done {
            tally.absorb(result?);
        }
    }
    tally.elapsed = start.elapsed();
    Ok(tally)
}

pub(crate) type Sender = http1::SendRequest<Full<Bytes>>;

pub(crate) async fn connect(addr: SocketAddr) -> Result<Sender, LoadError> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|source| LoadError::Connect { addr, source })?;
    let _ = stream.set_nodelay(true);
    let (sender, conn) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|source| LoadError::Handshake { addr, source })?;
    tokio::spawn(conn);
    Ok(sender)
}

async fn connection_loop(addr: SocketAddr, shot: Shot, until: Until) -> Result<Tally, LoadError> {
    let host: Arc<str> = addr.to_string().into();
    let mut tally = Tally::default();
    let mut sender = connect(addr).await?;
    while until.more(tally.completed() + tally.failed) {
        if sender.ready().await.is_err() {
            // The server closed the connection after an answer (nginx does every
            // keepalive_requests): not a failure, but counted, since it costs.
            tally.reconnects += 1;
            sender = connect(addr).await?;
            continue;
        }
        let Some(request) = shot.request(&host) else {
            tally.failed += 1;
            continue;
        };
        let sent = Instant::now();
        match exchange(&mut sender, request, &mut tally).await {
            Ok(true) => tally.latencies_us.push(micros(sent.elapsed())),
            Ok(false) | Err(_) => tally.failed += 1,
        }
    }
    Ok(tally)
}

/// Sends one request and reads its answer to the end; true when it was a 200.
async fn exchange(
    sender: &mut Sender,
    request: Request<Full<Bytes>>,
    tally: &mut Tally,
) -> Result<bool, hyper::Error> {
    let response = sender.send_request(request).await?;
    let ok = response.status() == StatusCode::OK;
    let mut body = response.into_body();
    let mut events = EventEnds::default();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            tally.bytes += data.len() as u64;
            tally.events += events.count(&data);
        }
    }
    Ok(ok)
}

/// One request on a fresh connection: true when it was answered 200 (used to wait for a
/// target to come up).
pub async fn answers(addr: SocketAddr, shot: &Shot) -> bool {
    let Ok(mut sender) = connect(addr).await else {
        return false;
    };
    let Some(request) = shot.request(&addr.to_string()) else {
        return false;
    };
    let mut tally = Tally::default();
    matches!(exchange(&mut sender, request, &mut tally).await, Ok(true))
}

fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

/// Counts blank lines (`\n\n`) across chunk boundaries: each ends one SSE event.
#[derive(Default)]
pub(crate) struct EventEnds {
    last_was_newline: bool,
}

impl EventEnds {
    pub(crate) fn count(&mut self, data: &[u8]) -> u64 {
        let mut ends = 0;
        for &b in data {
            let newline = b == b'\n';
            if newline && self.last_was_newline {
                ends += 1;
                self.last_was_newline = false;
            } else {
                self.last_was_newline = newline;
            }
        }
        ends
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_ends_are_counted_across_chunk_boundaries() {
        let mut ends = EventEnds::default();
        assert_eq!(ends.count(b"data: {\"a\":1}\n\ndata: {\"a\":2}\n"), 1);
        assert_eq!(ends.count(b"\ndata: [DONE]\n\n"), 2);
        assert_eq!(ends.count(b"\n"), 0);
        assert_eq!(ends.count(b"x\n\n\n\n"), 2);
    }
}
