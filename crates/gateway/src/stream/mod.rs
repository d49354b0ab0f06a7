//! The stream-back stage: a worker's response body relayed to the client frame by frame.
//!
//! `Relay` wraps the upstream body. It buffers nothing: each frame is passed on the moment it
//! arrives, and its arrival is timed (time to first byte, gaps between chunks: the worker's
//! progress as the gateway sees it). It holds the request's `Lease` until the end, so the
//! worker's in-flight count and its breaker permit live exactly as long as the response.
//!
//! What the forward stage read ahead of the head (`ahead`: an event stream's first event, a
//! 503's body) is passed on first, as it came.
//!
//! Four endings:
//! - the worker finishes: the outcome is settled in the breaker by the one rule
//!   (`Outcome::of_answer`: a 5xx is a failure, an engine's at-capacity refusal is not counted);
//! - the worker finishes an event stream after an error event (engines send one, then `[DONE]`,
//!   when a stream fails): relayed as it came, and a failed answer — charged to the worker when
//!   the engine was at fault, not when it blamed the request, kept off it briefly when its queue
//!   was full (`sluice_core::engine_error`);
//! - the worker fails mid-body (connection reset, or an event stream whose last event is not
//!   `[DONE]`, read by a real SSE parser): an SSE client gets one error event in the OpenAI shape
//!   and the stream ends *without* `[DONE]`, so no client can take it for a normal end; other
//!   bodies are cut, so the client sees a truncated response rather than a complete-looking one.
//!   The request's own deadline passing mid-body ends it the same way, named `request_timeout`;
//!
//! - the client goes away: the relay is dropped, which drops the upstream body and closes its
//!   connection — the engine aborts the request and frees its KV cache. The request's context
//!   goes with it and counts a cancellation.
//!
//! An event stream goes to the client chunked, whatever length the worker declared: its end is
//! read from the stream, and an error event may follow.
//!
//! For a tenant whose token budget is settled at the end, the relay also reads what the response
//! used (`meter`), and hands it to the context before the context ends.
//!
//! On a worker under an adaptive concurrency limit, a successful answer is a latency sample
//! (`fleet::AdaptiveLimit`): a stream's time to its first event and the gaps between its events
//! (events read together share their gap), a whole body's time over its completion tokens.

mod meter;
mod refusal;

pub(crate) use refusal::StreamError;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body as AxumBody;
use axum::http::{header, Response, Version};
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use sluice_core::admission::Tier;
use sluice_core::breaker::Outcome;
use sluice_core::engine_error::{error_event, ErrorClass, ErrorEvent};
use sluice_core::slo::Served;
use sluice_core::sse::{Oversized, SseParser};
use tokio::time::{Instant, Sleep};

use crate::admit::Terms;
use crate::context::RequestContext;
use crate::error::Expired;

use crate::fleet::{Lease, AT_CAPACITY_VETO};
use crate::forward::Answer;
use crate::http::{clean_response_headers, is_event_stream, OnWake};
use crate::upstream::UpstreamBody;
use meter::Meter;

/// The client's response: the worker's head, cleaned, and its body relayed. The request's
/// context goes with the body and ends with it.
pub(crate) fn relay(answer: Answer, mut ctx: RequestContext) -> Response<AxumBody> {
    let Answer {
        response,
        lease,
        sent_at,
        ahead,
        terms,
    } = answer;
    let (mut parts, body) = response.into_parts();
    let status = parts.status.as_u16();
    clean_response_headers(&mut parts.headers);
    parts.version = Version::HTTP_11;
    let sse = is_event_stream(&parts.headers);
    if sse {
        // An error event may be appended, and a stream's end must be read, not assumed at a
        // declared length: sent chunked.
        parts.headers.remove(header::CONTENT_LENGTH);
    }
    ctx.respond(status);
    let mut relay = Relay::new(body, lease, status, sse, sent_at, terms, ctx);
    relay.at_capacity = ahead.at_capacity;
    relay.ahead = Some(ahead.bytes).filter(|b| !b.is_empty());
    Response::from_parts(parts, AxumBody::new(relay))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Relaying,
    Done,
}

