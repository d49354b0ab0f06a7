//! A worker's adaptive concurrency limit (seed 003): learned from the latency its responses show
//! rather than set by hand, since what a request costs an engine varies with its prompt, its
//! cache hits and its length.
//!
//! Once per window the gateway hands in what it measured on the worker — time to first token per
//! response and the gaps between tokens — and `decide` moves the limit: p95 ITL or p95 TTFT over
//! its breach target → `limit x 0.85` (never under the floor); both under their healthy targets
//! → `limit + 2` (never over the ceiling) if the window used at least half the limit; otherwise, or with too few samples to judge, hold.
//! The TTFT targets are off unless configured; a target that is off never breaches and is always
//! healthy.

use std::time::Duration;

use super::buckets::Histogram;

/// The factor of a decrease and the step of an increase (the seed's figures).
const DECREASE: f64 = 0.85;
const INCREASE: u64 = 2;

/// What a limit follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AimdConfig {
    /// p95 inter-token latency at or over which the limit falls.
    pub itl_breach: Duration,
    /// p95 inter-token latency under which (with TTFT healthy) the limit rises.
    pub itl_healthy: Duration,
    /// p95 time to first token at or over which the limit falls; `None`: off.
    pub ttft_breach: Option<Duration>,
    /// p95 time to first token under which the limit may rise; `None`: off.
    pub ttft_healthy: Option<Duration>,
    /// Samples a window needs before it is judged.
    pub min_samples: u64,
    pub floor: u64,
    /// `None`: no ceiling.
    pub ceiling: Option<u64>,
}

impl Default for AimdConfig {
    fn default() -> Self {
        Self {
            itl_breach: Duration::from_millis(25),
            itl_healthy: Duration::from_millis(15),
            ttft_breach: None,
            ttft_healthy: None,
            min_samples: 20,
            floor: 1,
            ceiling: None,
        }
    }
}

/// What one window measured on a worker.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WindowSamples {
    /// Time to first token, one per streamed response.
    pub ttft: Histogram,
    /// Gaps between tokens (a stream's events; a whole body's time over its tokens).
    pub itl: Histogram,
    /// Responses measured: what the sample floor counts.
    pub responses: u64,
    /// The most of this gateway's requests in flight on the worker at once.
    pub peak_in_flight: u64,
}

/// The window's figures, as shown in `/workers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowStats {
    pub ttft_p95: Option<Duration>,
    pub itl_p95: Option<Duration>,
    /// Responses measured.
    pub samples: u64,
    /// The most requests in flight at once.
    pub peak_in_flight: u64,
}

/// Why the limit moved, or did not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// A p95 at or over its breach target.
    Decrease,
    /// Both p95s under their healthy targets, with the limit in use.
    Increase,
    /// Healthy, but the window never came near the limit (its peak in flight under half of it):
    /// no evidence that more would be served as well, so a quiet worker's limit does not climb
    /// without bound and then take many windows to come down.
    Unused,
    /// Between the targets.
    Hold,
    /// Fewer samples than the window needs.
    TooFewSamples,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Decrease => "decrease",
            Decision::Increase => "increase",
            Decision::Unused => "unused",
            Decision::Hold => "hold",
            Decision::TooFewSamples => "too_few_samples",
        }
    }
}

impl WindowSamples {
    /// The window's p95s and sample count.
    pub fn stats(&self) -> WindowStats {
        WindowStats {
            ttft_p95: self.ttft.quantile(0.95),
            itl_p95: self.itl.quantile(0.95),
            samples: self.responses,
            peak_in_flight: self.peak_in_flight,
        }
    }
}

/// The limit after a window that measured `stats`.
pub fn decide(limit: u64, stats: &WindowStats, config: &AimdConfig) -> (u64, Decision) {
    if stats.samples < config.min_samples {
        return (limit, Decision::TooFewSamples);
    }
    let at_or_over = |p95: Option<Duration>, target: Option<Duration>| match (p95, target) {
        (Some(p), Some(t)) => p >= t,
        _ => false,
    };
    let under = |p95: Option<Duration>, target: Option<Duration>| match (p95, target) {
        (Some(p), Some(t)) => p < t,
        (_, None) => true,
        (None, Some(_)) => false,
    };
    let breach = at_or_over(stats.itl_p95, Some(config.itl_breach))
        || at_or_over(stats.ttft_p95, config.ttft_breach);
    if breach {
        let lower = ((limit as f64) * DECREASE).floor() as u64;
        return (lower.max(config.floor), Decision::Decrease);
    }
    let healthy = under(stats.itl_p95, Some(config.itl_healthy))
        && under(stats.ttft_p95, config.ttft_healthy);
    if healthy && stats.peak_in_flight.saturating_mul(2) < limit {
        return (limit, Decision::Unused);
    }
    if healthy {
        let higher = limit.saturating_add(INCREASE);
        return (
            config
                .ceiling
                .map_or(higher, |c| higher.min(c))
                .max(config.floor),
            Decision::Increase,
        );
    }
    (limit, Decision::Hold)
}

