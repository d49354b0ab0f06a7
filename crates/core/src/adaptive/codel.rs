//! Controlled Delay (Nichols & Jacobson, 2012) on one tier of the gateway queue: tells a burst
//! that drains within an interval from a standing queue, and cuts only the standing queue.
//!
//! The controller watches the sojourn time of the waiter at the head of the queue (how long the
//! oldest request has waited). While it stays at or above the target for a whole interval — the
//! interval's minimum sojourn is above target, so no waiter got through quickly — the queue is
//! standing, and the controller enters the cutting state. There every head whose wait has
//! reached the target is refused, and so is every arrival expected to wait past it (`admits`):
//! the queue is held at the target. The state ends after a whole interval in which nothing had
//! to be refused — the load fits again.
//!
//! This departs from the paper twice, both measured (docs/benchmarks.md). The paper drops one
//! head at a time, `interval / sqrt(count)` apart, and leaves the state as soon as the head's
//! wait falls under the target. Its pace is made for TCP senders, which halve their rate after
//! one drop; LLM clients keep sending, and against a steady excess the paced drops let an
//! interval's backlog be served, every request of it past its objective, while leaving at the
//! first short wait let the next interval's backlog stand again: at twice and three times
//! capacity the tier swung between the two, and most of what it served was late. Held at the
//! target instead, what waits is what can still be served in time.

use std::time::Duration;

use tokio::time::Instant;

/// A tier's CoDel settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodelConfig {
    /// The sojourn time a queue may keep standing (the paper's `target`).
    pub target: Duration,
    /// How long the sojourn must stay above target before cutting starts, and how long nothing
    /// must be refused before it stops.
    pub interval: Duration,
}

/// What to do with the waiter at the head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadVerdict {
    /// Leave it: it goes when room opens.
    Keep,
    /// Refuse it (`codel_drop`).
    Drop,
}

/// One tier's controller.
#[derive(Debug, Clone)]
pub struct Codel {
    config: CodelConfig,
    /// When the sojourn first stayed above target, plus an interval: cutting may start then.
    first_above: Option<Instant>,
    dropping: bool,
    /// Heads cut in the current (or last) cutting state.
    count: u32,
    /// The last refusal while cutting, a head's or an arrival's: an interval without one ends
    /// the state.
    last_refusal: Instant,
}

impl Codel {
    pub fn new(config: CodelConfig, now: Instant) -> Self {
        Self {
            config,
            first_above: None,
            dropping: false,
            count: 0,
            last_refusal: now,
        }
    }

    pub fn config(&self) -> CodelConfig {
        self.config
    }

    /// Whether it is cutting a standing queue now.
    pub fn dropping(&self) -> bool {
        self.dropping
    }

    /// Whether the head's sojourn has been seen at or above target since it was last below:
    /// the interval that may end in cutting is running.
    pub fn above_target(&self) -> bool {
        self.first_above.is_some()
    }

    /// Heads cut in the current (or last) cutting state.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The queue is empty at `now`: nothing stands, though a cutting state lasts until an
    /// interval has passed without a refusal (a queue held at its target empties now and then
    /// while the excess goes on).
    pub fn empty(&mut self, now: Instant) {
        self.first_above = None;
        self.settle(now);
    }

    /// The head waiter has waited `sojourn` at `now`: keep it, or drop it. Called whenever the
    /// head is looked at (a dispatch, an arrival, and at `next_look`); a dropped head is taken
    /// out by the caller, which then asks again for the new head.
    pub fn judge(&mut self, sojourn: Duration, now: Instant) -> HeadVerdict {
        if self.dropping {
            if sojourn >= self.config.target {
                self.count = self.count.saturating_add(1);
                self.last_refusal = now;
                return HeadVerdict::Drop;
            }
            self.settle(now);
            return HeadVerdict::Keep;
        }
        if !self.above_for_an_interval(sojourn, now) {
            return HeadVerdict::Keep;
        }
        self.dropping = true;
        self.first_above = None;
        self.count = 1;
        self.last_refusal = now;
        HeadVerdict::Drop
    }

    /// Whether an arrival expected to wait `expected` may join the queue at `now`. While
    /// cutting, one expected to wait past the target is refused, and the refusal keeps the state
    /// on; without an estimate (nothing left the queue lately) a standing queue is not moving,
    /// and the arrival is refused too. Outside the cutting state every arrival may join.
    pub fn admits(&mut self, expected: Option<Duration>, now: Instant) -> bool {
        self.settle(now);
        if !self.dropping || expected.is_some_and(|wait| wait <= self.config.target) {
            return true;
        }
        self.last_refusal = now;
        false
    }

    /// When the head should be looked at again even if nothing happens: for a head waiting since
    /// `head_since`, when its sojourn reaches the target (cut then, or the interval starts);
    /// the end of the interval the sojourn has been above target for; while cutting, when an
    /// interval without a refusal would end the state.
    pub fn next_look(&self, head_since: Option<Instant>) -> Option<Instant> {
        let reaches_target = head_since.map(|since| since + self.config.target);
        if self.dropping {
            let ends = self.last_refusal + self.config.interval;
            Some(reaches_target.map_or(ends, |at| at.min(ends)))
        } else {
            self.first_above.or(reaches_target)
        }
    }

    /// Leaves the cutting state once a whole interval has passed without a refusal.
    fn settle(&mut self, now: Instant) {
        if self.dropping && now >= self.last_refusal + self.config.interval {
            self.dropping = false;
        }
    }

