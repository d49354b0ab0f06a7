//! The accept loop of one engine, built so that a crash can be real.
//!
//! axum's own `serve` cannot drop the connections it has accepted, so the engine runs its own
//! loop on hyper-util: every connection task watches a kill signal, and when it fires (the
//! `crash` fault) the task sets `SO_LINGER` to zero and drops the socket, so the peer sees a reset,
//! not a clean close, as when a process dies. The listener goes with the loop.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use socket2::SockRef;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};

use crate::engine::Totals;
use crate::faults::FaultSet;

/// Where an engine's port counts its open connections, and whom a change wakes: a test awaits
/// a peer letting go of the engine.
#[derive(Clone)]
pub(crate) struct Tally {
    pub totals: Arc<Totals>,
    pub changed: Arc<Notify>,
}

/// One open connection, counted while it lives.
struct Open(Tally);

impl Tally {
    fn open(&self) -> Open {
        self.totals.open_connections.fetch_add(1, Ordering::Relaxed);
        self.changed.notify_waiters();
        Open(self.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0
            .totals
            .open_connections
            .fetch_sub(1, Ordering::Relaxed);
        self.0.changed.notify_waiters();
    }
}

/// Resolves when the kill signal fires (or its sender is gone).
async fn killed(mut kill: watch::Receiver<bool>) {
    let _ = kill.wait_for(|k| *k).await;
}

/// Spawns `work` so that it stops when the kill signal fires.
fn spawn_killable<F>(kill: &watch::Receiver<bool>, work: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    let kill = kill.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = work => {}
            () = killed(kill) => {}
        }
    });
}

/// Accepts connections until killed, counting them in `tally` if given.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    faults: watch::Receiver<FaultSet>,
    kill: watch::Receiver<bool>,
    tally: Option<Tally>,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // No cap on streams per HTTP/2 connection (hyper's default is 200): a gateway speaking HTTP/2
    // sends an engine all of its requests on one connection, and an engine takes as many as its
    // scheduler holds, whatever the transport.
    builder.http2().max_concurrent_streams(None);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = killed(kill.clone()) => return,
        };
        let Ok((stream, _peer)) = accepted else {
            // Out of file descriptors or similar: back off briefly instead of spinning.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        let open = tally.as_ref().map(Tally::open);
        if faults.borrow().hang {
            // The kernel accepts; the hung process reads nothing until it runs again, then
            // serves what waited, as a stalled event loop does when it resumes.
            let (builder, router, kill_rx) = (builder.clone(), router.clone(), kill.clone());
            let (faults, tally) = (faults.clone(), tally.clone());
            spawn_killable(&kill, async move {
                let counted = held_while_hung(&stream, faults, tally.as_ref()).await;
                let router = if counted {
                    mark_first_request(router)
                } else {
                    router
                };
                serve_connection(builder, router, stream, kill_rx, open).await;
            });
            continue;
        }
        tokio::spawn(serve_connection(
            builder.clone(),
            router.clone(),
            stream,
            kill.clone(),
            open,
        ));
    }
}

/// Serves one connection with hyper until it ends, or until killed: then reset, not closed,
/// for the peer must see the engine die.
async fn serve_connection(
    builder: auto::Builder<TokioExecutor>,
    router: Router,
    stream: TcpStream,
    kill: watch::Receiver<bool>,
    open: Option<Open>,
) {
    let _open = open;
    let Some((stream, shadow)) = with_shadow(stream) else {
        return;
    };
    let service = TowerToHyperService::new(router);
    let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
    tokio::select! {
        _ = connection => {}
        () = killed(kill) => {
            let _ = SockRef::from(&shadow).set_linger(Some(Duration::ZERO));
        }
    }
}

/// A connection accepted while the API process hangs: waits, reading nothing, until the hang
/// lifts. A generation request that opens it is counted as an arrival at once (it reached the
/// engine's port), as the handler would count it. Whether it was counted.
async fn held_while_hung(
    stream: &TcpStream,
    mut faults: watch::Receiver<FaultSet>,
    tally: Option<&Tally>,
) -> bool {
    let mut first = [0u8; 4096];
    let lifted = async { faults.wait_for(|f| !f.hang).await.is_ok() };
    let peeked = tokio::select! {
        peeked = stream.peek(&mut first) => peeked.unwrap_or(0),
        _ = lifted => return false,
    };
    let counted = match tally {
        Some(tally) if first[..peeked].starts_with(b"POST /v1/") => {
            tally
                .totals
                .count_arrival(marked_as_trial(&first[..peeked]));
            tally.changed.notify_waiters();
            true
        }
        _ => false,
    };
    let _ = faults.wait_for(|f| !f.hang).await;
    counted
}

/// The connection's first request, already counted while it waited, is not counted again.
fn mark_first_request(router: Router) -> Router {
    let first = Arc::new(std::sync::atomic::AtomicBool::new(true));
    router.layer(axum::middleware::map_request(
        move |mut request: axum::extract::Request| {
            let first = first.clone();
            async move {
                if first.swap(false, Ordering::Relaxed) {
                    request.headers_mut().insert(
                        crate::engine::COUNTED_WHILE_HUNG,
                        axum::http::HeaderValue::from_static("1"),
                    );
                }
                request
            }
        },
    ))
}

/// A second handle on the connection's socket, through which a crash can set `SO_LINGER`
/// after hyper took the stream.
fn with_shadow(stream: TcpStream) -> Option<(TcpStream, std::net::TcpStream)> {
    let std_stream = stream.into_std().ok()?;
    let shadow = std_stream.try_clone().ok()?;
    let stream = TcpStream::from_std(std_stream).ok()?;
    Some((stream, shadow))
}

/// Whether a request's first bytes carry the liveness-trial header (`TRIAL_HEADER`).
fn marked_as_trial(first: &[u8]) -> bool {
    let line = format!("\r\n{}:", crate::engine::TRIAL_HEADER);
    first
        .windows(line.len())
        .any(|w| w.eq_ignore_ascii_case(line.as_bytes()))
}

#[cfg(test)]
mod trial_tests {
    #[test]
    fn a_trial_is_told_by_its_header_in_any_case() {
        let head =
            b"POST /v1/completions HTTP/1.1\r\nhost: e\r\nX-Sluice-Liveness-Trial: 1\r\n\r\n";
        assert!(super::marked_as_trial(head));
        assert!(!super::marked_as_trial(
            b"POST /v1/completions HTTP/1.1\r\nhost: e\r\n\r\n"
        ));
    }
}
