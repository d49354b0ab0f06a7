//! A worker's silence across requests: since when it has owed this gateway an answer with
//! none coming back and nothing in its reports to explain the wait.
//!
//! A request that ends without a byte — its client timed out, its deadline passed, it was
//! retried elsewhere — ends the request, not the evidence: the next request sent to the worker
//! continues the same silence. Only a sign of life ends it: a byte from the worker on any
//! request, or a report showing its engine stepped (for vLLM the token counters or the KV usage
//! its scheduler republishes after every step; for SGLang the KV tokens in use and the prompt
//! tokens still to prefill, both of which move with every prefill chunk). A report that stands
//! still, or a poll nobody answers, is the opposite: the engine shows no reason for the wait.
//!
//! A silence stops counting once nothing has been owed for a whole `gap`: a healthy engine that
//! was asked once by a client who left at once, and then not again, is not silent for ever.

use std::time::Duration;

use tokio::time::Instant;

use crate::load::LoadReport;

/// What a load poll said of the engine's stepping, for `Silence::polled`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollShowed {
    /// Its stepping moved since the previous report: it is working.
    Stepped,
    /// Its stepping stood still since the previous report.
    Stood,
    /// The poll got no answer (it timed out or failed): no reason shown either.
    Unanswered,
    /// An answer that carries no stepping signal: no opinion.
    NoSignal,
    /// A first reading with a stepping signal, nothing to compare it with yet.
    Baseline,
}

impl PollShowed {
    /// What `report` says of the engine's stepping against the one before it, if any.
    pub fn between(previous: Option<&LoadReport>, report: &LoadReport) -> PollShowed {
        match (previous.and_then(LoadReport::stepping), report.stepping()) {
            (_, None) => PollShowed::NoSignal,
            (None, Some(_)) => PollShowed::Baseline,
            (Some(before), Some(now)) if before == now => PollShowed::Stood,
            (Some(_), Some(_)) => PollShowed::Stepped,
        }
    }
}

/// One worker's silence, moved by the request path (`sent`, `abandoned`, `answered`) and the
/// load monitor (`polled`), read by the liveness checker (`span`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Silence {
    /// When the first request sent since the last sign of life went out; `None`: nothing owed.
    since: Option<Instant>,
    /// When the last request pending on it ended without a byte, leaving none pending.
    abandoned: Option<Instant>,
    /// The last poll that showed no step (standing, or unanswered) since the last sign of life.
    last_stood: Option<Instant>,
    /// Its reports carry a stepping signal (the last answered poll had one).
    signal: bool,
    /// The last byte on a request, or the last step a report showed.
    last_life: Option<Instant>,
}

/// The silence as the checker judges it at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Span {
    /// Since when it has owed an answer, counting across requests; `None`: nothing owed, or
    /// nothing for a whole gap.
    pub since: Option<Instant>,
    /// The last poll since the last sign of life that showed no step: a verdict on a worker
    /// whose reports carry a stepping signal needs one after the silence began.
    pub last_stood: Option<Instant>,
    /// Its reports carry a stepping signal, so a standing poll is needed before a verdict.
    pub signal: bool,
    /// The last sign of life: a byte on a request, or a step in a report.
    pub last_life: Option<Instant>,
    /// When the last request owed an answer stopped waiting, while none waits now; `None`
    /// while one waits. The silence is measured to here: a wait nobody shares any more is no
    /// longer evidence, however long ago it began.
    pub owed_until: Option<Instant>,
}

impl Silence {
    /// A request was sent at `at` while none of this gateway's was waiting for a byte from it.
    /// It continues the silence running, unless nothing was owed for a whole `gap` before.
    pub fn sent(&mut self, at: Instant, gap: Duration) {
        let lapsed = self
            .abandoned
            .is_some_and(|e| at.saturating_duration_since(e) >= gap);
        if self.since.is_none() || lapsed {
            self.since = Some(at);
        }
        self.abandoned = None;
    }

    /// The last request waiting on it ended at `at` without a byte: the silence goes on.
    pub fn abandoned(&mut self, at: Instant) {
        if self.since.is_some() {
            self.abandoned = Some(at);
        }
    }

    /// A stream owed its next token since `owed_since` ended at `at` without it (its client
    /// left): like a request that ended without a byte, it leaves the silence running, from
    /// when the token was owed or the last sign of life since. Only where the reports carry a
    /// stepping signal, for elsewhere a stream waiting is no evidence (seed 000).
    pub fn stream_left(&mut self, owed_since: Instant, at: Instant) {
        if !self.signal {
            return;
        }
        let owed = self.last_life.map_or(owed_since, |l| l.max(owed_since));
        self.since = Some(self.since.map_or(owed, |s| s.min(owed)));
        self.abandoned = Some(at);
    }

    /// A byte came back at `at`; `still` requests remain without one, whose wait counts afresh.
    pub fn answered(&mut self, at: Instant, still: bool) {
        self.life(at, still);
    }

    /// A load poll ended at `at` with `polled`; `pending`: requests of this gateway's wait on it.
    pub fn polled(&mut self, at: Instant, polled: PollShowed, pending: bool) {
        match polled {
            PollShowed::Stepped => {
                self.signal = true;
                self.life(at, pending);
            }
            PollShowed::Stood => {
                self.signal = true;
                self.last_stood = Some(at);
            }
            PollShowed::Unanswered => self.last_stood = Some(at),
            PollShowed::NoSignal => self.signal = false,
            PollShowed::Baseline => self.signal = true,
        }
    }

    fn life(&mut self, at: Instant, still_owed: bool) {
        self.last_life = Some(self.last_life.map_or(at, |l| l.max(at)));
        self.since = still_owed.then_some(at);
        self.last_stood = None;
        self.abandoned = None;
    }

