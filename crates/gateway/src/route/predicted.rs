//! The `predicted` policy's inputs: how much of the prompt each candidate is claimed to hold
//! cached (its prefix score, over the part of the prompt the score was matched on; taken at the
//! credit the candidate's engine gives such claims), and each candidate's predicted latency for
//! the request from its own latency model, which `sluice_core::latency::place` places by.

use std::sync::Arc;
use std::time::Duration;

use sluice_core::latency::{claimed_cached, lateness, place, Placed};
use sluice_core::policy::{Candidate, RouteInput};

use super::RouteRequest;
use crate::fleet::{Lease, Worker};

/// Prompt tokens per approximate prefix block: the index's 64-byte blocks at about four bytes
/// a token, the ratio the prompt-size estimate uses.
const TOKENS_PER_BLOCK: u64 = 16;

/// The prompt tokens each candidate is claimed to hold cached, from its prefix match as the
/// policy scored it (`input.prefix_blocks` of the prompt; a share of `PREFIX_SHARE_SCALE` where
/// engines' KV events scored it, `precise`).
pub(super) fn claimed_on(
    request: &RouteRequest,
    candidates: &[Candidate],
    input: &RouteInput,
    precise: bool,
) -> Vec<u64> {
    let covered = if precise {
        super::held::MAX_MATCHED_TOKENS as u64
    } else {
        request.blocks.len() as u64 * TOKENS_PER_BLOCK
    };
    candidates
        .iter()
        .map(|c| {
            let share = if input.prefix_blocks == 0 {
                0.0
            } else {
                f64::from(c.prefix_match) / f64::from(input.prefix_blocks)
            };
            claimed_cached(request.prompt_tokens, share, covered)
        })
        .collect()
}

/// The candidate the predictions place the request on; `None` while one is not learned yet
/// (the policy's fallback chooses). With none predicted to meet the objectives, the soonest:
/// whether the request goes at all was judged before (`late`).
pub(super) fn placed(
    workers: &[&Arc<Worker>],
    request: &RouteRequest,
    claimed: &[u64],
) -> Option<usize> {
    let prompt = request.prompt_tokens;
    let predictions: Vec<_> = workers
        .iter()
        .zip(claimed)
        .map(|(w, &cached)| w.predict(w.latency.uncached(prompt, cached), request.weight))
        .collect();
    match place(&predictions, request.objectives.as_ref()) {
        Placed::Meets(i) | Placed::NoneMeets(i) => Some(i),
        Placed::Unknown => None,
    }
}

/// How late the request's first token is predicted to be on the worker `lease` holds, and the
/// objective it misses; `None` when in time, unknown, or unbounded.
pub(super) fn late(lease: &Lease, request: &RouteRequest) -> Option<(Duration, Duration)> {
    let objective = request.objectives?.ttft;
    let predicted = lease.predicted(request.prompt_tokens)?.ttft;
    lateness(Some(predicted), Some(objective)).map(|_| (objective, predicted))
}

/// A Retry-After for a request predicted `by` late: when the work ahead of it should have
/// drained that much, in whole seconds, at least one.
pub(super) fn retry_after(by: Duration) -> Duration {
    Duration::from_secs(by.as_secs_f64().ceil().max(1.0) as u64)
}
