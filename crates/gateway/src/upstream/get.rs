//! One exchange with a worker on the gateway's own account — a `GET` of its models, a health
//! probe, a load poll; a `POST` of a liveness trial — with the worker's key, a size limit and a
//! deadline.

use std::time::Duration;

use axum::http::uri::PathAndQuery;
use axum::http::{header, HeaderName, HeaderValue, Method, Request, StatusCode};
use bytes::Bytes;
use http_body_util::{BodyExt, Limited};

use super::{Endpoint, Upstream};

/// Why a GET got no answer.
#[derive(Debug, thiserror::Error)]
pub enum GetError {
    #[error("timeout after {0:?}")]
    Timeout(Duration),
    /// Refused, reset, unreachable: the transport failed (a liveness signal).
    #[error("cannot reach it: {0}")]
    Connect(super::SendError),
    #[error("the exchange failed: {0}")]
    Failed(super::SendError),
    #[error("the answer broke off or was larger than {0} bytes")]
    Body(usize),
    #[error("invalid URL")]
    Uri,
}

impl GetError {
    /// A connection-level failure, as opposed to slowness or a bad answer.
    pub(crate) fn is_transport(&self) -> bool {
        matches!(self, GetError::Connect(_))
    }

    pub(crate) fn is_timeout(&self) -> bool {
        matches!(self, GetError::Timeout(_))
    }
}

/// `GET <endpoint><path>` with `authorization` (the worker's key) when there is one: the status
/// and at most `limit` bytes of body, within `timeout`.
pub(crate) async fn get(
    upstream: &Upstream,
    endpoint: &Endpoint,
    authorization: Option<&HeaderValue>,
    path: &str,
    limit: usize,
    timeout: Duration,
) -> Result<(StatusCode, Bytes), GetError> {
    let request = request(Method::GET, endpoint, authorization, path, Bytes::new())?;
    exchange(upstream, endpoint, request, limit, timeout).await
}

/// `POST <endpoint><path>` of a JSON `body` with `marker` as a header, as `get` otherwise.
pub(crate) async fn post_json(
    upstream: &Upstream,
    endpoint: &Endpoint,
    authorization: Option<&HeaderValue>,
    path: &str,
    (body, marker): (Bytes, (HeaderName, HeaderValue)),
    timeout: Duration,
) -> Result<(StatusCode, Bytes), GetError> {
    let mut request = request(Method::POST, endpoint, authorization, path, body)?;
    request.headers_mut().insert(marker.0, marker.1);
    exchange(upstream, endpoint, request, POST_ANSWER_LIMIT, timeout).await
}

/// The most of a POST's answer read: a one-token completion is a few hundred bytes.
const POST_ANSWER_LIMIT: usize = 64 * 1024;

fn request(
    method: Method,
    endpoint: &Endpoint,
    authorization: Option<&HeaderValue>,
    path: &str,
    body: Bytes,
) -> Result<Request<Bytes>, GetError> {
    let path = PathAndQuery::try_from(path).map_err(|_| GetError::Uri)?;
    let mut request = Request::builder()
        .method(method.clone())
        .uri(endpoint.uri(path));
    if let Some(auth) = authorization {
        request = request.header(header::AUTHORIZATION, auth.clone());
    }
    if method == Method::POST {
        request = request.header(header::CONTENT_TYPE, "application/json");
    }
    request.body(body).map_err(|_| GetError::Uri)
}

async fn exchange(
    upstream: &Upstream,
    endpoint: &Endpoint,
    request: Request<Bytes>,
    limit: usize,
    timeout: Duration,
) -> Result<(StatusCode, Bytes), GetError> {
    let exchange = async {
        let response = upstream.send(endpoint, request).await.map_err(|e| {
            if e.is_connect() {
                GetError::Connect(e)
            } else {
                GetError::Failed(e)
            }
        })?;
        let status = response.status();
        let body = Limited::new(response.into_body(), limit)
            .collect()
            .await
            .map_err(|_| GetError::Body(limit))?
            .to_bytes();
        Ok((status, body))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| GetError::Timeout(timeout))?
}
