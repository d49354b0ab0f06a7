//! The unresponsive rule's verdicts and the stickiness of vetoes that await progress, on
//! injected time: a silence across requests, streams owed their next token, the prefill
//! stretch where reports carry no stepping signal.

use super::tests::{quiet, secs, CFG};
use super::*;

/// A worker silent since `since`, with a poll that showed no step after it when `stood`.
fn silent(now: Instant, since: Instant, stood: u32, signal: bool) -> Observed {
    Observed {
        in_flight: 1,
        silence: Span {
            since: Some(since),
            last_stood: (stood > 0).then_some(since + Duration::from_millis(500)),
            signal,
            last_life: None,
            owed_until: None,
        },
        ..quiet(now)
    }
}

#[test]
fn a_wait_that_ended_before_the_bound_is_never_unresponsive() {
    // A client asked an idle, healthy engine once and left 10 ms later: the engine aborted it
    // before any step, so its polls stand. Nothing is owed after 10 ms: no verdict, ever.
    let t0 = Instant::now();
    let left = Observed {
        silence: Span {
            owed_until: Some(t0 + Duration::from_millis(10)),
            ..silent(t0, t0, 1, true).silence
        },
        in_flight: 0,
        ..quiet(t0)
    };
    for ms in [2_990, 3_000, 3_005, 5_000] {
        assert_eq!(
            judge(None, &left, &CFG, t0 + Duration::from_millis(ms)),
            None,
            "at {ms} ms"
        );
    }
    // Owed for the whole bound across requests, then left: the verdict stands.
    let gave_up = Observed {
        silence: Span {
            owed_until: Some(t0 + secs(5)),
            ..left.silence
        },
        ..left
    };
    assert_eq!(
        judge(None, &gave_up, &CFG, t0 + secs(5)),
        Some(LivenessVeto::Unresponsive)
    );
}

#[test]
fn a_silence_across_requests_with_a_standing_poll_is_unresponsive_at_the_bound() {
    let t0 = Instant::now();
    let hung = silent(t0, t0, 1, true);
    assert_eq!(judge(None, &hung, &CFG, t0 + secs(4)), None);
    assert_eq!(
        judge(None, &hung, &CFG, t0 + secs(5)),
        Some(LivenessVeto::Unresponsive)
    );
    let no_poll_yet = silent(t0, t0, 0, true);
    assert_eq!(
        judge(None, &no_poll_yet, &CFG, t0 + secs(60)),
        None,
        "a report with a stepping signal must have shown it standing"
    );
    let off = LivenessConfig {
        unresponsive: Duration::ZERO,
        ..CFG
    };
    assert_eq!(judge(None, &hung, &off, t0 + secs(60)), None);
}

#[test]
fn a_veto_awaiting_progress_stays_until_a_sign_of_life_after_it() {
    let t0 = Instant::now();
    let vetoed = Observed {
        vetoed_at: Some(t0 + secs(5)),
        ..quiet(t0 + secs(9))
    };
    for veto in [
        LivenessVeto::Unresponsive,
        LivenessVeto::EngineSilent,
        LivenessVeto::WedgedQueue,
        LivenessVeto::WedgedPile,
    ] {
        assert_eq!(
            judge(Some(veto), &vetoed, &CFG, t0 + secs(9)),
            Some(veto),
            "nothing owed any more is not life"
        );
        let before = Observed {
            silence: Span {
                last_life: Some(t0 + secs(4)),
                ..Span::default()
            },
            ..vetoed
        };
        assert_eq!(judge(Some(veto), &before, &CFG, t0 + secs(9)), Some(veto));
        let after = Observed {
            silence: Span {
                last_life: Some(t0 + secs(8)),
                ..Span::default()
            },
            ..vetoed
        };
        assert_eq!(judge(Some(veto), &after, &CFG, t0 + secs(9)), None);
    }
    assert_eq!(
        judge(Some(LivenessVeto::Unreachable), &vetoed, &CFG, t0 + secs(9)),
        None,
        "contact lifts an unreachable veto"
    );
}

#[test]
fn without_a_stepping_signal_the_unresponsive_bound_stretches_over_the_prefill_held() {
    let t0 = Instant::now();
    let o = Observed {
        prefill_allowance: secs(20),
        ..silent(t0, t0, 0, false)
    };
    assert_eq!(judge(None, &o, &CFG, t0 + secs(19)), None);
    assert_eq!(
        judge(None, &o, &CFG, t0 + secs(20)),
        Some(LivenessVeto::Unresponsive)
    );
    let stepping = Observed {
        prefill_allowance: secs(20),
        ..silent(t0, t0, 1, true)
    };
    assert_eq!(
        judge(None, &stepping, &CFG, t0 + secs(5)),
        Some(LivenessVeto::Unresponsive),
        "its own reports tell a prefill from a wedge"
    );
}

#[test]
fn streams_owed_their_next_token_are_silence_where_the_reports_show_steps() {
    let t0 = Instant::now();
    let streams = Observed {
        pile: 8,
        pile_at_progress: 8,
        pile_rule: false,
        in_flight: 8,
        last_progress: t0,
        silence: Span {
            last_stood: Some(t0 + secs(1)),
            signal: true,
            last_life: Some(t0 - secs(1)),
            ..Span::default()
        },
        ..quiet(t0)
    };
    assert_eq!(judge(None, &streams, &CFG, t0 + secs(4)), None);
    assert_eq!(
        judge(None, &streams, &CFG, t0 + secs(5)),
        Some(LivenessVeto::Unresponsive),
        "no token since the last one, no step in its reports"
    );
    let stepping = Observed {
        silence: Span {
            last_life: Some(t0 + secs(4)),
            last_stood: None,
            ..streams.silence
        },
        ..streams
    };
    assert_eq!(
        judge(None, &stepping, &CFG, t0 + secs(5)),
        None,
        "a step is life"
    );
}
