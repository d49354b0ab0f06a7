//! Controlled Delay (Nichols & Jacobson, 2012) on one tier of the gateway queue: tells a burst
//! that drains within an interval from a standing queue, and cuts only the standing queue.
//!
//! The controller watches the sojourn time of the waiter at the head of the queue (how long the
//! oldest request has waited). While it stays at or above the target for a whole interval — the
//! interval's minimum sojourn is above target, so no waiter got through quickly — the queue is
//! standing: the controller enters the dropping state and refuses the head, then again after
//! `interval / sqrt(count)`, the paper's control law, so the pace of drops rises until the
//! sojourn falls below target. Below target it leaves the state at once. Re-entering soon after
//! leaving resumes near the previous pace (the paper's `count - 2`), so an oscillating overload is
//! not met with a slow start each time.
//!
//! Drops are at the head, as in the paper (the seed's probabilistic drops at arrival are
//! replaced): the head has waited longest, so refusing it frees the most waiting time. While
//! dropping, an arrival expected to wait past the target is refused as well (`admits`): LLM
//! clients do not slow down after a refusal as TCP senders do after a drop, and against a
//! steady excess the control law alone lets the queue stand (measured in docs/benchmarks.md).

use std::time::Duration;

use tokio::time::Instant;

/// A tier's CoDel settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodelConfig {
    /// The sojourn time a queue may keep standing (the paper's `target`).
    pub target: Duration,
    /// How long the sojourn must stay above target before dropping starts, and the base of the
    /// control law.
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

/// Re-entering the dropping state within this many intervals of the last drop resumes near the
/// previous drop count (the paper's constant).
const RESUME_WITHIN_INTERVALS: u32 = 16;

/// One tier's controller.
#[derive(Debug, Clone)]
pub struct Codel {
    config: CodelConfig,
    /// When the sojourn first stayed above target, plus an interval: dropping may start then.
    first_above: Option<Instant>,
    dropping: bool,
    /// Drops in the current (or last) dropping state.
    count: u32,
    /// The count when the last dropping state was entered.
    last_count: u32,
    /// When the next drop is due while dropping.
    drop_next: Instant,
}

