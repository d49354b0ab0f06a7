//! Controlled Delay (Nichols & Jacobson, 2012) on one tier of the gateway queue: tells a burst
//! that drains within an interval from a standing queue, and cuts only the standing queue.
//!
//! The controller watches the sojourn time of the waiter at the head of the queue (how long the
//! oldest request has waited). While it stays at or above the target for a whole interval — the
//! interval's minimum sojourn is above target, so no waiter got through quickly — the queue is
//! standing: the controller enters the dropping state and refuses the head, then again after
//! `interval / sqrt(count)`, the paper's control law, so the pace of drops rises while the head's
//! wait stays above target. While dropping, an arrival expected to wait past the target is
//! refused as well (`admits`): LLM clients do not slow down after a refusal as TCP senders do
//! after a drop, and against a steady excess the control law alone lets the queue stand
//! (measured in docs/benchmarks.md). The seed's probabilistic drops at arrival are replaced by
//! these two.
//!
//! The state ends when the head's wait is under target (or the queue is empty) and a whole
//! interval has passed since the last refusal, of a head or of an arrival — not, as in the paper,
//! as soon as the head's wait falls under target. Refusing arrivals is what brings the wait
//! under target while the excess goes on, so leaving then let a whole interval of the excess in
//! before the next cut: at two and three times capacity the tier swung between the two, and what
//! it served of each interval's backlog was late (docs/benchmarks.md). An interval without a
//! refusal is the sign that the load fits again.

use std::time::Duration;

use tokio::time::Instant;

/// A tier's CoDel settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodelConfig {
    /// The sojourn time a queue may keep standing (the paper's `target`).
    pub target: Duration,
    /// How long the sojourn must stay above target before dropping starts, the base of the
    /// control law, and how long nothing must be refused before dropping stops.
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
    /// When the sojourn first stayed above target, plus an interval: dropping may start then.
    first_above: Option<Instant>,
    dropping: bool,
    /// Heads dropped in the current (or last) dropping state.
    count: u32,
    /// When the next head drop is due while dropping.
    drop_next: Instant,
    /// The last refusal while dropping, a head's or an arrival's.
    last_refusal: Instant,
}

