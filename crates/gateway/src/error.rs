//! Every answer the gateway makes on its own, in one place.
//!
//! Each error knows its HTTP status, its machine code (the `code` of the OpenAI error object and
//! the `X-Sluice-Error-Code` header), its OpenAI `type`, the `param` it is about, whether a
//! `Retry-After` makes sense, and where it came from (the client, a worker, or the gateway) — the
//! facts a client, a dashboard and the retry logic need. Messages name workers by id, never by URL.

use std::time::Duration;

use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Serialize;
use sluice_core::{ModelName, WorkerId};

/// The header that marks an answer as this gateway's decision. Stripped from worker responses.
pub const ERROR_CODE_HEADER: HeaderName = HeaderName::from_static("x-sluice-error-code");

/// How long a client should wait after `no_available_workers` before trying again: about one
/// registration retry, after which an unreachable worker may have come up.
const NO_WORKERS_RETRY_AFTER: Duration = Duration::from_secs(5);

/// The most of a client's own string (a model name) that an answer or a log line repeats.
pub const REFLECTED_MAX: usize = 256;

/// `s` as an answer or a log may repeat it: at most `REFLECTED_MAX` bytes (cut at a character
/// boundary, marked with `...`), so a client cannot make the gateway echo megabytes.
pub fn reflected(s: &str) -> String {
    if s.len() <= REFLECTED_MAX {
        return s.to_string();
    }
    let mut end = REFLECTED_MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

/// How long a client should wait after `request_buffers_full`.
const BODY_BUFFERS_RETRY_AFTER: Duration = Duration::from_secs(1);

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

/// A request the gateway answers itself.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum GatewayError {
    #[error("We could not parse the JSON body of your request: {detail}")]
    InvalidJson { detail: String },
    #[error("'{param}' must be {expected}")]
    InvalidType {
        param: &'static str,
        expected: &'static str,
    },
    #[error("The request body must be a JSON object")]
    BodyNotObject,
    /// A number over what this gateway accepts (`--max-n`, `--max-tokens-limit`).
    #[error("Invalid '{param}': integer above maximum value. Expected a value <= {max}, but got {got} instead.")]
    AboveMax {
        param: &'static str,
        max: u64,
        got: u64,
    },
    #[error("Invalid '{param}': integer below minimum value. Expected a value >= {min}, but got {got} instead.")]
    BelowMin {
        param: &'static str,
        min: u64,
        got: u64,
    },
    #[error("'{param}' is a required property")]
    MissingParameter { param: &'static str },
    /// A request a `grpc://` worker cannot take as it is (a field the token path cannot honour,
    /// a prompt the chat template refuses): the client's to change.
    #[error("{message}")]
    NotOnGrpc {
        param: Option<&'static str>,
        message: String,
    },
    /// A `grpc://` worker takes token ids and no tokenizer is loaded: none was named on the
    /// command line and no worker has served one yet.
    #[error("The model's tokenizer is not loaded: start the gateway with --model-path, or use workers that serve their tokenizer")]
    TokenizerUnavailable,
    #[error("'model' is required: this gateway serves {served} models")]
    ModelRequired { served: usize },
    #[error("The model '{model}' does not exist")]
    ModelNotFound { model: String },
    #[error("The request body is larger than the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("Content-Type must be application/json")]
    UnsupportedMediaType,
    /// A body compressed in a way the gateway does not decode (it must read the JSON to route).
    #[error("Content-Encoding '{encoding}' is not supported: send the body uncompressed")]
    UnsupportedContentEncoding { encoding: String },
    #[error("Could not read the request body")]
    BodyUnreadable,
    /// A multipart form that cannot be read.
    #[error("The form could not be read: {detail}")]
    InvalidForm { detail: String },
    /// `--body-read-timeout-secs`: the body stalled or dripped.
    #[error("The request body did not arrive within {timeout:?}")]
    BodyReadTimeout { timeout: Duration },
    /// `--max-buffered-body-bytes`: the request bodies held at once fill the gateway's budget.
    #[error("The gateway is holding as many request bodies as it may; retry shortly")]
    BodyBuffersFull,
    /// hyper could not parse the request head (see `http::shaped`).
    #[error("The request is not valid HTTP")]
    MalformedRequest,
    #[error("The request URL is longer than the limit of {limit} bytes")]
    UriTooLong { limit: usize },
    #[error("The request headers are larger than the limit of {fields} fields or {bytes} bytes")]
    HeadersTooLarge { fields: usize, bytes: usize },
    #[error("Unknown request URL: {method} {path}")]
    UnknownRoute { method: String, path: String },
    /// The router adds the `Allow` header.
    #[error("Method {method} is not allowed on {path}")]
    MethodNotAllowed { method: String, path: String },
    #[error("Invalid API key. Send it as 'Authorization: Bearer <key>'")]
    InvalidApiKey,
    #[error("Worker management is disabled: start the gateway with --admin-api-key to enable it")]
    AdminDisabled,
    #[error("Invalid admin key. Send it as 'Authorization: Bearer <admin key>'")]
    InvalidAdminKey,
    #[error("No worker is available for model '{model}'{detail}")]
    NoAvailableWorkers { model: ModelName, detail: String },
    /// `--worker-overload-shed`: every worker the request could use is overloaded.
    #[error("All workers for model '{model}' are overloaded")]
    WorkerOverloadShed {
        model: ModelName,
        status: u16,
        retry_after: Duration,
    },
    /// `--worker-overload-shed`: the chosen worker was flagged between selection and dispatch.
    #[error("Worker {worker} for model '{model}' became overloaded before dispatch")]
    OverloadedBeforeDispatch {
        worker: WorkerId,
        model: ModelName,
        status: u16,
        retry_after: Duration,
    },
    #[error("No worker for model '{model}' could be reached after {attempts} attempt(s)")]
    UpstreamUnreachable { model: ModelName, attempts: u32 },
    #[error("Worker {worker} failed before answering")]
    UpstreamFailed { worker: WorkerId },
    /// The worker's answer broke HTTP/1.1's framing or the client's bounds (`upstream::wire`'s
    /// limits): its details stay in the log, since the bytes are the worker's.
    #[error("Worker {worker} sent a malformed response")]
    UpstreamBadAnswer { worker: WorkerId },
    #[error("Worker {worker} did not answer within {timeout:?}")]
    UpstreamTimeout { worker: WorkerId, timeout: Duration },
    #[error("Worker {worker} failed in the middle of the response")]
    StreamInterrupted { worker: WorkerId },
    /// The worker's event stream held a line or an event past the gateway's cap
    /// (`sluice_core::sse::MAX_EVENT_BYTES`): not read on.
    #[error(
        "Worker {worker} sent an event-stream {what} over {limit} bytes; the response was cut"
    )]
    StreamEventTooLarge {
        worker: WorkerId,
        what: &'static str,
        limit: usize,
    },
    /// The gateway's own deadline (`--request-timeout-secs`) ended a response that had started.
    #[error("The response was cut at the gateway's request timeout of {timeout:?}")]
    RequestTimeout { timeout: Duration },
    #[error("The gateway is shutting down")]
    ShuttingDown,
    #[error("Invalid worker spec: {message}")]
    InvalidWorkerSpec { field: String, message: String },
    #[error(
        "A worker with URL {url} is already registered as {id}; change it with PUT /workers/{id}"
    )]
    WorkerExists { url: String, id: WorkerId },
    #[error("No worker with id '{id}'")]
    WorkerNotFound { id: String },
    /// A request header admission reads is malformed.
    #[error("Invalid header '{header}': {detail}")]
    InvalidHeader {
        header: &'static str,
        detail: String,
    },
    /// The tenant's requests or tokens per minute are spent for now.
    #[error("Rate limit reached for {what} per minute of tenant '{tenant}'; retry after {retry_after:?}")]
    RateLimited {
        tenant: String,
        what: &'static str,
        retry_after: Duration,
    },
    /// More tokens than the tenant's whole budget: it can never be admitted.
    #[error("Request too large for tenant '{tenant}': it may use {needs} tokens, more than its limit of {limit} tokens per minute; lower max_tokens or the prompt")]
    RequestTooLarge {
        tenant: String,
        needs: u64,
        limit: u64,
    },
    #[error("Tenant '{tenant}' has {limit} requests in flight, its limit")]
    TenantConcurrency { tenant: String, limit: u32 },
    /// `--max-concurrent-requests` or `--rate-limit-tokens-per-second`, with no room to wait.
    #[error("The gateway is at {why}; retry shortly")]
    GatewayFull {
        why: &'static str,
        retry_after: Duration,
    },
    /// The limits are shared through Redis, Redis is away, and `--redis-fail-open` is off.
    #[error("The gateway cannot check its shared limits right now; retry shortly")]
    SharedStateUnavailable,
    /// The gateway queue is full of requests at least as urgent.
    #[error("The gateway's queue is full; retry shortly")]
    QueueFull { retry_after: Duration },
    /// A more urgent request took this one's place in the queue.
    #[error(
        "The request was waiting in the gateway's queue and gave its place to a more urgent one"
    )]
    QueueEvicted { retry_after: Duration },
    /// Its tier's queue timeout passed before a worker had room.
    #[error("No worker had room within {waited:?} of waiting in the gateway's queue")]
    QueueTimeout {
        waited: Duration,
        retry_after: Duration,
    },
    /// CoDel is cutting its tier's standing queue: it was the head (it had waited longest), or
    /// it arrived expecting to wait past the tier's target.
    #[error("The gateway's queue for this request's tier has stood past its target; the request was refused to shorten it")]
    CodelDrop { retry_after: Duration },
    /// The degradation ladder's hard shedding refuses this tier at the level in force.
    #[error("The gateway is shedding {tier} requests under load; retry later")]
    DegradationShed {
        tier: &'static str,
        retry_after: Duration,
    },
    /// `X-Request-Deadline-Ms` passed, or cannot be met.
    #[error("The request's deadline of {budget:?} cannot be met")]
    DeadlineExceeded { budget: Duration },
}

