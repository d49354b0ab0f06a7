//! Each liveness rule's verdicts, on injected time.

use super::*;

pub(super) const CFG: LivenessConfig = LivenessConfig {
    stall: Duration::from_secs(2),
    wedge: Duration::from_secs(3),
    stale: Duration::from_secs(15),
    unresponsive: Duration::from_secs(5),
    trials: true,
};

pub(super) fn quiet(now: Instant) -> Observed {
    Observed {
        last_contact: now,
        last_failure: None,
        last_timeout: None,
        last_progress: now,
        last_token: Some(now),
        pile: 0,
        pile_at_progress: 0,
        pile_rule: true,
        in_flight: 0,
        queue: None,
        engine_stalled_since: None,
        prefill_allowance: Duration::ZERO,
        silence: Span::default(),
        vetoed_at: None,
        pushed_load: false,
    }
}

pub(super) fn secs(s: u64) -> Duration {
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
        vetoed_at: Some(t0 + secs(1)),
        silence: Span {
            last_life: Some(t0 + secs(2)),
            ..Span::default()
        },
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
        vetoed_at: Some(t0 + secs(3)),
        ..deep
    };
    assert_eq!(
        judge(
            Some(LivenessVeto::WedgedPile),
            &emptied,
            &CFG,
            t0 + secs(30)
        ),
        Some(LivenessVeto::WedgedPile),
        "its streams leaving is no sign of life"
    );
}

#[test]
fn a_queue_without_progress_is_wedged_and_stays_so_when_the_queue_empties() {
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
    let vetoed = Some(t0 + secs(3));
    let drained = Observed {
        queue: Some(0),
        vetoed_at: vetoed,
        ..o
    };
    let unreported = Observed {
        queue: None,
        vetoed_at: vetoed,
        ..o
    };
    for o in [drained, unreported] {
        assert_eq!(
            judge(Some(LivenessVeto::WedgedQueue), &o, &CFG, t0 + secs(4)),
            Some(LivenessVeto::WedgedQueue),
            "an empty queue is not evidence of health"
        );
    }
}