/// Whether an event stream ended as a finished OpenAI stream does: its last event's data is
/// `[DONE]`, however the event was spelled or cut (see `sluice_core::sse`) — and whether an
/// error event came before it, which engines send before `[DONE]` when a stream fails.
#[derive(Debug, Default)]
struct EndOfStream {
    parser: SseParser,
    done: bool,
    /// The first error event, if any.
    error: Option<ErrorEvent>,
}

impl EndOfStream {
    /// Reads `chunk`'s events; `meter`, when the response is metered, sees each one. Returns
    /// the events that completed in it, `[DONE]` and error events aside: the tokens it carried.
    /// `Oversized`: a line or an event past the parser's cap, and the stream is read no further.
    fn feed(&mut self, chunk: &[u8], mut meter: Option<&mut Meter>) -> Result<u64, Oversized> {
        let (done, error) = (&mut self.done, &mut self.error);
        let mut tokens = 0;
        self.parser.feed(chunk, |event| {
            *done = event.data == b"[DONE]";
            let failed = if *done { None } else { error_event(event.data) };
            if let Some(e) = failed {
                error.get_or_insert(e);
            }
            tokens += u64::from(!*done && failed.is_none());
            if let Some(meter) = meter.as_deref_mut() {
                meter.event(event.data);
            }
        })?;
        Ok(tokens)
    }

    /// The stream ended: whether its last event was `[DONE]`.
    fn finished(&mut self, mut meter: Option<&mut Meter>) -> Result<bool, Oversized> {
        let done = &mut self.done;
        self.parser.finish(|event| {
            *done = event.data == b"[DONE]";
            if let Some(meter) = meter.as_deref_mut() {
                meter.event(event.data);
            }
        })?;
        Ok(self.done)
    }
}

/// A worker's response body on its way to the client.
struct Relay {
    /// The worker's body, read frame by frame as the client takes them.
    inner: UpstreamBody,
    /// Read by the forward stage before the head went out: passed on first.
    ahead: Option<Bytes>,
    /// The answer is the engine saying it is full: not charged to its circuit.
    at_capacity: bool,
    /// The request's hold on its worker: settled with the stream's outcome, released at its end.
    lease: Lease,
    /// The worker's status, judged with how the body ended (`Outcome::of_answer`).
    status: u16,
    /// An event stream: its events are counted, timed and read for an in-band error or `[DONE]`.
    sse: bool,
    /// When the request went to the worker: time to first token counts from here.
    sent_at: Instant,
    /// The first frame's time: the worker's time to first token, and the SLO's.
    first_chunk: Option<Instant>,
    /// The latest frame's time: gaps between tokens are measured from it.
    last_chunk: Option<Instant>,
    /// Token events of an event stream so far.
    tokens: u64,
    /// Read only for event streams.
    end: EndOfStream,
    /// What the response used, when its tenant's tokens are settled at the end or its length
    /// is measured.
    meter: Option<Box<Meter>>,
    /// Its latencies are samples for the worker's adaptive limit.
    measured: bool,
    /// Relaying, or done: so an ending is accounted for once.
    state: State,
    /// Admission's terms: the deadline and whose it is, the tier the SLO is judged in.
    terms: Terms,
    /// The request's deadline, which covers the whole stream; polled when it passes, not after
    /// every frame.
    deadline: OnWake<Pin<Box<Sleep>>>,
    /// Dropped at the end of the response (which accounts for it), or with the relay when the
    /// client leaves.
    ctx: Option<RequestContext>,
}

