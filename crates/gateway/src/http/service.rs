//! What a listener does with each request: the main listener's shortcut tried before the router
//! (`Routes`), heads past the gateway's own limits refused in the OpenAI error shape, and the
//! connection's first request noted (`FirstRequest`, the service hyper calls).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{Request, Version};
use axum::response::{IntoResponse, Response};
use axum::routing::future::RouteFuture;
use axum::Router;
use hyper::body::Incoming;
use tower::Service;

use super::idle::{Activity, InProgress, Tracked};
use super::RequestError;

/// A way past the router for the routes nearly every request takes: the request's answer, or the
/// request handed back for the router. axum's routing (matching the path, the URL parameters it
/// stores in each request, its wrappers around the handler's boxed future) took 4.6k
/// instructions of the 60k a small request cost; past it, the request costs 2.5k fewer (the box
/// stays: the handler's future is too large to hold in the connection's).
pub(crate) type Shortcut =
    Arc<dyn Fn(Request<Incoming>) -> Result<Answering, Request<Incoming>> + Send + Sync>;
/// A shortcut's answer in progress.
pub(crate) type Answering = Pin<Box<dyn Future<Output = Response> + Send>>;

/// What a listener serves: its router, and for the main listener a shortcut tried first.
#[derive(Clone)]
pub(crate) struct Routes {
    router: Router,
    shortcut: Option<Shortcut>,
}

impl Routes {
    pub fn new(router: Router, shortcut: Option<Shortcut>) -> Self {
        Self { router, shortcut }
    }

    fn call(&mut self, request: Request<Incoming>) -> Dispatched {
        let request = match &self.shortcut {
            Some(shortcut) => match shortcut(request) {
                Ok(answering) => return Dispatched::Shortcut(answering),
                Err(request) => request,
            },
            None => request,
        };
        Dispatched::Routed(Box::new(self.router.call(request)))
    }
}

impl From<Router> for Routes {
    fn from(router: Router) -> Self {
        Self::new(router, None)
    }
}

/// A request on its way to an answer: through a shortcut or through the router. The router's
/// future is boxed: the rarer way (every way, with CORS on, where there is no shortcut) pays an
/// allocation, and the connection's state, which holds this, stays small for the common one.
pub(super) enum Dispatched {
    Shortcut(Answering),
    Routed(Box<RouteFuture<Infallible>>),
}

impl Future for Dispatched {
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Dispatched::Shortcut(answering) => answering.as_mut().poll(cx).map(Ok),
            Dispatched::Routed(routed) => Pin::new(&mut **routed).poll(cx),
        }
    }
}

/// The longest request target (path and query) served; hyper itself refuses past 64 KiB, with an
/// empty answer.
const MAX_URI_BYTES: usize = 8 * 1024;
/// The most header fields and header bytes a request may carry; hyper's own, higher limits
/// (`HYPER_MAX_HEADERS`, `HYPER_MAX_BUF`) answer past them with an empty 431.
const MAX_HEADERS: usize = 100;
const MAX_HEADER_BYTES: usize = 64 * 1024;
pub(super) const HYPER_MAX_HEADERS: usize = 256;
pub(super) const HYPER_MAX_BUF: usize = 512 * 1024;

/// The refusal a request head calls for, if any: 414 or 431, in the OpenAI error shape like every
/// other refusal (hyper's own would be empty).
fn head_refusal<B>(request: &Request<B>) -> Option<RequestError> {
    let uri = request
        .uri()
        .path_and_query()
        .map_or(0, |p| p.as_str().len());
    if uri > MAX_URI_BYTES {
        return Some(RequestError::UriTooLong {
            limit: MAX_URI_BYTES,
        });
    }
    let headers = request.headers();
    let bytes: usize = headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    if headers.len() > MAX_HEADERS || bytes > MAX_HEADER_BYTES {
        return Some(RequestError::HeadersTooLarge {
            fields: MAX_HEADERS,
            bytes: MAX_HEADER_BYTES,
        });
    }
    None
}

/// The router's answer, or a refusal made before it.
pub(super) enum Answer<F> {
    Routed(F),
    /// An HTTP/2 request, in progress until its response body is done.
    Tracked(F, Option<InProgress>),
    Refused(Option<Response>),
}

impl<F, E> Future for Answer<F>
where
    F: Future<Output = Result<Response, E>> + Unpin,
{
    type Output = Result<Response, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut *self {
            Answer::Routed(routed) => Pin::new(routed).poll(cx),
            Answer::Tracked(routed, progress) => {
                let response = std::task::ready!(Pin::new(routed).poll(cx))?;
                Poll::Ready(Ok(match progress.take() {
                    Some(progress) => response.map(|inner| {
                        Body::new(Tracked {
                            inner,
                            _progress: progress,
                        })
                    }),
                    None => response,
                }))
            }
            Answer::Refused(refusal) => Poll::Ready(Ok(refusal
                .take()
                .unwrap_or_else(|| RequestError::BodyUnreadable.into_response()))),
        }
    }
}

/// The routes, noting that a connection's first request arrived.
#[derive(Clone)]
pub(super) struct FirstRequest {
    pub(super) inner: Routes,
    /// Set by the first request: the connection's first-request bound no longer applies.
    pub(super) seen: Arc<AtomicBool>,
    /// HTTP/2 requests in progress, which keep the connection from counting as idle.
    pub(super) activity: Arc<Activity>,
}

impl Service<Request<Incoming>> for FirstRequest {
    type Response = Response;
    type Error = Infallible;
    type Future = Answer<Dispatched>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Both ways are always ready (axum's router is).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Incoming>) -> Self::Future {
        if !self.seen.load(Ordering::Relaxed) {
            self.seen.store(true, Ordering::Release);
        }
        match head_refusal(&request) {
            Some(refusal) => Answer::Refused(Some(refusal.into_response())),
            None if request.version() == Version::HTTP_2 => {
                let progress = self.activity.start();
                Answer::Tracked(self.inner.call(request), Some(progress))
            }
            None => Answer::Routed(self.inner.call(request)),
        }
    }
}