#[test]
fn a_queue_behind_a_long_prefill_is_not_wedged_while_the_reports_step() {
    // Another client's 128k prompt fills every step's token budget: this gateway's requests
    // wait in the engine's queue with no token for many seconds, while the KV usage its
    // scheduler republishes moves with each chunk.
    let t0 = Instant::now();
    let stepping = |last_step: u64| Observed {
        pile: 2,
        pile_at_progress: 1,
        in_flight: 2,
        queue: Some(2),
        silence: Span {
            signal: true,
            last_life: Some(t0 + secs(last_step)),
            ..Span::default()
        },
        ..quiet(t0)
    };
    for s in 3..=30 {
        assert_eq!(
            judge(None, &stepping(s - 1), &CFG, t0 + secs(s)),
            None,
            "at {s} s"
        );
    }
    assert_eq!(
        judge(None, &stepping(10), &CFG, t0 + secs(13)),
        Some(LivenessVeto::WedgedQueue),
        "the wedge bound after the last step"
    );
    let no_signal = Observed {
        silence: Span {
            signal: false,
            ..stepping(12).silence
        },
        ..stepping(12)
    };
    assert_eq!(
        judge(None, &no_signal, &CFG, t0 + secs(13)),
        Some(LivenessVeto::WedgedQueue),
        "without a stepping signal a report's change says nothing of steps"
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
fn the_engines_own_silence_vetoes_by_itself_past_the_wedge_bound_unless_wedging_is_off() {
    let t0 = Instant::now();
    let o = Observed {
        engine_stalled_since: Some(t0),
        ..quiet(t0)
    };
    assert_eq!(
        judge(None, &o, &CFG, t0 + Duration::from_millis(2999)),
        None
    );
    assert_eq!(
        judge(None, &o, &CFG, t0 + secs(3)),
        Some(LivenessVeto::EngineSilent)
    );
    let off = LivenessConfig {
        wedge: Duration::ZERO,
        ..CFG
    };
    assert_eq!(judge(None, &o, &off, t0 + secs(300)), None);
    assert_eq!(LivenessVeto::EngineSilent.reason(), "wedged");
    assert_eq!(LivenessVeto::Stale.reason(), "unreachable");
}

#[test]
fn tokens_this_gateway_received_within_the_bound_outweigh_a_report_that_stands_still() {
    let t0 = Instant::now();
    // The report has stood still for 10 s, but a token came 250 ms ago: the engine steps, its
    // answers are only slow to come out.
    let trickling = Observed {
        engine_stalled_since: Some(t0),
        last_progress: t0 + secs(10) - Duration::from_millis(250),
        last_token: Some(t0 + secs(10) - Duration::from_millis(250)),
        pile: 1336,
        pile_at_progress: 1336,
        in_flight: 1336,
        ..quiet(t0)
    };
    assert_eq!(judge(None, &trickling, &CFG, t0 + secs(10)), None);
    // Then nothing for the bound either: wedged.
    let last = trickling.last_progress;
    let pile_started = Observed {
        last_token: None,
        ..trickling
    };
    assert_eq!(
        judge(None, &pile_started, &CFG, t0 + secs(10)),
        Some(LivenessVeto::EngineSilent),
        "a pile that began is no token"
    );
    assert_eq!(
        judge(None, &trickling, &CFG, last + secs(3)),
        Some(LivenessVeto::EngineSilent)
    );
}

#[test]
fn the_engines_silence_is_allowed_the_prefill_it_holds_for_this_gateway() {
    let t0 = Instant::now();
    let prefilling = Observed {
        engine_stalled_since: Some(t0),
        prefill_allowance: secs(8),
        ..quiet(t0)
    };
    assert_eq!(judge(None, &prefilling, &CFG, t0 + secs(7)), None);
    assert_eq!(
        judge(None, &prefilling, &CFG, t0 + secs(8)),
        Some(LivenessVeto::EngineSilent)
    );
    let endless = Observed {
        prefill_allowance: secs(100_000),
        ..prefilling
    };
    assert_eq!(
        judge(None, &endless, &CFG, t0 + WEDGE_CAP),
        Some(LivenessVeto::EngineSilent),
        "within the cap"
    );
}

#[test]
fn the_engine_stalls_only_while_nothing_in_its_stepping_moves_with_work_in_hand() {
    use crate::load::Stepping;
    let t0 = Instant::now();
    let at = |tokens: f64, kv_usage: f64| Some(Stepping { tokens, kv_usage });
    let first = Reading {
        stepping: at(100.0, 0.1),
        at: t0,
        stalled_since: None,
    };
    assert_eq!(
        stalled_since(None, at(100.0, 0.1), true),
        None,
        "one reading is not a stall"
    );
    assert_eq!(stalled_since(Some(&first), at(100.0, 0.1), true), Some(t0));
    assert_eq!(
        stalled_since(Some(&first), at(101.0, 0.1), true),
        None,
        "a token"
    );
    assert_eq!(
        stalled_since(Some(&first), at(100.0, 0.2), true),
        None,
        "a prefill chunk took KV blocks"
    );
    assert_eq!(
        stalled_since(Some(&first), at(100.0, 0.1), false),
        None,
        "idle engines are still"
    );
    assert_eq!(
        stalled_since(Some(&first), None, true),
        None,
        "no counter, no opinion"
    );
    let second = Reading {
        stepping: at(100.0, 0.1),
        at: t0 + secs(10),
        stalled_since: Some(t0),
    };
    assert_eq!(
        stalled_since(Some(&second), at(100.0, 0.1), true),
        Some(t0),
        "since the first"
    );
}

#[test]
fn the_prefill_allowance_is_twice_the_pending_tokens_at_the_learned_rate_stretched_for_attention() {
    assert_eq!(
        prefill_allowance(10_000, 0.0),
        Duration::ZERO,
        "no rate measured yet"
    );
    let rate = 10_000.0;
    let allowance = prefill_allowance(10_000, rate).as_secs_f64();
    assert!(
        (allowance - 2.0 * (1.0 + 10_000.0 / 32_768.0)).abs() < 1e-9,
        "{allowance}"
    );
    // 128k tokens at 10k a second: twice 13.1 s, stretched five times for attention.
    let long = prefill_allowance(131_072, rate).as_secs_f64();
    assert!((long - 2.0 * 13.1072 * 5.0).abs() < 1e-6, "{long}");
    assert_eq!(prefill_allowance(0, rate), Duration::ZERO);
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

#[test]
fn a_worker_that_pushed_load_records_is_stale_after_total_silence_with_nothing_held() {
    let t0 = Instant::now();
    let pushed = Observed {
        pushed_load: true,
        ..quiet(t0)
    };
    assert_eq!(judge(None, &pushed, &CFG, t0 + secs(14)), None);
    assert_eq!(
        judge(None, &pushed, &CFG, t0 + secs(15)),
        Some(LivenessVeto::Stale),
        "held to its cadence: silence alone, nothing in flight"
    );
    let polled_only = quiet(t0);
    assert_eq!(
        judge(None, &polled_only, &CFG, t0 + secs(60)),
        None,
        "a worker that never pushed is not judged by silence while nothing waits on it"
    );
    let heard = Observed {
        last_contact: t0 + secs(20),
        ..pushed
    };
    assert_eq!(
        judge(Some(LivenessVeto::Stale), &heard, &CFG, t0 + secs(21)),
        None,
        "any contact (a record, a poll, a probe, a token) re-admits it"
    );
    let off = LivenessConfig {
        stale: Duration::ZERO,
        ..CFG
    };
    assert_eq!(
        judge(None, &pushed, &off, t0 + secs(600)),
        None,
        "0 disables the rule"
    );
}

#[test]
fn an_http_workers_streams_form_no_pile_but_still_show_its_queue_held() {
    let t0 = Instant::now();
    let http = Observed {
        pile: 6,
        pile_at_progress: 2,
        pile_rule: false,
        in_flight: 6,
        ..quiet(t0)
    };
    let later = t0 + secs(10);
    assert_eq!(
        judge(None, &http, &CFG, later),
        None,
        "a deep, growing pile of HTTP streams is not evidence (seed 000)"
    );
    let queued = Observed {
        queue: Some(3),
        ..http
    };
    assert_eq!(
        judge(None, &queued, &CFG, later),
        Some(LivenessVeto::WedgedQueue),
        "streams held and a waiting queue without progress are"
    );
}
