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
//!   `stale` while the gateway holds requests on it. Any contact clears it.
//! - **Wedged**: streams in flight on the worker, evidence it should be producing (a waiting
//!   queue in its report, or a pile of the gateway's streams that grew since the last progress or
//!   stands 4 deep), and no token for the wedge bound (`wedge`, stretched to the time in-flight
//!   prompts may still need in prefill, at most 120 s). Or, by itself, the engine's own silence:
//!   its generated-token counter did not move between two reports while it reported running
//!   requests (or waiting ones). Progress, an empty pile, or the evidence going away clears it.
//!
//! - **Unresponsive**: the worker takes requests and answers none, while looking healthy — its
//!   probes pass and its metrics report it idle. This gateway has held requests on it with no byte
//!   from any of them for `unresponsive`, and over the same span at least two of the engine's own
//!   reports counted fewer running and waiting requests than this gateway had unanswered on it:
//!   the engine does not even know it holds them. A busy engine doing long non-streaming work
//!   reports them running, so it is not caught. A first byte, or a report that accounts for
//!   them, clears it.
//!
//! Unreachable wins over wedged: a wedged worker whose link then fails is judged gone.

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
    /// The engine's own token counter stood still while it reported running requests.
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
            LivenessVeto::EngineSilent => "its token counter stood still with requests running",
            LivenessVeto::Unresponsive => {
                "requests held unanswered that its own reports do not account for"
            }
        })
    }
}

/// An earlier load report's reading of the engine's own progress counter (generated plus prompt
/// tokens), for `stalled_since`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    pub tokens: Option<f64>,
    pub at: Instant,
    /// What `stalled_since` said for that report.
    pub stalled_since: Option<Instant>,
}

/// Since when the engine's counter has stood still while it held requests: from the earlier of
/// the equal readings. `None` when it moved, is not reported, or the engine holds nothing.
pub fn stalled_since(
    prev: Option<&Reading>,
    tokens: Option<f64>,
    in_hand: bool,
) -> Option<Instant> {
    let prev = prev?;
    let still = in_hand && tokens.is_some() && prev.tokens == tokens;
    still.then(|| prev.stalled_since.unwrap_or(prev.at))
}

/// The engine's own silence is evidence of a wedge once it spans the wedge bound (never with the
/// wedge rule off).
pub fn engine_silent(stalled_since: Option<Instant>, now: Instant, wedge: Duration) -> bool {
    !wedge.is_zero() && stalled_since.is_some_and(|s| now.saturating_duration_since(s) >= wedge)
}

/// Weight of the newest sample in the prefill-rate average.
const RATE_WEIGHT: f64 = 0.2;

/// The prefill rate (prompt tokens per second) after one request's first byte came `ttft`
/// after it was sent with `prompt_tokens`: an exponential average, the first sample taken as is.
/// It underestimates (queueing counts too), which only makes the wedge bound more lenient.
/// `None` for a sample that says nothing.
pub fn prefill_rate(old: f64, prompt_tokens: u64, ttft: Duration) -> Option<f64> {
    if prompt_tokens == 0 || ttft.is_zero() {
        return None;
    }
    let sample = prompt_tokens as f64 / ttft.as_secs_f64();
    Some(if old > 0.0 {
        old + RATE_WEIGHT * (sample - old)
    } else {
        sample
    })
}

/// How long prompts waiting for prefill may still take: twice their tokens at the measured rate
/// (twice, as the rate is an estimate); zero until a rate is measured.
pub fn prefill_allowance(pending_tokens: u64, rate: f64) -> Duration {
    if rate <= 0.0 || pending_tokens == 0 {
        return Duration::ZERO;
    }
    Duration::try_from_secs_f64(2.0 * pending_tokens as f64 / rate).unwrap_or(Duration::MAX)
}

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
    /// Requests of any kind in flight on it through this gateway.
    pub in_flight: u64,
    /// Its reported waiting queue; `None` without a report or when the report has none.
    pub queue: Option<u64>,
    /// Its token counter stood still between its last two reports while requests ran.
    pub engine_silent: bool,
    /// How long the prompts in flight may still need in prefill.
    pub prefill_allowance: Duration,
    /// This gateway's unanswered requests against the engine's reports.
    pub unanswered: Unanswered,
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

