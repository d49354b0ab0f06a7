//! The load monitor: every Ready worker's engine load, polled on its pool's schedule, turned into
//! the overload and busy verdicts the route stage reads.
//!
//! A poll that yields no report (error, timeout, empty, unsupported) clears the worker's
//! verdicts: no fresh signal, no opinion — the overload check fails open.
//!
//! ## Layout
//!
//! - `poll` — one poll: the endpoint for the worker's flavor and the report it gives.
//! - `pushed` — a gRPC worker's KV-event stream: its load records, each a report.
//! - `pushed_events` — the same stream's block events: what the worker's engine holds.
//! - `verdict` — what a report means for the worker's vetoes and gauges.

mod poll;
mod pushed;
mod pushed_events;
mod verdict;

use std::sync::{Arc, Weak};
use std::time::Duration;

use sluice_core::health::HealthState;
use sluice_core::overload::{BusyThresholds, Ceilings, RunningSize};
use tokio::time::Instant;

pub use poll::PollError;
pub use verdict::activity;

use super::Control;
use crate::fleet::{Fleet, OverloadOverrides, Worker};

/// Load monitoring and overload protection, gateway-wide (the flags).
#[derive(Debug, Clone, PartialEq)]
pub struct LoadConfig {
    /// `--load-monitor-interval`.
    pub interval: Duration,
    /// The gateway's ceilings; both `None` under `--disable-worker-overload-protection`.
    pub ceilings: Ceilings,
    /// The busy thresholds at startup (`/busy_threshold` changes them at runtime).
    pub busy: BusyThresholds,
    /// The longest one load request may take (5 s; `poll_timeout_at` shortens it for short
    /// intervals).
    pub poll_timeout: Duration,
    /// The shortest poll interval, whatever a spec asks (1 s).
    pub min_interval: Duration,
}

impl Default for LoadConfig {
    /// The flags' defaults.
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            ceilings: Ceilings {
                waiting_requests: Some(8),
                token_usage: Some(0.8),
            },
            busy: BusyThresholds::default(),
            poll_timeout: Duration::from_secs(5),
            min_interval: Duration::from_secs(1),
        }
    }
}

impl LoadConfig {
    /// How long a poll at `interval` may take: twice the interval, at least a second, at most
    /// `poll_timeout`. A poll nobody answers is evidence for the liveness checks (the engine
    /// shows no reason for a wait), so it should not take five intervals to count.
    pub(crate) fn poll_timeout_at(&self, interval: Duration) -> Duration {
        self.poll_timeout
            .min(interval.saturating_mul(2).max(Duration::from_secs(1)))
    }

    /// A worker's ceilings: each field of its block wins over the gateway's.
    pub(crate) fn ceilings_for(&self, o: &OverloadOverrides) -> Ceilings {
        Ceilings {
            waiting_requests: o.waiting_requests.or(self.ceilings.waiting_requests),
            token_usage: o.token_usage.or(self.ceilings.token_usage),
        }
    }
}

/// The least time between a poll and an early one (requests piling up on an engine that had
/// room, see `QueueGate::early_poll_at`), so a steady stream into a roomy engine cannot turn the
/// monitor into a busy loop.
const EARLY_POLL_SPACING: Duration = Duration::from_millis(250);

/// The next push of a gRPC worker's stream; never, for a worker without one.
async fn next_push(
    pushed: &mut Option<pushed::Pushed>,
    upstream: &crate::upstream::Upstream,
    worker: &Worker,
) -> pushed::Push {
    match pushed {
        Some(pushed) => pushed.next(upstream, worker).await,
        None => std::future::pending().await,
    }
}

/// What one worker's monitor keeps from one report to the next.
#[derive(Default)]
struct Between {
    /// Where its reports are read, as found.
    sources: poll::Sources,
    /// Which less-than-whole reports of it were logged already: each kind is logged once.
    told: verdict::Told,
    /// The size its running requests settle at, in which the reserve counts room.
    size: RunningSize,
    /// Its engine's batch size, asked once, of SGLang workers only (vLLM's /metrics does not
    /// carry it).
    engine_batch: Option<Option<u64>>,
}

impl Between {
    /// What the verdict on its next report reads and keeps.
    fn verdict(&mut self, interval: Duration) -> verdict::Kept<'_> {
        verdict::Kept {
            told: &mut self.told,
            size: &mut self.size,
            interval,
        }
    }

    /// Polls `worker` now and judges its answer; `None` once the fleet is gone.
    async fn poll(
        &mut self,
        fleet: &Weak<Fleet>,
        worker: &Arc<Worker>,
        control: &Control,
        interval: Duration,
        timeout: Duration,
    ) -> Option<()> {
        let upstream = &control.upstream;
        let result = self.sources.poll(upstream, worker, timeout).await;
        let sglang = worker.info().is_some_and(|i| i.flavor == "sglang");
        if result.is_ok() && sglang && self.engine_batch.is_none() {
            self.engine_batch = Some(poll::sglang_batch_size(upstream, worker, timeout).await);
        }
        let fleet = fleet.upgrade()?;
        let batch = self.engine_batch.flatten();
        control.load_polled(&fleet, worker, result, batch, self.verdict(interval));
        Some(())
    }
}

