//! An answer's body, read from its connection on whichever task polls it (the request's own).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::time::Sleep;

use super::framing::{Decoded, Framing};
use super::limits::{MAX_READ, STALL};
use super::{Conn, WireError};

/// The body of an answer on a connection of our own; the connection comes back out of it once
/// the body was read to its end, if it may carry another exchange.
#[derive(Debug)]
pub(in crate::upstream) struct Body {
    /// `None` once given back, or after an error (the connection is dropped, hence closed).
    conn: Option<Conn>,
    framing: Framing,
    reusable: bool,
    /// Set while the body waits inside a line of framing (`Framing::mid_line`): when the worker
    /// stops there for `STALL`, the answer is given up. `None` otherwise, so a stream's events
    /// cost no timer.
    stall: Option<Pin<Box<Sleep>>>,
}

impl Body {
    pub(super) fn new(conn: Conn, framing: Framing, reusable: bool) -> Self {
        Self {
            conn: Some(conn),
            framing,
            reusable,
            stall: None,
        }
    }

    /// The next piece of data; `None` at the end. After an error the body yields nothing more.
    pub(crate) fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, WireError>>> {
        loop {
            if self.framing == Framing::Done {
                return Poll::Ready(None);
            }
            let Some(conn) = self.conn.as_mut() else {
                return Poll::Ready(None);
            };
            let step = match self.framing.decode(&mut conn.read) {
                Ok(Decoded::Data(data)) => return Poll::Ready(Some(Ok(data))),
                Ok(Decoded::End) => return Poll::Ready(None),
                Ok(Decoded::NeedMore) => match conn.poll_fill(cx) {
                    Poll::Ready(Ok(0)) => {
                        // The worker closed: the end of a body that runs to the close.
                        self.reusable = false;
                        self.framing.closed()
                    }
                    Poll::Ready(Ok(_)) => {
                        self.stall = None;
                        Ok(())
                    }
                    Poll::Ready(Err(e)) => Err(WireError::Io(e)),
                    Poll::Pending => {
                        if !self.framing.mid_line(&conn.read) {
                            return Poll::Pending;
                        }
                        let stall = self
                            .stall
                            .get_or_insert_with(|| Box::pin(tokio::time::sleep(STALL)));
                        std::task::ready!(stall.as_mut().poll(cx));
                        Err(WireError::Stalled)
                    }
                },
                Err(e) => Err(e),
            };
            if let Err(e) = step {
                self.conn = None;
                return Poll::Ready(Some(Err(e)));
            }
        }
    }

    /// Read to its end.
    pub(crate) fn is_end(&self) -> bool {
        self.framing == Framing::Done
    }

    /// The body's bytes left, when its length is known.
    pub(crate) fn remaining(&self) -> Option<u64> {
        self.framing.remaining()
    }

    /// The connection, when the body was read to its end and the connection may be used again.
    pub(crate) fn take_reusable(&mut self) -> Option<Conn> {
        if !self.is_end() || !self.reusable {
            return None;
        }
        self.conn.take()?.idle()
    }
}

impl Conn {
    /// Reads what the socket has into the read buffer; 0 when the worker closed. A read that
    /// fills the room it was given doubles the next one's, up to `MAX_READ`.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        self.read.reserve(self.read_size);
        let room = self.read.capacity() - self.read.len();
        loop {
            std::task::ready!(self.stream.poll_read_ready(cx))?;
            match self.stream.try_read_buf(&mut self.read) {
                Ok(n) => {
                    if n == room {
                        self.read_size = (self.read_size * 2).min(MAX_READ);
                    }
                    return Poll::Ready(Ok(n));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}
