//! The number of OpenAI requests in flight through the gateway, moved only by a guard that
//! lives as long as the request's response, so shutdown can wait for exactly zero.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

/// Requests in flight, and a signal when there are none.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    count: AtomicU64,
    idle: Notify,
}

/// One request's place in the count.
#[derive(Debug)]
pub(crate) struct InFlightGuard(Arc<InFlight>);

impl InFlight {
    pub(crate) fn enter(self: &Arc<Self>) -> InFlightGuard {
        self.count.fetch_add(1, Ordering::SeqCst);
        InFlightGuard(self.clone())
    }

    pub(crate) fn count(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }

    /// Resolves when nothing is in flight.
    pub(crate) async fn idle(&self) {
        loop {
            let idle = self.idle.notified();
            if self.count() == 0 {
                return;
            }
            idle.await;
        }
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn idle_waits_for_the_last_guard() {
        let inflight = Arc::new(InFlight::default());
        inflight.idle().await;
        let a = inflight.enter();
        let b = inflight.enter();
        let waiter = tokio::spawn({
            let inflight = inflight.clone();
            async move { inflight.idle().await }
        });
        drop(a);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(b);
        waiter.await.unwrap();
        assert_eq!(inflight.count(), 0);
    }
}