impl Relay {
    fn new(
        inner: UpstreamBody,
        lease: Lease,
        status: u16,
        sse: bool,
        sent_at: Instant,
        terms: Terms,
        ctx: RequestContext,
    ) -> Self {
        let deadline = terms.deadline;
        // A worker under an adaptive limit is measured on its successful answers; a whole body
        // is read for its token count.
        let measured = status == 200 && lease.worker().adaptive.measuring();
        // A traced request's span says what it used too.
        let meter = (terms.metered || (measured && !sse) || ctx.traced())
            .then(|| Box::new(Meter::new(sse)));
        Self {
            inner,
            ahead: None,
            at_capacity: false,
            lease,
            status,
            sse,
            sent_at,
            first_chunk: None,
            last_chunk: None,
            tokens: 0,
            end: EndOfStream::default(),
            meter,
            measured,
            state: State::Relaying,
            terms,
            deadline: OnWake::new(Box::pin(tokio::time::sleep_until(deadline))),
            ctx: Some(ctx),
        }
    }

    /// Times and reads a chunk from the worker before it is passed on; `Oversized` when it
    /// carries an event-stream line or event past the cap, and then it is not passed on.
    fn observe(&mut self, data: &Bytes) -> Result<(), Oversized> {
        let now = Instant::now();
        if self.sse {
            // Progress, below, only for a token.
            self.lease.worker().signals.contact(now);
        }
        let previous = self.last_chunk.replace(now);
        match previous {
            None => {
                self.first_chunk = Some(now);
                if let (200, Some(ctx)) = (self.status, &self.ctx) {
                    let (tier, ttft) = (self.terms.tier, now - ctx.started);
                    let slo = &ctx.metrics().slo;
                    slo.first_byte(tier, ttft);
                    if tier == Tier::Interactive {
                        self.lease.worker().signals.interactive_answered(now);
                    }
                }
                let ttft = now - self.sent_at;
                self.lease.worker().metrics.ttft.observe(ttft.as_secs_f64());
                self.lease.first_byte_after(ttft);
                if self.sse && self.measured {
                    self.lease.worker().adaptive.first_token(ttft);
                }
            }
            Some(last) => {
                let gap = (now - last).as_secs_f64();
                self.lease.worker().metrics.inter_chunk.observe(gap);
            }
        }
        if let Some(ctx) = &mut self.ctx {
            ctx.relayed(data.len());
        }
        if self.sse {
            let tokens = self.end.feed(data, self.meter.as_deref_mut())?;
            if tokens > 0 {
                // Progress is a token: an error event, or a chunk of one, is not.
                self.lease.worker().signals.progress(now);
            }
            self.tokens += tokens;
            if let (true, Some(last), 1..) = (self.measured, previous, tokens) {
                // Events read together arrived, on average, evenly across the gap.
                let gap = (now - last) / u32::try_from(tokens).unwrap_or(u32::MAX);
                self.lease.worker().adaptive.token_gaps(gap, tokens);
            }
        } else {
            self.lease.worker().signals.progress(now);
            if let Some(meter) = &mut self.meter {
                meter.body(data);
            }
        }
        Ok(())
    }

    /// A whole body's time over its tokens, for the worker's adaptive limit.
    fn measure_whole(&self, usage: Option<crate::context::Usage>) {
        if let (true, false, Some(usage)) = (self.measured, self.sse, usage) {
            self.lease
                .worker()
                .adaptive
                .whole_response(self.sent_at.elapsed(), usage.completion);
        }
    }

    /// Gives the context what the response used, once, before it ends; returns it.
    fn read_meter(&mut self) -> Option<crate::context::Usage> {
        let (Some(mut meter), Some(ctx)) = (self.meter.take(), self.ctx.as_mut()) else {
            return None;
        };
        let (usage, chunks) = meter.read();
        ctx.metered(usage, chunks);
        usage
    }

    /// The response is over: its context ends now (the lease stays until the relay goes).
    fn finish(&mut self, interrupted: bool) {
        let usage = self.read_meter();
        if !interrupted {
            self.measure_whole(usage);
        }
        if let Some(mut ctx) = self.ctx.take() {
            ctx.end(interrupted);
        }
    }

