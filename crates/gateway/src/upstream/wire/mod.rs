//! HTTP/1.1 to cleartext workers on connections of our own, driven by the request's own task.
//!
//! vLLM and SGLang speak HTTP/1.1 only, so every stream to them holds a worker connection for
//! its whole length. hyper's client gives each connection a task of its own that the request
//! reaches over channels, a dispatch channel block (9 KB), and 8 KiB read and write buffers that
//! do not shrink: 25 KB a connection, most of a stream's cost. Here a connection is its socket
//! and one read buffer, 2 KiB at first, doubled only when a read fills it, and let go while the
//! connection is idle; the request's task writes the request in one vectored write and reads the
//! answer itself, with no task or channel between.
//!
//! What it does not do, because workers do not need it: pipelining, `Expect: 100-continue`,
//! protocol upgrades (a 101 is an error), HTTP/1.0 keep-alive (such a connection is closed after
//! its answer). Heads are parsed by httparse, the parser hyper uses; where a body ends, chunk
//! lines and trailers by `framing`, never looser than hyper 1.x's own decoder (the conformance
//! suite, `conformance`, holds both to a table of answers). Every bound on an answer is in
//! `limits`.
//!
//! ## Layout
//!
//! - `mod.rs` — the connection, writing a request, reading an answer's head.
//! - `limits` — every bound an answer is held to.
//! - `framing` — where an answer's body ends, and taking its data out of what was read.
//! - `body` — the body as the request's task reads it.
//! - `conformance` (tests) — the client held to hyper's on a table of answers and mutations.

mod body;
mod framing;
mod limits;

use std::io::{self, IoSlice};
use std::mem::MaybeUninit;

use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, Response, StatusCode};
use axum::http::{request, Version};
use bytes::{Buf, Bytes, BytesMut};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

pub(super) use body::Body;
use framing::Framing;
use limits::{FIRST_READ, MAX_HEAD, MAX_HEADERS, MAX_INFORMATIONAL, STALL};

/// Why an exchange on a connection of our own failed.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("the connection failed: {0}")]
    Io(#[from] io::Error),
    #[error("the worker closed the connection before answering")]
    ClosedBeforeAnswer,
    #[error("the worker closed the connection before the end of its answer")]
    Truncated,
    #[error("the answer's head is malformed: {0}")]
    MalformedHead(httparse::Error),
    #[error("the answer's head is longer than {MAX_HEAD} bytes")]
    HeadTooLarge,
    #[error("more than {MAX_INFORMATIONAL} informational answers came before the final one")]
    TooManyInformational,
    #[error("the answer's length is invalid")]
    BadLength,
    #[error("the answer's chunked encoding is malformed")]
    BadChunk,
    #[error("an HTTP/1.0 answer carries Transfer-Encoding (faulty framing, RFC 9112 section 6.1)")]
    TransferEncodingOn10,
    #[error("the worker switched protocols, which was not asked for")]
    Upgrade,
    #[error("the worker stopped for {STALL:?} inside a head or a line of framing, or took no more of the request")]
    Stalled,
}

impl WireError {
    /// The worker answered, but not as HTTP/1.1 allows or within the client's bounds
    /// (`limits`): its failure, though not a lost connection.
    pub(crate) fn is_bad_answer(&self) -> bool {
        !matches!(
            self,
            WireError::Io(_) | WireError::ClosedBeforeAnswer | WireError::Truncated
        )
    }
}

/// A write begun: done (whole, or cut short by an early answer), or blocked with this left.
pub(super) enum Started<'a> {
    Done(Written),
    Blocked([&'a [u8]; 2]),
}

/// How much of a request reached the worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Written {
    Whole,
    /// The worker answered, or closed, before taking all of it: its answer is read, and the
    /// connection is not used again.
    AnsweredEarly,
}