    /// The silence at `now`; `pending`: requests of this gateway's wait on it now. A silence
    /// with nothing owed for a whole `gap` no longer counts.
    pub fn span(&self, now: Instant, pending: bool, gap: Duration) -> Span {
        let owed = pending
            || self
                .abandoned
                .is_some_and(|e| now.saturating_duration_since(e) < gap);
        Span {
            since: self.since.filter(|_| owed),
            last_stood: self.last_stood,
            signal: self.signal,
            last_life: self.last_life,
            owed_until: if pending { None } else { self.abandoned },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    const GAP: Duration = Duration::from_secs(5);

    #[test]
    fn a_request_that_ends_without_a_byte_leaves_the_silence_running_into_the_next() {
        let t0 = Instant::now();
        let mut s = Silence::default();
        s.sent(t0, GAP);
        s.abandoned(t0 + secs(1));
        assert_eq!(
            s.span(t0 + secs(2), false, GAP).since,
            Some(t0),
            "within the gap"
        );
        s.sent(t0 + secs(2), GAP);
        assert_eq!(
            s.span(t0 + secs(4), true, GAP).since,
            Some(t0),
            "one silence"
        );
    }

    #[test]
    fn a_stream_left_while_owed_its_next_token_leaves_the_silence_running() {
        let t0 = Instant::now();
        let mut s = Silence::default();
        s.polled(t0, PollShowed::Baseline, false);
        s.answered(t0, false);
        s.stream_left(t0 + secs(1), t0 + secs(3));
        assert_eq!(s.span(t0 + secs(4), false, GAP).since, Some(t0 + secs(1)));
        s.sent(t0 + secs(4), GAP);
        assert_eq!(
            s.span(t0 + secs(5), true, GAP).since,
            Some(t0 + secs(1)),
            "the next request continues it"
        );
        let mut no_signal = Silence::default();
        no_signal.stream_left(t0 + secs(1), t0 + secs(3));
        assert_eq!(
            no_signal.span(t0 + secs(4), false, GAP).since,
            None,
            "a stream waiting is no evidence without a stepping signal"
        );
    }

    #[test]
    fn nothing_owed_for_a_whole_gap_ends_the_silence() {
        let t0 = Instant::now();
        let mut s = Silence::default();
        s.sent(t0, GAP);
        s.abandoned(t0 + secs(1));
        assert_eq!(s.span(t0 + secs(6), false, GAP).since, None);
        s.sent(t0 + secs(9), GAP);
        assert_eq!(
            s.span(t0 + secs(9), true, GAP).since,
            Some(t0 + secs(9)),
            "a new silence starts with the next request"
        );
    }

    #[test]
    fn a_byte_ends_the_silence_and_the_requests_still_waiting_start_a_new_one() {
        let t0 = Instant::now();
        let mut s = Silence::default();
        s.sent(t0, GAP);
        s.answered(t0 + secs(3), true);
        let span = s.span(t0 + secs(4), true, GAP);
        assert_eq!(span.since, Some(t0 + secs(3)));
        assert_eq!(span.last_life, Some(t0 + secs(3)));
        s.answered(t0 + secs(5), false);
        assert_eq!(s.span(t0 + secs(5), false, GAP).since, None);
    }

    #[test]
    fn a_step_in_a_report_is_life_and_a_standing_or_unanswered_poll_is_remembered() {
        let t0 = Instant::now();
        let mut s = Silence::default();
        s.sent(t0 + secs(1), GAP);
        s.polled(t0 + secs(2), PollShowed::Stood, true);
        s.polled(t0 + secs(3), PollShowed::Unanswered, true);
        let span = s.span(t0 + secs(3), true, GAP);
        assert_eq!(
            (span.since, span.last_stood, span.signal),
            (Some(t0 + secs(1)), Some(t0 + secs(3)), true)
        );
        s.polled(t0 + secs(4), PollShowed::Stepped, true);
        let span = s.span(t0 + secs(4), true, GAP);
        assert_eq!(
            (span.since, span.last_stood, span.last_life),
            (Some(t0 + secs(4)), None, Some(t0 + secs(4))),
            "the wait counts afresh from the step"
        );
        s.polled(t0 + secs(5), PollShowed::NoSignal, true);
        assert!(!s.span(t0 + secs(5), true, GAP).signal);
    }

    #[test]
    fn a_poll_is_judged_by_the_stepping_of_the_report_before() {
        use crate::load::{LoadReport, RankLoad};
        let at = |generated: f64, kv_usage: f64| LoadReport {
            ranks: vec![RankLoad {
                generation_tokens: Some(generated),
                kv_usage,
                ..RankLoad::default()
            }],
            ..LoadReport::default()
        };
        let first = at(10.0, 0.1);
        assert_eq!(PollShowed::between(None, &first), PollShowed::Baseline);
        assert_eq!(
            PollShowed::between(Some(&first), &at(10.0, 0.1)),
            PollShowed::Stood
        );
        assert_eq!(
            PollShowed::between(Some(&first), &at(10.0, 0.2)),
            PollShowed::Stepped
        );
        let no_counters = LoadReport {
            ranks: vec![RankLoad::default()],
            ..LoadReport::default()
        };
        assert_eq!(
            PollShowed::between(Some(&first), &no_counters),
            PollShowed::NoSignal
        );
    }

    #[test]
    fn life_only_moves_forward() {
        let t0 = Instant::now();
        let mut s = Silence::default();
        s.answered(t0 + secs(5), false);
        s.answered(t0 + secs(2), false);
        assert_eq!(
            s.span(t0 + secs(6), false, GAP).last_life,
            Some(t0 + secs(5))
        );
    }
}
