//! A budget or a cap, kept by this gateway alone or shared with the other replicas through
//! Redis (`crate::shared`); admission asks both the same way.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use sluice_core::admission::{Bucket, Level, Refusal};
use tokio::time::Instant;

use crate::shared::{Shared, SharedBudget, SharedSlots, Short};

/// A rate budget (requests or tokens per period).
#[derive(Debug)]
pub(crate) enum Budget {
    Local(Mutex<Bucket>),
    Shared(Arc<SharedBudget>),
}

impl Budget {
    /// `capacity` per `period`, shared under `name` when there is shared state.
    pub fn new(
        shared: Option<&Shared>,
        name: &str,
        capacity: u64,
        period: Duration,
        now: Instant,
    ) -> Self {
        match shared {
            Some(shared) => Budget::Shared(shared.budget(name, capacity, period)),
            None => Budget::Local(Mutex::new(Bucket::new(capacity, period, now))),
        }
    }

    /// Takes `amount`, or says why not.
    pub(crate) async fn reserve(&self, amount: u64, now: Instant) -> Result<(), Short> {
        match self {
            Budget::Local(bucket) => bucket.lock().reserve(amount, now).map_err(Short::Refused),
            // Boxed: the round trip to Redis is the rare path, and its future would otherwise
            // sit inline in every request's future.
            Budget::Shared(shared) => Box::pin(shared.reserve(amount, now)).await,
        }
    }

    /// A request that reserved `reserved` used `used`.
    pub(crate) fn settle(&self, reserved: u64, used: u64, now: Instant) {
        match self {
            Budget::Local(bucket) => bucket.lock().settle(reserved, used, now),
            Budget::Shared(shared) => shared.settle(reserved, used, now),
        }
    }

    pub(crate) fn level(&self, now: Instant) -> Level {
        match self {
            Budget::Local(bucket) => bucket.lock().level(now),
            Budget::Shared(shared) => shared.level(now),
        }
    }
}

/// A concurrency cap: `limit` requests at once.
#[derive(Debug)]
pub(crate) enum Cap {
    Local { limit: u32, in_flight: AtomicU32 },
    Shared(Arc<SharedSlots>),
}

impl Cap {
    pub fn new(shared: Option<&Shared>, name: &str, limit: u32) -> Self {
        match shared {
            Some(shared) => Cap::Shared(shared.slots(name, u64::from(limit))),
            None => Cap::Local {
                limit,
                in_flight: AtomicU32::new(0),
            },
        }
    }

    /// Takes a place under the cap: `Ok(false)` when there is none.
    pub(crate) async fn enter(&self) -> Result<bool, Short> {
        match self {
            Cap::Local { limit, in_flight } => Ok(in_flight
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < *limit).then_some(n + 1)
                })
                .is_ok()),
            // Boxed, as `Budget::reserve`'s round trip is.
            Cap::Shared(slots) => Box::pin(slots.enter()).await,
        }
    }

    pub(crate) fn leave(&self) {
        match self {
            Cap::Local { in_flight, .. } => {
                in_flight.fetch_sub(1, Ordering::AcqRel);
            }
            Cap::Shared(slots) => slots.leave(),
        }
    }
}

/// What a refusal of a budget means to a client.
pub(crate) fn not_yet(refusal: Refusal) -> Duration {
    match refusal {
        Refusal::NotYet { retry_after } => retry_after,
        Refusal::TooBig { .. } => Duration::from_secs(1),
    }
}
