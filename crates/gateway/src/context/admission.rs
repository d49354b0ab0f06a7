//! What admission decides for a request and holds on its behalf until it ends.
//!
//! Today the admit stage sets only the deadline; tenants, tiers, queue permits, concurrency slots
//! and token reservations land here as the admission rules arrive. Whatever is held is a `Hold`,
//! given back by the request context's `Drop` with the request's ending — so a reservation is
//! settled and a permit returned whether the request completed, failed, timed out, or its client
//! left.

use std::time::Duration;

use tokio::time::Instant;

/// How a request ended, as a hold needs to know to settle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ending {
    /// The status the client got; `None` when it left before any.
    pub status: Option<u16>,
    /// Bytes of response body relayed.
    pub bytes: u64,
    /// From arrival to the end.
    pub duration: Duration,
    /// The client left before the end.
    pub cancelled: bool,
    /// The worker failed mid-response.
    pub interrupted: bool,
}

/// Something taken for one request and given back when it ends: a queue permit, a concurrency
/// slot, a token reservation (which settles against what was used).
pub trait Hold: Send + Sync {
    fn release(self: Box<Self>, ending: &Ending);
}

/// Admission's decisions and holdings for one request.
pub struct Admission {
    /// The tenant asking, once tenants are configured.
    pub tenant: Option<sluice_core::TenantId>,
    /// The request's priority tier, once tiers are configured.
    pub tier: Option<sluice_core::admission::Tier>,
    /// After this the answer is of no use: the request is cut (504 before a response, the stream
    /// ended after). The arrival plus `--request-timeout-secs` unless admission says otherwise.
    pub deadline: Instant,
    holds: Vec<Box<dyn Hold>>,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("tenant", &self.tenant)
            .field("tier", &self.tier)
            .field("deadline", &self.deadline)
            .field("holds", &self.holds.len())
            .finish()
    }
}

impl Admission {
    /// Nothing decided yet: no tenant, no tier, a deadline of `deadline`.
    pub fn new(deadline: Instant) -> Self {
        Self {
            tenant: None,
            tier: None,
            deadline,
            holds: Vec::new(),
        }
    }

    /// Keeps `hold` until the request ends.
    pub fn hold(&mut self, hold: Box<dyn Hold>) {
        self.holds.push(hold);
    }

    /// Gives back everything held, last taken first.
    pub(super) fn release(&mut self, ending: &Ending) {
        while let Some(hold) = self.holds.pop() {
            hold.release(ending);
        }
    }
}
