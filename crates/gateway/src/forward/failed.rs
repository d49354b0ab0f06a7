//! An attempt's failure, classified once where it happens and judged once, by one rule.
//!
//! Every way an attempt can fail — refused or reset by the worker, a broken answer, at capacity,
//! an error status, silent past the liveness bound, the deadline, something the gateway itself
//! lacks — becomes a `Failed`: the kind `sluice_core::retry` judges (and metrics and traces
//! name), and what it leaves the client when it is not retried: the worker's own answer, the
//! gateway's refusal, or — for a worker judged unresponsive while the request waited — the wait
//! going on. `Forwarder::judge` is the only place that decides, for a single worker's attempts
//! and for both legs of a disaggregated pair alike.

use sluice_core::retry::{may_retry, AttemptFailure};
use tokio::time::Instant;
use tower::retry::budget::Budget;

use super::refusal::ForwardError;
use super::{Answer, Attempt, Forwarder};

/// An attempt that did not end in an answer to relay as it is.
pub(super) struct Failed<L = Left> {
    /// The worker it failed on, which the chooser skips if it is retried.
    pub(super) worker: u64,
    /// What the retry rule judges.
    pub(super) kind: AttemptFailure,
    /// What the client is left with when it is not retried.
    pub(super) left: L,
}

/// What a failed attempt leaves the client when no other worker gets the request. The answer
/// inline, as in `Tried`: boxing it would cost an allocation per retried answer.
#[allow(clippy::large_enum_variant)]
pub(super) enum Left {
    /// The worker's own answer (at capacity, an error status), relayed as it is: nothing of it
    /// reached the client yet, and it is the truest account of what happened.
    Relay(Answer),
    /// The gateway's refusal.
    Refuse(ForwardError),
}

impl Failed {
    /// A failure that is final whatever the budget: the deadline, a timeout, what the gateway
    /// itself cannot do.
    pub(super) fn refused(worker: u64, error: ForwardError) -> Self {
        Failed {
            worker,
            kind: AttemptFailure::Other,
            left: Left::Refuse(error),
        }
    }
}

impl Forwarder {
    /// The one judgment of a failed attempt: another worker (`Ok`: the failed one's key, and
    /// why) when the failure is of a safe kind with retries left (`sluice_core::retry`), the
    /// chooser has another worker, and the shared budget pays for it (withdrawn only when
    /// everything else allows); else what the failure leaves.
    pub(super) fn judge<L>(
        &self,
        failed: Failed<L>,
        at: &Attempt<'_>,
    ) -> Result<(u64, AttemptFailure), L> {
        let Failed { worker, kind, left } = failed;
        if !may_retry(kind, at.attempts - 1, self.retry.max_retries)
            || !at.job.chooser.has_another(worker)
        {
            return Err(left);
        }
        if !self.budget.withdraw() {
            self.metrics.retry_budget_exhausted.inc();
            return Err(left);
        }
        Ok((worker, kind))
    }
}

/// A transport failure of `worker`: refused before the request was sent or lost after (a
/// liveness signal), or a bad answer (contact, and the breaker's); and its kind in
/// `sluice_upstream_errors_total`.
pub(super) fn transport_failure(
    worker: &crate::fleet::Worker,
    e: &crate::upstream::SendError,
) -> (AttemptFailure, &'static str) {
    if e.is_bad_answer() {
        // Bytes came: the worker is there, its answer broken (the breaker's to judge).
        worker.signals.contact(Instant::now());
        return (AttemptFailure::BadAnswer, "bad_answer");
    }
    worker.signals.transport_failure(Instant::now());
    if e.is_connect() {
        (AttemptFailure::Connect, "connect")
    } else {
        (AttemptFailure::Dropped, "reset")
    }
}

/// Why an attempt is given up for another worker, as metrics and traces name it.
pub(super) fn retry_reason(failure: AttemptFailure) -> &'static str {
    match failure {
        AttemptFailure::AtCapacity => "at_capacity",
        AttemptFailure::Dropped => "dropped",
        AttemptFailure::ServerError => "status",
        AttemptFailure::Unresponsive => "unresponsive",
        AttemptFailure::BadAnswer => "bad_answer",
        _ => "connect",
    }
}
