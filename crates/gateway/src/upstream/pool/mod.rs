//! Keep-alive HTTP/1.1 connections to cleartext workers: the path nearly every request takes.
//!
//! hyper-util's pooled client serves every scheme and protocol through one keyed pool, and pays
//! for it on each request: a checkout through its waiter machinery, a channel handshake, and a
//! task spawned to put the connection back once it is ready again. Here a worker's idle
//! connections (our own, `wire`) are a stack behind a mutex held for a push or a pop: a request
//! takes the most recently used one (its socket is warmest), and its answer's body puts the
//! connection back when it has been read to the end. A body dropped before its end drops its
//! connection, which closes it: the engine sees its client leave and stops.
//!
//! A connection the worker closed while idle is noticed when it is taken (its socket reads the
//! end); a request that could not be written on it is sent on the next one, or on a fresh
//! connection. One the worker closes just as the request goes out (a keep-alive race: the
//! connection ends with nothing of an answer read) is not the worker's failure: the request is
//! sent once more, on a fresh connection to the same worker, and counted. Idle connections are
//! closed after the idle timeout, before the worker's own keep-alive timeout can close one under
//! a request: those found stale when taken, and the rest by a sweep every half timeout.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::http::uri::Authority;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use parking_lot::Mutex;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::exchange::{ExchangeError, SendError, UpstreamRequest};
use super::wire::{self, Conn, Started, WireError, Written};

/// One idle connection, and since when.
struct Idle {
    conn: Conn,
    since: Instant,
}

/// The idle HTTP/1.1 connections to every cleartext worker.
pub(super) struct Http1Pool {
    /// Keyed by the authority's text as the worker's URL spells it: `Authority`'s own hash is
    /// case-insensitive, a SipHash round per byte, and cost more than the rest of the checkout.
    idle: Mutex<HashMap<Box<str>, VecDeque<Idle>>>,
    connect_timeout: Duration,
    keepalive: Duration,
    idle_timeout: Duration,
    /// Whether the sweep was started (on the first connection put back, inside the runtime).
    sweeping: std::sync::Once,
    /// Keep-alive races resent on a fresh connection: `sluice_upstream_keepalive_resends_total`.
    keepalive_resends: AtomicU64,
}

impl std::fmt::Debug for Http1Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let idle: usize = self.idle.lock().values().map(VecDeque::len).sum();
        f.debug_struct("Http1Pool")
            .field("idle", &idle)
            .field("idle_timeout", &self.idle_timeout)
            .finish()
    }
}

impl Http1Pool {
    pub fn new(connect_timeout: Duration, keepalive: Duration, idle_timeout: Duration) -> Self {
        Self {
            idle: Mutex::new(HashMap::new()),
            connect_timeout,
            keepalive,
            idle_timeout,
            sweeping: std::sync::Once::new(),
            keepalive_resends: AtomicU64::new(0),
        }
    }

    /// Sends `request` to `authority` on an idle connection, or a new one, and reads the
    /// answer's head.
    pub(crate) async fn send(
        self: &Arc<Self>,
        authority: &Authority,
        request: UpstreamRequest,
    ) -> Result<UpstreamResponse, SendError> {
        // Of the request's parts only the method lives on, so the future stays small.
        let (head, close, method, body) = {
            let (parts, body) = request.into_parts();
            let (head, close) = wire::request_head(&parts, authority.as_str(), body.len());
            (head, close, parts.method, body)
        };
        let (mut conn, written, reused) = match self.written_on_idle(authority, &head, &body)? {
            Some((conn, Started::Done(written))) => (conn, written, true),
            Some((mut conn, Started::Blocked(rest))) => {
                let written = Box::pin(conn.write_when_taken(rest)).await;
                (conn, written.map_err(exchange)?, true)
            }
            None => {
                // Boxed: a new connection is rare, and its future (name resolution, the TCP
                // handshake) would otherwise sit inline in every request's future, which is
                // moved whole into a box per request on its way through the router.
                let (conn, written) = Box::pin(self.written_fresh(authority, &head, &body)).await?;
                (conn, written, false)
            }
        };
        let (conn, written, answer) = match conn.read_head(&method).await {
            Err(WireError::ClosedBeforeAnswer) if reused => {
                // A keep-alive race: the worker closed the idle connection as the request went
                // out, and read none of it. Not its failure; once more, on a fresh connection.
                self.keepalive_resends.fetch_add(1, Ordering::Relaxed);
                Box::pin(self.resent(authority, &head, &body, &method)).await?
            }
            answer => (conn, written, answer),
        };
        let answer = answer.map_err(exchange)?;
        let (response, mut body) = answer.body(conn, close || written != Written::Whole);
        let back = if body.is_end() {
            // No body to read (a refusal with none, say): the connection is free already.
            if let Some(conn) = body.take_reusable() {
                self.put(authority, conn);
            }
            None
        } else {
            Some(Back {
                pool: self.clone(),
                authority: authority.clone(),
            })
        };
        Ok(response.map(|()| UpstreamBody {
            source: Source::Wire(body),
            back,
        }))
    }