impl GatewayError {
    pub fn status(&self) -> StatusCode {
        use GatewayError::*;
        match self {
            InvalidJson { .. }
            | InvalidType { .. }
            | AboveMax { .. }
            | BelowMin { .. }
            | BodyNotObject
            | InvalidForm { .. }
            | MissingParameter { .. }
            | NotOnGrpc { .. }
            | ModelRequired { .. }
            | BodyUnreadable
            | InvalidHeader { .. }
            | InvalidWorkerSpec { .. } => StatusCode::BAD_REQUEST,
            RateLimited { .. } | RequestTooLarge { .. } | TenantConcurrency { .. } => {
                StatusCode::TOO_MANY_REQUESTS
            }
            GatewayFull { .. }
            | SharedStateUnavailable
            | QueueFull { .. }
            | QueueEvicted { .. }
            | QueueTimeout { .. }
            | CodelDrop { .. }
            | DegradationShed { .. } => StatusCode::SERVICE_UNAVAILABLE,
            DeadlineExceeded { .. } => StatusCode::GATEWAY_TIMEOUT,
            InvalidApiKey | InvalidAdminKey => StatusCode::UNAUTHORIZED,
            AdminDisabled => StatusCode::FORBIDDEN,
            ModelNotFound { .. } | UnknownRoute { .. } | WorkerNotFound { .. } => {
                StatusCode::NOT_FOUND
            }
            MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            UriTooLong { .. } => StatusCode::URI_TOO_LONG,
            MalformedRequest => StatusCode::BAD_REQUEST,
            HeadersTooLarge { .. } => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            BodyReadTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            WorkerExists { .. } => StatusCode::CONFLICT,
            PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            UnsupportedMediaType | UnsupportedContentEncoding { .. } => {
                StatusCode::UNSUPPORTED_MEDIA_TYPE
            }
            NoAvailableWorkers { .. } | ShuttingDown | BodyBuffersFull | TokenizerUnavailable => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            UpstreamUnreachable { .. }
            | UpstreamFailed { .. }
            | UpstreamBadAnswer { .. }
            | StreamInterrupted { .. }
            | StreamEventTooLarge { .. } => StatusCode::BAD_GATEWAY,
            UpstreamTimeout { .. } | RequestTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            WorkerOverloadShed { status, .. } | OverloadedBeforeDispatch { status, .. } => {
                StatusCode::from_u16(*status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
            }
        }
    }

    /// The machine-readable code.
    pub fn code(&self) -> &'static str {
        use GatewayError::*;
        match self {
            InvalidJson { .. } => "invalid_json",
            InvalidType { .. } | BodyNotObject => "invalid_type",
            AboveMax { .. } => "integer_above_max_value",
            BelowMin { .. } => "integer_below_min_value",
            MissingParameter { .. } | ModelRequired { .. } => "missing_required_parameter",
            NotOnGrpc { param: Some(_), .. } => "unsupported_parameter",
            NotOnGrpc { param: None, .. } => "invalid_request",
            ModelNotFound { .. } => "model_not_found",
            PayloadTooLarge { .. } => "request_body_too_large",
            UnsupportedMediaType => "unsupported_media_type",
            UnsupportedContentEncoding { .. } => "unsupported_content_encoding",
            BodyUnreadable => "invalid_request_body",
            BodyReadTimeout { .. } => "body_read_timeout",
            InvalidForm { .. } => "invalid_form",
            BodyBuffersFull => "request_buffers_full",
            UnknownRoute { .. } => "unknown_url",
            UriTooLong { .. } => "uri_too_long",
            MalformedRequest => "invalid_request",
            HeadersTooLarge { .. } => "request_headers_too_large",
            MethodNotAllowed { .. } => "method_not_allowed",
            InvalidApiKey => "invalid_api_key",
            AdminDisabled => "admin_api_disabled",
            InvalidAdminKey => "invalid_admin_key",
            NoAvailableWorkers { .. } => "no_available_workers",
            WorkerOverloadShed { .. } | OverloadedBeforeDispatch { .. } => "worker_overload_shed",
            UpstreamUnreachable { .. } => "upstream_unreachable",
            UpstreamFailed { .. } => "upstream_failed",
            UpstreamBadAnswer { .. } => "upstream_bad_response",
            UpstreamTimeout { .. } => "upstream_timeout",
            StreamInterrupted { .. } => "upstream_stream_interrupted",
            StreamEventTooLarge { .. } => "upstream_event_too_large",
            RequestTimeout { .. } => "request_timeout",
            ShuttingDown => "shutting_down",
            TokenizerUnavailable => "tokenizer_unavailable",
            InvalidWorkerSpec { .. } => "invalid_worker_spec",
            WorkerExists { .. } => "worker_exists",
            WorkerNotFound { .. } => "worker_not_found",
            InvalidHeader { .. } => "invalid_header",
            RateLimited { .. } | RequestTooLarge { .. } => "rate_limit_exceeded",
            TenantConcurrency { .. } => "tenant_concurrency_exceeded",
            GatewayFull { .. } | QueueFull { .. } => "queue_full",
            SharedStateUnavailable => "shared_state_unavailable",
            QueueEvicted { .. } => "queue_evicted",
            QueueTimeout { .. } => "queue_timeout",
            CodelDrop { .. } => "codel_drop",
            DegradationShed { .. } => "degradation_shed",
            DeadlineExceeded { .. } => "deadline_exceeded",
        }
    }

