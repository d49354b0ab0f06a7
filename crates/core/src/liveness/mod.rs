//! Liveness vetoes: a worker that is gone, or up but producing nothing, is kept out of routing
//! long before the health checker's probes would demote it.
//!
//! `judge` is a pure function of what the gateway has observed of one worker; a checker calls it
//! several times a second, so a veto lands at its threshold rather than at the next poll.
//!
//! - **Unreachable** (transport): a connection-level failure (refused, reset) while nothing was
//!   heard from the worker for `stall`. A failure while contact is recent is remembered, and the
//!   veto lands once the silence reaches `stall`. Any contact clears it. Request deadlines and
//!   engine errors are not transport failures and never arm it.
//! - **Unreachable** (stale): nothing at all arrives — polls and probes time out rather than
//!   fail (at least one has, since the last contact), requests in flight get no byte — for
//!   `stale` while the gateway holds requests on it; or, for a worker that has pushed a load
//!   record (a gRPC worker's event stream, which carries one with every batch and a heartbeat
//!   through quiet spells), nothing heard for `stale` at all, requests held or not. Any contact
//!   clears it.
//! - **Wedged**: streams in flight on the worker, evidence it should be producing (a waiting
//!   queue in its report, or a pile of the gateway's streams that grew since the last progress or
//!   stands 4 deep), and no token for the wedge bound (`wedge`, stretched to the time in-flight
//!   prompts may still need in prefill, at most 120 s). Or, by itself, the engine's own silence:
//!   nothing in its stepping moved between two reports (its token counters, and the KV usage its
//!   scheduler republishes every step) while it reported requests in hand, for the same bound.
//!   vLLM counts a prompt only when its prefill ends, so the counters stand still through a long
//!   prefill; the KV usage, allocated chunk by chunk, does not. Progress, an empty pile, or the
//!   evidence going away clears it.
//!
//! - **Unresponsive**: the worker takes requests and answers none, while looking healthy — its
//!   probes pass and its metrics report it idle. This gateway has held requests on it with no byte
//!   from any of them for `unresponsive`, and over the same span at least two of the engine's own
//!   reports counted fewer running and waiting requests than this gateway had unanswered on it:
//!   the engine does not even know it holds them. A busy engine doing long non-streaming work
//!   reports them running, so it is not caught; SGLang's request in chunked prefill, in neither
//!   of its counts, is accounted for by its pending prefill tokens (`LoadReport::in_hand`), and
//!   where an engine reports no such figure the bound stretches like the wedge bound. A first
//!   byte, or a report that accounts for them, clears it.
//!
//! Unreachable wins over wedged: a wedged worker whose link then fails is judged gone.

mod progress;

use std::fmt;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

/// The longest a wedge bound may be stretched for prefill.
pub const WEDGE_CAP: Duration = Duration::from_secs(120);
/// A pile of streams this deep is evidence by itself.
pub const DEEP_PILE: u32 = 4;

/// The thresholds (`--worker-stall-secs`, `--worker-wedge-secs`, `--worker-stale-secs`,
/// `--worker-unresponsive-secs`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LivenessConfig {
    /// Silence needed before a transport failure vetoes (0: the first failure does).
    pub stall: Duration,
    /// Wedge bound; zero disables the wedge rule.
    pub wedge: Duration,
    /// Total silence with requests held that vetoes; zero disables the rule.
    pub stale: Duration,
    /// Unanswered requests the engine does not account for, for this long, veto; zero disables.
    pub unresponsive: Duration,
}

impl Default for LivenessConfig {
    fn default() -> Self {
        Self {
            stall: Duration::from_secs(2),
            wedge: Duration::from_secs(3),
            stale: Duration::from_secs(15),
            unresponsive: Duration::from_secs(5),
        }
    }
}

/// A liveness veto and its cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LivenessVeto {
    /// A connection-level failure, then silence.
    Unreachable,
    /// Requests held, and nothing at all heard for the stale bound.
    Stale,
    /// A waiting queue and no progress.
    WedgedQueue,
    /// A growing or deep pile of streams and no progress.
    WedgedPile,
    /// The engine's own reports showed no step while it held requests.
    EngineSilent,
    /// Requests held unanswered that the engine's own reports do not account for.
    Unresponsive,
}

impl LivenessVeto {
    /// The `reason` label: `unreachable`, `wedged` or `unresponsive`.
    pub fn reason(self) -> &'static str {
        match self {
            LivenessVeto::Unreachable | LivenessVeto::Stale => "unreachable",
            LivenessVeto::WedgedQueue | LivenessVeto::WedgedPile | LivenessVeto::EngineSilent => {
                "wedged"
            }
            LivenessVeto::Unresponsive => "unresponsive",
        }
    }
}

impl fmt::Display for LivenessVeto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LivenessVeto::Unreachable => "connection failed and nothing heard since",
            LivenessVeto::Stale => "requests held and nothing heard at all",
            LivenessVeto::WedgedQueue => "a waiting queue and no token",
            LivenessVeto::WedgedPile => "a growing or deep pile of streams and no token",
            LivenessVeto::EngineSilent => "its reports showed no step with requests in hand",
            LivenessVeto::Unresponsive => {
                "requests held unanswered that its own reports do not account for"
            }
        })
    }
}

pub use progress::{
    leg_silence_bound, prefill_allowance, prefill_rate, stalled_since, wedge_bound, Reading,
};

