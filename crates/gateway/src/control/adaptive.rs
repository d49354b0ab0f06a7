//! The limiter (`--adaptive-concurrency`): once per window, each worker's concurrency limit is
//! moved by the latency its responses showed (`sluice_core::adaptive::decide`), and published
//! for the route stage and the gateway queue (`fleet::AdaptiveLimit`).
//!
//! A limit starts at the engine's running window where it reports one (SGLang's
//! `max_running_requests`, or the window learned from its reports), else at
//! `--adaptive-initial-limit`; until a window moves it, it keeps following the engine's figure,
//! which may only arrive with a later report.

use std::sync::Arc;
use std::time::Duration;

use sluice_core::adaptive::{decide, AimdConfig, Decision};
use tokio::time::{Instant, MissedTickBehavior};
use tracing::info;

use crate::fleet::{AdaptiveOverrides, LimitWindow, Worker};

/// The limiter's settings (the `--adaptive-*` flags).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdaptiveConfig {
    /// `--adaptive-window-secs`: how often each limit is judged.
    pub window: Duration,
    /// Targets, floor, ceiling and the sample floor.
    pub aimd: AimdConfig,
    /// `--adaptive-initial-limit`: the start of a limit whose engine reports no running window.
    pub initial_limit: u64,
}

impl Default for AdaptiveConfig {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(10),
            aimd: AimdConfig::default(),
            initial_limit: 32,
        }
    }
}

impl AdaptiveConfig {
    /// The settings for a worker, its spec's `adaptive` block over the flags (a new spec is a new
    /// registration, whose limiter starts again).
    pub(crate) fn for_worker(&self, own: &AdaptiveOverrides) -> Self {
        let ms = Duration::from_millis;
        let aimd = AimdConfig {
            itl_breach: own.itl_breach_ms.map_or(self.aimd.itl_breach, ms),
            itl_healthy: own.itl_healthy_ms.map_or(self.aimd.itl_healthy, ms),
            ttft_breach: own.ttft_breach_ms.map(ms).or(self.aimd.ttft_breach),
            ttft_healthy: own.ttft_healthy_ms.map(ms).or(self.aimd.ttft_healthy),
            floor: own.min_limit.unwrap_or(self.aimd.floor),
            ceiling: own.max_limit.or(self.aimd.ceiling),
            ..self.aimd
        };
        Self {
            window: own.window_secs.map_or(self.window, Duration::from_secs_f64),
            aimd,
            initial_limit: own.initial_limit.unwrap_or(self.initial_limit),
        }
    }

    /// Where `worker`'s limit starts now: its engine's running window if known, else the
    /// initial limit; within the floor and ceiling.
    fn starting_limit(&self, worker: &Worker) -> u64 {
        let reported = worker
            .vetoes
            .load()
            .and_then(|load| load.report.max_running())
            .or_else(|| worker.vetoes.window());
        let start = reported.unwrap_or(self.initial_limit);
        let capped = self.aimd.ceiling.map_or(start, |c| start.min(c));
        capped.max(self.aimd.floor).max(1)
    }
}

/// Runs `worker`'s limit until the registration ends (the fleet aborts it).
pub(crate) async fn run_limiter(worker: Arc<Worker>, flags: AdaptiveConfig) {
    let config = flags.for_worker(&worker.live().spec.adaptive);
    let mut limit = config.starting_limit(&worker);
    worker.adaptive.set_limit(limit);
    let _ = worker.adaptive.take_window(worker.in_flight());
    // Whether a decision has moved the limit; until then it follows the engine's figure.
    let mut moved = false;
    let mut ticks = tokio::time::interval_at(Instant::now() + config.window, config.window);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let config = flags.for_worker(&worker.live().spec.adaptive);
        if !moved {
            limit = config.starting_limit(&worker);
        }
        let stats = worker.adaptive.take_window(worker.in_flight()).stats();
        let (next, decision) = decide(limit, &stats, &config.aimd);
        moved |= next != limit;
        if decision == Decision::Decrease {
            info!(
                worker = %worker.id,
                from = limit,
                to = next,
                itl_p95_ms = stats.itl_p95.map(tenths_of_ms),
                ttft_p95_ms = stats.ttft_p95.map(tenths_of_ms),
                samples = stats.samples,
                "concurrency limit lowered: latency over its breach target"
            );
        }
        let window = LimitWindow {
            stats,
            decision,
            from: limit,
            at: Instant::now(),
        };
        worker.adaptive.judged(window, next);
        limit = next;
    }
}

/// Milliseconds to a tenth, as the log line shows them.
fn tenths_of_ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 10_000.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workers_block_overrides_the_flags_field_by_field() {
        let flags = AdaptiveConfig::default();
        let own = AdaptiveOverrides {
            itl_breach_ms: Some(40),
            ttft_healthy_ms: Some(500),
            max_limit: Some(8),
            window_secs: Some(2.5),
            ..AdaptiveOverrides::default()
        };
        let mine = flags.for_worker(&own);
        assert_eq!(mine.aimd.itl_breach, Duration::from_millis(40));
        assert_eq!(mine.aimd.itl_healthy, flags.aimd.itl_healthy);
        assert_eq!(mine.aimd.ttft_healthy, Some(Duration::from_millis(500)));
        assert_eq!(mine.aimd.ttft_breach, None);
        assert_eq!((mine.aimd.floor, mine.aimd.ceiling), (1, Some(8)));
        assert_eq!(mine.initial_limit, 32);
        assert_eq!(mine.window, Duration::from_millis(2500));
        assert_eq!(flags.for_worker(&AdaptiveOverrides::default()), flags);
    }
}
