//! What the gateway refuses of a request as it was sent: its head, its body, its JSON, its key —
//! before any stage spends anything on it. Every HTTP surface answers with these.

use std::time::Duration;

use axum::http::StatusCode;

use crate::error::{answered_as_is, Answerable, Origin};

/// How long a client should wait after `request_buffers_full`: bodies in hand are sent on within
/// a request's first moments.
const BODY_BUFFERS_RETRY_AFTER: Duration = Duration::from_secs(1);

/// A request refused as it was sent.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum RequestError {
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
    #[error("The gateway is shutting down")]
    ShuttingDown,
}

impl Answerable for RequestError {
    fn status(&self) -> StatusCode {
        match self {
            RequestError::InvalidJson { .. }
            | RequestError::InvalidType { .. }
            | RequestError::BodyNotObject
            | RequestError::AboveMax { .. }
            | RequestError::BelowMin { .. }
            | RequestError::MissingParameter { .. }
            | RequestError::BodyUnreadable
            | RequestError::InvalidForm { .. }
            | RequestError::MalformedRequest => StatusCode::BAD_REQUEST,
            RequestError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            RequestError::UnsupportedMediaType
            | RequestError::UnsupportedContentEncoding { .. } => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            RequestError::BodyReadTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            RequestError::BodyBuffersFull | RequestError::ShuttingDown => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            RequestError::UriTooLong { .. } => StatusCode::URI_TOO_LONG,
            RequestError::HeadersTooLarge { .. } => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            RequestError::UnknownRoute { .. } => StatusCode::NOT_FOUND,
            RequestError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            RequestError::InvalidApiKey | RequestError::InvalidAdminKey => StatusCode::UNAUTHORIZED,
            RequestError::AdminDisabled => StatusCode::FORBIDDEN,
        }
    }

    fn code(&self) -> &'static str {
        match self {
            RequestError::InvalidJson { .. } => "invalid_json",
            RequestError::InvalidType { .. } => "invalid_type",
            RequestError::BodyNotObject => "invalid_type",
            RequestError::AboveMax { .. } => "integer_above_max_value",
            RequestError::BelowMin { .. } => "integer_below_min_value",
            RequestError::MissingParameter { .. } => "missing_required_parameter",
            RequestError::PayloadTooLarge { .. } => "request_body_too_large",
            RequestError::UnsupportedMediaType => "unsupported_media_type",
            RequestError::UnsupportedContentEncoding { .. } => "unsupported_content_encoding",
            RequestError::BodyUnreadable => "invalid_request_body",
            RequestError::InvalidForm { .. } => "invalid_form",
            RequestError::BodyReadTimeout { .. } => "body_read_timeout",
            RequestError::BodyBuffersFull => "request_buffers_full",
            RequestError::MalformedRequest => "invalid_request",
            RequestError::UriTooLong { .. } => "uri_too_long",
            RequestError::HeadersTooLarge { .. } => "request_headers_too_large",
            RequestError::UnknownRoute { .. } => "unknown_url",
            RequestError::MethodNotAllowed { .. } => "method_not_allowed",
            RequestError::InvalidApiKey => "invalid_api_key",
            RequestError::AdminDisabled => "admin_api_disabled",
            RequestError::InvalidAdminKey => "invalid_admin_key",
            RequestError::ShuttingDown => "shutting_down",
        }
    }

    fn origin(&self) -> Origin {
        match self {
            RequestError::BodyBuffersFull | RequestError::ShuttingDown => Origin::Gateway,
            RequestError::InvalidJson { .. }
            | RequestError::InvalidType { .. }
            | RequestError::BodyNotObject
            | RequestError::AboveMax { .. }
            | RequestError::BelowMin { .. }
            | RequestError::MissingParameter { .. }
            | RequestError::PayloadTooLarge { .. }
            | RequestError::UnsupportedMediaType
            | RequestError::UnsupportedContentEncoding { .. }
            | RequestError::BodyUnreadable
            | RequestError::InvalidForm { .. }
            | RequestError::BodyReadTimeout { .. }
            | RequestError::MalformedRequest
            | RequestError::UriTooLong { .. }
            | RequestError::HeadersTooLarge { .. }
            | RequestError::UnknownRoute { .. }
            | RequestError::MethodNotAllowed { .. }
            | RequestError::InvalidApiKey
            | RequestError::AdminDisabled
            | RequestError::InvalidAdminKey => Origin::Client,
        }
    }

    fn param(&self) -> Option<&str> {
        match self {
            RequestError::InvalidType { param, .. } => Some(param),
            RequestError::AboveMax { param, .. } => Some(param),
            RequestError::BelowMin { param, .. } => Some(param),
            RequestError::MissingParameter { param } => Some(param),
            _ => None,
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            RequestError::BodyBuffersFull => Some(BODY_BUFFERS_RETRY_AFTER),
            _ => None,
        }
    }
}

answered_as_is!(RequestError);
