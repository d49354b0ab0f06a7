//! What every answer the gateway makes on its own has in common, and how it is written.
//!
//! Each stage refuses in its own type (`http::RequestError`, `admit::AdmitError`,
//! `route::RouteError`, `forward::ForwardError`, `stream::StreamError`, `admin::AdminError`);
//! each says, through `Answerable`, its HTTP status, its machine code (the `code` of the OpenAI
//! error object and the `X-Sluice-Error-Code` header), the `param` it is about, whether a
//! `Retry-After` makes sense, and where it came from (the client, a worker, or the gateway) — the
//! facts a client, a dashboard and the retry logic need. The OpenAI error object is written here,
//! once, for the edge that answers (`respond`, `sse_event`). Messages name workers by id, never
//! by URL.

use std::time::Duration;

use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Serialize;

/// The header that marks an answer as this gateway's decision. Stripped from worker responses.
pub const ERROR_CODE_HEADER: HeaderName = HeaderName::from_static("x-sluice-error-code");

/// How long a client should wait after `no_available_workers` before trying again: about one
/// registration retry, after which an unreachable worker may have come up.
pub(crate) const NO_WORKERS_RETRY_AFTER: Duration = Duration::from_secs(5);

/// The most of a client's own string (a model name) that an answer or a log line repeats.
pub(crate) const REFLECTED_MAX: usize = 256;

/// `s` as an answer or a log may repeat it: at most `REFLECTED_MAX` bytes (cut at a character
/// boundary, marked with `...`), so a client cannot make the gateway echo megabytes.
pub(crate) fn reflected(s: &str) -> String {
    if s.len() <= REFLECTED_MAX {
        return s.to_string();
    }
    let mut end = REFLECTED_MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

/// Who caused an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// The client sent something wrong.
    Client,
    /// A worker failed or could not be reached.
    Upstream,
    /// The gateway refused on its own account (no worker, shutting down).
    Gateway,
}

/// What a refusal tells the client, whichever stage made it.
pub trait Answerable: std::error::Error {
    /// The HTTP status `sluice serve` answers with. An overload refusal's is the operator's
    /// (`--overload-status-code`): the edge puts it in place of this one (`is_overload`).
    fn status(&self) -> StatusCode;
    /// The machine-readable code.
    fn code(&self) -> &'static str;
    /// Who caused it.
    fn origin(&self) -> Origin;
    /// The request field it is about, when there is one.
    fn param(&self) -> Option<&str> {
        None
    }
    /// How long a client should wait before trying again, where trying again can help.
    fn retry_after(&self) -> Option<Duration> {
        None
    }
    /// A refusal because the fleet or the request's tier or tenant is at its limit (the queue,
    /// CoDel, the ladder, overload shedding, budgets): what a Gateway API data plane expects as
    /// 429 from an endpoint picker, whatever status `sluice serve` gives it.
    fn is_shed(&self) -> bool {
        false
    }
    /// Every worker the request could use is overloaded (`--worker-overload-shed`).
    fn is_overload(&self) -> bool {
        false
    }
}

/// The request's time ran out: the client's deadline or the gateway's request timeout. Any stage
/// from admission to the end of the stream may find it so.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum Expired {
    /// `X-Request-Deadline-Ms` passed, or cannot be met.
    #[error("The request's deadline of {budget:?} cannot be met")]
    DeadlineExceeded { budget: Duration },
    /// The gateway's own deadline (`--request-timeout-secs`) ended a response that had started.
    #[error("The response was cut at the gateway's request timeout of {timeout:?}")]
    RequestTimeout { timeout: Duration },
}

impl Answerable for Expired {
    fn status(&self) -> StatusCode {
        StatusCode::GATEWAY_TIMEOUT
    }

    fn code(&self) -> &'static str {
        match self {
            Expired::DeadlineExceeded { .. } => "deadline_exceeded",
            Expired::RequestTimeout { .. } => "request_timeout",
        }
    }

    fn origin(&self) -> Origin {
        Origin::Gateway
    }
}

