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
//!   stands 4 deep), and no token — nor, where its reports carry a stepping signal, a step —
//!   for the wedge bound (`wedge`, stretched to the time in-flight
//!   prompts may still need in prefill, at most 120 s). Or, by itself, the engine's own silence:
//!   nothing in its stepping moved between two reports (its token counters, and the KV usage its
//!   scheduler republishes every step) while it reported requests in hand, for the same bound.
//!   vLLM counts a prompt only when its prefill ends, so the counters stand still through a long
//!   prefill; the KV usage, allocated chunk by chunk, does not. Progress, an empty pile, or the
//!   evidence going away clears it.
//!
//! - **Unresponsive**: the worker owes this gateway answers and gives none, while nothing it
//!   reports explains the wait. Its silence (`Silence`) runs from the first request sent to it
//!   that got no byte, across requests — a client leaving, a deadline or a retry elsewhere ends
//!   the request, not the evidence — until a byte comes back or a report shows its engine
//!   stepped. Where its reports carry a stepping signal, at least one poll since the silence
//!   began must have shown the engine standing still (or gone unanswered): a long prefill moves
//!   the KV usage with every chunk, so it is never taken for a wedge. Where they carry none,
//!   the bound stretches like the wedge bound, over the prefill this gateway knows it sent.
//!
//! A veto that waits on progress (wedged, engine silent, unresponsive) stays until a sign of
//! life after it was set: a byte on a request (a trial's included), or a report whose stepping
//! moved. A report that stands still, an empty queue, or the requests that armed it leaving is
//! not evidence of health. Unreachable and stale lift on contact, as before.
//!
//! Unreachable wins over wedged: a wedged worker whose link then fails is judged gone.

mod progress;
mod silence;

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
    /// A silence across requests this long, with nothing in its reports to explain it, vetoes;
    /// zero disables.
    pub unresponsive: Duration,
    /// Trials while a worker is out for a veto that awaits progress (`--disable-liveness-trials`
    /// turns them off).
    pub trials: bool,
}

impl Default for LivenessConfig {
    fn default() -> Self {
        Self {
            stall: Duration::from_secs(2),
            wedge: Duration::from_secs(3),
            stale: Duration::from_secs(15),
            unresponsive: Duration::from_secs(3),
            trials: true,
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
    /// Requests sent and unanswered across requests, and no step in its reports.
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

/// What a liveness trial — a one-token generation sent to a worker out for a veto that awaits
/// progress — came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TrialVerdict {
    /// It generated: the engine steps, and the worker is readmitted.
    Answered,
    /// It answered with an error status, or an answer that broke off: no proof its engine steps.
    Refused,
    /// No answer within the trial's time.
    Timeout,
    /// The connection failed.
    Unreachable,
}

impl TrialVerdict {
    pub const ALL: [TrialVerdict; 4] = [
        TrialVerdict::Answered,
        TrialVerdict::Refused,
        TrialVerdict::Timeout,
        TrialVerdict::Unreachable,
    ];

    /// The `verdict` label.
    pub fn label(self) -> &'static str {
        match self {
            TrialVerdict::Answered => "answered",
            TrialVerdict::Refused => "refused",
            TrialVerdict::Timeout => "timeout",
            TrialVerdict::Unreachable => "unreachable",
        }
    }
}

impl LivenessVeto {
    /// Whether the veto lifts only on a sign of life (a byte, a step), not on contact.
    pub fn awaits_progress(self) -> bool {
        !matches!(self, LivenessVeto::Unreachable | LivenessVeto::Stale)
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
                "requests sent and unanswered, and nothing in its reports explains the wait"
            }
        })
    }
}

pub use progress::{leg_silence_bound, prefill_allowance, stalled_since, wedge_bound, Reading};
pub use silence::{PollShowed, Silence, Span};

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
    /// The last token or completion alone.
    pub last_token: Option<Instant>,
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
    /// Its silence across requests, and its last sign of life.
    pub silence: Span,
    /// When the liveness veto in force was set.
    pub vetoed_at: Option<Instant>,
    /// It has pushed a load record (a gRPC worker's event stream, whose servicer sends one with
    /// every batch and a heartbeat through quiet spells): from then on it is held to that
    /// cadence, and total silence for the stale bound means it is gone whether or not this
    /// gateway holds requests on it. Workers that only answer polls are judged by silence only
    /// while requests wait on them.
    pub pushed_load: bool,
}

