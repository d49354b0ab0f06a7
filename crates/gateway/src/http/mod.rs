//! What every HTTP surface of the gateway shares — the OpenAI routes, the admin API and the
//! probes: the accept loop, API keys, the request id, reading a bounded body, which headers cross
//! the gateway in each direction, the answers for a route or method that does not exist, and a
//! future polled only when what it waits on happened (`OnWake`).

mod auth;
mod body;
mod headers;
mod idle;
mod protocol;
mod refusal;
mod request_id;
mod server;
mod service;
mod shaped;
mod woken;

pub use auth::{Access, ControlPlaneKey, ControlPlaneKeyError, CorsOrigins, KeyOwner, Keys};
pub use body::{declared_length, discard, read_body, BodyLimits, Buffered};
pub use headers::{
    clean_response_headers, copy_request_headers, is_event_stream, CLIENT_CREDENTIALS,
};
pub use refusal::RequestError;
pub(crate) use request_id::{accept_or_make as request_id, REQUEST_ID};
pub(crate) use server::{serve, Limits};
pub(crate) use service::{Routes, Shortcut};
pub(crate) use woken::OnWake;

use axum::body::Body;
use axum::http::{Method, Response, Uri};
use axum::response::IntoResponse;

/// The answer for a path no router knows.
pub(crate) async fn unknown_route(method: Method, uri: Uri) -> Response<Body> {
    RequestError::UnknownRoute {
        method: method.to_string(),
        path: uri.path().to_string(),
    }
    .into_response()
}

/// The answer for a known path asked with the wrong method (axum adds the `Allow` header).
pub(crate) async fn method_not_allowed(method: Method, uri: Uri) -> Response<Body> {
    RequestError::MethodNotAllowed {
        method: method.to_string(),
        path: uri.path().to_string(),
    }
    .into_response()
}
