//! The stream-back stage: a worker's response body relayed to the client frame by frame.
//!
//! `Relay` wraps the upstream body. It buffers nothing: each frame is passed on the moment it
//! arrives, and its arrival is timed (time to first byte, gaps between chunks: the worker's
//! progress as the gateway sees it). It holds the request's `Lease` until the end, so the
//! worker's in-flight count and its breaker permit live exactly as long as the response.
//!
//! Three endings:
//! - the worker finishes: the outcome is settled in the breaker (5xx other than 529 counts as a
//!   failure);
//! - the worker fails mid-body (connection reset, or an SSE stream that ends without
//!   `data: [DONE]`): an SSE client gets one error event in the OpenAI shape and the stream ends
//!   *without* `[DONE]`, so no client can take it for a normal end; other bodies are cut, so the
//!   client sees a truncated response rather than a complete-looking one;
//! - the client goes away: the relay is dropped, which drops the upstream body and closes its
//!   connection — the engine aborts the request and frees its KV cache. Counted as a
//!   cancellation.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use sluice_core::breaker::Outcome;
use tokio::time::{Instant, Sleep};

use crate::access_log::{AccessLog, AccessRecord};
use crate::error::GatewayError;
use crate::fleet::Lease;
use crate::inflight::InFlightGuard;
use crate::metrics::{CancelLabels, Metrics, RouteLabel, UpstreamErrorLabels};

/// The status Dynamo-style workers answer when at capacity: a refusal, not a malfunction.
const STATUS_AT_CAPACITY: u16 = 529;

/// What the end of a response accounts for: metrics and the access log line.
pub struct Ending {
    /// Holds the request's place in the gateway's in-flight count until the response ends.
    pub in_flight: InFlightGuard,
    pub metrics: Arc<Metrics>,
    pub route: &'static str,
    pub started: Instant,
    pub access: Option<(AccessLog, AccessRecord)>,
}

impl Ending {
    /// An attempt went to `worker`.
    pub fn note_attempt(&mut self, worker: &str, attempts: u32) {
        if let Some((_, record)) = &mut self.access {
            record.worker = Some(worker.to_string());
            record.attempts = attempts;
        }
    }

    /// The response started with `status`.
    pub fn note_response(&mut self, status: u16) {
        let elapsed = self.started.elapsed();
        if let Some((_, record)) = &mut self.access {
            record.status = status;
            record.ttfb_ms = elapsed.as_secs_f64() * 1e3;
        }
    }

    /// The gateway answered itself with this error.
    pub fn note_error(&mut self, status: u16, code: &'static str) {
        self.note_response(status);
        if let Some((_, record)) = &mut self.access {
            record.code = Some(code);
        }
    }

    pub fn finish(self, bytes: u64, cancelled: bool, interrupted: bool) {
        let elapsed = self.started.elapsed();
        self.metrics
            .duration
            .get_or_create(&RouteLabel { route: self.route })
            .observe(elapsed.as_secs_f64());
        if cancelled {
            self.metrics
                .cancellations
                .get_or_create(&CancelLabels {
                    route: self.route,
                    stage: "streaming",
                })
                .inc();
        }
        if let Some((log, mut record)) = self.access {
            record.duration_ms = elapsed.as_secs_f64() * 1e3;
            record.bytes = bytes;
            record.cancelled = cancelled;
            record.interrupted = interrupted;
            log.record(record);
        }
    }
}