/// Polls one worker while it is registered: every interval of its pool, only while Ready (the
/// first poll as soon as it is). A gRPC worker's pushed records are reports too, each ingested
/// as it comes; its poll is skipped while a record came within the interval, and takes over when
/// they stop.
pub(super) async fn run_monitor(fleet: Weak<Fleet>, worker: Arc<Worker>, control: Arc<Control>) {
    let upstream = &control.upstream;
    let mut kept = Between::default();
    let mut pushed = worker.endpoint.grpc().then(pushed::Pushed::new);
    if pushed.is_some() {
        // This task is the one writer of a gRPC worker's held blocks.
        worker.held.begin(control.settings.kv_events.max_blocks);
    }
    loop {
        let Some((interval, timeout, mut changes)) = fleet.upgrade().map(|f| {
            let interval = control.poll_interval_of(&f, &worker);
            (
                interval,
                control.settings.load.poll_timeout_at(interval),
                f.changes(),
            )
        }) else {
            return;
        };
        match worker.status() {
            HealthState::Draining => return,
            HealthState::Ready => {
                // While records are arriving the poll steps aside: only the next push or the
                // interval's end is waited for.
                let polled = if pushed.as_ref().is_some_and(|p| p.fresh(interval)) {
                    None
                } else {
                    let Some(()) = kept
                        .poll(&fleet, &worker, &control, interval, timeout)
                        .await
                    else {
                        return;
                    };
                    Some(Instant::now())
                };
                let early = async {
                    let Some(polled) = polled else {
                        return std::future::pending().await;
                    };
                    worker.vetoes.early_poll_wanted().await;
                    tokio::time::sleep_until(polled + EARLY_POLL_SPACING.min(interval)).await;
                };
                tokio::select! {
                    () = tokio::time::sleep(interval) => {}
                    () = early => {}
                    push = next_push(&mut pushed, upstream, &worker) => {
                        let Some(fleet) = fleet.upgrade() else {
                            return;
                        };
                        let batch = kept.engine_batch.flatten();
                        control.load_pushed(&fleet, &worker, push, batch, kept.verdict(interval));
                    }
                }
            }
            _ => {
                // Not polled; look again when the fleet changes (it may become Ready).
                let _ = tokio::time::timeout(interval, changes.changed()).await;
            }
        }
    }
}

impl Control {
    /// Ingests one push of a gRPC worker's stream: a record is a report (judged as a poll's
    /// answer is), a batch without one is contact, a broken stream a transport failure.
    fn load_pushed(
        &self,
        fleet: &Fleet,
        worker: &Worker,
        push: pushed::Push,
        engine_batch: Option<u64>,
        kept: verdict::Kept<'_>,
    ) {
        let now = Instant::now();
        match push {
            pushed::Push::Report(report, silence) => {
                worker.signals.load_pushed(now);
                let polled = poll::Polled {
                    report,
                    source: "pushed",
                    fell_back: false,
                };
                self.load_polled(fleet, worker, Ok(polled), engine_batch, kept);
                self.engine_silence(worker, silence, now);
            }
            pushed::Push::Contact => worker.signals.contact(now),
            pushed::Push::Lost => worker.signals.transport_failure(now),
        }
    }

    /// The engine's own silence, when its record reports one (seed 000, "The engine's own
    /// silence"): it stalled that long ago. On a wire that carries token batches only a long
    /// prefill is silent too, so there the signal passes no verdict until the gateway has
    /// measured the worker's prefill rate (the wedge bound then stretches over the prefill in
    /// hand). A record without the figure leaves the signal as the report left it.
    fn engine_silence(&self, worker: &Worker, silence: pushed::Silence, now: Instant) {
        let Some(ms) = silence.ms else {
            return;
        };
        let judged = self.settings.liveness.is_some_and(|l| !l.wedge.is_zero());
        let rate_known = worker.latency.prefill_rate().is_some();
        let since = (ms > 0 && (silence.reports_steps || rate_known))
            .then(|| now.checked_sub(Duration::from_millis(u64::from(ms))))
            .flatten();
        worker
            .signals
            .set_engine_stalled_since(since.filter(|_| judged));
    }

    /// How often `worker` is polled: the smallest interval asked by any worker of its pools (its
    /// own spec's, else the flag), never under a second.
    fn poll_interval_of(&self, fleet: &Fleet, worker: &Worker) -> Duration {
        let own = |w: &Worker| {
            w.live()
                .spec
                .load_monitor_interval_secs
                .and_then(|s| Duration::try_from_secs_f64(s).ok())
                .unwrap_or(self.settings.load.interval)
        };
        let snapshot = fleet.snapshot();
        let peers = worker
            .models()
            .into_iter()
            .filter_map(|m| snapshot.pools.get(&m))
            .flat_map(|p| p.workers.iter())
            .map(|w| own(w));
        peers
            .chain(std::iter::once(own(worker)))
            .min()
            .unwrap_or(self.settings.load.interval)
            .max(self.settings.load.min_interval)
    }
}

/// The busy checks, validated; an error names the setting (flag and `/busy_threshold` field).
pub fn busy_thresholds(
    decode: Option<f64>,
    prefill: Option<u64>,
    frac: Option<f64>,
) -> Result<BusyThresholds, (&'static str, String)> {
    if let Some(x) = decode.filter(|x| !(*x > 0.0 && *x <= 1.0)) {
        return Err((
            "active-decode-blocks-threshold",
            format!("{x} is not a fraction of the KV blocks in (0, 1]"),
        ));
    }
    if let Some(x) = frac.filter(|x| !(x.is_finite() && *x > 0.0)) {
        return Err((
            "active-prefill-tokens-threshold-frac",
            format!("{x} must be greater than 0"),
        ));
    }
    Ok(BusyThresholds {
        active_decode_blocks_threshold: decode,
        active_prefill_tokens_threshold: prefill,
        active_prefill_tokens_threshold_frac: frac,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poll_gets_twice_the_interval_at_least_a_second_and_at_most_its_timeout() {
        let load = LoadConfig::default();
        let s = Duration::from_secs;
        assert_eq!(load.poll_timeout_at(s(1)), s(2));
        assert_eq!(load.poll_timeout_at(Duration::from_millis(100)), s(1));
        assert_eq!(load.poll_timeout_at(s(10)), s(5));
    }
}