    /// The request begun on an idle connection, if one is left (a connection that fails the
    /// write had closed: the next one gets it).
    fn written_on_idle<'a>(
        &self,
        authority: &Authority,
        head: &'a [u8],
        body: &'a [u8],
    ) -> Result<Option<(Conn, Started<'a>)>, SendError> {
        while let Some(mut conn) = self.take(authority) {
            match conn.write_now(head, body) {
                Ok(started) => return Ok(Some((conn, started))),
                Err(WireError::Io(_)) => continue,
                Err(e) => return Err(exchange(e)),
            }
        }
        Ok(None)
    }

    /// The request written on a new connection.
    async fn written_fresh(
        &self,
        authority: &Authority,
        head: &[u8],
        body: &[u8],
    ) -> Result<(Conn, Written), SendError> {
        let mut conn = self.connect(authority).await?;
        let written = conn.write(head, body).await.map_err(exchange)?;
        Ok((conn, written))
    }

    /// The request sent once more on a new connection, and its answer's head.
    async fn resent(
        &self,
        authority: &Authority,
        head: &[u8],
        body: &[u8],
        method: &axum::http::Method,
    ) -> Result<(Conn, Written, Result<wire::Head, WireError>), SendError> {
        let (mut conn, written) = self.written_fresh(authority, head, body).await?;
        let answer = conn.read_head(method).await;
        Ok((conn, written, answer))
    }

    /// Requests sent once more on a fresh connection after a keep-alive race, since start.
    pub(crate) fn keepalive_resends(&self) -> u64 {
        self.keepalive_resends.load(Ordering::Relaxed)
    }

    /// The most recently used live connection to `authority`; stale ones are dropped.
    fn take(&self, authority: &Authority) -> Option<Conn> {
        let mut idle = self.idle.lock();
        let stack = idle.get_mut(authority.as_str())?;
        while let Some(idle) = stack.pop_back() {
            if idle.since.elapsed() < self.idle_timeout && !idle.conn.is_closed() {
                return Some(idle.conn);
            }
        }
        None
    }

    fn put(self: &Arc<Self>, authority: &Authority, conn: Conn) {
        // An idle timeout of zero keeps nothing: every request gets its own connection.
        if self.idle_timeout.is_zero() {
            return;
        }
        self.sweeping.call_once(|| {
            tokio::spawn(sweep(Arc::downgrade(self), self.idle_timeout));
        });
        let conn = Idle {
            conn,
            since: Instant::now(),
        };
        let mut idle = self.idle.lock();
        match idle.get_mut(authority.as_str()) {
            Some(stack) => stack.push_back(conn),
            None => {
                idle.insert(authority.as_str().into(), VecDeque::from([conn]));
            }
        }
    }

    /// Closes connections idle for the timeout (the oldest are at the front of each stack).
    fn close_stale(&self) {
        let mut idle = self.idle.lock();
        for stack in idle.values_mut() {
            while stack
                .front()
                .is_some_and(|c| c.since.elapsed() >= self.idle_timeout || c.conn.is_closed())
            {
                stack.pop_front();
            }
        }
        idle.retain(|_, stack| !stack.is_empty());
    }

    /// A new connection: TCP within the connect timeout, no Nagle delay, TCP keep-alive so a
    /// vanished worker is noticed on an idle connection.
    async fn connect(&self, authority: &Authority) -> Result<Conn, SendError> {
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        let port = authority.port_u16().unwrap_or(80);
        let stream = tokio::time::timeout(self.connect_timeout, TcpStream::connect((host, port)))
            .await
            .map_err(|_| SendError::ConnectTimeout(self.connect_timeout))?
            .map_err(SendError::Connect)?;
        let _ = stream.set_nodelay(true);
        let keepalive = socket2::TcpKeepalive::new().with_time(self.keepalive);
        let _ = socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive);
        Ok(Conn::new(stream))
    }
}

fn exchange(e: impl Into<WireError>) -> SendError {
    SendError::Exchange(ExchangeError::Wire(e.into()))
}

