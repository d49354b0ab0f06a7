//! What admission hands on: the terms it set for a request and what it took for it.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sluice_core::admission::Tier;
use sluice_core::TenantId;
use tokio::time::Instant;

use super::Turn;
use crate::context::Grants;
use crate::fleet::Pool;
use crate::metrics::TenantCounters;

/// The admit stage's hand-off to the route stage: the request admitted to a model's pool, on
/// admission's terms, with what it holds.
#[derive(Debug)]
pub(crate) struct Admitted {
    /// What binds the request from here to its end: its tier, its deadlines, whether its usage
    /// is read.
    pub(crate) terms: Terms,
    /// What admission took for it (slots, reservations, the ladder's diversion), given back
    /// with its ending; the front stage hands them to the request's context, which knows it.
    pub(crate) grants: Grants,
    /// Its turn out of the gateway queue, when it waited: the room it was sent for is its own
    /// until the route stage leases its first worker.
    pub(crate) turn: Turn,
    /// The pool it was admitted to (its model's, or the one the ladder cascaded it to), as the
    /// fleet was then.
    pub(crate) pool: Arc<Pool>,
    /// The body its worker gets: the client's, with the served model's name where it differs,
    /// or as the ladder rewrote it.
    pub(crate) body: Bytes,
}

/// What admission decided that binds a request after it, read by the stages that follow.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Terms {
    /// Its priority tier: the decode window's order, the interactive reserve, its SLO.
    pub(crate) tier: Tier,
    /// After this the answer is of no use: the request is cut (504 before a response, the
    /// stream ended after). The arrival plus `--request-timeout-secs`, or the client's deadline
    /// when it gave an earlier one.
    pub(crate) deadline: Instant,
    /// `X-Request-Deadline-Ms` (or its tier's default): the client's own deadline, what is left
    /// of which the worker is told.
    pub(crate) client_deadline: Option<Instant>,
    /// Its response's token usage is read: its tenant has a token budget to settle.
    pub(crate) metered: bool,
}

impl Terms {
    /// The client's deadline is what cuts the request (not the gateway's request timeout).
    pub(crate) fn cut_by_client(&self) -> bool {
        self.client_deadline.is_some_and(|d| d <= self.deadline)
    }

    /// The whole time the request was allowed from its arrival at `started`: what a timeout's
    /// answer names.
    pub(crate) fn allowed(&self, started: Instant) -> Duration {
        self.deadline.saturating_duration_since(started)
    }
}

/// What admission has decided and taken for one request so far. Dropped on a refusal, its grants
/// go back at once, as a request the gateway refused.
#[derive(Debug)]
pub(super) struct Decided {
    /// Its tier: the tenant's until the request's own header is read.
    pub(crate) tier: Tier,
    /// The tenant asking, once known: its place in the queue's fairness.
    pub(crate) tenant: Option<TenantId>,
    /// Its tenant's counters, for what befalls it in the queue.
    pub(crate) counters: Option<Arc<TenantCounters>>,
    /// `Terms::deadline`, as it stands.
    pub(crate) deadline: Instant,
    /// `Terms::client_deadline`, once the header (or the tier's default) is read.
    pub(crate) client_deadline: Option<Instant>,
    /// `Terms::metered`: set once its tenant's token budget is reserved from.
    pub(crate) metered: bool,
    /// Its tenant's weight among its tier: with `cost`, its place in the queue.
    pub(crate) weight: f64,
    /// Its estimated tokens: what a fair queue charges its tenant for its turn.
    pub(crate) cost: u64,
    /// What it has taken so far.
    pub(crate) grants: Grants,
}

impl Decided {
    /// Nothing decided yet but its deadline: the gateway's request timeout.
    pub fn new(deadline: Instant, tier: Tier) -> Self {
        Self {
            tier,
            tenant: None,
            counters: None,
            deadline,
            client_deadline: None,
            metered: false,
            weight: 1.0,
            cost: 0,
            grants: Grants::default(),
        }
    }

    pub(crate) fn terms(&self) -> Terms {
        Terms {
            tier: self.tier,
            deadline: self.deadline,
            client_deadline: self.client_deadline,
            metered: self.metered,
        }
    }
}
