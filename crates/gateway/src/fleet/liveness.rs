//! What the gateway hears from each worker, and the checker that turns it into liveness vetoes.
//!
//! The request path, the prober and the load monitor record contact, progress and transport
//! failures in a worker's `Signals` (relaxed atomic stores: a relayed token costs one). A single
//! checker task reads them several times a second and runs `sluice_core::liveness::judge`, so a
//! veto lands at its threshold, not at the next poll.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use sluice_core::liveness::{
    judge, prefill_allowance, prefill_rate, LivenessConfig, LivenessVeto, Observed,
};
use tokio::time::Instant;
use tracing::{info, warn};

use super::{Fleet, Worker};

/// How often the checker looks.
pub const CHECK_EVERY: Duration = Duration::from_millis(200);

/// One worker's signals. Instants are nanoseconds after `base` (0: never).
#[derive(Debug)]
pub struct Signals {
    base: Instant,
    last_contact: AtomicU64,
    last_failure: AtomicU64,
    last_timeout: AtomicU64,
    last_progress: AtomicU64,
    /// Streams in flight on it through this gateway, moved only by `Lease`.
    pile: AtomicU32,
    /// Its token counter stood still across reports for the wedge bound (the load monitor).
    engine_silent: AtomicBool,
    /// Measured prefill rate, prompt tokens per second (f64 bits; 0: not measured yet).
    prefill_rate: AtomicU64,
}

impl Default for Signals {
    fn default() -> Self {
        Self {
            base: Instant::now(),
            last_contact: AtomicU64::new(1),
            last_failure: AtomicU64::new(0),
            last_timeout: AtomicU64::new(0),
            last_progress: AtomicU64::new(1),
            pile: AtomicU32::new(0),
            engine_silent: AtomicBool::new(false),
            prefill_rate: AtomicU64::new(0),
        }
    }
}

impl Signals {
    fn nanos(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.base).as_nanos())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    fn instant(&self, nanos: u64) -> Instant {
        self.base + Duration::from_nanos(nanos)
    }

    /// Something arrived from it: a response, a byte, an answered poll or probe.
    pub fn contact(&self, at: Instant) {
        self.last_contact
            .fetch_max(self.nanos(at), Ordering::Relaxed);
    }

    /// A token or a completion (contact too).
    pub fn progress(&self, at: Instant) {
        let n = self.nanos(at);
        self.last_contact.fetch_max(n, Ordering::Relaxed);
        self.last_progress.fetch_max(n, Ordering::Relaxed);
    }

    /// A connection-level failure on one of its channels.
    pub fn transport_failure(&self, at: Instant) {
        self.last_failure
            .fetch_max(self.nanos(at), Ordering::Relaxed);
    }

    /// A poll or probe got no answer in time.
    pub fn timeout(&self, at: Instant) {
        self.last_timeout
            .fetch_max(self.nanos(at), Ordering::Relaxed);
    }

    /// A stream starts on it; when it is the first of a pile, the silence is counted from now.
    pub(crate) fn stream_started(&self, at: Instant) {
        if self.pile.fetch_add(1, Ordering::Relaxed) == 0 {
            self.last_progress
                .fetch_max(self.nanos(at), Ordering::Relaxed);
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

    pub(crate) fn set_engine_silent(&self, silent: bool) {
        self.engine_silent.store(silent, Ordering::Relaxed);
    }

    fn observe(&self, worker: &Worker, pile_at_progress: u32) -> Observed {
        let failure = self.last_failure.load(Ordering::Relaxed);
        let timeout = self.last_timeout.load(Ordering::Relaxed);
        Observed {
            last_timeout: (timeout != 0).then(|| self.instant(timeout)),
            last_contact: self.instant(self.last_contact.load(Ordering::Relaxed)),
            last_failure: (failure != 0).then(|| self.instant(failure)),
            last_progress: self.instant(self.last_progress.load(Ordering::Relaxed)),
            pile: self.pile(),
            pile_at_progress,
            in_flight: worker.in_flight(),
            queue: worker.vetoes.load().map(|l| l.report.waiting()),
            engine_silent: self.engine_silent.load(Ordering::Relaxed),
            prefill_allowance: prefill_allowance(
                worker.pending_prefill_tokens(),
                f64::from_bits(self.prefill_rate.load(Ordering::Relaxed)),
            ),
        }
    }
}

/// What the checker remembers of a worker between looks: the progress it last saw and the
/// pile at that moment (to tell a growing pile).
struct Seen {
    progress: u64,
    pile_at_progress: u32,
}

/// Judges every worker every `CHECK_EVERY`, for as long as the fleet lives.
pub(super) async fn run_checker(fleet: Weak<Fleet>, cfg: LivenessConfig) {
    let mut seen: HashMap<u64, Seen> = HashMap::new();
    let mut tick = tokio::time::interval(CHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(fleet) = fleet.upgrade() else {
            return;
        };
        let snapshot = fleet.snapshot();
        let now = Instant::now();
        seen.retain(|key, _| snapshot.workers.iter().any(|w| w.key == *key));
        for worker in &snapshot.workers {
            let signals = &worker.signals;
            let progress = signals.last_progress.load(Ordering::Relaxed);
            let entry = seen.entry(worker.key).or_insert(Seen {
                progress,
                pile_at_progress: signals.pile(),
            });
            if entry.progress != progress {
                entry.progress = progress;
                entry.pile_at_progress = signals.pile();
            }
            let observed = signals.observe(worker, entry.pile_at_progress);
            let prev = worker.vetoes.liveness();
            let next = judge(prev, &observed, &cfg, now);
            if next != prev {
                fleet.liveness_changed(worker, prev, next, &observed, now);
            }
        }
    }
}

impl Fleet {
    /// Publishes a liveness verdict, logs it with its numbers, and on re-admission after an
    /// outage readmits the circuit the outage opened.
    fn liveness_changed(
        &self,
        worker: &Arc<Worker>,
        prev: Option<LivenessVeto>,
        next: Option<LivenessVeto>,
        o: &Observed,
        now: Instant,
    ) {
        worker.vetoes.set_liveness(next);
        let silent_ms = now.saturating_duration_since(o.last_contact).as_millis() as u64;
        let quiet_ms = now.saturating_duration_since(o.last_progress).as_millis() as u64;
        match next {
            Some(veto) => warn!(
                worker = %worker.id,
                reason = veto.reason(),
                cause = %veto,
                silent_ms,
                no_token_ms = quiet_ms,
                pile = o.pile,
                in_flight = o.in_flight,
                "worker vetoed by liveness"
            ),
            None => info!(
                worker = %worker.id,
                was = prev.map(|p| p.reason()),
                "worker re-admitted by liveness"
            ),
        }
        if next.is_none() && matches!(prev, Some(LivenessVeto::Unreachable | LivenessVeto::Stale)) {
            worker.breaker.readmit();
        }
        self.changed.send_modify(|v| *v += 1);
    }
}
