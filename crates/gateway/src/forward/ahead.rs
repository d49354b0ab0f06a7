//! Reading a little of an answer before its head goes to the client, so that a refusal the engine
//! writes in the body can still be retried elsewhere.
//!
//! vLLM and SGLang send a stream's head at once and its first event after the prefill; an engine
//! that cannot take the request says so in that first event (SGLang's full queue), and one that
//! failed early sends an error event there. So for an event stream the head is held until the
//! first event arrives — the client's time to first token does not change, it was waiting for
//! that event anyway. A 503 is read whole (bounded) to tell SGLang's full queue, which is
//! backpressure, from an engine that is failing. What was read goes to the client first, as it
//! came (`Relay`).

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use sluice_core::engine_error::{self, ErrorEvent};
use sluice_core::sse::SseParser;
use tokio::time::Instant;

use crate::http::is_event_stream;
use crate::upstream::{ExchangeError, UpstreamResponse};

/// Bytes read ahead of the client: the most an event stream's first event, or a 503's body, may
/// take before the answer is passed on without a verdict.
const AHEAD_LIMIT: usize = 64 * 1024;

/// What was read of an answer's body before it went to the client.
#[derive(Debug, Default)]
pub(crate) struct Ahead {
    /// Sent to the client first.
    pub(crate) bytes: Bytes,
    /// The body ended within them.
    pub(crate) ended: bool,
    /// The first event, when it was an engine's error event.
    pub(crate) error: Option<ErrorEvent>,
    /// The answer is the engine saying it is full (a 429, a 529, SGLang's full-queue 503).
    pub(crate) at_capacity: bool,
}

/// Reads ahead of `response`'s head what its verdict needs: an event stream's first event, a
/// 503's body; nothing for any other answer. At `deadline` it stops with what it has, and no
/// verdict. The reading is boxed, only for the answers that need it: most answers need none,
/// and every request's future would otherwise carry its state.
pub(crate) async fn read_ahead(
    response: &mut UpstreamResponse,
    deadline: Instant,
) -> Result<Ahead, ExchangeError> {
    let status = response.status().as_u16();
    let first_event = status == 200 && is_event_stream(response.headers());
    if !first_event && status != 503 {
        return Ok(Ahead {
            at_capacity: engine_error::at_capacity(status, &[]),
            ..Ahead::default()
        });
    }
    Box::pin(read_body_ahead(response, first_event, deadline)).await
}

/// An event stream's first event (`first_event`), or a 503's body.
async fn read_body_ahead(
    response: &mut UpstreamResponse,
    first_event: bool,
    deadline: Instant,
) -> Result<Ahead, ExchangeError> {
    let status = response.status().as_u16();
    let mut ahead = Ahead::default();
    let mut read = BytesMut::new();
    let mut parser = SseParser::new();
    let mut events = 0;
    while read.len() < AHEAD_LIMIT && !(first_event && events > 0) {
        let Ok(next) = tokio::time::timeout_at(deadline, response.body_mut().frame()).await else {
            break;
        };
        let Some(frame) = next.transpose()? else {
            ahead.ended = true;
            break;
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if first_event {
            // What is read ahead is bounded by `AHEAD_LIMIT`, far under the parser's cap; a
            // stream past that cap is refused by the relay, which reads it on.
            let _within_cap = parser.feed(&data, |event| {
                if events == 0 {
                    ahead.error = engine_error::error_event(event.data);
                }
                events += 1;
            });
        }
        read.extend_from_slice(&data);
    }
    ahead.bytes = read.freeze();
    if status == 503 && ahead.ended {
        ahead.at_capacity = engine_error::at_capacity(status, &ahead.bytes);
    }
    if ahead
        .error
        .is_some_and(|e| e.class == engine_error::ErrorClass::AtCapacity)
    {
        ahead.at_capacity = true;
    }
    Ok(ahead)
}