/// The OpenAI error `type` of an answer with `status`.
fn kind(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        400..=499 => "invalid_request_error",
        _ => "server_error",
    }
}

/// The OpenAI error object for `error`.
pub fn body(error: &dyn Answerable) -> Bytes {
    #[derive(Serialize)]
    struct Inner<'a> {
        message: String,
        #[serde(rename = "type")]
        kind: &'a str,
        param: Option<&'a str>,
        code: &'a str,
    }
    #[derive(Serialize)]
    struct Outer<'a> {
        error: Inner<'a>,
    }
    let outer = Outer {
        error: Inner {
            message: error.to_string(),
            kind: kind(error.status()),
            param: error.param(),
            code: error.code(),
        },
    };
    Bytes::from(serde_json::to_vec(&outer).unwrap_or_default())
}

/// The same object as one SSE event, for an error after a stream has started.
pub(crate) fn sse_event(error: &dyn Answerable) -> Bytes {
    let body = body(error);
    let mut event = Vec::with_capacity(body.len() + 8);
    event.extend_from_slice(b"data: ");
    event.extend_from_slice(&body);
    event.extend_from_slice(b"\n\n");
    Bytes::from(event)
}

/// The answer to a request `error` refused, with `status`: the OpenAI error object, its code in
/// `X-Sluice-Error-Code`, and `Retry-After` where waiting helps.
pub(crate) fn respond(error: &dyn Answerable, status: StatusCode) -> Response {
    let mut response = (status, body(error)).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(ERROR_CODE_HEADER, HeaderValue::from_static(error.code()));
    if let Some(wait) = error.retry_after() {
        // Whole seconds, rounded up: a client that waits as told finds room.
        let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        headers.insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
    }
    response
}

/// Answers with the error itself, at its own status: for the types no overload refusal is ever
/// made of (an overload's status is the edge's to set, `front::Answers`).
macro_rules! answered_as_is {
    ($($ty:ty),+) => {$(
        impl axum::response::IntoResponse for $ty {
            fn into_response(self) -> axum::response::Response {
                let status = $crate::error::Answerable::status(&self);
                $crate::error::respond(&self, status)
            }
        }
    )+};
}
pub(crate) use answered_as_is;

answered_as_is!(Expired);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_reflected_is_capped_at_a_character_boundary() {
        assert_eq!(reflected("m"), "m");
        let long = "é".repeat(1000);
        let cut = reflected(&long);
        assert!(cut.len() <= REFLECTED_MAX + 3, "{}", cut.len());
        assert!(cut.ends_with("..."));
        assert!(cut.starts_with("éé"));
    }

    #[test]
    fn sse_events_are_one_data_line() {
        let event = sse_event(&Expired::RequestTimeout {
            timeout: Duration::from_secs(1),
        });
        assert!(event.starts_with(b"data: {\"error\":"));
        assert!(event.ends_with(b"}\n\n"));
    }

    #[test]
    fn retry_after_is_whole_seconds_rounded_up() {
        #[derive(Debug, thiserror::Error)]
        #[error("full")]
        struct Full;
        impl Answerable for Full {
            fn status(&self) -> StatusCode {
                StatusCode::SERVICE_UNAVAILABLE
            }
            fn code(&self) -> &'static str {
                "queue_full"
            }
            fn origin(&self) -> Origin {
                Origin::Gateway
            }
            fn retry_after(&self) -> Option<Duration> {
                Some(Duration::from_millis(1500))
            }
        }
        let r = respond(&Full, StatusCode::from_u16(529).unwrap());
        assert_eq!(r.status(), 529);
        assert_eq!(r.headers()[&ERROR_CODE_HEADER], "queue_full");
        assert_eq!(r.headers()[header::RETRY_AFTER], "2");
        let v: serde_json::Value = serde_json::from_slice(&body(&Full)).unwrap();
        assert_eq!(v["error"]["type"], "server_error");
    }
}