impl Codel {
    pub fn new(config: CodelConfig, now: Instant) -> Self {
        Self {
            config,
            first_above: None,
            dropping: false,
            count: 0,
            last_count: 0,
            drop_next: now,
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

    /// Drops in the current (or last) dropping state.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The queue emptied: nothing stands.
    pub fn empty(&mut self) {
        self.first_above = None;
        self.dropping = false;
    }

    /// The head waiter has waited `sojourn` at `now`: keep it, or drop it. Called whenever the
    /// head is looked at (a dispatch, an arrival, and at `next_look`); a dropped head is taken
    /// out by the caller, which then asks again for the new head.
    pub fn judge(&mut self, sojourn: Duration, now: Instant) -> HeadVerdict {
        let ok_to_drop = self.above_for_an_interval(sojourn, now);
        if self.dropping {
            if !ok_to_drop {
                self.dropping = false;
                return HeadVerdict::Keep;
            }
            if now >= self.drop_next {
                self.count = self.count.saturating_add(1);
                self.drop_next = self.control_law(self.drop_next);
                return HeadVerdict::Drop;
            }
            return HeadVerdict::Keep;
        }
        if !ok_to_drop {
            return HeadVerdict::Keep;
        }
        self.dropping = true;
        let recently = now.saturating_duration_since(self.drop_next)
            < self.config.interval * RESUME_WITHIN_INTERVALS;
        let delta = self.count.saturating_sub(self.last_count);
        self.count = if delta > 1 && recently { delta } else { 1 };
        self.last_count = self.count;
        self.drop_next = self.control_law(now);
        HeadVerdict::Drop
    }

    /// Whether an arrival expected to wait `expected` may join the queue. While dropping, one
    /// expected to wait past the target is refused at once: the control law's pace rises only
    /// with the square root of its drops, which is enough for senders that slow down after a
    /// drop (TCP, for which it was made) but not for clients that keep sending at the same rate,
    /// whose excess it would let stand. Without an estimate (nothing left the queue lately) a
    /// standing queue is not moving, and the arrival is refused too. Outside the dropping state
    /// every arrival may join.
    pub fn admits(&self, expected: Option<Duration>) -> bool {
        !self.dropping || expected.is_some_and(|wait| wait <= self.config.target)
    }

    /// When the head should be looked at again even if nothing happens: the next drop while
    /// dropping, the end of the interval the sojourn has been above target for, or — for a head
    /// waiting since `head_since` and not yet seen above target — when its sojourn reaches it.
    pub fn next_look(&self, head_since: Option<Instant>) -> Option<Instant> {
        if self.dropping {
            Some(self.drop_next)
        } else {
            self.first_above
                .or_else(|| head_since.map(|since| since + self.config.target))
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

    #[test]
    fn while_dropping_an_arrival_that_would_wait_past_the_target_is_refused() {
        let t0 = Instant::now();
        let mut c = codel(t0);
        assert!(
            c.admits(Some(10_000 * MS)),
            "not dropping: the queue takes it"
        );
        c.judge(300 * MS, t0);
        assert_eq!(c.judge(300 * MS, t0 + 5000 * MS), HeadVerdict::Drop);
        assert!(!c.admits(Some(201 * MS)));
        assert!(c.admits(Some(200 * MS)), "within the target");
        assert!(
            !c.admits(None),
            "no estimate: nothing leaves the standing queue"
        );
        c.judge(100 * MS, t0 + 5100 * MS);
        assert!(c.admits(Some(10_000 * MS)), "the state left");
    }

    #[test]
    fn a_burst_that_drains_within_the_interval_loses_nothing() {
        let t0 = Instant::now();
        let mut c = codel(t0);
        // The head waits up to 4.9 s above target, then the queue drains below it.
        for ms in (0..4900u32).step_by(100) {
            assert_eq!(c.judge((300 + ms) * MS, t0 + ms * MS), HeadVerdict::Keep);
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
        // The next drops come interval / sqrt(count) apart: 5 s, 3.54 s, 2.89 s, 2.5 s.
        let mut at = start;
        for count in 1..=4u32 {
            let gap = (5000 * MS).div_f64(f64::from(count).sqrt());
            let next = c.next_look(None).unwrap();
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
    fn it_leaves_the_dropping_state_below_target_and_resumes_near_its_pace() {
        let t0 = Instant::now();
        let mut c = codel(t0);
        c.judge(250 * MS, t0);
        let mut now = t0 + 5000 * MS;
        assert_eq!(c.judge(250 * MS, now), HeadVerdict::Drop);
        for _ in 0..4 {
            now = c.next_look(None).unwrap();
            assert_eq!(c.judge(250 * MS, now), HeadVerdict::Drop);
        }
        assert_eq!(c.count(), 5);
        now += 10 * MS;
        assert_eq!(c.judge(150 * MS, now), HeadVerdict::Keep, "below target");
        assert!(!c.dropping());
        // Standing again soon after: after a whole interval, it resumes at count 5 - 1 = 4.
        c.judge(250 * MS, now);
        now += 5000 * MS;
        assert_eq!(c.judge(250 * MS, now), HeadVerdict::Drop);
        assert_eq!(c.count(), 4, "the drops of the last state, less the first");
        // Much later, it starts over at 1.
        c.empty();
        let later = now + 5000 * 20 * MS;
        c.judge(250 * MS, later);
        assert_eq!(c.judge(250 * MS, later + 5000 * MS), HeadVerdict::Drop);
        assert_eq!(c.count(), 1);
    }

    #[test]
    fn an_empty_queue_resets_the_watch() {
        let t0 = Instant::now();
        let mut c = codel(t0);
        c.judge(250 * MS, t0);
        c.empty();
        assert_eq!(c.next_look(None), None);
        assert_eq!(
            c.judge(250 * MS, t0 + 5000 * MS),
            HeadVerdict::Keep,
            "a fresh interval"
        );
    }
}
