//! Dynamo's worker-side hard cap: N engine slots plus an overflow queue of Q.
//!
//! Exactly N + Q requests can be inside the worker; the next is refused at once with "Server
//! overloaded: worker at capacity". Requests beyond N wait (in arrival order) for a slot, which
//! they keep until their response ends.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The admission gate of an engine started with `--engine-request-limit`.
#[derive(Debug)]
pub struct AdmissionGate {
    inside: Arc<AtomicU32>,
    capacity: u32,
    slots: Arc<Semaphore>,
    limit: u32,
}

/// A place inside the gate (in a slot or in the overflow queue), given back when dropped.
#[derive(Debug)]
pub struct GateTicket {
    inside: Arc<AtomicU32>,
    slots: Arc<Semaphore>,
    slot: Option<OwnedSemaphorePermit>,
}

impl AdmissionGate {
    pub fn new(engine_request_limit: u32, request_queue_limit: u32) -> Self {
        Self {
            inside: Arc::new(AtomicU32::new(0)),
            capacity: engine_request_limit + request_queue_limit,
            slots: Arc::new(Semaphore::new(engine_request_limit as usize)),
            limit: engine_request_limit,
        }
    }

    /// Enters the gate, or `None` when N + Q requests are already inside.
    pub fn try_enter(&self) -> Option<GateTicket> {
        self.inside
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.capacity).then_some(n + 1)
            })
            .ok()?;
        Some(GateTicket {
            inside: self.inside.clone(),
            slots: self.slots.clone(),
            slot: None,
        })
    }

    /// Requests holding an engine slot.
    pub fn in_engine(&self) -> u32 {
        self.limit - self.slots.available_permits() as u32
    }

    /// Requests waiting for a slot.
    pub fn queued(&self) -> u32 {
        self.inside
            .load(Ordering::Acquire)
            .saturating_sub(self.in_engine())
    }
}

impl GateTicket {
    /// Waits for an engine slot (the overflow queue).
    pub async fn slot(&mut self) {
        if self.slot.is_none() {
            // The semaphore is never closed, so acquiring cannot fail.
            self.slot = self.slots.clone().acquire_owned().await.ok();
        }
    }
}

impl Drop for GateTicket {
    fn drop(&mut self) {
        self.slot.take();
        self.inside.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn exactly_n_plus_q_get_in_and_the_next_is_refused() {
        let gate = AdmissionGate::new(2, 3);
        let mut inside: Vec<GateTicket> = (0..5).map(|_| gate.try_enter().unwrap()).collect();
        assert!(gate.try_enter().is_none());
        for ticket in inside.iter_mut().take(2) {
            ticket.slot().await;
        }
        assert_eq!((gate.in_engine(), gate.queued()), (2, 3));
        inside.remove(0);
        assert_eq!((gate.in_engine(), gate.queued()), (1, 3));
        assert!(gate.try_enter().is_some(), "a place opened");
    }
}
