//! The accept loop: HTTP/1.1 and h2c on one port, every phase of a connection bounded, at most
//! `max_connections` at once, and a stop signal that ends every connection.
//!
//! The phases and what bounds each (`Limits`):
//! - **accepting**: at the cap, no more connections are accepted (they wait in the kernel's
//!   backlog) until one closes — so a flood of sockets costs queue space, not file descriptors
//!   the rest of the process (its upstream connections, the probe port) needs.
//! - **first request**: a connection must complete its first request head within
//!   `header_read`, whatever it sends meanwhile: nothing, one byte, an h2c preface and then
//!   nothing. (hyper's own header timeout only starts once the protocol is known.) On a TLS
//!   listener the handshake must also end within `header_read`, and the first request gets
//!   `header_read` again after it.
//! - **headers and idle keep-alive** (HTTP/1.1): hyper's header timeout, `header_read`, runs
//!   from the end of one response to the next complete head.
//! - **idle HTTP/2**: closed once no request has been in progress for `header_read`, as an idle
//!   HTTP/1.1 connection is (`idle`); and a ping every `h2_keepalive`, so a peer that vanished
//!   is noticed within it.
//! - **bodies**: the request's own reader bounds them (`--body-read-timeout-secs`).
//!
//! Heads past the gateway's own limits are refused in the OpenAI error shape (`service`); what
//! hyper refuses by itself on a connection's first message is reshaped on the way out
//! (`shaped`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;
use tracing::debug;

use super::idle::Activity;
use super::protocol::{Builders, Serving, Sniff};
use super::service::{FirstRequest, Routes, HYPER_MAX_BUF, HYPER_MAX_HEADERS};
use super::shaped::Shaped;
use super::woken::OnWake;

/// The bounds of the connections one listener serves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Limits {
    /// The first request head must be complete within this; later heads too (HTTP/1.1).
    pub(crate) header_read: Duration,
    /// Connections served at once.
    pub(crate) max_connections: usize,
    /// HTTP/2 keep-alive ping interval and timeout.
    pub(crate) h2_keepalive: Duration,
}

/// Resolves once `stop` is set (or its sender is gone).
pub(crate) async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Serves `routes` on `listener` (over TLS with `tls`) until `stop` is set; then the listener
/// and every connection are dropped.
pub(crate) async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    routes: impl Into<Routes>,
    limits: Limits,
    stop: watch::Receiver<bool>,
) {
    let routes: Routes = routes.into();
    let builders = Arc::new(builders(&limits));
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    loop {
        let accepted = tokio::select! {
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => tokio::select! {
                    accepted = listener.accept() => accepted.map(|a| (a, slot)),
                    () = stopped(stop.clone()) => return,
                },
                Err(_) => return,
            },
            () = stopped(stop.clone()) => return,
        };
        let ((stream, _peer), slot) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors or similar: back off instead of spinning.
                debug!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (routes, builders, stop) = (routes.clone(), builders.clone(), stop.clone());
        match &tls {
            None => {
                tokio::spawn(serve_connection(
                    stream, routes, builders, limits, stop, slot,
                ));
            }
            Some(acceptor) => {
                let handshake = acceptor.accept(stream);
                tokio::spawn(async move {
                    if let Some(stream) = handshake_within(handshake, &limits, &stop).await {
                        serve_connection(stream, routes, builders, limits, stop, slot).await;
                    }
                });
            }
        }
    }
}

/// hyper's builders: HTTP/1.1 with its header timeout and head bounds, HTTP/2 with keep-alive
/// pings, and both in `auto` for connections whose protocol is not known up front.
fn builders(limits: &Limits) -> Builders {
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read)
        .max_headers(HYPER_MAX_HEADERS)
        .max_buf_size(HYPER_MAX_BUF);
    let mut http2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    http2
        .timer(TokioTimer::new())
        .keep_alive_interval(limits.h2_keepalive)
        .keep_alive_timeout(limits.h2_keepalive);
    let mut auto = auto::Builder::new(TokioExecutor::new());
    auto.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read)
        .max_headers(HYPER_MAX_HEADERS)
        .max_buf_size(HYPER_MAX_BUF);
    auto.http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(limits.h2_keepalive)
        .keep_alive_timeout(limits.h2_keepalive);
    Builders { http1, http2, auto }
}

/// A TLS handshake, bounded like a request head (and by the stop); `None` if it failed.
async fn handshake_within<S>(
    handshake: tokio_rustls::Accept<S>,
    limits: &Limits,
    stop: &watch::Receiver<bool>,
) -> Option<tokio_rustls::server::TlsStream<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    tokio::select! {
        done = tokio::time::timeout(limits.header_read, handshake) => match done {
            Ok(Ok(stream)) => Some(stream),
            Ok(Err(e)) => {
                debug!(error = %e, "TLS handshake failed");
                None
            }
            Err(_) => {
                debug!("no TLS handshake within the header read timeout; closing");
                None
            }
        },
        () = stopped(stop.clone()) => None,
    }
}

/// One client connection, bounded as the module docs say; `slot` is its place under the cap.
async fn serve_connection<S>(
    stream: S,
    routes: Routes,
    builders: Arc<Builders>,
    limits: Limits,
    stop: watch::Receiver<bool>,
    slot: OwnedSemaphorePermit,
) where
    S: AsyncRead + AsyncWrite + Sniff + Unpin + Send + 'static,
{
    let _slot = slot;
    let first = Arc::new(AtomicBool::new(false));
    let no_first = no_first_request(&first, limits.header_read);
    tokio::pin!(no_first);
    let speaks = tokio::select! {
        speaks = stream.speaks() => speaks,
        () = stopped(stop.clone()) => return,
        () = no_first.as_mut() => {
            debug!("no request head within the header read timeout; closing");
            return;
        }
    };
    let activity = Arc::new(Activity::new());
    let service = TowerToHyperService::new(FirstRequest {
        inner: routes,
        seen: first.clone(),
        activity: activity.clone(),
    });
    let io = TokioIo::new(Shaped::new(stream, first.clone()));
    let mut connection = Serving::new(&builders, speaks, io, service);
    // Polled only when one of them happened, not on every wake of the connection's task.
    // In a block of their own, so the task's memory for them is reused once they are done.
    let (watch, header_read) = (stop.clone(), limits.header_read);
    let ended = {
        let watchers = OnWake::new(async {
            tokio::select! {
                () = stopped(watch) => Ended::Stopped,
                () = no_first => Ended::NoFirstRequest,
                () = activity.idle_for(header_read) => Ended::IdleHttp2,
            }
        });
        tokio::pin!(watchers);
        tokio::select! {
            () = &mut connection => return,
            ended = &mut watchers => ended,
        }
    };
    match ended {
        Ended::Stopped => return,
        Ended::NoFirstRequest => {
            debug!("no request head within the header read timeout; closing");
            return;
        }
        Ended::IdleHttp2 => debug!("HTTP/2 connection idle for the header read timeout; closing"),
    }
    // Idle HTTP/2: a GOAWAY, so the client opens a new connection rather than fail.
    connection.graceful_shutdown();
    tokio::select! {
        () = connection => {}
        () = stopped(stop) => {}
    }
}

/// Why a connection ends other than by its client.
enum Ended {
    Stopped,
    NoFirstRequest,
    IdleHttp2,
}

/// Resolves if no request reached the service within `within`; otherwise never.
async fn no_first_request(seen: &AtomicBool, within: Duration) {
    tokio::time::sleep(within).await;
    if seen.load(Ordering::Acquire) {
        std::future::pending::<()>().await;
    }
}