/// Whether a report counts fewer requests than this gateway holds unanswered: a report that does
/// not account for them.
pub fn report_short(running: u64, waiting: u64, unanswered: u64) -> bool {
    running + waiting < unanswered
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
    let stale = (o.in_flight > 0 && timed_out_since_contact) || prev == Some(LivenessVeto::Stale);
    if !cfg.stale.is_zero() && stale && silence >= cfg.stale {
        return Some(LivenessVeto::Stale);
    }
    if unresponsive(&o.unanswered, cfg.unresponsive, now) {
        return Some(LivenessVeto::Unresponsive);
    }
    if cfg.wedge.is_zero() {
        return None;
    }
    if o.engine_silent {
        return Some(LivenessVeto::EngineSilent);
    }
    if o.pile == 0 {
        return None;
    }
    let bound = cfg.wedge.max(o.prefill_allowance.min(WEDGE_CAP));
    if now.saturating_duration_since(o.last_progress) < bound {
        return None;
    }
    if o.queue.is_some_and(|q| q > 0) {
        Some(LivenessVeto::WedgedQueue)
    } else if o.pile > o.pile_at_progress || o.pile >= DEEP_PILE {
        Some(LivenessVeto::WedgedPile)
    } else {
        None
    }
}

/// The unresponsive rule: unanswered for `bound`, and for as long every report — two at least —
/// fell short of them. Zero `bound` disables it.
fn unresponsive(u: &Unanswered, bound: Duration, now: Instant) -> bool {
    let (Some(since), Some(short_since)) = (u.since, u.short_since) else {
        return false;
    };
    !bound.is_zero()
        && u.short_reports >= 2
        && now.saturating_duration_since(since) >= bound
        && now.saturating_duration_since(short_since) >= bound
}

#[cfg(test)]
mod tests {
    use super::*;

    const CFG: LivenessConfig = LivenessConfig {
        stall: Duration::from_secs(2),
        wedge: Duration::from_secs(3),
        stale: Duration::from_secs(15),
        unresponsive: Duration::from_secs(5),
    };

    fn quiet(now: Instant) -> Observed {
        Observed {
            last_contact: now,
            last_failure: None,
            last_timeout: None,
            last_progress: now,
            pile: 0,
            pile_at_progress: 0,
            in_flight: 0,
            queue: None,
            engine_silent: false,
            prefill_allowance: Duration::ZERO,
            unanswered: Unanswered::default(),
        }
    }

    #[test]
    fn requests_the_engine_does_not_account_for_veto_it_as_unresponsive() {
        let t0 = Instant::now();
        let hung = Observed {
            in_flight: 3,
            unanswered: Unanswered {
                since: Some(t0),
                short_since: Some(t0 + secs(1)),
                short_reports: 2,
            },
            ..quiet(t0)
        };
        assert_eq!(
            judge(None, &hung, &CFG, t0 + secs(5)),
            None,
            "not a whole bound of short reports yet"
        );
        assert_eq!(
            judge(None, &hung, &CFG, t0 + secs(6)),
            Some(LivenessVeto::Unresponsive)
        );
        let one_report = Observed {
            unanswered: Unanswered {
                short_reports: 1,
                ..hung.unanswered
            },
            ..hung
        };
        assert_eq!(
            judge(None, &one_report, &CFG, t0 + secs(60)),
            None,
            "two reports at least"
        );
        let answered = Observed {
            unanswered: Unanswered {
                since: Some(t0 + secs(58)),
                ..hung.unanswered
            },
            ..hung
        };
        assert_eq!(
            judge(
                Some(LivenessVeto::Unresponsive),
                &answered,
                &CFG,
                t0 + secs(60)
            ),
            None,
            "a byte two seconds ago lifts it"
        );
        let accounted = Observed {
            unanswered: Unanswered {
                short_since: None,
                short_reports: 0,
                ..hung.unanswered
            },
            ..hung
        };
        assert_eq!(
            judge(None, &accounted, &CFG, t0 + secs(60)),
            None,
            "a busy engine reporting them running is not unresponsive"
        );
        let off = LivenessConfig {
            unresponsive: Duration::ZERO,
            ..CFG
        };
        assert_eq!(judge(None, &hung, &off, t0 + secs(60)), None);
    }