    fn above_for_an_interval(&mut self, sojourn: Duration, now: Instant) -> bool {
        if sojourn < self.config.target {
            self.first_above = None;
            return false;
        }
        match self.first_above {
            None => {
                self.first_above = Some(now + self.config.interval);
                false
            }
            Some(at) => now >= at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn codel(now: Instant) -> Codel {
        Codel::new(
            CodelConfig {
                target: 200 * MS,
                interval: 5000 * MS,
            },
            now,
        )
    }

    /// A controller that entered the cutting state at `t0 + 5 s`.
    fn cutting(t0: Instant) -> Codel {
        let mut c = codel(t0);
        c.judge(250 * MS, t0);
        assert_eq!(c.judge(5250 * MS, t0 + 5000 * MS), HeadVerdict::Drop);
        c
    }

    #[test]
    fn while_cutting_an_arrival_that_would_wait_past_the_target_is_refused() {
        let t0 = Instant::now();
        assert!(
            codel(t0).admits(Some(10_000 * MS), t0),
            "not cutting: the queue takes it"
        );
        let mut c = cutting(t0);
        let now = t0 + 5000 * MS;
        assert!(!c.admits(Some(201 * MS), now));
        assert!(c.admits(Some(200 * MS), now), "within the target");
        assert!(
            !c.admits(None, now),
            "no estimate: nothing leaves the standing queue"
        );
        assert_eq!(c.judge(100 * MS, now + 100 * MS), HeadVerdict::Keep);
        assert!(c.dropping(), "a head under target does not end it");
    }

    #[test]
    fn a_burst_that_drains_within_the_interval_loses_nothing() {
        let t0 = Instant::now();
        let mut c = codel(t0);
        // The head waits up to 4.9 s above target, then the queue drains below it.
        for ms in (0..4900u32).step_by(100) {
            assert_eq!(c.judge((300 + ms) * MS, t0 + ms * MS), HeadVerdict::Keep);
            assert!(c.admits(Some(10_000 * MS), t0 + ms * MS));
        }
        assert_eq!(c.judge(50 * MS, t0 + 4950 * MS), HeadVerdict::Keep);
        assert!(!c.dropping());
        assert_eq!(
            c.next_look(None),
            None,
            "below target and empty: nothing to watch for"
        );
        assert_eq!(
            c.next_look(Some(t0)),
            Some(t0 + c.config().target),
            "a head is looked at again when its sojourn reaches the target"
        );
        // Above again: a fresh interval starts.
        assert_eq!(c.judge(300 * MS, t0 + 5000 * MS), HeadVerdict::Keep);
        assert_eq!(c.next_look(None), Some(t0 + 10_000 * MS));
    }

    #[test]
    fn a_standing_queue_is_cut_to_its_target_at_once_after_a_whole_interval() {
        let t0 = Instant::now();
        let mut c = codel(t0);
        assert_eq!(c.judge(250 * MS, t0), HeadVerdict::Keep);
        assert_eq!(c.judge(5249 * MS, t0 + 4999 * MS), HeadVerdict::Keep);
        let start = t0 + 5000 * MS;
        // The interval's backlog, oldest first: every head at or past the target goes in the
        // same look, the first under it stays.
        for wait in [5250, 4000, 1000, 200] {
            assert_eq!(c.judge(wait * MS, start), HeadVerdict::Drop, "{wait} ms");
        }
        assert_eq!(c.judge(199 * MS, start), HeadVerdict::Keep);
        assert_eq!(c.count(), 4);
        assert_eq!(
            c.next_look(Some(start - 199 * MS)),
            Some(start + MS),
            "looked at again when that head reaches the target"
        );
        assert_eq!(
            c.judge(200 * MS, start + MS),
            HeadVerdict::Drop,
            "and cut then"
        );
    }

    #[test]
    fn the_state_lasts_while_refusals_go_on_and_ends_an_interval_after_the_last() {
        let t0 = Instant::now();
        let mut c = cutting(t0);
        let mut now = t0 + 5000 * MS;
        // A steady excess: an arrival refused every second, the queue emptying between.
        for _ in 0..10 {
            now += 1000 * MS;
            c.empty(now);
            assert!(!c.admits(Some(500 * MS), now));
            assert!(
                c.dropping(),
                "an empty queue does not end it while arrivals are refused"
            );
        }
        assert_eq!(
            c.next_look(None),
            Some(now + 5000 * MS),
            "looked at again when an interval without a refusal would end it"
        );
        c.empty(now + 4999 * MS);
        assert!(c.dropping());
        c.empty(now + 5000 * MS);
        assert!(!c.dropping(), "a whole interval without a refusal");
        let later = now + 5000 * MS;
        assert!(
            c.admits(Some(10_000 * MS), later),
            "every arrival joins again"
        );
        assert_eq!(
            c.judge(250 * MS, later),
            HeadVerdict::Keep,
            "a fresh interval before cutting again"
        );
    }

    #[test]
    fn an_arrival_within_the_target_does_not_keep_the_state() {
        let t0 = Instant::now();
        let mut c = cutting(t0);
        let end = t0 + 10_000 * MS;
        assert!(c.admits(Some(100 * MS), end - MS));
        assert!(c.dropping());
        assert!(
            c.admits(Some(10_000 * MS), end),
            "ended at the interval's end"
        );
        assert!(!c.dropping());
    }

    #[test]
    fn an_empty_queue_resets_the_watch() {
        let t0 = Instant::now();
        let mut c = codel(t0);
        c.judge(250 * MS, t0);
        c.empty(t0 + MS);
        assert_eq!(c.next_look(None), None);
        assert_eq!(
            c.judge(250 * MS, t0 + 5000 * MS),
            HeadVerdict::Keep,
            "a fresh interval"
        );
    }
}