    /// A successful answer completed: judged against its tier's objectives.
    fn judge(&self) {
        let (200, Some(ctx), Some(first), Some(last)) =
            (self.status, &self.ctx, self.first_chunk, self.last_chunk)
        else {
            return;
        };
        let served = Served {
            ttft: first - ctx.started,
            total: last - ctx.started,
            tokens: self.sse.then_some(self.tokens),
        };
        ctx.metrics().slo.completed(self.terms.tier, &served);
        if let (true, 2..) = (self.sse, self.tokens) {
            let gaps = u32::try_from(self.tokens - 1).unwrap_or(u32::MAX);
            self.lease.paced((last - first) / gaps);
        }
    }

    /// The worker finished the response.
    fn complete(&mut self) {
        if let Some(error) = self.end.error {
            return self.failed_by_event(error);
        }
        // A full engine's refusal goes back unrecorded (the forward stage kept it off).
        if let Some(outcome) = Outcome::of_answer(self.status, self.at_capacity) {
            self.lease.settle(outcome);
        }
        self.judge();
        self.finish(false);
        self.state = State::Done;
    }

    /// The stream ended, but after an error event (relayed to the client as it came): a failed
    /// answer — not a completion for its tier's objectives, its latency not a sample — charged to
    /// the worker only when the engine, not the client, was at fault, and a full engine's
    /// refusal kept off it for a moment instead.
    fn failed_by_event(&mut self, error: ErrorEvent) {
        let worker = self.lease.worker().clone();
        match error.class {
            ErrorClass::Engine => {
                self.lease.settle(Outcome::Failure);
                self.count_upstream_error("error_event");
            }
            ErrorClass::Client => self.lease.settle(Outcome::Success),
            // Its permit goes back unrecorded.
            ErrorClass::AtCapacity => worker.vetoes.at_capacity_for(AT_CAPACITY_VETO),
        }
        if let Some(ctx) = &mut self.ctx {
            ctx.error_event(error.class);
        }
        self.finish(true);
        self.state = State::Done;
    }

    /// The worker failed mid-body: settle, count, and tell the client.
    fn fail(&mut self, kind: &'static str) -> Poll<Option<Result<Frame<Bytes>, StreamError>>> {
        let worker = self.lease.worker().id.clone();
        let error = StreamError::StreamInterrupted { worker };
        self.charge(kind, error, false)
    }

    /// The worker's event stream held a line or an event past the parser's cap: a failure of
    /// the worker, and the chunk that carried it is not passed on.
    fn too_large(&mut self, e: Oversized) -> Poll<Option<Result<Frame<Bytes>, StreamError>>> {
        let error = StreamError::StreamEventTooLarge {
            worker: self.lease.worker().id.clone(),
            what: e.what,
            limit: e.limit,
        };
        self.charge("event_too_large", error, true)
    }

    /// Settles a failure of the worker, counts it as `kind`, and ends the response with `error`
    /// (`mid_event`: the client may hold part of an event, ended before the error's).
    fn charge(
        &mut self,
        kind: &'static str,
        error: StreamError,
        mid_event: bool,
    ) -> Poll<Option<Result<Frame<Bytes>, StreamError>>> {
        self.lease.settle(Outcome::Failure);
        self.count_upstream_error(kind);
        self.interrupt(error, mid_event)
    }

    fn count_upstream_error(&self, kind: &'static str) {
        if let Some(ctx) = &self.ctx {
            ctx.metrics()
                .upstream_error(self.lease.worker().id.as_str(), kind);
        }
    }

    /// The request's deadline passed mid-body: the gateway ends the response, not the worker, so
    /// the worker's circuit is not charged (its permit goes back unrecorded); a worker that
    /// stopped sending is the liveness checker's to judge.
    fn cut_at_deadline(&mut self) -> Poll<Option<Result<Frame<Bytes>, StreamError>>> {
        let timeout = self
            .ctx
            .as_ref()
            .map(|ctx| self.terms.allowed(ctx.started))
            .unwrap_or_default();
        if self.terms.cut_by_client() {
            // The client's own deadline: nobody's failure, and named as the client asked.
            return self.interrupt(Expired::DeadlineExceeded { budget: timeout }.into(), false);
        }
        self.count_upstream_error("timeout");
        self.interrupt(Expired::RequestTimeout { timeout }.into(), false)
    }

