//! The pressure level (seed 003, "load shedding should not be binary"): how far down the
//! degradation ladder the gateway goes, from what it sees of its queue and its fleet.
//!
//! Three signals, each read as a level, the highest winning:
//!
//! | signal | 1 | 2 | 3 | 4 | 5 | 6 |
//! | --- | --- | --- | --- | --- | --- | --- |
//! | the gateway queue's oldest wait, over the reference delay | >= 1x | >= 2x | >= 4x | >= 8x | >= 16x | |
//! | the share of the fleet's routable workers vetoed as full | >= 1/2 | >= 3/4 | all | | | |
//! | CoDel | | | | a tier dropping | the agent or interactive tier dropping | the interactive tier dropping |
//!
//! The reference delay is the interactive tier's CoDel target (200 ms) unless configured: a queue
//! that holds the most urgent requests that long is the first sign that demand exceeds the fleet.
//! A fleet that is all vetoed but has no queue reaches level 3 (a shorter answer is the only
//! help it can get); levels 4 and up need the queue to show that shortening did not suffice.
//!
//! The level rises at once and falls one step at a time, each only after the level above it held
//! for a whole interval (`Ladder`), so a ladder that flaps between two readings does not flap the
//! requests' bodies.

use std::time::Duration;

use tokio::time::Instant;

/// The highest level: hard shedding of tiers 2 and 1.
pub const MAX_LEVEL: u8 = 6;

/// What the gateway sees, at one reading.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pressure {
    /// The longest any request now in the gateway queue has waited (zero when empty or none).
    pub queue_delay: Duration,
    /// Routable workers vetoed as full (overloaded, busy, at capacity, at their limit), over
    /// the routable workers; 0 when there are none.
    pub vetoed_share: f64,
    /// Which tiers' CoDel is dropping: interactive, agent, batch.
    pub codel_dropping: [bool; 3],
}

impl Pressure {
    /// No pressure at all.
    pub const CALM: Pressure = Pressure {
        queue_delay: Duration::ZERO,
        vetoed_share: 0.0,
        codel_dropping: [false; 3],
    };
}

/// The level one reading calls for, `reference` being the queue delay of level 1.
pub fn level_of(p: &Pressure, reference: Duration) -> u8 {
    let delay = if reference.is_zero() || p.queue_delay.is_zero() {
        0
    } else {
        let ratio = p.queue_delay.as_secs_f64() / reference.as_secs_f64();
        // 1x → 1, 2x → 2, 4x → 3, 8x → 4, 16x → 5.
        if ratio < 1.0 {
            0
        } else {
            (ratio.log2().floor() as u8).saturating_add(1).min(5)
        }
    };
    let vetoed = match p.vetoed_share {
        s if s >= 1.0 => 3,
        s if s >= 0.75 => 2,
        s if s >= 0.5 => 1,
        _ => 0,
    };
    let codel = match p.codel_dropping {
        [true, _, _] => 6,
        [_, true, _] => 5,
        [_, _, true] => 4,
        _ => 0,
    };
    delay.max(vetoed).max(codel).min(MAX_LEVEL)
}

/// The level in force, with hysteresis.
#[derive(Debug, Clone)]
pub struct Ladder {
    interval: Duration,
    level: u8,
    /// Since when the level in force has been called for without a reading above it.
    since: Instant,
}

impl Ladder {
    pub fn new(interval: Duration, now: Instant) -> Self {
        Self {
            interval,
            level: 0,
            since: now,
        }
    }

    pub fn level(&self) -> u8 {
        self.level
    }

    /// A reading that calls for `wanted` at `now`: the level rises to it at once; it falls one
    /// step once the level has held a whole interval with no reading at or above it.
    pub fn observe(&mut self, wanted: u8, now: Instant) -> u8 {
        let wanted = wanted.min(MAX_LEVEL);
        if wanted >= self.level {
            self.level = wanted;
            self.since = now;
        } else if now.saturating_duration_since(self.since) >= self.interval {
            self.level -= 1;
            self.since = now;
        }
        self.level
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const REF: Duration = Duration::from_millis(200);

    fn reading(delay_ms: u64, vetoed: f64, codel: [bool; 3]) -> Pressure {
        Pressure {
            queue_delay: Duration::from_millis(delay_ms),
            vetoed_share: vetoed,
            codel_dropping: codel,
        }
    }

    #[test]
    fn the_table_of_inputs_to_levels() {
        let none = [false; 3];
        let table: &[(Pressure, u8)] = &[
            (Pressure::CALM, 0),
            (reading(199, 0.0, none), 0),
            (reading(200, 0.0, none), 1),
            (reading(399, 0.0, none), 1),
            (reading(400, 0.0, none), 2),
            (reading(800, 0.0, none), 3),
            (reading(1600, 0.0, none), 4),
            (reading(3200, 0.0, none), 5),
            (reading(60_000, 0.0, none), 5),
            (reading(0, 0.49, none), 0),
            (reading(0, 0.5, none), 1),
            (reading(0, 0.75, none), 2),
            (reading(0, 1.0, none), 3),
            (reading(0, 0.0, [false, false, true]), 4),
            (reading(0, 0.0, [false, true, true]), 5),
            (reading(0, 0.0, [true, false, false]), 6),
            (reading(400, 1.0, [false, false, true]), 4),
            (reading(3200, 1.0, none), 5),
        ];
        for (p, level) in table {
            assert_eq!(level_of(p, REF), *level, "{p:?}");
        }
        assert_eq!(level_of(&reading(5000, 0.0, [false; 3]), Duration::ZERO), 0);
    }

    #[test]
    fn the_level_rises_at_once_and_falls_a_step_per_interval_held() {
        let t0 = Instant::now();
        let interval = 5000 * MS;
        let mut ladder = Ladder::new(interval, t0);
        assert_eq!(ladder.observe(4, t0), 4, "at once");
        assert_eq!(ladder.observe(1, t0 + 4999 * MS), 4, "held for an interval");
        assert_eq!(ladder.observe(1, t0 + 5000 * MS), 3, "one step");
        assert_eq!(ladder.observe(0, t0 + 9999 * MS), 3);
        assert_eq!(
            ladder.observe(3, t0 + 9999 * MS),
            3,
            "called for again: held anew"
        );
        assert_eq!(ladder.observe(0, t0 + 14_998 * MS), 3);
        assert_eq!(ladder.observe(0, t0 + 14_999 * MS), 2);
        assert_eq!(ladder.observe(6, t0 + 15_000 * MS), 6);
        assert_eq!(ladder.observe(9, t0 + 15_000 * MS), MAX_LEVEL, "capped");
    }
}