impl Codel {
    pub fn new(config: CodelConfig, now: Instant) -> Self {
        Self {
            config,
            first_above: None,
            dropping: false,
            count: 0,
            drop_next: now,
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
    /// the interval that may end in dropping is running.
    pub fn above_target(&self) -> bool {
        self.first_above.is_some()
    }

    /// Heads dropped in the current (or last) dropping state.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The queue is empty at `now`: nothing stands, though the dropping state lasts until an
    /// interval has passed without a refusal (a queue kept short by refusing arrivals empties
    /// now and then while the excess goes on).
    pub fn empty(&mut self, now: Instant) {
        self.first_above = None;
        self.settle(now);
    }

    /// The head waiter has waited `sojourn` at `now`: keep it, or drop it. Called whenever the
    /// head is looked at (a dispatch, an arrival, and at `next_look`); a dropped head is taken
    /// out by the caller, which then asks again for the new head.
    pub fn judge(&mut self, sojourn: Duration, now: Instant) -> HeadVerdict {
        if self.dropping {
            if sojourn < self.config.target {
                self.settle(now);
                return HeadVerdict::Keep;
            }
            if now >= self.drop_next {
                self.count = self.count.saturating_add(1);
                self.drop_next = self.control_law(self.drop_next);
                self.last_refusal = now;
                return HeadVerdict::Drop;
            }
            return HeadVerdict::Keep;
        }
        if !self.above_for_an_interval(sojourn, now) {
            return HeadVerdict::Keep;
        }
        self.dropping = true;
        self.first_above = None;
        self.count = 1;
        self.drop_next = self.control_law(now);
        self.last_refusal = now;
        HeadVerdict::Drop
    }

    /// Whether an arrival expected to wait `expected` may join the queue at `now`. While
    /// dropping, one expected to wait past the target is refused (and the refusal keeps the
    /// state on): the control law's pace rises only with the square root of its drops, which is
    /// enough for senders that slow down after a drop (TCP, for which it was made) but not for
    /// clients that keep sending at the same rate, whose excess it would let stand. Without an
    /// estimate (nothing left the queue lately) a standing queue is not moving, and the arrival
    /// is refused too. Outside the dropping state every arrival may join.
    pub fn admits(&mut self, expected: Option<Duration>, now: Instant) -> bool {
        if !self.dropping || expected.is_some_and(|wait| wait <= self.config.target) {
            return true;
        }
        self.last_refusal = now;
        false
    }

    /// When the head should be looked at again at `now` if nothing else happens. Outside the
    /// dropping state: the end of the interval the sojourn has been above target for, or — for a
    /// head waiting since `head_since` and not yet seen above target — when its sojourn reaches
    /// it. While dropping: when the head is both at target and due a drop, and when an interval
    /// without a refusal would end the state.
    pub fn next_look(&self, head_since: Option<Instant>, now: Instant) -> Option<Instant> {
        let reaches_target = head_since.map(|since| since + self.config.target);
        if !self.dropping {
            return self.first_above.or(reaches_target);
        }
        let head_due = reaches_target.map(|at| at.max(self.drop_next));
        let ends = Some(self.last_refusal + self.config.interval).filter(|at| *at > now);
        match (head_due, ends) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Leaves the dropping state once a whole interval has passed without a refusal.
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

    /// The paper's control law: the next drop `interval / sqrt(count)` after `t`.
    fn control_law(&self, t: Instant) -> Instant {
        t + self
            .config
            .interval
            .div_f64(f64::from(self.count.max(1)).sqrt())
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

    /// A controller that entered the dropping state at `t0 + 5 s`, its head waiting since `t0`.
    fn dropping(t0: Instant) -> Codel {
        let mut c = codel(t0);
        c.judge(200 * MS, t0 + 200 * MS);
        assert_eq!(c.judge(5200 * MS, t0 + 5200 * MS), HeadVerdict::Drop);
        c
    }

    #[test]
    fn while_dropping_an_arrival_that_would_wait_past_the_target_is_refused() {
        let t0 = Instant::now();
        assert!(
            codel(t0).admits(Some(10_000 * MS), t0),
            "not dropping: the queue takes it"
        );
        let mut c = dropping(t0);
        let now = t0 + 5200 * MS;
        assert!(!c.admits(Some(201 * MS), now));
        assert!(c.admits(Some(200 * MS), now), "within the target");
        assert!(
            !c.admits(None, now),
            "no estimate: nothing leaves the standing queue"
        );
        assert_eq!(c.judge(100 * MS, now + 100 * MS), HeadVerdict::Keep);
        assert!(c.dropping(), "a head under target does not end it at once");
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
        let now = t0 + 4950 * MS;
        assert_eq!(c.judge(50 * MS, now), HeadVerdict::Keep);
        assert!(!c.dropping());
        assert_eq!(
            c.next_look(None, now),
            None,
            "below target and empty: nothing to watch for"
        );
        assert_eq!(
            c.next_look(Some(now), now),
            Some(now + c.config().target),
            "a head is looked at again when its sojourn reaches the target"
        );
        // Above again: a fresh interval starts.
        assert_eq!(c.judge(300 * MS, t0 + 5000 * MS), HeadVerdict::Keep);
        assert_eq!(c.next_look(None, now), Some(t0 + 10_000 * MS));
    }

    #[test]
    fn a_standing_queue_is_cut_after_a_whole_interval_by_the_control_law() {
        let t0 = Instant::now();
        let mut c = codel(t0);
        assert_eq!(c.judge(250 * MS, t0), HeadVerdict::Keep);
        assert_eq!(c.judge(250 * MS, t0 + 4999 * MS), HeadVerdict::Keep);
        let start = t0 + 5000 * MS;
        assert_eq!(
            c.judge(250 * MS, start),
            HeadVerdict::Drop,
            "a whole interval"
        );
        assert!(c.dropping());
        assert_eq!(c.count(), 1);
        assert_eq!(
            c.judge(250 * MS, start),
            HeadVerdict::Keep,
            "one head, not the whole backlog"
        );
        // The next drops come interval / sqrt(count) apart: 5 s, 3.54 s, 2.89 s, 2.5 s, while
        // the head stays above target (a head that arrived long ago).
        let mut at = start;
        for count in 1..=4u32 {
            let gap = (5000 * MS).div_f64(f64::from(count).sqrt());
            let next = c.next_look(Some(t0), at).unwrap();
            assert_eq!(next, at + gap, "drop {} follows the control law", count + 1);
            assert_eq!(
                c.judge(250 * MS, next - MS),
                HeadVerdict::Keep,
                "not before"
            );
            assert_eq!(c.judge(250 * MS, next), HeadVerdict::Drop);
            at = next;
        }
        assert_eq!(c.count(), 5);
    }

    #[test]
    fn the_state_lasts_while_arrivals_are_refused_and_ends_an_interval_after_the_last() {
        let t0 = Instant::now();
        let mut c = dropping(t0);
        let mut now = t0 + 5200 * MS;
        // A steady excess: an arrival refused every second, the head under target or the queue
        // empty between.
        for i in 0..10 {
            now += 1000 * MS;
            if i % 2 == 0 {
                c.empty(now);
            } else {
                assert_eq!(c.judge(100 * MS, now), HeadVerdict::Keep);
            }
            assert!(!c.admits(Some(500 * MS), now));
            assert!(c.dropping(), "the excess goes on");
        }
        assert_eq!(
            c.next_look(None, now),
            Some(now + 5000 * MS),
            "looked at again when an interval without a refusal would end it"
        );
        assert_eq!(c.judge(100 * MS, now + 4999 * MS), HeadVerdict::Keep);
        assert!(c.dropping());
        assert_eq!(c.judge(100 * MS, now + 5000 * MS), HeadVerdict::Keep);
        assert!(!c.dropping(), "a whole interval without a refusal");
        let later = now + 5000 * MS;
        assert!(
            c.admits(Some(10_000 * MS), later),
            "every arrival joins again"
        );
        assert_eq!(
            c.judge(250 * MS, later),
            HeadVerdict::Keep,
            "a fresh interval before dropping again"
        );
    }

    #[test]
    fn a_head_above_target_keeps_the_state_and_is_looked_at_when_its_drop_is_due() {
        let t0 = Instant::now();
        let mut c = dropping(t0);
        // No arrival refused, the head standing above target: the next look is the next drop
        // (5 s after the first), and the state has not ended by then.
        let now = t0 + 7000 * MS;
        let head_since = now - 400 * MS;
        assert_eq!(c.judge(400 * MS, now), HeadVerdict::Keep, "not due yet");
        let due = t0 + 10_200 * MS;
        assert_eq!(c.next_look(Some(head_since), now), Some(due));
        assert_eq!(c.judge(3600 * MS, due), HeadVerdict::Drop);
        assert!(c.dropping());
        // A head under target waits for both its target and the next drop, never for a moment
        // already past.
        let fresh = due + 100 * MS;
        let next = c.next_look(Some(fresh), fresh).unwrap();
        assert_eq!(next, due + (5000 * MS).div_f64(2f64.sqrt()));
    }

    #[test]
    fn an_empty_queue_resets_the_watch() {
        let t0 = Instant::now();
        let mut c = codel(t0);
        c.judge(250 * MS, t0);
        c.empty(t0 + MS);
        assert_eq!(c.next_look(None, t0 + MS), None);
        assert_eq!(
            c.judge(250 * MS, t0 + 5000 * MS),
            HeadVerdict::Keep,
            "a fresh interval"
        );
    }
}