/// Whether a request of `weight` sequences may go to a worker with `in_flight` of this gateway's
/// already, under `limit` (`None`: no limit). An idle worker takes any request, so one asking for
/// more sequences than the limit is served rather than refused for good.
pub fn admits(limit: Option<u64>, in_flight: u64, weight: u64) -> bool {
    match limit {
        None => true,
        Some(limit) => in_flight == 0 || in_flight.saturating_add(weight) <= limit,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn stats(itl_ms: u64, ttft_ms: u64, samples: u64) -> WindowStats {
        WindowStats {
            ttft_p95: Some(Duration::from_millis(ttft_ms)),
            itl_p95: Some(Duration::from_millis(itl_ms)),
            samples,
            peak_in_flight: 1000,
        }
    }

    #[test]
    fn a_breach_cuts_the_limit_by_15_percent_down_to_the_floor() {
        let c = AimdConfig::default();
        assert_eq!(
            decide(40, &stats(25, 100, 20), &c),
            (34, Decision::Decrease)
        );
        assert_eq!(
            decide(40, &stats(60, 100, 500), &c),
            (34, Decision::Decrease)
        );
        assert_eq!(
            decide(1, &stats(60, 100, 20), &c),
            (1, Decision::Decrease),
            "floor"
        );
        let ttft = AimdConfig {
            ttft_breach: Some(2000 * MS),
            ..c
        };
        assert_eq!(
            decide(20, &stats(10, 2000, 20), &ttft),
            (17, Decision::Decrease),
            "a TTFT breach alone"
        );
    }

    #[test]
    fn healthy_windows_raise_it_by_two_up_to_the_ceiling() {
        let c = AimdConfig {
            ceiling: Some(41),
            ..AimdConfig::default()
        };
        assert_eq!(
            decide(30, &stats(14, 5000, 20), &c),
            (32, Decision::Increase)
        );
        assert_eq!(
            decide(40, &stats(14, 5000, 20), &c),
            (41, Decision::Increase)
        );
        let ttft = AimdConfig {
            ttft_healthy: Some(1000 * MS),
            ..c
        };
        assert_eq!(
            decide(30, &stats(14, 1000, 20), &ttft),
            (30, Decision::Hold),
            "TTFT not under its healthy target"
        );
        let quiet = WindowStats {
            peak_in_flight: 14,
            ..stats(14, 5000, 20)
        };
        assert_eq!(decide(30, &quiet, &c), (30, Decision::Unused));
        let used = WindowStats {
            peak_in_flight: 15,
            ..quiet
        };
        assert_eq!(decide(30, &used, &c), (32, Decision::Increase), "half used");
    }

    #[test]
    fn between_the_targets_or_with_too_few_samples_it_holds() {
        let c = AimdConfig::default();
        assert_eq!(decide(30, &stats(15, 0, 20), &c), (30, Decision::Hold));
        assert_eq!(decide(30, &stats(24, 0, 20), &c), (30, Decision::Hold));
        assert_eq!(
            decide(30, &stats(90, 0, 19), &c),
            (30, Decision::TooFewSamples)
        );
        let no_itl = WindowStats {
            itl_p95: None,
            ..stats(0, 10, 20)
        };
        assert_eq!(
            decide(30, &no_itl, &c),
            (30, Decision::Hold),
            "no token gaps measured (one-token answers): no evidence of health"
        );
    }

    #[test]
    fn the_limit_admits_up_to_itself_and_an_idle_worker_takes_anything() {
        assert!(admits(None, 1000, 1));
        assert!(admits(Some(4), 3, 1));
        assert!(!admits(Some(4), 4, 1));
        assert!(!admits(Some(4), 3, 2), "n=2 counts twice");
        assert!(admits(Some(2), 0, 8), "idle: served, not refused for good");
    }

    #[test]
    fn a_windows_stats_are_its_p95s_and_its_responses() {
        let mut window = WindowSamples {
            responses: 3,
            ..WindowSamples::default()
        };
        window.ttft.record(MS, 3);
        for i in 1..=100 {
            window.itl.record(i * MS, 1);
        }
        let stats = window.stats();
        assert_eq!(stats.samples, 3);
        assert_eq!(stats.ttft_p95, window.ttft.quantile(0.95));
        assert!(stats.itl_p95.unwrap() > 95 * MS && stats.itl_p95.unwrap() < 107 * MS);
        let empty = WindowSamples::default().stats();
        assert_eq!(
            (empty.ttft_p95, empty.itl_p95, empty.samples),
            (None, None, 0)
        );
    }
}
