//! Reading a request body whole, within a limit — and throwing away one that is refused.
//!
//! Bodies read whole are held in memory until the request has been sent on, so many large ones
//! at once could take the gateway's memory anywhere: the bytes held at once are bounded by a
//! budget (`--max-buffered-body-bytes`), taken as they arrive and given back with the body. Past
//! it a request is refused with 503 and `Retry-After` at once, rather than waiting or growing.
//!
//! Why throw it away rather than just close: a client that writes its whole body before reading
//! (Python's http.client, requests, urllib3, most simple clients) is still writing when an early
//! refusal (a 413 on the declared length, a 401, a 415) is decided. Closing a connection with
//! unread bytes makes the kernel reset it, and that client sees a broken pipe instead of the
//! answer. So the rest of a refused body is read and dropped first, bounded in time like nginx's
//! lingering close, and then the refusal is sent.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap};
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

use super::RequestError;

/// A body read whole, holding its share of the buffer budget until it is dropped.
#[derive(Debug)]
pub struct Buffered<'a> {
    pub(crate) bytes: Bytes,
    _held: Option<SemaphorePermit<'a>>,
}

/// Takes `n` more bytes of `budget` into `held`, or refuses: no waiting.
fn take<'a>(
    budget: Option<&'a Semaphore>,
    held: &mut Option<SemaphorePermit<'a>>,
    n: usize,
) -> Result<(), RequestError> {
    let Some(budget) = budget else {
        return Ok(());
    };
    let n = u32::try_from(n).map_err(|_| RequestError::BodyBuffersFull)?;
    let permit = budget
        .try_acquire_many(n)
        .map_err(|_| RequestError::BodyBuffersFull)?;
    match held {
        Some(all) => all.merge(permit),
        None => *held = Some(permit),
    }
    Ok(())
}

/// The longest a refused body is read for before the connection is given up.
const DISCARD_FOR: Duration = Duration::from_secs(5);
/// The longest a refused body may pause while it is read and dropped.
const DISCARD_IDLE: Duration = Duration::from_secs(1);

/// The body's declared length, when it declares one.
pub fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
}

/// How a body is read: its size limit, the time it may take, and the budget it counts in.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits<'a> {
    pub(crate) max_bytes: usize,
    pub(crate) within: Duration,
    pub(crate) budget: Option<&'a Semaphore>,
}

/// Reads the whole body within `limits.within`, refusing one over `limits.max_bytes` whether it
/// declares its length or is chunked, and one that does not fit what is left of the budget (when
/// there is one). On a refusal the body is left unread past that point, for `discard`.
pub async fn read_body<'a>(
    body: &mut Body,
    headers: &HeaderMap,
    limits: BodyLimits<'a>,
) -> Result<Buffered<'a>, RequestError> {
    let within = limits.within;
    tokio::time::timeout(
        within,
        read_within(body, headers, limits.max_bytes, limits.budget),
    )
    .await
    .map_err(|_| RequestError::BodyReadTimeout { timeout: within })?
}

async fn read_within<'a>(
    body: &mut Body,
    headers: &HeaderMap,
    limit: usize,
    budget: Option<&'a Semaphore>,
) -> Result<Buffered<'a>, RequestError> {
    let declared = declared_length(headers);
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(RequestError::PayloadTooLarge { limit });
    }
    let mut held = None;
    // A declared length is taken whole at once: refused before a byte is read.
    let mut taken = declared.map_or(0, |n| n as usize);
    take(budget, &mut held, taken)?;
    let mut first: Option<Bytes> = None;
    let mut more: Option<BytesMut> = None;
    let mut total = 0usize;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(|_| RequestError::BodyUnreadable)?.into_data() else {
            continue; // trailers
        };
        total += data.len();
        if total > limit {
            return Err(RequestError::PayloadTooLarge { limit });
        }
        if total > taken {
            take(budget, &mut held, total - taken)?;
            taken = total;
        }
        match (&mut first, &mut more) {
            (None, _) => first = Some(data),
            (Some(head), None) => {
                let mut joined = BytesMut::with_capacity(total);
                joined.extend_from_slice(head);
                joined.extend_from_slice(&data);
                more = Some(joined);
            }
            (Some(_), Some(joined)) => joined.extend_from_slice(&data),
        }
    }
    let bytes = match (more, first) {
        (Some(joined), _) => joined.freeze(),
        (None, Some(only)) => only,
        (None, None) => Bytes::new(),
    };
    Ok(Buffered { bytes, _held: held })
}

/// Reads what is left of a refused body and drops it: until its end, for at most `DISCARD_FOR`,
/// and while it pauses no longer than `DISCARD_IDLE` at a time.
pub async fn discard(mut body: Body) {
    let until = Instant::now() + DISCARD_FOR;
    loop {
        let next = (Instant::now() + DISCARD_IDLE).min(until);
        match tokio::time::timeout_at(next, body.frame()).await {
            Ok(Some(Ok(_))) => {}
            Ok(None | Some(Err(_))) | Err(_) => return,
        }
    }
}
