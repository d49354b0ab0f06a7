//! A future polled only when something it waits on happened.
//!
//! A connection's task is woken for every frame it relays, and `tokio::select!` then polls every
//! branch: the shutdown watch and the timers beside the connection, and a stream's deadline
//! beside its worker's body, were polled once per streamed event, about a tenth of the
//! instructions an event cost under callgrind. Behind [`OnWake`] they are polled on their first
//! poll and afterwards only when their own waker fired.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

pin_project_lite::pin_project! {
    /// `inner`, polled only when its waker fired since its last poll (and on the first). Pinned
    /// in place, so a connection's watchers stay in its task's own memory.
    pub(crate) struct OnWake<F> {
        #[pin]
        inner: F,
        flag: Arc<Flag>,
        // The waker `inner` is given: always the same one, so what it registers stays registered.
        waker: Waker,
    }
}

/// Whether `inner`'s waker fired, and the task to wake when it does.
struct Flag {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

impl<F: Future> OnWake<F> {
    pub fn new(inner: F) -> Self {
        let flag = Arc::new(Flag {
            woken: AtomicBool::new(true),
            task: AtomicWaker::new(),
        });
        Self {
            inner,
            waker: Waker::from(flag.clone()),
            flag,
        }
    }
}

impl<F: Future> Future for OnWake<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        // The task first, then the flag: a wake in between is seen on the next poll.
        this.flag.task.register(cx.waker());
        if !this.flag.woken.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        this.inner.poll(&mut Context::from_waker(this.waker))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    use super::*;

    /// A ten-second sleep that counts its polls.
    fn counted_sleep(polls: Arc<AtomicUsize>) -> impl Future<Output = ()> + Unpin {
        let mut sleep = Box::pin(tokio::time::sleep(Duration::from_secs(10)));
        std::future::poll_fn(move |cx| {
            polls.fetch_add(1, Ordering::Relaxed);
            sleep.as_mut().poll(cx)
        })
    }

    #[tokio::test(start_paused = true)]
    async fn other_wakes_of_the_task_do_not_poll_it() {
        let polls = Arc::new(AtomicUsize::new(0));
        let mut gated = OnWake::new(counted_sleep(polls.clone()));
        for _ in 0..100 {
            tokio::select! {
                biased;
                () = &mut gated => panic!("the sleep ended early"),
                () = tokio::task::yield_now() => {}
            }
        }
        assert_eq!(polls.load(Ordering::Relaxed), 1);
        tokio::time::advance(Duration::from_secs(10)).await;
        gated.await;
        assert_eq!(polls.load(Ordering::Relaxed), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn without_the_gate_every_wake_polls_it() {
        // The cost the gate removes: the same loop polls a bare future every time.
        let polls = Arc::new(AtomicUsize::new(0));
        let mut bare = counted_sleep(polls.clone());
        for _ in 0..100 {
            tokio::select! {
                biased;
                () = &mut bare => panic!("the sleep ended early"),
                () = tokio::task::yield_now() => {}
            }
        }
        assert!(polls.load(Ordering::Relaxed) >= 100);
    }
}