/// Runs until the pool is gone.
async fn sweep(pool: Weak<Http1Pool>, idle_timeout: Duration) {
    let mut every = tokio::time::interval(idle_timeout / 2);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        match pool.upgrade() {
            Some(pool) => pool.close_stale(),
            None => return,
        }
    }
}

/// A worker's answer, its body read as it comes.
pub type UpstreamResponse = axum::http::Response<UpstreamBody>;

/// Where a connection goes back once its answer has been read.
struct Back {
    pool: Arc<Http1Pool>,
    authority: Authority,
}

/// A worker's answer body: read from the worker's connection (a pooled connection goes back to
/// the pool once read to its end), or handed over frame by frame by a data plane that made the
/// exchange itself (`sluice epp`: Envoy sends the request and streams the answer through).
pub struct UpstreamBody {
    source: Source,
    back: Option<Back>,
}

enum Source {
    /// From hyper's pooled client (TLS or HTTP/2 workers).
    Connection(Incoming),
    /// From a connection of our own (cleartext HTTP/1.1 workers).
    Wire(wire::Body),
    /// `None` in the channel is the end of the body. A sender dropped without it leaves the body
    /// unfinished for good: the data plane went away, and whoever relays the body is about to be
    /// dropped too — reading that as an end would judge a cut stream as a finished one.
    HandedOver {
        frames: tokio::sync::mpsc::Receiver<Option<Frame<Bytes>>>,
        ended: bool,
    },
    /// Rendered by the gateway from a gRPC worker's replies: the channel's end is the body's
    /// end (the renderer closes it only when it is done), an error its break.
    Rendered(tokio::sync::mpsc::Receiver<Result<Bytes, ExchangeError>>),
}

impl std::fmt::Debug for UpstreamBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let source = match self.source {
            Source::Connection(_) => "pooled client",
            Source::Wire(_) => "own connection",
            Source::HandedOver { .. } => "handed over",
            Source::Rendered(_) => "rendered",
        };
        f.debug_struct("UpstreamBody")
            .field("source", &source)
            .field("goes_back", &self.back.is_some())
            .finish()
    }
}

impl From<Incoming> for UpstreamBody {
    fn from(inner: Incoming) -> Self {
        Self {
            source: Source::Connection(inner),
            back: None,
        }
    }
}

impl UpstreamBody {
    /// A body the gateway renders as it goes (a gRPC worker's answer in OpenAI's shape).
    pub(crate) fn rendered(
        pieces: tokio::sync::mpsc::Receiver<Result<Bytes, ExchangeError>>,
    ) -> Self {
        Self {
            source: Source::Rendered(pieces),
            back: None,
        }
    }

    /// A body whose frames a data plane hands over as they arrive; `None` ends it.
    pub fn handed_over(frames: tokio::sync::mpsc::Receiver<Option<Frame<Bytes>>>) -> Self {
        Self {
            source: Source::HandedOver {
                frames,
                ended: false,
            },
            back: None,
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = ExchangeError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ExchangeError>>> {
        let this = self.get_mut();
        match &mut this.source {
            Source::Connection(inner) => {
                Pin::new(inner).poll_frame(cx).map_err(ExchangeError::Hyper)
            }
            Source::Wire(body) => {
                let data = std::task::ready!(body.poll_data(cx));
                // A reader that knows the length stops at the last frame without asking for
                // the end: the connection goes back with that frame.
                if body.is_end() {
                    if let (Some(back), Some(conn)) = (this.back.take(), body.take_reusable()) {
                        back.pool.put(&back.authority, conn);
                    }
                }
                Poll::Ready(data.map(|d| d.map(Frame::data).map_err(ExchangeError::Wire)))
            }
            Source::HandedOver { frames, ended } => {
                if *ended {
                    return Poll::Ready(None);
                }
                match std::task::ready!(frames.poll_recv(cx)) {
                    Some(Some(frame)) => Poll::Ready(Some(Ok(frame))),
                    Some(None) => {
                        *ended = true;
                        Poll::Ready(None)
                    }
                    None => Poll::Pending,
                }
            }
            Source::Rendered(pieces) => std::task::ready!(pieces.poll_recv(cx))
                .map(|piece| piece.map(Frame::data))
                .into(),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.source {
            Source::Connection(inner) => inner.is_end_stream(),
            Source::Wire(body) => body.is_end(),
            Source::HandedOver { ended, .. } => *ended,
            Source::Rendered(_) => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.source {
            Source::Connection(inner) => inner.size_hint(),
            Source::Wire(body) => body
                .remaining()
                .map_or_else(SizeHint::default, SizeHint::with_exact),
            Source::HandedOver { .. } | Source::Rendered(_) => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests;
