//! Which HTTP a client connection speaks, decided before hyper reads a byte of it.
//!
//! hyper-util's `auto` builder tells HTTP/1.1 from h2c by reading a connection's first bytes
//! and handing them back to hyper through a rewinding reader. hyper's first read then returns
//! only those few bytes, and its read buffer, which must keep 8 KiB free for the next read,
//! doubles to 16 KiB — and keeps that for the connection's life: 8 KiB more for every idle
//! keep-alive connection and every open stream. Deciding instead from bytes peeked in the
//! kernel's socket buffer (`MSG_PEEK`, nothing consumed), or from what TLS's ALPN agreed, hands
//! hyper's HTTP/1.1 or HTTP/2 connection the socket untouched. Only when neither tells (a
//! partial h2c preface so far, a TLS client that offered no ALPN) is `auto` left to sniff.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::service::FirstRequest;
use super::shaped::Shaped;

/// What an h2c connection starts with (RFC 9113, section 3.4).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The protocol a connection was found to speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Speaks {
    Http1,
    Http2,
    /// Not known yet: hyper-util's `auto` finds out.
    Unsure,
}

/// A client socket that can say which protocol it carries without consuming anything.
pub(super) trait Sniff {
    /// Waits for the first bytes where it needs them.
    fn speaks(&self) -> impl Future<Output = Speaks> + Send;
}

impl Sniff for TcpStream {
    async fn speaks(&self) -> Speaks {
        let mut first = [0u8; H2_PREFACE.len()];
        match self.peek(&mut first).await {
            // Closed, or failing: hyper's HTTP/1.1 connection reads the end and stops.
            Ok(0) | Err(_) => Speaks::Http1,
            Ok(n) => from_first_bytes(&first[..n]),
        }
    }
}

impl<S: Sync> Sniff for tokio_rustls::server::TlsStream<S> {
    async fn speaks(&self) -> Speaks {
        match self.get_ref().1.alpn_protocol() {
            Some(b"h2") => Speaks::Http2,
            Some(b"http/1.1") => Speaks::Http1,
            _ => Speaks::Unsure,
        }
    }
}

/// HTTP/2 when they are the whole preface, HTTP/1.1 as soon as they differ from it.
fn from_first_bytes(first: &[u8]) -> Speaks {
    if !H2_PREFACE.starts_with(first) {
        Speaks::Http1
    } else if first.len() == H2_PREFACE.len() {
        Speaks::Http2
    } else {
        Speaks::Unsure
    }
}

/// hyper's builders for each protocol, configured once per listener.
#[derive(Clone)]
pub(super) struct Builders {
    pub(crate) http1: http1::Builder,
    pub(crate) http2: http2::Builder<TokioExecutor>,
    pub(crate) auto: auto::Builder<TokioExecutor>,
}

type Io<S> = TokioIo<Shaped<S>>;
type Svc = TowerToHyperService<FirstRequest>;

/// One connection served by the builder for the protocol it speaks.
pub(super) enum Serving<'a, S: AsyncRead + AsyncWrite + Unpin + Send + 'static> {
    Http1(Pin<Box<http1::UpgradeableConnection<Io<S>, Svc>>>),
    Http2(Pin<Box<http2::Connection<Io<S>, Svc, TokioExecutor>>>),
    Auto(Pin<Box<auto::UpgradeableConnection<'a, Io<S>, Svc, TokioExecutor>>>),
}

impl<'a, S: AsyncRead + AsyncWrite + Unpin + Send + 'static> Serving<'a, S> {
    pub fn new(builders: &'a Builders, speaks: Speaks, io: Io<S>, service: Svc) -> Self {
        match speaks {
            Speaks::Http1 => Serving::Http1(Box::pin(
                builders.http1.serve_connection(io, service).with_upgrades(),
            )),
            Speaks::Http2 => Serving::Http2(Box::pin(builders.http2.serve_connection(io, service))),
            Speaks::Unsure => Serving::Auto(Box::pin(
                builders.auto.serve_connection_with_upgrades(io, service),
            )),
        }
    }

    /// Stops taking requests; those in progress finish (a GOAWAY on HTTP/2).
    pub(crate) fn graceful_shutdown(&mut self) {
        match self {
            Serving::Http1(c) => c.as_mut().graceful_shutdown(),
            Serving::Http2(c) => c.as_mut().graceful_shutdown(),
            Serving::Auto(c) => c.as_mut().graceful_shutdown(),
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> Future for Serving<'_, S> {
    /// Whether the connection ended cleanly does not matter to the caller: it is gone either way.
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match self.get_mut() {
            Serving::Http1(c) => c.as_mut().poll(cx).map(drop),
            Serving::Http2(c) => c.as_mut().poll(cx).map(drop),
            Serving::Auto(c) => c.as_mut().poll(cx).map(drop),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_bytes_tell_http1_from_h2c() {
        assert_eq!(from_first_bytes(b"POST /v1/chat"), Speaks::Http1);
        assert_eq!(from_first_bytes(b"GET / HTTP/1.1\r\n"), Speaks::Http1);
        assert_eq!(from_first_bytes(H2_PREFACE), Speaks::Http2);
        assert_eq!(from_first_bytes(b"PRI * HTTP/2.0\r\n"), Speaks::Unsure);
        assert_eq!(from_first_bytes(b"PRI * HTTP/1.1"), Speaks::Http1);
    }
}
