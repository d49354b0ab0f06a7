//! hyper's own refusals in the OpenAI error shape.
//!
//! When hyper cannot parse a request head — not HTTP, a head over its buffer, a target over 64 KiB —
//! it answers by itself, before any service sees a request, with a bare status line and no body:
//! a client gets no `code`, no message, no `X-Sluice-Error-Code`. hyper has no hook for that
//! answer, so the client's socket is wrapped: the first bytes hyper writes on a connection where
//! no request has reached the gateway are, by construction, such a refusal (a response to a
//! request always follows the request), and they are replaced by the same refusal in the gateway's
//! shape. Only the first message of a connection is watched: a later unparsable request on a
//! keep-alive connection keeps hyper's bare answer.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::RequestError;
use crate::error::Answerable;

/// A client socket whose first bytes, if hyper writes them before any request was served, are
/// rewritten (see the module docs).
pub(crate) struct Shaped<T> {
    inner: T,
    /// Set by the service when a request reaches it.
    served: Arc<AtomicBool>,
    /// The shaped refusal still to be written, and how much of it is written.
    replacing: Option<(Vec<u8>, usize)>,
    /// After a shaped refusal, hyper's own bytes are dropped.
    swallow: bool,
    /// A request was served: nothing here is hyper's own refusal any more (no more watching).
    passed: bool,
}

impl<T> Shaped<T> {
    pub fn new(inner: T, served: Arc<AtomicBool>) -> Self {
        Self {
            inner,
            served,
            replacing: None,
            swallow: false,
            passed: false,
        }
    }
}

/// The shaped answer for hyper's status line at the start of `bytes`, if that is what they are.
fn shaped_refusal(bytes: &[u8]) -> Option<Vec<u8>> {
    let rest = bytes.strip_prefix(b"HTTP/1.1 ")?;
    let code = std::str::from_utf8(rest.get(..3)?)
        .ok()?
        .parse::<u16>()
        .ok()?;
    let error = match code {
        400 => RequestError::MalformedRequest,
        414 => RequestError::UriTooLong { limit: 65_534 },
        431 => RequestError::HeadersTooLarge {
            fields: super::service::HYPER_MAX_HEADERS,
            bytes: super::service::HYPER_MAX_BUF,
        },
        _ => return None,
    };
    let body = crate::error::body(&error);
    let mut out = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\n{}: {}\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n",
        error.status().as_u16(),
        error.status().canonical_reason().unwrap_or(""),
        crate::error::ERROR_CODE_HEADER,
        error.code(),
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    Some(out)
}

impl<T: AsyncWrite + Unpin> Shaped<T> {
    /// Writes what is left of the shaped refusal; ready once all of it is out.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((bytes, at)) = &mut self.replacing {
            if *at == bytes.len() {
                self.replacing = None;
                self.swallow = true;
                break;
            }
            let n = std::task::ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*at..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *at += n;
        }
        Poll::Ready(Ok(()))
    }

    /// Whether `first` (the start of hyper's next write) is to be replaced; arms the replacement.
    fn intercept(&mut self, first: &[u8]) -> bool {
        if self.passed {
            return false;
        }
        if self.swallow || self.replacing.is_some() {
            return true;
        }
        if self.served.load(Ordering::Acquire) {
            self.passed = true;
            return false;
        }
        match shaped_refusal(first) {
            Some(shaped) => {
                self.replacing = Some((shaped, 0));
                true
            }
            None => false,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Shaped<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Shaped<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.intercept(buf) {
            std::task::ready!(self.drain(cx))?;
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let first = bufs
            .iter()
            .find(|b| !b.is_empty())
            .map_or(&[][..], |b| &b[..]);
        if self.intercept(first) {
            std::task::ready!(self.drain(cx))?;
            return Poll::Ready(Ok(bufs.iter().map(|b| b.len()).sum()));
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.drain(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.drain(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hypers_status_lines_become_openai_errors() {
        let shaped =
            shaped_refusal(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n").unwrap();
        let text = String::from_utf8(shaped).unwrap();
        assert!(text.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{text}");
        assert!(
            text.contains("x-sluice-error-code: invalid_request\r\n"),
            "{text}"
        );
        let body = text.split("\r\n\r\n").nth(1).unwrap();
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(json["error"]["code"], "invalid_request");
        assert!(shaped_refusal(b"HTTP/1.1 431 Request Header Fields Too Large\r\n").is_some());
        assert!(shaped_refusal(b"HTTP/1.1 200 OK\r\n").is_none());
        assert!(shaped_refusal(b"data: x").is_none());
    }
}
