//! What the gateway hears from each worker: contact, progress, transport failures, timeouts, its
//! pile of streams and its measured prefill rate.
//!
//! Many writers record here — the request path, the prober, the load monitor — but each signal
//! only moves forward (an instant is kept at its latest), so their order does not matter; a
//! relayed token costs one relaxed store. The liveness checker (`control::liveness`) reads them
//! several times a second and judges.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use sluice_core::liveness::{prefill_rate, Unanswered};
use tokio::time::Instant;

use super::atomic::AtomicInstant;

/// One worker's signals.
#[derive(Debug)]
pub struct Signals {
    /// Anything at all from it; starts at registration so a new worker is not judged silent.
    last_contact: AtomicInstant,
    last_failure: AtomicInstant,
    last_timeout: AtomicInstant,
    /// A token or a completion; starts at registration.
    last_progress: AtomicInstant,
    /// Streams in flight on it through this gateway, moved only by `Lease`.
    pile: AtomicU32,
    /// Since when its reports have shown no step with requests in hand (the load monitor).
    engine_stalled_since: AtomicInstant,
    /// Measured prefill rate, prompt tokens per second (f64 bits; 0: not measured yet).
    prefill_rate: AtomicU64,
    /// Since when this gateway has held requests on it with no byte from any (moved by `Lease`).
    unanswered_since: AtomicInstant,
    /// Since when every load report fell short of this gateway's unanswered requests, and how
    /// many reports did (the load monitor).
    short_since: AtomicInstant,
    short_reports: AtomicU32,
    /// When an interactive request on it last had its first token: the interactive reserve is
    /// kept for a while after (`reserve_in_force`).
    interactive_answered: AtomicInstant,
    /// It has pushed a load record (a gRPC worker's KV-event stream): from then on it is held
    /// to the stream's cadence (the stale rule).
    pushed_load: AtomicBool,
}

impl Default for Signals {
    fn default() -> Self {
        Self {
            last_contact: AtomicInstant::now(),
            last_failure: AtomicInstant::none(),
            last_timeout: AtomicInstant::none(),
            last_progress: AtomicInstant::now(),
            pile: AtomicU32::new(0),
            engine_stalled_since: AtomicInstant::none(),
            prefill_rate: AtomicU64::new(0),
            unanswered_since: AtomicInstant::none(),
            short_since: AtomicInstant::none(),
            short_reports: AtomicU32::new(0),
            interactive_answered: AtomicInstant::none(),
            pushed_load: AtomicBool::new(false),
        }
    }
}

/// The signals as read at one moment, for a judgment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Heard {
    pub last_contact: Instant,
    pub last_failure: Option<Instant>,
    pub last_timeout: Option<Instant>,
    pub last_progress: Instant,
    /// Changes exactly when `last_progress` does.
    pub progress_stamp: u64,
    pub pile: u32,
    pub engine_stalled_since: Option<Instant>,
    /// Prompt tokens per second; 0 until measured.
    pub prefill_rate: f64,
    pub unanswered: Unanswered,
    /// It has pushed a load record.
    pub pushed_load: bool,
}

impl Signals {
    /// Something arrived from it: a response, a byte, an answered poll or probe.
    pub fn contact(&self, at: Instant) {
        self.last_contact.advance_to(at);
    }

    /// An interactive request on it had its first token at `at`.
    pub(crate) fn interactive_answered(&self, at: Instant) {
        self.interactive_answered.advance_to(at);
    }

    /// When an interactive request on it last had its first token.
    pub fn interactive_answered_at(&self) -> Option<Instant> {
        self.interactive_answered.load()
    }

    /// A token or a completion (contact too).
    pub fn progress(&self, at: Instant) {
        self.last_contact.advance_to(at);
        self.last_progress.advance_to(at);
    }

    /// A connection-level failure on one of its channels.
    pub fn transport_failure(&self, at: Instant) {
        self.last_failure.advance_to(at);
    }

    /// A poll or probe got no answer in time.
    pub fn timeout(&self, at: Instant) {
        self.last_timeout.advance_to(at);
    }

    /// A stream starts on it; when it is the first of a pile, the silence is counted from now.
    pub(crate) fn stream_started(&self, at: Instant) {
        if self.pile.fetch_add(1, Ordering::Relaxed) == 0 {
            self.last_progress.advance_to(at);
        }
    }

    pub(crate) fn stream_ended(&self) {
        self.pile.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn pile(&self) -> u32 {
        self.pile.load(Ordering::Relaxed)
    }

    /// A request's first byte came `ttft` after it was sent with `prompt_tokens` of prompt: one
    /// sample of the worker's prefill rate.
    pub(crate) fn prefill_sample(&self, prompt_tokens: u64, ttft: Duration) {
        let _ = self
            .prefill_rate
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                prefill_rate(f64::from_bits(bits), prompt_tokens, ttft).map(f64::to_bits)
            });
    }

    /// This gateway's unanswered requests on it went from none to some at `at`.
    pub(crate) fn unanswered_from(&self, at: Instant) {
        self.unanswered_since.set_if_none(at);
    }

    /// A first byte arrived at `at`, leaving `still` of this gateway's requests unanswered: the
    /// worker answers, so the wait is counted afresh from here.
    pub(crate) fn answered(&self, at: Instant, still: u64) {
        if still > 0 {
            self.unanswered_since.store(at);
        } else {
            self.unanswered_since.clear();
        }
    }

    /// No request of this gateway's is unanswered on it any more.
    pub(crate) fn none_unanswered(&self) {
        self.unanswered_since.clear();
    }

    /// A load report at `at` did (`short`) or did not fall short of this gateway's unanswered
    /// requests; `None`: a poll with no report, no opinion.
    pub fn report_judged(&self, short: Option<bool>, at: Instant) {
        if short == Some(true) {
            self.short_since.set_if_none(at);
            self.short_reports.fetch_add(1, Ordering::Relaxed);
        } else {
            self.short_since.clear();
            self.short_reports.store(0, Ordering::Relaxed);
        }
    }

    /// A load record arrived on its KV-event stream at `at`: contact, and from now on the
    /// worker is expected to keep pushing.
    pub fn load_pushed(&self, at: Instant) {
        self.pushed_load.store(true, Ordering::Relaxed);
        self.contact(at);
    }

    /// The load monitor's finding on the engine's stepping: since when it showed none.
    pub fn set_engine_stalled_since(&self, since: Option<Instant>) {
        match since {
            Some(at) => self.engine_stalled_since.store(at),
            None => self.engine_stalled_since.clear(),
        }
    }

    /// Everything heard, as of now.
    pub fn heard(&self) -> Heard {
        let start = Instant::now();
        Heard {
            last_contact: self.last_contact.load().unwrap_or(start),
            last_failure: self.last_failure.load(),
            last_timeout: self.last_timeout.load(),
            last_progress: self.last_progress.load().unwrap_or(start),
            progress_stamp: self.last_progress.stamp(),
            pile: self.pile(),
            engine_stalled_since: self.engine_stalled_since.load(),
            prefill_rate: f64::from_bits(self.prefill_rate.load(Ordering::Relaxed)),
            unanswered: Unanswered {
                since: self.unanswered_since.load(),
                short_since: self.short_since.load(),
                short_reports: self.short_reports.load(Ordering::Relaxed),
            },
            pushed_load: self.pushed_load.load(Ordering::Relaxed),
        }
    }
}
