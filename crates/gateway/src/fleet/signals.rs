//! What the gateway hears from each worker: contact, progress, transport failures, timeouts, its
//! pile of streams and its measured prefill rate.
//!
//! Many writers record here — the request path, the prober, the load monitor — but each signal
//! only moves forward (an instant is kept at its latest), so their order does not matter; a
//! relayed token costs one relaxed store. The liveness checker (`control::liveness`) reads them
//! several times a second and judges.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use sluice_core::liveness::{LivenessConfig, PollShowed, Silence, TrialVerdict};
use tokio::time::Instant;

use super::atomic::AtomicInstant;

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

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
    /// Its silence across requests (moved by `Lease` and the load monitor, under a lock held
    /// for a few instructions, never across an await).
    silence: parking_lot::Mutex<Silence>,
    /// How long nothing owed ends a silence (`--worker-unresponsive-secs`), in nanoseconds.
    silence_lapse: AtomicU64,
    /// The last token or completion (not, as `last_progress`, the start of a pile).
    last_token: AtomicInstant,
    /// When an interactive request on it last had its first token: the interactive reserve is
    /// kept for a while after (`reserve_in_force`).
    interactive_answered: AtomicInstant,
    /// It has pushed a load record (a gRPC worker's KV-event stream): from then on it is held
    /// to the stream's cadence (the stale rule).
    pushed_load: AtomicBool,
    /// The last liveness trial's verdict and when it came (the trial task alone writes it).
    last_trial: parking_lot::Mutex<Option<(Instant, TrialVerdict)>>,
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
            silence: parking_lot::Mutex::new(Silence::default()),
            silence_lapse: AtomicU64::new(nanos(LivenessConfig::default().unresponsive)),
            last_token: AtomicInstant::none(),
            interactive_answered: AtomicInstant::none(),
            pushed_load: AtomicBool::new(false),
            last_trial: parking_lot::Mutex::new(None),
        }
    }
}

/// The signals as read at one moment, for a judgment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Heard {
    pub(crate) last_contact: Instant,
    pub(crate) last_failure: Option<Instant>,
    pub(crate) last_timeout: Option<Instant>,
    pub(crate) last_progress: Instant,
    /// Changes exactly when `last_progress` does.
    pub(crate) progress_stamp: u64,
    pub(crate) pile: u32,
    pub(crate) engine_stalled_since: Option<Instant>,
    /// Its silence across requests.
    pub(crate) silence: Silence,
    /// The last token or completion.
    pub(crate) last_token: Option<Instant>,
    /// It has pushed a load record.
    pub(crate) pushed_load: bool,
}

impl Signals {
    /// Something arrived from it: a response, a byte, an answered poll or probe.
    pub(crate) fn contact(&self, at: Instant) {
        self.last_contact.advance_to(at);
    }

    /// An interactive request on it had its first token at `at`.
    pub(crate) fn interactive_answered(&self, at: Instant) {
        self.interactive_answered.advance_to(at);
    }

    /// When an interactive request on it last had its first token.
    pub(crate) fn interactive_answered_at(&self) -> Option<Instant> {
        self.interactive_answered.load()
    }

    /// A token or a completion (contact too).
    pub(crate) fn progress(&self, at: Instant) {
        self.last_contact.advance_to(at);
        self.last_progress.advance_to(at);
        self.last_token.advance_to(at);
    }

    /// A connection-level failure on one of its channels.
    pub(crate) fn transport_failure(&self, at: Instant) {
        self.last_failure.advance_to(at);
    }

    /// A poll or probe got no answer in time.
    pub(crate) fn timeout(&self, at: Instant) {
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

    /// How long nothing owed ends a silence: the unresponsive bound.
    pub(crate) fn set_silence_lapse(&self, lapse: Duration) {
        self.silence_lapse.store(nanos(lapse), Ordering::Relaxed);
    }

    /// A request was sent at `at` while none of this gateway's waited for a byte from it.
    pub(crate) fn sent(&self, at: Instant) {
        let lapse = Duration::from_nanos(self.silence_lapse.load(Ordering::Relaxed));
        self.silence.lock().sent(at, lapse);
    }

    /// A byte came back at `at`, leaving `still` of this gateway's requests without one.
    pub fn answered(&self, at: Instant, still: u64) {
        self.silence.lock().answered(at, still > 0);
    }

    /// The last request waiting on it stopped waiting at `at` without a byte: the client left,
    /// its deadline passed, it went elsewhere. The silence goes on.
    pub(crate) fn abandoned(&self, at: Instant) {
        self.silence.lock().abandoned(at);
    }

    /// A stream owed its next token since `owed_since` was left by its client at `at`.
    pub(crate) fn stream_left(&self, owed_since: Instant, at: Instant) {
        self.silence.lock().stream_left(owed_since, at);
    }

    /// A load poll ended at `at` with `polled`; `pending`: requests of this gateway's wait on it.
    pub(crate) fn polled(&self, at: Instant, polled: PollShowed, pending: bool) {
        self.silence.lock().polled(at, polled, pending);
    }

    /// A liveness trial came to `verdict` at `at`; one that generated is a sign of life. The
    /// requests of this gateway's still waiting on it (`pending`) start a new silence.
    pub(crate) fn trial(&self, at: Instant, verdict: TrialVerdict, pending: bool) {
        if verdict == TrialVerdict::Answered {
            self.silence.lock().answered(at, pending);
        }
        *self.last_trial.lock() = Some((at, verdict));
    }

    /// The last liveness trial's verdict and when it came.
    pub(crate) fn last_trial(&self) -> Option<(Instant, TrialVerdict)> {
        *self.last_trial.lock()
    }

    /// A load record arrived on its KV-event stream at `at`: contact, and from now on the
    /// worker is expected to keep pushing.
    pub(crate) fn load_pushed(&self, at: Instant) {
        self.pushed_load.store(true, Ordering::Relaxed);
        self.contact(at);
    }

    /// The load monitor's finding on the engine's stepping: since when it showed none.
    pub(crate) fn set_engine_stalled_since(&self, since: Option<Instant>) {
        match since {
            Some(at) => self.engine_stalled_since.store(at),
            None => self.engine_stalled_since.clear(),
        }
    }

    /// Everything heard, as of now.
    pub(crate) fn heard(&self) -> Heard {
        let start = Instant::now();
        Heard {
            last_contact: self.last_contact.load().unwrap_or(start),
            last_failure: self.last_failure.load(),
            last_timeout: self.last_timeout.load(),
            last_progress: self.last_progress.load().unwrap_or(start),
            progress_stamp: self.last_progress.stamp(),
            pile: self.pile(),
            engine_stalled_since: self.engine_stalled_since.load(),
            silence: *self.silence.lock(),
            last_token: self.last_token.load(),
            pushed_load: self.pushed_load.load(Ordering::Relaxed),
        }
    }
}