/// A connection to a worker, idle or in an exchange.
#[derive(Debug)]
pub(super) struct Conn {
    stream: TcpStream,
    /// What was read and not yet used; empty (no allocation) while idle.
    read: BytesMut,
    /// How much the next read asks for.
    read_size: usize,
}

/// An answer's head, and where its body ends.
pub(super) struct Head {
    pub(crate) response: Response<()>,
    framing: Framing,
    /// The connection may carry another exchange once the body is read.
    reusable: bool,
}

impl Conn {
    pub(super) fn new(stream: TcpStream) -> Self {
        Self {
            stream,
            read: BytesMut::new(),
            read_size: FIRST_READ,
        }
    }

    /// The worker closed the connection, or sent something nobody asked for, while it was idle.
    /// Free unless the socket was woken since its last read.
    pub(super) fn is_closed(&self) -> bool {
        let mut probe = [0u8; 1];
        !matches!(self.stream.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// Writes the request whole: its head and `body` in one vectored write where the socket
    /// takes it. A worker that answers (a 413, a 401) or closes before taking it all is heard
    /// (RFC 9112 section 9.5), and one that takes none of it for `STALL` is given up on.
    pub(super) async fn write(&mut self, head: &[u8], body: &[u8]) -> Result<Written, WireError> {
        match self.write_now(head, body)? {
            Started::Done(written) => Ok(written),
            Started::Blocked(rest) => Box::pin(self.write_when_taken(rest)).await,
        }
    }

    /// Writes what the socket takes now, which on a healthy connection is all of it: done
    /// without a future, so none sits in every request's (which is moved whole on its way).
    pub(super) fn write_now<'a>(
        &mut self,
        head: &'a [u8],
        body: &'a [u8],
    ) -> Result<Started<'a>, WireError> {
        let mut rest = [head, body];
        loop {
            match self.try_write(&mut rest) {
                Ok(true) => return Ok(Started::Done(Written::Whole)),
                Ok(false) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Ok(Started::Blocked(rest))
                }
                Err(e) => return self.answered_before(e).map(Started::Done),
            }
        }
    }

    /// The rest of a request the socket did not take at once, written as the worker takes it;
    /// `STALL` without progress gives up.
    pub(super) async fn write_when_taken(
        &mut self,
        mut rest: [&[u8]; 2],
    ) -> Result<Written, WireError> {
        let stall = tokio::time::sleep(STALL);
        tokio::pin!(stall);
        loop {
            tokio::select! {
                ready = self.stream.writable() => {
                    ready?;
                    match self.try_write(&mut rest) {
                        Ok(true) => return Ok(Written::Whole),
                        Ok(false) => stall.as_mut().reset(tokio::time::Instant::now() + STALL),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => return self.answered_before(e),
                    }
                }
                ready = self.stream.readable() => {
                    ready?;
                    self.read.reserve(self.read_size);
                    match self.stream.try_read_buf(&mut self.read) {
                        // The worker spoke, or closed: its answer (or end) is read next.
                        Ok(_) => return Ok(Written::AnsweredEarly),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                () = &mut stall => return Err(WireError::Stalled),
            }
        }
    }

    /// One non-blocking write of what is left of `rest`; true once all of it is written.
    fn try_write(&self, rest: &mut [&[u8]; 2]) -> io::Result<bool> {
        let written = self
            .stream
            .try_write_vectored(&[IoSlice::new(rest[0]), IoSlice::new(rest[1])])?;
        if written == 0 && !(rest[0].is_empty() && rest[1].is_empty()) {
            return Err(io::ErrorKind::WriteZero.into());
        }
        let of_head = written.min(rest[0].len());
        rest[0] = &rest[0][of_head..];
        rest[1] = &rest[1][written - of_head..];
        Ok(rest[0].is_empty() && rest[1].is_empty())
    }

    /// A write failed: if the worker answered before it closed (it refused the request and
    /// will not read the rest), the answer is there to read; else the write's error.
    fn answered_before(&mut self, e: io::Error) -> Result<Written, WireError> {
        self.read.reserve(self.read_size);
        match self.stream.try_read_buf(&mut self.read) {
            Ok(n) if n > 0 => Ok(Written::AnsweredEarly),
            _ => Err(e.into()),
        }
    }

    /// Reads the answer's head (informational answers skipped, at most `MAX_INFORMATIONAL`)
    /// for a request sent as `method`. The wait for its first byte is not bounded here; once a
    /// head has started, each wait for more of it is (`STALL`).
    pub(super) async fn read_head(&mut self, method: &Method) -> Result<Head, WireError> {
        // Nothing but the count lives across a read: the future stays small, as it sits in
        // every request's.
        let mut informational = 0;
        loop {
            if let Some(head) = self.final_head(method, &mut informational)? {
                return Ok(head);
            }
            let started = !self.read.is_empty();
            self.read.reserve(self.read_size);
            let read = if started {
                // Boxed for the same reason as a slow write: a head in pieces is rare.
                Box::pin(tokio::time::timeout(
                    STALL,
                    self.stream.read_buf(&mut self.read),
                ))
                .await
                .map_err(|_| WireError::Stalled)?
            } else {
                self.stream.read_buf(&mut self.read).await
            };
            if !started && informational == 0 && closed(&read) {
                return Err(WireError::ClosedBeforeAnswer);
            }
            match read {
                Ok(0) => return Err(WireError::Truncated),
                Ok(_) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The final head at the front of what was read, informational ones before it taken off
    /// and counted; `None` when more must be read.
    fn final_head(
        &mut self,
        method: &Method,
        informational: &mut usize,
    ) -> Result<Option<Head>, WireError> {
        // Nothing read is nothing to parse: the first look would always come back empty.
        while !self.read.is_empty() {
            let Some(head) = self.parse_head(method)? else {
                break;
            };
            if !head.response.status().is_informational() {
                return Ok(Some(head));
            }
            *informational += 1;
            if *informational > MAX_INFORMATIONAL {
                return Err(WireError::TooManyInformational);
            }
        }
        if self.read.len() >= MAX_HEAD {
            return Err(WireError::HeadTooLarge);
        }
        Ok(None)
    }

    /// A whole head at the front of what was read, taken off it; `None` when more must be read.
    fn parse_head(&mut self, method: &Method) -> Result<Option<Head>, WireError> {
        // Uninitialised room for the fields: zeroing room for 100 cost more than the parse.
        let mut fields = [MaybeUninit::<httparse::Header<'_>>::uninit(); MAX_HEADERS];
        let mut parsed = httparse::Response::new(&mut []);
        let config = httparse::ParserConfig::default();
        let len =
            match config.parse_response_with_uninit_headers(&mut parsed, &self.read, &mut fields) {
                Ok(httparse::Status::Complete(len)) => len,
                Ok(httparse::Status::Partial) => return Ok(None),
                Err(e) => return Err(WireError::MalformedHead(e)),
            };
        let status = parsed
            .code
            .and_then(|code| StatusCode::from_u16(code).ok())
            .ok_or(WireError::MalformedHead(httparse::Error::Status))?;
        if status == StatusCode::SWITCHING_PROTOCOLS {
            return Err(WireError::Upgrade);
        }
        let version = if parsed.version == Some(1) {
            Version::HTTP_11
        } else {
            Version::HTTP_10
        };
        // The values share one copy of the head, so the read buffer stays free for the body.
        let text = Bytes::copy_from_slice(&self.read[..len]);
        let base = self.read.as_ptr() as usize;
        let mut headers = HeaderMap::with_capacity(parsed.headers.len());
        for field in parsed.headers.iter() {
            let name = HeaderName::from_bytes(field.name.as_bytes())
                .map_err(|_| WireError::MalformedHead(httparse::Error::HeaderName))?;
            let at = field.value.as_ptr() as usize - base;
            let value = HeaderValue::from_maybe_shared(text.slice(at..at + field.value.len()))
                .map_err(|_| WireError::MalformedHead(httparse::Error::HeaderValue))?;
            headers.append(name, value);
        }
        self.read.advance(len);
        let mut response = Response::new(());
        *response.status_mut() = status;
        *response.version_mut() = version;
        let framing = Framing::of(method, status, version, &headers)?;
        // Both framings given: the chunks rule (RFC 9112 section 6.3) and the length goes, so no
        // client is told one the body does not have; the connection is not trusted again.
        let both = headers.contains_key(header::TRANSFER_ENCODING)
            && headers.remove(header::CONTENT_LENGTH).is_some();
        let reusable = version == Version::HTTP_11
            && framing != Framing::UntilClose
            && !both
            && !says_close(&headers);
        *response.headers_mut() = headers;
        Ok(Some(Head {
            response,
            framing,
            reusable,
        }))
    }

    /// Ready to wait in the pool: nothing left unread, the read buffer let go.
    fn idle(mut self) -> Option<Self> {
        if !self.read.is_empty() {
            // Bytes after an answer's end: the worker and the gateway disagree on framing.
            return None;
        }
        self.read = BytesMut::new();
        self.read_size = FIRST_READ;
        Some(self)
    }
}

impl Head {
    /// The body of this answer, read from `conn`; with `close`, the request asked for the
    /// connection to close after it.
    pub(super) fn body(self, conn: Conn, close: bool) -> (Response<()>, Body) {
        let reusable = self.reusable && !close;
        (self.response, Body::new(conn, self.framing, reusable))
    }
}

/// A read that found the connection closed: its end, or a reset (the worker closed with the
/// request unread).
fn closed(read: &io::Result<usize>) -> bool {
    match read {
        Ok(n) => *n == 0,
        Err(e) => matches!(
            e.kind(),
            io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted
        ),
    }
}

/// `Connection: close` among the headers.
fn says_close(headers: &HeaderMap) -> bool {
    headers.get_all(header::CONNECTION).iter().any(|v| {
        v.to_str().is_ok_and(|v| {
            v.split(',')
                .any(|token| token.trim().eq_ignore_ascii_case("close"))
        })
    })
}

/// A request's head as HTTP/1.1 writes it, for a body of `body_len` bytes: the target in
/// origin form, `Host` as the request names it or else `host` (the worker's authority), the
/// headers as given but for the framing ones, which are written from the body actually sent.
/// Also whether the request asks to close the connection. Written straight into one buffer,
/// with no header inserted and no number formatted on the heap: this runs for every request.
pub(super) fn request_head(parts: &request::Parts, host: &str, body_len: usize) -> (Vec<u8>, bool) {
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let size: usize = parts
        .headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    let mut head =
        Vec::with_capacity(parts.method.as_str().len() + target.len() + host.len() + size + 56);
    head.extend_from_slice(parts.method.as_str().as_bytes());
    head.push(b' ');
    head.extend_from_slice(target.as_bytes());
    head.extend_from_slice(b" HTTP/1.1\r\n");
    if !parts.headers.contains_key(header::HOST) {
        head.extend_from_slice(b"host: ");
        head.extend_from_slice(host.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    for (name, value) in &parts.headers {
        if name == header::CONTENT_LENGTH || name == header::TRANSFER_ENCODING {
            continue;
        }
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    let may_have_body = !matches!(
        parts.method,
        Method::GET | Method::HEAD | Method::DELETE | Method::OPTIONS | Method::CONNECT
    );
    if body_len > 0 || may_have_body {
        head.extend_from_slice(b"content-length: ");
        head.extend_from_slice(itoa::Buffer::new().format(body_len).as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    (head, says_close(&parts.headers))
}

#[cfg(test)]
mod conformance;
#[cfg(test)]
mod tests;
