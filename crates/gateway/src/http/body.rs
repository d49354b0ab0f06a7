//! Reading a request body whole, within a limit — and throwing away one that is refused.
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
use tokio::time::Instant;

use crate::error::GatewayError;

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

/// Reads the whole body, refusing one over `limit` bytes whether it declares its length or is
/// chunked. On a refusal the body is left unread past that point, for `discard`.
pub async fn read_body(
    body: &mut Body,
    headers: &HeaderMap,
    limit: usize,
) -> Result<Bytes, GatewayError> {
    if declared_length(headers).is_some_and(|n| n > limit as u64) {
        return Err(GatewayError::PayloadTooLarge { limit });
    }
    let mut first: Option<Bytes> = None;
    let mut more: Option<BytesMut> = None;
    let mut total = 0usize;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(|_| GatewayError::BodyUnreadable)?.into_data() else {
            continue; // trailers
        };
        total += data.len();
        if total > limit {
            return Err(GatewayError::PayloadTooLarge { limit });
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
    Ok(match (more, first) {
        (Some(joined), _) => joined.freeze(),
        (None, Some(only)) => only,
        (None, None) => Bytes::new(),
    })
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