/// What the gateway has observed of one worker.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observed {
    /// Anything heard: a response byte, an answered poll, a passing probe.
    pub last_contact: Instant,
    /// The last connection-level failure (refused, reset) on any of its channels.
    pub last_failure: Option<Instant>,
    /// The last poll or probe that timed out.
    pub last_timeout: Option<Instant>,
    /// The last token or completion, or when the current pile of streams started.
    pub last_progress: Instant,
    /// Streams in flight on it through this gateway.
    pub pile: u32,
    /// The pile when progress was last seen.
    pub pile_at_progress: u32,
    /// The pile rule applies: the streams are gRPC generations, whose tokens arrive as the
    /// engine makes them. An HTTP worker's streams only show that requests are held (the queue
    /// rule's evidence); they never form a pile to be judged by (seed 000).
    pub pile_rule: bool,
    /// Requests of any kind in flight on it through this gateway.
    pub in_flight: u64,
    /// Its reported waiting queue; `None` without a report or when the report has none.
    pub queue: Option<u64>,
    /// Since when its reports have shown no step while it held requests (two reports at least).
    pub engine_stalled_since: Option<Instant>,
    /// How long the prompts in flight may still need in prefill.
    pub prefill_allowance: Duration,
    /// This gateway's unanswered requests against the engine's reports.
    pub unanswered: Unanswered,
    /// It has pushed a load record (a gRPC worker's event stream, whose servicer sends one with
    /// every batch and a heartbeat through quiet spells): from then on it is held to that
    /// cadence, and total silence for the stale bound means it is gone whether or not this
    /// gateway holds requests on it. Workers that only answer polls are judged by silence only
    /// while requests wait on them.
    pub pushed_load: bool,
}

/// What the unresponsive rule reads.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Unanswered {
    /// Since when this gateway has held requests on the worker with no byte from any of them.
    pub since: Option<Instant>,
    /// Since when every load report counted fewer running and waiting requests than this gateway
    /// had unanswered on the worker at that report.
    pub short_since: Option<Instant>,
    /// The reports of that streak.
    pub short_reports: u32,
}

/// How many of this gateway's unanswered requests a report does not account for: those beyond
/// the requests it says it holds (`LoadReport::in_hand`). Once a worker is unresponsive, that
/// many may go elsewhere (the engine never held them).
pub fn unaccounted(in_hand: u64, unanswered: u64) -> u64 {
    unanswered.saturating_sub(in_hand)
}

/// Whether a report counts fewer requests than this gateway holds unanswered: a report that does
/// not account for them.
pub fn report_short(in_hand: u64, unanswered: u64) -> bool {
    unaccounted(in_hand, unanswered) > 0
}

/// The veto, if any, that `o` calls for at `now`. `prev` is the veto in force, which the stale
/// rule keeps until contact even once the requests that armed it are gone.
pub fn judge(
    prev: Option<LivenessVeto>,
    o: &Observed,
    cfg: &LivenessConfig,
    now: Instant,
) -> Option<LivenessVeto> {
    let silence = now.saturating_duration_since(o.last_contact);
    let failed_since_contact = o.last_failure.is_some_and(|f| f >= o.last_contact);
    if failed_since_contact && silence >= cfg.stall {
        return Some(LivenessVeto::Unreachable);
    }
    let timed_out_since_contact = o.last_timeout.is_some_and(|t| t >= o.last_contact);
    let stale = o.pushed_load
        || (o.in_flight > 0 && timed_out_since_contact)
        || prev == Some(LivenessVeto::Stale);
    if !cfg.stale.is_zero() && stale && silence >= cfg.stale {
        return Some(LivenessVeto::Stale);
    }
    if unresponsive(&o.unanswered, cfg.unresponsive, o.prefill_allowance, now) {
        return Some(LivenessVeto::Unresponsive);
    }
    if cfg.wedge.is_zero() {
        return None;
    }
    let bound = wedge_bound(cfg.wedge, o.prefill_allowance);
    // Tokens this gateway received from it within the bound outweigh its reports: an engine
    // whose report stands still while its answers trickle out (a starved API process writing
    // out one step's tokens for longer than the bound) is slow, not wedged.
    let progressing = now.saturating_duration_since(o.last_progress) < bound;
    if !progressing
        && o.engine_stalled_since
            .is_some_and(|since| now.saturating_duration_since(since) >= bound)
    {
        return Some(LivenessVeto::EngineSilent);
    }
    if o.pile == 0 {
        return None;
    }
    if now.saturating_duration_since(o.last_progress) < bound {
        return None;
    }
    if o.queue.is_some_and(|q| q > 0) {
        Some(LivenessVeto::WedgedQueue)
    } else if o.pile_rule && (o.pile > o.pile_at_progress || o.pile >= DEEP_PILE) {
        Some(LivenessVeto::WedgedPile)
    } else {
        None
    }
}

/// The unresponsive rule: unanswered for `bound` (or, when longer, the time the prompts held may
/// still need in prefill), and for as long every report — two at least — fell short of them.
/// Zero `bound` disables it.
fn unresponsive(u: &Unanswered, bound: Duration, allowance: Duration, now: Instant) -> bool {
    let (Some(since), Some(short_since)) = (u.since, u.short_since) else {
        return false;
    };
    if bound.is_zero() {
        return false;
    }
    let bound = wedge_bound(bound, allowance);
    u.short_reports >= 2
        && now.saturating_duration_since(since) >= bound
        && now.saturating_duration_since(short_since) >= bound
}

#[cfg(test)]
mod tests;