    #[test]
    fn a_report_is_short_when_it_counts_fewer_than_we_hold() {
        assert!(report_short(0, 0, 3));
        assert!(report_short(1, 1, 3));
        assert!(!report_short(2, 1, 3));
        assert!(!report_short(5, 0, 3), "other gateways' requests count too");
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn a_failure_after_silence_vetoes_at_once_and_contact_clears_it() {
        let t0 = Instant::now();
        let o = Observed {
            last_failure: Some(t0 + secs(5)),
            ..quiet(t0)
        };
        assert_eq!(
            judge(None, &o, &CFG, t0 + secs(5)),
            Some(LivenessVeto::Unreachable)
        );
        let heard = Observed {
            last_contact: t0 + secs(6),
            ..o
        };
        assert_eq!(
            judge(Some(LivenessVeto::Unreachable), &heard, &CFG, t0 + secs(6)),
            None
        );
    }

    #[test]
    fn a_failure_during_recent_contact_lands_at_the_stall_threshold() {
        let t0 = Instant::now();
        let o = Observed {
            last_failure: Some(t0 + Duration::from_millis(500)),
            ..quiet(t0)
        };
        assert_eq!(judge(None, &o, &CFG, t0 + Duration::from_millis(500)), None);
        assert_eq!(
            judge(None, &o, &CFG, t0 + Duration::from_millis(1999)),
            None
        );
        assert_eq!(
            judge(None, &o, &CFG, t0 + secs(2)),
            Some(LivenessVeto::Unreachable)
        );
        let zero_stall = LivenessConfig {
            stall: Duration::ZERO,
            ..CFG
        };
        assert_eq!(
            judge(None, &o, &zero_stall, t0 + Duration::from_millis(500)),
            Some(LivenessVeto::Unreachable),
            "stall 0 removes the silence requirement"
        );
    }

    #[test]
    fn a_failure_before_the_last_contact_is_forgiven() {
        let t0 = Instant::now();
        let o = Observed {
            last_failure: Some(t0),
            last_contact: t0 + secs(1),
            ..quiet(t0)
        };
        assert_eq!(judge(None, &o, &CFG, t0 + secs(60)), None);
    }

    #[test]
    fn total_silence_with_requests_held_is_stale_until_contact() {
        let t0 = Instant::now();
        let held = Observed {
            in_flight: 2,
            last_timeout: Some(t0 + secs(10)),
            ..quiet(t0)
        };
        let no_timeout = Observed {
            last_timeout: None,
            ..held
        };
        assert_eq!(
            judge(None, &no_timeout, &CFG, t0 + secs(60)),
            None,
            "a long answer with nothing asked of the worker meanwhile is not silence"
        );
        assert_eq!(judge(None, &held, &CFG, t0 + secs(14)), None);
        assert_eq!(
            judge(None, &held, &CFG, t0 + secs(15)),
            Some(LivenessVeto::Stale)
        );
        let idle = quiet(t0);
        assert_eq!(
            judge(None, &idle, &CFG, t0 + secs(100)),
            None,
            "nothing held: not judged"
        );
        assert_eq!(
            judge(Some(LivenessVeto::Stale), &idle, &CFG, t0 + secs(100)),
            Some(LivenessVeto::Stale),
            "ends with contact alone, not when the requests give up"
        );
        let heard = Observed {
            last_contact: t0 + secs(99),
            ..idle
        };
        assert_eq!(
            judge(Some(LivenessVeto::Stale), &heard, &CFG, t0 + secs(100)),
            None
        );
        let off = LivenessConfig {
            stale: Duration::ZERO,
            ..CFG
        };
        assert_eq!(judge(None, &held, &off, t0 + secs(1000)), None);
    }

    #[test]
    fn a_deep_or_growing_pile_without_tokens_is_wedged_after_the_bound() {
        let t0 = Instant::now();
        let deep = Observed {
            pile: 4,
            pile_at_progress: 4,
            in_flight: 4,
            ..quiet(t0)
        };
        assert_eq!(
            judge(None, &deep, &CFG, t0 + Duration::from_millis(2999)),
            None
        );
        assert_eq!(
            judge(None, &deep, &CFG, t0 + secs(3)),
            Some(LivenessVeto::WedgedPile)
        );
        let steady = Observed {
            pile: 2,
            pile_at_progress: 2,
            last_contact: t0 + secs(29), // its polls answer
            ..deep
        };
        assert_eq!(
            judge(None, &steady, &CFG, t0 + secs(30)),
            None,
            "no evidence: a long prefill"
        );
        let grew = Observed { pile: 3, ..steady };
        assert_eq!(
            judge(None, &grew, &CFG, t0 + secs(3)),
            Some(LivenessVeto::WedgedPile)
        );
        let progressed = Observed {
            last_progress: t0 + secs(2),
            ..deep
        };
        assert_eq!(
            judge(
                Some(LivenessVeto::WedgedPile),
                &progressed,
                &CFG,
                t0 + secs(3)
            ),
            None
        );
        let emptied = Observed {
            pile: 0,
            in_flight: 0,
            ..deep
        };
        assert_eq!(
            judge(
                Some(LivenessVeto::WedgedPile),
                &emptied,
                &CFG,
                t0 + secs(30)
            ),
            None
        );
    }

    #[test]
    fn a_queue_without_progress_is_wedged_and_a_report_without_one_clears_it() {
        let t0 = Instant::now();
        let o = Observed {
            pile: 1,
            pile_at_progress: 1,
            in_flight: 1,
            queue: Some(3),
            ..quiet(t0)
        };
        assert_eq!(
            judge(None, &o, &CFG, t0 + secs(3)),
            Some(LivenessVeto::WedgedQueue)
        );
        let drained = Observed {
            queue: Some(0),
            ..o
        };
        assert_eq!(
            judge(
                Some(LivenessVeto::WedgedQueue),
                &drained,
                &CFG,
                t0 + secs(4)
            ),
            None
        );
        let unreported = Observed { queue: None, ..o };
        assert_eq!(
            judge(
                Some(LivenessVeto::WedgedQueue),
                &unreported,
                &CFG,
                t0 + secs(4)
            ),
            None
        );
    }

    #[test]
    fn prefill_stretches_the_bound_up_to_the_cap() {
        let t0 = Instant::now();
        let o = Observed {
            pile: 5,
            pile_at_progress: 5,
            in_flight: 5,
            prefill_allowance: secs(20),
            last_contact: t0 + secs(200), // its polls answer throughout
            ..quiet(t0)
        };
        assert_eq!(judge(None, &o, &CFG, t0 + secs(19)), None);
        assert_eq!(
            judge(None, &o, &CFG, t0 + secs(20)),
            Some(LivenessVeto::WedgedPile)
        );
        let long = Observed {
            prefill_allowance: secs(1000),
            ..o
        };
        assert_eq!(judge(None, &long, &CFG, t0 + secs(119)), None);
        assert_eq!(
            judge(None, &long, &CFG, t0 + secs(120)),
            Some(LivenessVeto::WedgedPile)
        );
    }

    #[test]
    fn the_engines_own_silence_vetoes_by_itself_unless_wedging_is_off() {
        let t0 = Instant::now();
        let o = Observed {
            engine_silent: true,
            ..quiet(t0)
        };
        assert_eq!(judge(None, &o, &CFG, t0), Some(LivenessVeto::EngineSilent));
        let off = LivenessConfig {
            wedge: Duration::ZERO,
            ..CFG
        };
        assert_eq!(judge(None, &o, &off, t0), None);
        assert_eq!(LivenessVeto::EngineSilent.reason(), "wedged");
        assert_eq!(LivenessVeto::Stale.reason(), "unreachable");
    }

    #[test]
    fn the_counter_stalls_only_while_it_stands_still_with_work_in_hand() {
        let t0 = Instant::now();
        let first = Reading {
            tokens: Some(100.0),
            at: t0,
            stalled_since: None,
        };
        assert_eq!(
            stalled_since(None, Some(100.0), true),
            None,
            "one reading is not a stall"
        );
        assert_eq!(stalled_since(Some(&first), Some(100.0), true), Some(t0));
        assert_eq!(
            stalled_since(Some(&first), Some(101.0), true),
            None,
            "it moved"
        );
        assert_eq!(
            stalled_since(Some(&first), Some(100.0), false),
            None,
            "idle engines are still"
        );
        assert_eq!(
            stalled_since(Some(&first), None, true),
            None,
            "no counter, no opinion"
        );
        let second = Reading {
            tokens: Some(100.0),
            at: t0 + secs(10),
            stalled_since: Some(t0),
        };
        assert_eq!(
            stalled_since(Some(&second), Some(100.0), true),
            Some(t0),
            "since the first"
        );
        assert!(!engine_silent(
            Some(t0),
            t0 + Duration::from_millis(2999),
            CFG.wedge
        ));
        assert!(engine_silent(Some(t0), t0 + secs(3), CFG.wedge));
        assert!(
            !engine_silent(Some(t0), t0 + secs(300), Duration::ZERO),
            "wedge rule off"
        );
        assert!(!engine_silent(None, t0 + secs(300), CFG.wedge));
    }

    #[test]
    fn the_prefill_allowance_is_twice_the_pending_tokens_at_the_measured_rate() {
        assert_eq!(
            prefill_allowance(10_000, 0.0),
            Duration::ZERO,
            "no rate measured yet"
        );
        let rate = prefill_rate(0.0, 5_000, Duration::from_millis(500)).unwrap();
        assert_eq!(rate, 10_000.0, "the first sample as is");
        assert_eq!(prefill_allowance(10_000, rate), secs(2));
        let rate = prefill_rate(rate, 1_000, Duration::from_millis(500)).unwrap();
        assert!((rate - 8_400.0).abs() < 1e-6, "{rate}");
        assert_eq!(prefill_allowance(0, rate), Duration::ZERO);
        assert_eq!(prefill_rate(rate, 0, secs(1)), None);
        assert_eq!(prefill_rate(rate, 10, Duration::ZERO), None);
    }

    #[test]
    fn unreachable_wins_over_wedged() {
        let t0 = Instant::now();
        let o = Observed {
            pile: 4,
            pile_at_progress: 4,
            in_flight: 4,
            last_failure: Some(t0 + secs(1)),
            ..quiet(t0)
        };
        assert_eq!(
            judge(Some(LivenessVeto::WedgedPile), &o, &CFG, t0 + secs(5)),
            Some(LivenessVeto::Unreachable)
        );
    }
}
