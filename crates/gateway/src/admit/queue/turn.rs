//! A request's turn out of the gateway queue: admission's guard on the room the dispatcher sent
//! the request for.

use tokio::sync::oneshot;

/// Held from the dispatcher's call until the request has its worker. While it is held the
/// dispatcher sends no one else (so the room it was sent for is not promised twice); `taken` by
/// the route stage when it leases the request's first worker, or dropped with the request,
/// whichever comes first — and the dispatcher waits `TURN_BOUND` at most. A request that went
/// on without waiting holds an empty one.
#[derive(Debug, Default)]
pub struct Turn(Option<oneshot::Sender<()>>);

impl Turn {
    /// A turn the queue's dispatcher waits on until `ack` is sent or dropped.
    pub(super) fn new(ack: oneshot::Sender<()>) -> Self {
        Self(Some(ack))
    }

    /// The request waited in the queue and was called (its turn not yet taken): the queue has
    /// judged the room it was sent for.
    pub(crate) fn called(&self) -> bool {
        self.0.is_some()
    }

    /// The request has its worker: the dispatcher may look for the next waiter.
    pub(crate) fn taken(&mut self) {
        if let Some(ack) = self.0.take() {
            let _ = ack.send(());
        }
    }
}