/// The veto, if any, that `o` calls for at `now`. `prev` is the veto in force: the stale rule
/// keeps it until contact even once the requests that armed it are gone, and a veto that awaits
/// progress keeps it until a sign of life after `o.vetoed_at`.
pub fn judge(
    prev: Option<LivenessVeto>,
    o: &Observed,
    cfg: &LivenessConfig,
    now: Instant,
) -> Option<LivenessVeto> {
    if let Some(gone) = unreachable(prev, o, cfg, now) {
        return Some(gone);
    }
    let fresh = progress_veto(o, cfg, now);
    if fresh.is_some() {
        return fresh;
    }
    prev.filter(|p| p.awaits_progress() && !alive_since_veto(o))
}

/// A sign of life (a byte on a request, a step in a report) since the veto was set.
fn alive_since_veto(o: &Observed) -> bool {
    match (o.silence.last_life, o.vetoed_at) {
        (Some(life), Some(vetoed)) => life > vetoed,
        _ => false,
    }
}

/// The rules of contact: a transport failure then silence, or total silence.
fn unreachable(
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
    (!cfg.stale.is_zero() && stale && silence >= cfg.stale).then_some(LivenessVeto::Stale)
}

/// The rules of progress, on what is observed now: engine silent or wedged (the more specific
/// verdicts), else unresponsive.
fn progress_veto(o: &Observed, cfg: &LivenessConfig, now: Instant) -> Option<LivenessVeto> {
    wedged(o, cfg, now).or_else(|| {
        unresponsive(&owed(o), cfg.unresponsive, o.prefill_allowance, now)
            .then_some(LivenessVeto::Unresponsive)
    })
}

/// The silence as the unresponsive rule judges it: requests owed a first byte (`Silence`), or
/// streams in flight owed their next token — since the pile began or its last token, and never
/// before the last sign of life — whichever began first. Streams count only where the worker's
/// reports carry a stepping signal, which tells a long prefill (no token, but steps) apart; where
/// they carry none, a pile of streams is no evidence (seed 000).
fn owed(o: &Observed) -> Span {
    let streams = (o.pile > 0 && o.silence.signal).then(|| match o.silence.last_life {
        Some(life) => o.last_progress.max(life),
        None => o.last_progress,
    });
    let since = match (o.silence.since, streams) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    Span {
        since,
        // Streams in flight are owed now.
        owed_until: o.silence.owed_until.filter(|_| streams.is_none()),
        ..o.silence
    }
}

/// The wedge rules: the engine's own silence, a waiting queue or a pile without progress.
fn wedged(o: &Observed, cfg: &LivenessConfig, now: Instant) -> Option<LivenessVeto> {
    if cfg.wedge.is_zero() {
        return None;
    }
    let bound = wedge_bound(cfg.wedge, o.prefill_allowance);
    // Tokens this gateway received from it within the bound outweigh its reports: an engine
    // whose report stands still while its answers trickle out (a starved API process writing
    // out one step's tokens for longer than the bound) is slow, not wedged.
    let progressing = o
        .last_token
        .is_some_and(|t| now.saturating_duration_since(t) < bound);
    if !progressing
        && o.engine_stalled_since
            .is_some_and(|since| now.saturating_duration_since(since) >= bound)
    {
        return Some(LivenessVeto::EngineSilent);
    }
    // Where its reports carry a stepping signal, a step is progress too: a long prefill holds
    // back everything queued behind it and sends no token for its length, but its KV usage
    // moves with every chunk.
    let progress = match o.silence.last_life {
        Some(step) if o.silence.signal => o.last_progress.max(step),
        _ => o.last_progress,
    };
    if o.pile == 0 || now.saturating_duration_since(progress) < bound {
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

/// The unresponsive rule: a silence across requests of `bound`. Where the worker's reports
/// carry a stepping signal, a poll since the silence began must have shown no step (a long
/// prefill moves it); where they carry none, the bound stretches over the prefill this gateway
/// sent, like the wedge bound. Zero `bound` disables it.
fn unresponsive(s: &Span, bound: Duration, allowance: Duration, now: Instant) -> bool {
    let Some(since) = s.since else {
        return false;
    };
    let stood_since = s.last_stood.is_some_and(|t| t >= since);
    if bound.is_zero() || (s.signal && !stood_since) {
        return false;
    }
    let bound = if s.signal {
        bound
    } else {
        wedge_bound(bound, allowance)
    };
    let end = s.owed_until.map_or(now, |until| until.min(now));
    end.saturating_duration_since(since) >= bound
}

#[cfg(test)]
mod clients_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod unresponsive_tests;