    /// Ends the response early with `error`: one error event for an SSE client (and no
    /// `[DONE]`), a cut body for others. `mid_event`: the client may hold part of a line or an
    /// event, so a blank line ends it first and the error is an event of its own.
    fn interrupt(
        &mut self,
        error: StreamError,
        mid_event: bool,
    ) -> Poll<Option<Result<Frame<Bytes>, StreamError>>> {
        self.finish(true);
        self.state = State::Done;
        if !self.sse {
            return Poll::Ready(Some(Err(error)));
        }
        let event = crate::error::sse_event(&error);
        if !mid_event {
            return Poll::Ready(Some(Ok(Frame::data(event))));
        }
        let mut ended = Vec::with_capacity(event.len() + 2);
        ended.extend_from_slice(b"\n\n");
        ended.extend_from_slice(&event);
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(ended)))))
    }
}

impl Drop for Relay {
    /// The client left: what was generated until then is what the request used. A stream it
    /// left while owed its next token leaves the worker's silence running from its last token,
    /// as a request that ended without a byte does.
    fn drop(&mut self) {
        let _ = self.read_meter();
        if self.state != State::Done && self.sse {
            if let Some(last) = self.last_chunk {
                self.lease.stream_left(last);
            }
        }
    }
}

impl Body for Relay {
    type Data = Bytes;
    type Error = StreamError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, StreamError>>> {
        let this = &mut *self;
        if this.state == State::Done {
            return Poll::Ready(None);
        }
        if let Some(data) = this.ahead.take() {
            if let Err(e) = this.observe(&data) {
                return this.too_large(e);
            }
            if this.inner.is_end_stream() && !this.sse {
                this.complete();
            }
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(Err(e)) = frame.data_ref().map(|data| this.observe(data)) {
                    return this.too_large(e);
                }
                // A body of known length is over with its last byte; the server will not poll
                // again to see the end, so the end is taken now.
                if this.inner.is_end_stream() && !this.sse {
                    this.complete();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) if e.is_bad_answer() => this.fail("bad_answer"),
            Poll::Ready(Some(Err(_))) => this.fail("stream"),
            Poll::Ready(None) => {
                if this.sse && this.status == 200 {
                    match this.end.finished(this.meter.as_deref_mut()) {
                        Ok(true) => {}
                        Ok(false) => return this.fail("stream"),
                        Err(e) => return this.too_large(e),
                    }
                }
                this.complete();
                Poll::Ready(None)
            }
            Poll::Pending => match Pin::new(&mut this.deadline).poll(cx) {
                Poll::Ready(()) => this.cut_at_deadline(),
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
            return SizeHint::default();
        }
        // What was read ahead is still to come, before the rest (the head's declared length
        // counts both).
        let inner = self.inner.size_hint();
        let ahead = self.ahead.as_ref().map_or(0, |b| b.len() as u64);
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + ahead);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + ahead);
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_end_is_read_from_the_last_event() {
        let mut end = EndOfStream::default();
        end.feed(b"data: {\"x\":1}\n\ndata:[DO", None).unwrap();
        end.feed(b"NE]\r\n\r\n", None).unwrap();
        assert_eq!(end.finished(None), Ok(true), "no space, CRLF, cut mid-word");
        let mut late = EndOfStream::default();
        late.feed(b"data: [DONE]\n\ndata: {\"late\":true}\n\n", None)
            .unwrap();
        assert_eq!(late.finished(None), Ok(false), "an event after [DONE]");
        let mut quoted = EndOfStream::default();
        quoted
            .feed(b"data: {\"text\":\"data: [DONE]\"}\n\n", None)
            .unwrap();
        assert_eq!(
            quoted.finished(None),
            Ok(false),
            "[DONE] inside another event's data"
        );
    }
}
