//! What admission decides for a request and holds on its behalf until it ends.
//!
//! The admit stage takes what the request holds while it runs: concurrency slots, gateway permits,
//! token and request reservations. Whatever is held is a `Hold`, handed on as `Grants` and given
//! back by the request context's `Drop` with the request's ending — so a reservation is settled
//! and a permit returned whether the request completed, failed, timed out, or its client left.

use std::time::Duration;

use axum::http::HeaderName;

/// `X-Request-Deadline-Ms` (seed 003): the client's budget for the whole response, in
/// milliseconds from arrival; what is left of it is passed on to the worker.
pub(crate) const DEADLINE: HeaderName = HeaderName::from_static("x-request-deadline-ms");

/// How a request ended, as a hold needs to know to settle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ending {
    /// The status the client got; `None` when it left before any.
    pub(crate) status: Option<u16>,
    /// Bytes of response body relayed.
    pub(crate) bytes: u64,
    /// From arrival to the end.
    pub(crate) duration: Duration,
    /// The client left before the end.
    pub(crate) cancelled: bool,
    /// The worker failed mid-response.
    pub(crate) interrupted: bool,
    /// The request was sent to a worker (else the gateway answered it alone).
    pub(crate) forwarded: bool,
    /// What the response said it used, when it was metered and said so.
    pub(crate) usage: Option<Usage>,
    /// Events of a metered stream, `[DONE]` aside: the tokens generated, where no usage is given.
    pub(crate) chunks: u64,
}

/// Tokens a response used, from its `usage` block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Usage {
    pub(crate) prompt: u64,
    pub(crate) completion: u64,
}

/// Something taken for one request and given back when it ends: a queue permit, a concurrency
/// slot, a token reservation (which settles against what was used).
pub(crate) trait Hold: Send + Sync {
    fn release(self: Box<Self>, ending: &Ending);
}

/// What admission took for one request (concurrency slots, gateway permits, token and request
/// reservations, the ladder's diversion), given back when it ends: by the request's context with
/// its ending once the front stage handed them over, or — dropped before that, on a refusal or a
/// client gone while admission ran — as a request the gateway never sent on.
#[derive(Default)]
pub(crate) struct Grants(Vec<Box<dyn Hold>>);

impl std::fmt::Debug for Grants {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Grants").field(&self.0.len()).finish()
    }
}

impl Grants {
    /// Keeps `hold` until the request ends.
    pub(crate) fn hold(&mut self, hold: Box<dyn Hold>) {
        self.0.push(hold);
    }

    /// All of them, leaving none here.
    pub(crate) fn take(&mut self) -> Grants {
        Grants(std::mem::take(&mut self.0))
    }

    /// Adds `other`'s, to be given back after these (taken later, given back first).
    pub(super) fn extend(&mut self, mut other: Grants) {
        self.0.append(&mut other.0);
    }

    /// Gives back everything held, last taken first.
    pub(super) fn release(&mut self, ending: &Ending) {
        while let Some(hold) = self.0.pop() {
            hold.release(ending);
        }
    }
}

impl Drop for Grants {
    fn drop(&mut self) {
        self.release(&Ending::UNSENT);
    }
}

impl Ending {
    /// A request that ended before it was sent on, or any answer made for it.
    pub(crate) const UNSENT: Ending = Ending {
        status: None,
        bytes: 0,
        duration: Duration::ZERO,
        cancelled: false,
        interrupted: false,
        forwarded: false,
        usage: None,
        chunks: 0,
    };
}

/// What the request's context records of admission: who asked, in which tier, and the budgets
/// its answer shows. The terms admission set travel on in its hand-off (`admit::Admitted`).
#[derive(Debug, Default)]
pub(crate) struct Admission {
    /// The tenant asking, once tenants are configured.
    pub(crate) tenant: Option<sluice_core::TenantId>,
    /// The request's priority tier, once known.
    pub(crate) tier: Option<sluice_core::admission::Tier>,
    /// Its tenant's counters, for a refusal counted under it.
    pub(crate) counters: Option<std::sync::Arc<crate::metrics::TenantCounters>>,
    /// OpenAI's `x-ratelimit-*` headers for a tenant with limits, as admission saw its budgets.
    pub(crate) rate_headers: Option<axum::http::HeaderMap>,
}
