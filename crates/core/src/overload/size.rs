//! The KV a running request holds on a worker, remembered across its busy spells
//! (`RunningSize`), so the interactive reserve counts room in requests of the size they run at
//! rather than the size they start at.
//!
//! A request enters the engine holding its prompt's KV and grows by every token it answers. On a
//! fleet of short answers the two sizes are close; on one of long (reasoning) answers a request
//! ends several times the size it started at. When a burst lands on an idle worker, its first
//! reports show only freshly started requests, and room counted in their size lets the gateway
//! start more than the KV holds once they have grown: the cache then passes its ceiling with an
//! interactive request behind it (measured on the long-answer fleet: the interactive requests
//! that missed their objective came in the first seconds of a load step, on a worker whose KV
//! then reported 0.81-0.997). A worker's requests settle at the size its traffic grows them to,
//! and that size is learnt from its own reports — so room shrinks only where requests grow.

use std::time::Duration;

use tokio::time::Instant;

use crate::load::LoadReport;

/// How long a size is remembered: about the time a long answer holds its place, so the size
/// requests grew to in one busy spell is still known when the next begins.
pub const SIZE_MEMORY: Duration = Duration::from_secs(60);

/// The mean KV a running request holds, averaged over the worker's busy life: each busy report
/// weighs by the time it stands for (at most one poll interval, so an idle spell between two
/// reports forgets nothing), with `SIZE_MEMORY` as its time constant.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RunningSize {
    mean: Option<f64>,
    seen: Option<Instant>,
}

impl RunningSize {
    /// Learns from `report`, taken at `now` with reports `interval` apart: a report with
    /// requests running moves the remembered size towards theirs; an idle one changes nothing.
    pub fn observe(&mut self, report: &LoadReport, now: Instant, interval: Duration) {
        let Some(size) = size_now(report) else {
            return;
        };
        let stands_for = self
            .seen
            .map_or(interval, |seen| now.saturating_duration_since(seen))
            .min(interval);
        let weight = 1.0 - (-stands_for.as_secs_f64() / SIZE_MEMORY.as_secs_f64()).exp();
        self.mean = Some(match self.mean {
            Some(mean) => mean + weight * (size - mean),
            None => size,
        });
        self.seen = Some(now);
    }

    /// The remembered size, once the worker has been seen busy.
    pub fn remembered(&self) -> Option<f64> {
        self.mean
    }
}

/// The KV a running request holds by `report`: the KV used over the requests running, summed
/// over ranks. `None` with nothing running.
pub fn size_now(report: &LoadReport) -> Option<f64> {
    let running = report.running();
    let used: f64 = report.ranks.iter().map(|r| r.kv_usage).sum();
    (running > 0 && used > 0.0).then(|| used / running as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::RankLoad;

    fn report(running: u64, kv_usage: f64) -> LoadReport {
        LoadReport {
            ranks: vec![RankLoad {
                running,
                kv_usage,
                ..RankLoad::default()
            }],
            ..LoadReport::default()
        }
    }

    const POLL: Duration = Duration::from_secs(2);

    #[test]
    fn the_first_busy_report_is_the_size_and_an_idle_one_teaches_nothing() {
        let mut size = RunningSize::default();
        let t0 = Instant::now();
        size.observe(&report(0, 0.0), t0, POLL);
        assert_eq!(size.remembered(), None, "nothing running: no size");
        size.observe(&report(10, 0.2), t0, POLL);
        assert_eq!(size.remembered(), Some(0.02));
    }

    #[test]
    fn the_size_moves_slowly_and_an_idle_spell_forgets_nothing() {
        let mut size = RunningSize::default();
        let t0 = Instant::now();
        size.observe(&report(10, 0.5), t0, POLL);
        // An idle minute, then a burst of fresh requests a fifth of the size: one report
        // stands for one poll interval only, so the remembered size stays near the old one.
        let later = t0 + Duration::from_secs(60);
        size.observe(&report(10, 0.1), later, POLL);
        let after_one = size.remembered().unwrap();
        assert!(
            after_one > 0.048 && after_one < 0.05,
            "one report moved it to {after_one}"
        );
        // A minute of reports at the new size brings it most of the way there.
        let mut at = later;
        for _ in 0..30 {
            at += POLL;
            size.observe(&report(10, 0.1), at, POLL);
        }
        let settled = size.remembered().unwrap();
        assert!(settled < 0.03 && settled > 0.01, "settled at {settled}");
    }

    #[test]
    fn reports_closer_than_the_interval_weigh_by_the_time_between_them() {
        let t0 = Instant::now();
        let mut fast = RunningSize::default();
        let mut slow = RunningSize::default();
        fast.observe(&report(10, 0.5), t0, POLL);
        slow.observe(&report(10, 0.5), t0, POLL);
        // Eight early polls a quarter of an interval apart teach what two regular ones do.
        for i in 1..=8 {
            fast.observe(&report(10, 0.1), t0 + POLL / 4 * i, POLL);
        }
        for i in 1..=2 {
            slow.observe(&report(10, 0.1), t0 + POLL * i, POLL);
        }
        let (f, s) = (fast.remembered().unwrap(), slow.remembered().unwrap());
        assert!((f - s).abs() < 1e-3, "{f} against {s}");
    }
}