/// Whether an upstream answer counts against the worker's circuit.
pub fn outcome_of(status: u16) -> Outcome {
    if status >= 500 && status != STATUS_AT_CAPACITY {
        Outcome::Failure
    } else {
        Outcome::Success
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Relaying,
    Done,
}

/// The last bytes of a stream, to tell whether it ended with `data: [DONE]`.
#[derive(Default)]
struct Tail {
    buf: [u8; 32],
    len: usize,
}

impl Tail {
    fn push(&mut self, data: &[u8]) {
        let cap = self.buf.len();
        if data.len() >= cap {
            self.buf.copy_from_slice(&data[data.len() - cap..]);
            self.len = cap;
            return;
        }
        let keep = (cap - data.len()).min(self.len);
        self.buf.copy_within(self.len - keep..self.len, 0);
        self.buf[keep..keep + data.len()].copy_from_slice(data);
        self.len = keep + data.len();
    }

    fn ends_with_done(&self) -> bool {
        self.buf[..self.len]
            .trim_ascii_end()
            .ends_with(b"data: [DONE]")
    }
}

/// A worker's response body on its way to the client.
pub struct Relay {
    inner: Incoming,
    lease: Lease,
    status: u16,
    sse: bool,
    sent_at: Instant,
    last_chunk: Option<Instant>,
    tail: Tail,
    bytes: u64,
    state: State,
    /// The request timeout, which covers the whole stream.
    deadline: Pin<Box<Sleep>>,
    ending: Option<Ending>,
}

impl Relay {
    pub fn new(
        inner: Incoming,
        lease: Lease,
        status: u16,
        sse: bool,
        sent_at: Instant,
        deadline: Instant,
        ending: Ending,
    ) -> Self {
        Self {
            inner,
            lease,
            status,
            sse,
            sent_at,
            last_chunk: None,
            tail: Tail::default(),
            bytes: 0,
            state: State::Relaying,
            deadline: Box::pin(tokio::time::sleep_until(deadline)),
            ending: Some(ending),
        }
    }

    fn observe(&mut self, data: &Bytes) {
        let now = Instant::now();
        self.lease.worker().signals.progress(now);
        let metrics = &self.lease.worker().metrics;
        match self.last_chunk {
            None => {
                let ttft = now - self.sent_at;
                metrics.ttft.observe(ttft.as_secs_f64());
                self.lease.first_byte_after(ttft);
            }
            Some(last) => metrics.inter_chunk.observe((now - last).as_secs_f64()),
        }
        self.last_chunk = Some(now);
        self.bytes += data.len() as u64;
        if self.sse {
            self.tail.push(data);
        }
    }

    fn finish(&mut self, cancelled: bool, interrupted: bool) {
        if let Some(ending) = self.ending.take() {
            ending.finish(self.bytes, cancelled, interrupted);
        }
    }

    /// The worker finished the response.
    fn complete(&mut self) {
        self.lease.settle(outcome_of(self.status));
        self.finish(false, false);
        self.state = State::Done;
    }

    /// The worker failed mid-body: settle, count, and decide what the client gets.
    fn fail(&mut self, kind: &'static str) -> Poll<Option<Result<Frame<Bytes>, GatewayError>>> {
        self.lease.settle(Outcome::Failure);
        let worker = self.lease.worker().clone();
        if let Some(ending) = &self.ending {
            ending
                .metrics
                .upstream_errors
                .get_or_create(&UpstreamErrorLabels {
                    worker: worker.id.to_string(),
                    kind,
                })
                .inc();
        }
        self.finish(false, true);
        let error = GatewayError::StreamInterrupted {
            worker: worker.id.clone(),
        };
        self.state = State::Done;
        if self.sse {
            Poll::Ready(Some(Ok(Frame::data(error.sse_event()))))
        } else {
            Poll::Ready(Some(Err(error)))
        }
    }
}

impl Body for Relay {
    type Data = Bytes;
    type Error = GatewayError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, GatewayError>>> {
        let this = &mut *self;
        if this.state == State::Done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.observe(data);
                }
                // A body of known length is over with its last byte; the server will not poll
                // again to see the end, so the end is taken now.
                if this.inner.is_end_stream() && !this.sse {
                    this.complete();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(_))) => this.fail("stream"),
            Poll::Ready(None) => {
                if this.sse && this.status == 200 && !this.tail.ends_with_done() {
                    return this.fail("stream");
                }
                this.complete();
                Poll::Ready(None)
            }
            Poll::Pending => match this.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => this.fail("timeout"),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.state == State::Done
    }

    fn size_hint(&self) -> SizeHint {
        if self.sse {
            // An error event may be appended.
            SizeHint::default()
        } else {
            self.inner.size_hint()
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if self.state != State::Done {
            // The client went away mid-response. Dropping `inner` closes the upstream connection.
            self.finish(true, false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_sees_done_across_chunk_boundaries() {
        let mut t = Tail::default();
        t.push(b"data: {\"x\":1}\n\ndata: [DO");
        assert!(!t.ends_with_done());
        t.push(b"NE]\n\n");
        assert!(t.ends_with_done());
        t.push(b"data: {\"late\":true}\n\n");
        assert!(!t.ends_with_done());
        let mut long = Tail::default();
        long.push(&[b'x'; 100]);
        long.push(b"data: [DONE]\r\n\r\n");
        assert!(long.ends_with_done());
    }

    #[test]
    fn at_capacity_and_client_errors_do_not_count_against_a_worker() {
        assert_eq!(outcome_of(200), Outcome::Success);
        assert_eq!(outcome_of(400), Outcome::Success);
        assert_eq!(outcome_of(429), Outcome::Success);
        assert_eq!(outcome_of(529), Outcome::Success);
        assert_eq!(outcome_of(500), Outcome::Failure);
        assert_eq!(outcome_of(503), Outcome::Failure);
    }
}