    /// A refusal because the fleet or the request's tier or tenant is at its limit (the queue,
    /// CoDel, the ladder, overload shedding, budgets): what a Gateway API data plane expects as
    /// 429 from an endpoint picker, whatever status `sluice serve` gives it.
    pub fn is_shed(&self) -> bool {
        use GatewayError::*;
        matches!(
            self,
            WorkerOverloadShed { .. }
                | OverloadedBeforeDispatch { .. }
                | GatewayFull { .. }
                | QueueFull { .. }
                | QueueEvicted { .. }
                | QueueTimeout { .. }
                | CodelDrop { .. }
                | DegradationShed { .. }
                | RateLimited { .. }
                | RequestTooLarge { .. }
                | TenantConcurrency { .. }
        )
    }

    /// The OpenAI error `type`.
    pub fn kind(&self) -> &'static str {
        match self.status().as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            400..=499 => "invalid_request_error",
            _ => "server_error",
        }
    }

    pub fn param(&self) -> Option<&str> {
        use GatewayError::*;
        match self {
            InvalidType { param, .. }
            | MissingParameter { param }
            | AboveMax { param, .. }
            | BelowMin { param, .. } => Some(param),
            ModelRequired { .. } | ModelNotFound { .. } => Some("model"),
            NotOnGrpc { param, .. } => *param,
            InvalidWorkerSpec { field, .. } => Some(field),
            InvalidHeader { header, .. } => Some(header),
            _ => None,
        }
    }

    pub fn origin(&self) -> Origin {
        use GatewayError::*;
        match self {
            NoAvailableWorkers { .. }
            | ShuttingDown
            | TokenizerUnavailable
            | BodyBuffersFull
            | RequestTimeout { .. }
            | WorkerOverloadShed { .. }
            | OverloadedBeforeDispatch { .. }
            | GatewayFull { .. }
            | SharedStateUnavailable
            | QueueFull { .. }
            | QueueEvicted { .. }
            | QueueTimeout { .. }
            | CodelDrop { .. }
            | DegradationShed { .. }
            | DeadlineExceeded { .. } => Origin::Gateway,
            UpstreamUnreachable { .. }
            | UpstreamFailed { .. }
            | UpstreamBadAnswer { .. }
            | UpstreamTimeout { .. }
            | StreamInterrupted { .. }
            | StreamEventTooLarge { .. } => Origin::Upstream,
            _ => Origin::Client,
        }
    }

    /// How long a client should wait before trying again, where trying again can help.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            GatewayError::NoAvailableWorkers { .. } | GatewayError::UpstreamUnreachable { .. } => {
                Some(NO_WORKERS_RETRY_AFTER)
            }
            GatewayError::WorkerOverloadShed { retry_after, .. }
            | GatewayError::OverloadedBeforeDispatch { retry_after, .. }
            | GatewayError::RateLimited { retry_after, .. }
            | GatewayError::GatewayFull { retry_after, .. }
            | GatewayError::QueueFull { retry_after }
            | GatewayError::QueueEvicted { retry_after }
            | GatewayError::QueueTimeout { retry_after, .. }
            | GatewayError::CodelDrop { retry_after, .. }
            | GatewayError::DegradationShed { retry_after, .. } => Some(*retry_after),
            GatewayError::TenantConcurrency { .. } | GatewayError::SharedStateUnavailable => {
                Some(Duration::from_secs(1))
            }
            // Bodies in hand are sent on within a request's first moments.
            GatewayError::BodyBuffersFull => Some(BODY_BUFFERS_RETRY_AFTER),
            _ => None,
        }
    }

    /// The OpenAI error object.
    pub fn body(&self) -> Bytes {
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
                message: self.to_string(),
                kind: self.kind(),
                param: self.param(),
                code: self.code(),
            },
        };
        Bytes::from(serde_json::to_vec(&outer).unwrap_or_default())
    }

    /// The same object as one SSE event, for an error after a stream has started.
    pub fn sse_event(&self) -> Bytes {
        let body = self.body();
        let mut event = Vec::with_capacity(body.len() + 8);
        event.extend_from_slice(b"data: ");
        event.extend_from_slice(&body);
        event.extend_from_slice(b"\n\n");
        Bytes::from(event)
    }
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        let mut response = (self.status(), self.body()).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(ERROR_CODE_HEADER, HeaderValue::from_static(self.code()));
        if let Some(wait) = self.retry_after() {
            // Whole seconds, rounded up: a client that waits as told finds room.
            let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
        }
        response
    }
}

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
    fn the_body_is_the_openai_error_object() {
        let e = GatewayError::InvalidType {
            param: "stream",
            expected: "a boolean",
        };
        let v: serde_json::Value = serde_json::from_slice(&e.body()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"error": {
                "message": "'stream' must be a boolean",
                "type": "invalid_request_error",
                "param": "stream",
                "code": "invalid_type",
            }})
        );
    }

    #[test]
    fn answers_carry_the_code_header_and_retry_after_where_useful() {
        let r = GatewayError::NoAvailableWorkers {
            model: ModelName::new("m"),
            detail: String::new(),
        }
        .into_response();
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()[&ERROR_CODE_HEADER], "no_available_workers");
        assert_eq!(r.headers()[header::RETRY_AFTER], "5");
        let r = GatewayError::ModelNotFound { model: "x".into() }.into_response();
        assert!(r.headers().get(header::RETRY_AFTER).is_none());
    }

    #[test]
    fn sse_events_are_one_data_line() {
        let e = GatewayError::StreamInterrupted {
            worker: WorkerId::new("w1"),
        };
        let event = e.sse_event();
        assert!(event.starts_with(b"data: {\"error\":"));
        assert!(event.ends_with(b"}\n\n"));
    }
}
