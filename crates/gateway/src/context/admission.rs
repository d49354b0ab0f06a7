//! What admission decides for a request and holds on its behalf until it ends.
//!
//! The admit stage sets the tenant, the tier and the deadlines, and takes what the request holds
//! while it runs: concurrency slots, gateway permits, token and request reservations. Whatever is
//! held is a `Hold`, given back by the request context's `Drop` with the request's ending — so a
//! reservation is settled and a permit returned whether the request completed, failed, timed out,
//! or its client left.

use std::time::Duration;

use axum::http::{HeaderName, HeaderValue};
use tokio::time::Instant;

/// `X-Request-Deadline-Ms` (seed 003): the client's budget for the whole response, in
/// milliseconds from arrival; what is left of it is passed on to the worker.
pub const DEADLINE: HeaderName = HeaderName::from_static("x-request-deadline-ms");

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
    /// The request was sent to a worker (else the gateway answered it alone).
    pub forwarded: bool,
    /// What the response said it used, when it was metered and said so.
    pub usage: Option<Usage>,
    /// Events of a metered stream, `[DONE]` aside: the tokens generated, where no usage is given.
    pub chunks: u64,
}

/// Tokens a response used, from its `usage` block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt: u64,
    pub completion: u64,
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
    /// The request's priority tier.
    pub tier: Option<sluice_core::admission::Tier>,
    /// Its tenant's counters, for what befalls it after admission (an eviction from the queue).
    pub counters: Option<std::sync::Arc<crate::metrics::TenantCounters>>,
    /// After this the answer is of no use: the request is cut (504 before a response, the stream
    /// ended after). The arrival plus `--request-timeout-secs`, or the client's deadline when it
    /// gave an earlier one.
    pub deadline: Instant,
    /// `X-Request-Deadline-Ms`: the client's own deadline, when it gave one.
    pub client_deadline: Option<Instant>,
    /// The response's token usage is read (its tenant has a token budget to settle).
    pub metered: bool,
    /// OpenAI's `x-ratelimit-*` headers for a tenant with limits, as admission saw its budgets.
    pub rate_headers: Option<axum::http::HeaderMap>,
    /// Its tenant's weight among its tier, and its estimated tokens: its place in the queue.
    pub weight: f64,
    pub cost: u64,
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
            counters: None,
            deadline,
            client_deadline: None,
            metered: false,
            rate_headers: None,
            weight: 1.0,
            cost: 0,
            holds: Vec::new(),
        }
    }

    /// The client's deadline is what cuts the request (not the gateway's request timeout).
    pub fn cut_by_client(&self) -> bool {
        self.client_deadline.is_some_and(|d| d <= self.deadline)
    }

    /// What is left of the client's budget at `now`, in whole milliseconds, for the worker.
    pub fn budget_left(&self, now: Instant) -> Option<HeaderValue> {
        self.client_deadline
            .map(|d| HeaderValue::from(d.saturating_duration_since(now).as_millis() as u64))
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
