//! Idle HTTP/2 connections are closed after the idle bound, as idle HTTP/1.1 ones are by hyper's
//! header timeout (which HTTP/2 has no equivalent of: its pings only prove the peer is there).
//!
//! A connection is idle while none of its requests is in progress — from a request's arrival to
//! the end of its response body, which a guard in the body marks. Only HTTP/2 requests are
//! tracked: they are what multiplexes on one connection, and HTTP/1.1 needs none of this.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use tokio::sync::Notify;
use tokio::time::Instant;

/// One connection's HTTP/2 activity.
#[derive(Debug)]
pub(crate) struct Activity {
    /// Requests in progress, and since when none has been (`None` while one is).
    state: parking_lot::Mutex<(u64, Option<Instant>)>,
    h2: AtomicBool,
    h2_seen: Notify,
}

impl Activity {
    pub fn new() -> Self {
        Self {
            state: parking_lot::Mutex::new((0, Some(Instant::now()))),
            h2: AtomicBool::new(false),
            h2_seen: Notify::new(),
        }
    }

    /// An HTTP/2 request arrived; it is in progress until the guard goes.
    pub fn start(self: &std::sync::Arc<Self>) -> InProgress {
        if !self.h2.swap(true, Ordering::AcqRel) {
            self.h2_seen.notify_one();
        }
        let mut state = self.state.lock();
        state.0 += 1;
        state.1 = None;
        InProgress(self.clone())
    }

    /// Resolves once the connection is HTTP/2 and has been idle for `bound`; never for HTTP/1.1.
    pub(crate) async fn idle_for(&self, bound: Duration) {
        if !self.h2.load(Ordering::Acquire) {
            self.h2_seen.notified().await;
        }
        loop {
            let until = match self.state.lock().1 {
                Some(since) if Instant::now() >= since + bound => return,
                Some(since) => since + bound,
                None => Instant::now() + bound,
            };
            tokio::time::sleep_until(until).await;
        }
    }
}

/// One request in progress.
#[derive(Debug)]
pub(crate) struct InProgress(std::sync::Arc<Activity>);

impl Drop for InProgress {
    fn drop(&mut self) {
        let mut state = self.0.state.lock();
        state.0 -= 1;
        if state.0 == 0 {
            state.1 = Some(Instant::now());
        }
    }
}

/// A response body that keeps its request in progress until it is done or dropped.
pub(crate) struct Tracked {
    pub(crate) inner: Body,
    pub(crate) _progress: InProgress,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_h2_connection_is_idle_only_without_a_request_in_progress() {
        let activity = Arc::new(Activity::new());
        let bound = Duration::from_secs(10);
        let watch = {
            let activity = activity.clone();
            tokio::spawn(async move { activity.idle_for(bound).await })
        };
        tokio::time::advance(Duration::from_secs(60)).await;
        tokio::task::yield_now().await;
        assert!(
            !watch.is_finished(),
            "HTTP/1.1 so far: never idle by this rule"
        );
        let request = activity.start();
        tokio::time::advance(Duration::from_secs(60)).await;
        tokio::task::yield_now().await;
        assert!(!watch.is_finished(), "a request in progress");
        drop(request);
        tokio::time::advance(Duration::from_secs(9)).await;
        tokio::task::yield_now().await;
        assert!(!watch.is_finished());
        tokio::time::advance(Duration::from_secs(1)).await;
        watch.await.unwrap();
    }
}
