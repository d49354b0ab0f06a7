//! The pressure level (seed 003, "load shedding should not be binary"): how far down the
//! degradation ladder the gateway goes, from what it sees of its queue and its fleet.
//!
//! Three signals, each read as a level, the highest winning:
//!
//! | signal | 1 | 2 | 3 | 4 | 5 | 6 |
//! | --- | --- | --- | --- | --- | --- | --- |
//! | a tier's oldest wait in the gateway queue, over that tier's reference delay | >= 1x | >= 2x | >= 4x | >= 8x | >= 16x | |
//! | the share of a model's routable workers vetoed as full, for the model worst off | >= 1/2 | >= 3/4 | all | | | |
//! | CoDel | | | | a tier dropping | the agent or interactive tier dropping | the interactive tier dropping |
//!
//! A tier's reference delay is its CoDel target (200 ms, 1 s, 5 s) unless configured: a queue that
//! holds a tier's requests that long is the first sign that demand exceeds the fleet, and each
//! doubling is one more step. Each tier against its own reference, so batch work waiting the
//! seconds it is allowed to wait is not read as pressure. The veto share is per model: a model
//! whose every worker is full is under pressure however idle another model's workers are. A fleet
//! all vetoed but with no queue reaches level 3 (a shorter answer is the only help it can get);
//! levels 4 and up need the queue to show that shortening did not suffice.
//!
//! The level rises at once and falls one step at a time, each only after the level above it held
//! for a hold time with no reading at or above it (`Ladder`). The shedding levels (5 and 6) hold
//! for a fixed, shorter time: refusing is the costliest step. The others' hold starts at the
//! interval and
//! is damped against flapping: a level called back within the hold after it fell (the step was
//! still carrying the load, and undoing it brought the pressure back) doubles the hold, up to 16
//! intervals; each whole hold at level 0 halves it again, down to the interval. A level with a
//! step of its own is undone a quarter at a time: after its hold, a quarter of the requests pass
//! its step (`released`), after another a half, then three quarters, and only then does it fall
//! — so the load a step diverted comes back a share at a time, and pressure back at any share
//! takes the release back. And a share is given back only when the fleet's reports show room for
//! it (`room_for`): the absence of pressure is not room, since the step is what took the
//! pressure away.

use std::time::Duration;

use tokio::time::Instant;

/// The highest level: hard shedding of tiers 2 and 1.
pub const MAX_LEVEL: u8 = 6;

/// What the gateway sees, at one reading.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pressure {
    /// The longest any request of each tier (interactive, agent, batch) now in the gateway queue
    /// has waited (zero when none).
    pub queue_delay: [Duration; 3],
    /// For the model worst off, its routable workers vetoed as full (overloaded, busy, at
    /// capacity, at their limit) over its routable workers; 0 when there are none.
    pub vetoed_share: f64,
    /// Which tiers' CoDel is dropping: interactive, agent, batch.
    pub codel_dropping: [bool; 3],
}

impl Pressure {
    /// No pressure at all.
    pub const CALM: Pressure = Pressure {
        queue_delay: [Duration::ZERO; 3],
        vetoed_share: 0.0,
        codel_dropping: [false; 3],
    };
}

/// The level one tier's oldest wait calls for: 1 at its reference, one more per doubling, up to 5.
fn delay_level(delay: Duration, reference: Duration) -> u8 {
    if reference.is_zero() || delay.is_zero() {
        return 0;
    }
    let ratio = delay.as_secs_f64() / reference.as_secs_f64();
    if ratio < 1.0 {
        0
    } else {
        // 1x → 1, 2x → 2, 4x → 3, 8x → 4, 16x → 5.
        (ratio.log2().floor() as u8).saturating_add(1).min(5)
    }
}

/// The level one reading calls for, `references` being each tier's queue delay of level 1.
pub fn level_of(p: &Pressure, references: [Duration; 3]) -> u8 {
    let delay = p
        .queue_delay
        .iter()
        .zip(references)
        .map(|(d, r)| delay_level(*d, r))
        .max()
        .unwrap_or(0);
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

/// The hold of a level never grows past this many intervals.
const MAX_HOLD_INTERVALS: u32 = 16;

/// The first level that refuses requests (hard shedding).
pub const SHED_FROM: u8 = 5;

/// A level with a step is undone in this many shares of its requests.
pub const RELEASE_SHARES: u8 = 4;

/// Whether a level released by `released` quarters may give back its next share: `diverted`
/// requests are now in flight where its step sent them (the share given back brings
/// `diverted / (quarters still kept)` of them back), and `room` requests could start where they
/// would come back to, beyond the interactive reserve (`None`: unknown, as on an idle fleet).
pub fn room_for(diverted: u64, released: u8, room: Option<u64>) -> bool {
    let kept = u64::from(RELEASE_SHARES.saturating_sub(released).max(1));
    room.is_none_or(|room| room >= diverted.div_ceil(kept))
}

/// Whether a request the ladder's cascade covers stays on the model it asked for: it does when
/// that model has room and either the cascade is being given back to it (`released`: the request
/// drew a share given back) or the cascade's model has none — a cascade never moves a request
/// from a model with room to one without. Each room is a scan of a model's workers, so each is
/// asked at most once, and only when the answer matters.
pub fn cascade_stays(
    released: bool,
    to_has_room: impl FnOnce() -> bool,
    asked_has_room: impl FnOnce() -> bool,
) -> bool {
    (released || !to_has_room()) && asked_has_room()
}

/// Whether the request drawn `draw`-th (a counter over the requests the top step applies to)
/// passes the top level's step while `released` quarters of them do.
pub fn passes_release(released: u8, draw: u64) -> bool {
    draw % u64::from(RELEASE_SHARES) < u64::from(released)
}

/// The level in force, with hysteresis.
#[derive(Debug, Clone)]
pub struct Ladder {
    interval: Duration,
    /// Bit `l` set: level `l` has a step of its own, so it is released before it falls.
    steps: u8,
    /// Quarters of the requests that pass the top level's step (a level is undone a quarter
    /// at a time).
    released: u8,
    /// How long a shedding level holds: refusing is the costliest step, so it is left sooner
    /// and never damped.
    shed_hold: Duration,
    /// How long a level holds, with no reading at or above it, before it falls a step.
    hold: Duration,
    level: u8,
    /// Since when the level in force has been called for without a reading above it.
    since: Instant,
    /// When the level last fell, until a reading calls it back up.
    fell_at: Option<Instant>,
}

impl Ladder {
    /// `steps`: bit `l` set when level `l` has a step of its own (levels with none fall
    /// without a release).
    pub fn new(interval: Duration, shed_hold: Duration, steps: u8, now: Instant) -> Self {
        Self {
            interval,
            steps,
            released: 0,
            shed_hold,
            hold: interval,
            level: 0,
            since: now,
            fell_at: None,
        }
    }

    pub fn level(&self) -> u8 {
        self.level
    }

    /// How many quarters of the requests now pass the top level's step (0: none; the level is
    /// being undone otherwise).
    pub fn released(&self) -> u8 {
        self.released
    }

    /// How long a level that does not shed must hold before it may fall.
    pub fn hold(&self) -> Duration {
        self.hold
    }

    /// How long the level in force must hold before it may fall.
    fn hold_now(&self) -> Duration {
        if self.level >= SHED_FROM {
            self.shed_hold
        } else {
            self.hold
        }
    }

    /// A reading that calls for `wanted` at `now`: the level rises to it at once. Once a level
    /// with a step of its own (not a shedding one) has held for its hold with no reading at or
    /// above it, a quarter of the requests pass that step (`released`), then a half, then three
    /// quarters, each after another such hold, and then the level falls a step. Levels without a
    /// step, and the shedding ones, fall at once.
    pub fn observe(&mut self, wanted: u8, now: Instant) -> u8 {
        self.observe_with_room(wanted, true, now)
    }

    /// As `observe`, but a level with a step of its own gives back its next share (or falls)
    /// only when `room` says the fleet has room for what that share brings back (`room_for`):
    /// until then it stays as it is, and gives the share back at the first reading that shows
    /// the room, its hold already served.
    pub fn observe_with_room(&mut self, wanted: u8, room: bool, now: Instant) -> u8 {
        let wanted = wanted.min(MAX_LEVEL);
        if wanted > self.level || (wanted == self.level && self.released > 0) {
            // Undoing (part of) a step brought the pressure back soon: the step was carrying
            // the load.
            let fell_soon = self
                .fell_at
                .take()
                .is_some_and(|fell| now.saturating_duration_since(fell) < self.hold);
            if self.released > 0 || fell_soon {
                self.hold = (self.hold * 2).min(self.interval * MAX_HOLD_INTERVALS);
            }
            self.released = 0;
            self.level = wanted;
            self.since = now;
        } else if wanted == self.level && self.level > 0 {
            self.since = now;
        } else if now.saturating_duration_since(self.since) >= self.hold_now() {
            let stepped =
                self.level > 0 && self.level < SHED_FROM && self.steps & (1 << self.level) != 0;
            if stepped && !room {
                // Its hold is served; what it diverts has nowhere to go back to yet.
                return self.level;
            }
            if self.level == 0 {
                // Calm for a whole hold: the falls that led here stood.
                self.hold = (self.hold / 2).max(self.interval);
            } else if self.level < SHED_FROM
                && self.steps & (1 << self.level) != 0
                && self.released < RELEASE_SHARES - 1
            {
                self.released += 1;
            } else {
                self.level -= 1;
                self.released = 0;
                self.fell_at = Some(now);
            }
            self.since = now;
        }
        self.level
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    /// The tiers' default CoDel targets.
    const REFS: [Duration; 3] = [
        Duration::from_millis(200),
        Duration::from_secs(1),
        Duration::from_secs(5),
    ];

    fn reading(delays_ms: [u64; 3], vetoed: f64, codel: [bool; 3]) -> Pressure {
        Pressure {
            queue_delay: delays_ms.map(Duration::from_millis),
            vetoed_share: vetoed,
            codel_dropping: codel,
        }
    }

    fn interactive(delay_ms: u64) -> Pressure {
        reading([delay_ms, 0, 0], 0.0, [false; 3])
    }

    #[test]
    fn the_table_of_inputs_to_levels() {
        let none = [false; 3];
        let table: &[(Pressure, u8)] = &[
            (Pressure::CALM, 0),
            (interactive(199), 0),
            (interactive(200), 1),
            (interactive(399), 1),
            (interactive(400), 2),
            (interactive(800), 3),
            (interactive(1600), 4),
            (interactive(3200), 5),
            (interactive(60_000), 5),
            // Each tier against its own reference.
            (reading([0, 999, 4999], 0.0, none), 0),
            (reading([0, 0, 5000], 0.0, none), 1),
            (reading([0, 2000, 0], 0.0, none), 2),
            (reading([100, 1000, 20_000], 0.0, none), 3),
            (reading([0; 3], 0.49, none), 0),
            (reading([0; 3], 0.5, none), 1),
            (reading([0; 3], 0.75, none), 2),
            (reading([0; 3], 1.0, none), 3),
            (reading([0; 3], 0.0, [false, false, true]), 4),
            (reading([0; 3], 0.0, [false, true, true]), 5),
            (reading([0; 3], 0.0, [true, false, false]), 6),
            (reading([400, 0, 0], 1.0, [false, false, true]), 4),
            (reading([3200, 0, 0], 1.0, none), 5),
        ];
        for (p, level) in table {
            assert_eq!(level_of(p, REFS), *level, "{p:?}");
        }
        assert_eq!(level_of(&interactive(5000), [Duration::ZERO; 3]), 0);
    }

    #[test]
    fn the_level_rises_at_once_and_falls_a_step_per_interval_held() {
        let t0 = Instant::now();
        let interval = 5000 * MS;
        let mut ladder = Ladder::new(interval, interval, 0, t0);
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
        assert_eq!(ladder.observe(9, t0 + 20_000 * MS), MAX_LEVEL, "capped");
    }

    #[test]
    fn a_level_called_back_soon_after_it_fell_holds_longer_next_time() {
        let t0 = Instant::now();
        let interval = 1000 * MS;
        let mut ladder = Ladder::new(interval, interval, 0, t0);
        ladder.observe(2, t0);
        assert_eq!(ladder.observe(0, t0 + 1000 * MS), 1);
        // Undoing step 2 brought the pressure back within the hold: the hold doubles.
        assert_eq!(ladder.observe(2, t0 + 1500 * MS), 2);
        assert_eq!(ladder.hold(), 2000 * MS);
        assert_eq!(
            ladder.observe(0, t0 + 3499 * MS),
            2,
            "held for the longer hold"
        );
        assert_eq!(ladder.observe(0, t0 + 3500 * MS), 1);
        assert_eq!(ladder.observe(0, t0 + 5500 * MS), 0);
        // Again within the hold after the last fall: 4 s; and never past 16 intervals.
        ladder.observe(2, t0 + 6000 * MS);
        assert_eq!(ladder.hold(), 4000 * MS);
        let mut t = t0 + 6000 * MS;
        for _ in 0..10 {
            t += ladder.hold() + MS;
            assert_eq!(ladder.observe(1, t), 1);
            t += MS;
            assert_eq!(ladder.observe(2, t), 2);
        }
        assert_eq!(ladder.hold(), 16 * interval, "capped");
        // A rise long after the last fall leaves the hold alone.
        t += ladder.hold();
        assert_eq!(ladder.observe(0, t), 1);
        assert_eq!(ladder.observe(2, t + 20 * interval), 2);
        assert_eq!(ladder.hold(), 16 * interval);
    }

    #[test]
    fn each_calm_hold_at_level_zero_halves_the_hold_down_to_the_interval() {
        let t0 = Instant::now();
        let interval = 1000 * MS;
        let mut ladder = Ladder::new(interval, interval, 0, t0);
        ladder.observe(1, t0);
        ladder.observe(0, t0 + 1000 * MS);
        ladder.observe(1, t0 + 1100 * MS);
        ladder.observe(0, t0 + 3100 * MS);
        ladder.observe(1, t0 + 3200 * MS);
        assert_eq!(ladder.hold(), 4000 * MS);
        assert_eq!(ladder.observe(0, t0 + 7200 * MS), 0);
        assert_eq!(ladder.observe(0, t0 + 11_199 * MS), 0);
        assert_eq!(ladder.hold(), 4000 * MS, "not yet a whole hold at 0");
        ladder.observe(0, t0 + 11_200 * MS);
        assert_eq!(ladder.hold(), 2000 * MS);
        ladder.observe(0, t0 + 13_200 * MS);
        ladder.observe(0, t0 + 14_200 * MS);
        ladder.observe(0, t0 + 99_000 * MS);
        assert_eq!(ladder.hold(), interval, "never under the interval");
    }

    #[test]
    fn shedding_levels_hold_their_own_shorter_time() {
        let t0 = Instant::now();
        let mut ladder = Ladder::new(4000 * MS, 1000 * MS, 0b1_0000, t0);
        assert_eq!(ladder.observe(6, t0), 6);
        assert_eq!(ladder.observe(0, t0 + 1000 * MS), 5);
        assert_eq!(ladder.observe(0, t0 + 2000 * MS), 4);
        assert_eq!(
            ladder.observe(0, t0 + 5999 * MS),
            4,
            "a quality step holds longer"
        );
        assert_eq!(ladder.observe(0, t0 + 6000 * MS), 4);
        assert_eq!(ladder.released(), 1, "and is undone a quarter at a time");
        assert_eq!(ladder.observe(0, t0 + 10_000 * MS), 4);
        assert_eq!(ladder.observe(0, t0 + 14_000 * MS), 4);
        assert_eq!(ladder.observe(0, t0 + 18_000 * MS), 3);
    }

    #[test]
    fn a_level_with_a_step_is_undone_a_quarter_at_a_time() {
        let t0 = Instant::now();
        let interval = 1000 * MS;
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // Steps at levels 1 and 2; none at 3.
        let mut ladder = Ladder::new(interval, interval, 0b110, t0);
        assert_eq!(ladder.observe(3, t0), 3);
        assert_eq!(
            ladder.observe(0, at(1000)),
            2,
            "no step at 3: falls at once"
        );
        assert_eq!(ladder.released(), 0);
        for (ms, quarters) in [(2000, 1), (3000, 2), (4000, 3)] {
            assert_eq!(ladder.observe(0, at(ms)), 2);
            assert_eq!(ladder.released(), quarters, "at {ms} ms");
        }
        assert_eq!(ladder.observe(0, at(4999)), 2);
        assert_eq!(ladder.observe(0, at(5000)), 1, "then it falls");
        assert_eq!(ladder.released(), 0);
        // Pressure back at a released level: the release is taken back and the hold doubles.
        assert_eq!(ladder.observe(0, at(6000)), 1);
        assert_eq!(ladder.released(), 1);
        assert_eq!(ladder.observe(1, at(6500)), 1);
        assert_eq!(ladder.released(), 0);
        assert_eq!(ladder.hold(), 2000 * MS);
    }

    #[test]
    fn a_share_is_given_back_only_when_there_is_room_for_it() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut ladder = Ladder::new(1000 * MS, 1000 * MS, 0b100, t0);
        assert_eq!(ladder.observe(2, t0), 2);
        assert_eq!(ladder.observe_with_room(0, false, at(1000)), 2);
        assert_eq!(ladder.released(), 0, "held: no room for what it diverts");
        assert_eq!(ladder.observe_with_room(0, false, at(5000)), 2);
        assert_eq!(ladder.released(), 0);
        assert_eq!(ladder.observe_with_room(0, true, at(5001)), 2);
        assert_eq!(
            ladder.released(),
            1,
            "room shown: its hold was served long ago"
        );
        assert_eq!(ladder.hold(), 1000 * MS, "waiting for room is not flapping");
        // Levels without a step do not wait for room.
        let mut plain = Ladder::new(1000 * MS, 1000 * MS, 0, t0);
        plain.observe(1, t0);
        assert_eq!(plain.observe_with_room(0, false, at(1000)), 0);
    }

    #[test]
    fn the_room_asked_for_is_the_share_given_back() {
        // 40 diverted, none released: a quarter comes back, 10.
        assert!(room_for(40, 0, Some(10)));
        assert!(!room_for(40, 0, Some(9)));
        // Three quarters released: the rest (all 40 still diverted by the last quarter) falls.
        assert!(room_for(40, 3, Some(40)));
        assert!(!room_for(40, 3, Some(39)));
        assert!(room_for(40, 0, None), "unknown room: no opinion");
        assert!(room_for(0, 2, Some(0)), "nothing diverted");
    }

    #[test]
    fn a_cascade_keeps_a_request_on_its_model_only_where_that_model_has_room() {
        let asked = std::cell::Cell::new(0);
        let room = |has: bool| {
            let asked = &asked;
            move || {
                asked.set(asked.get() + 1);
                has
            }
        };
        // Given back, with room where it asked: it stays, the cascade's model never asked.
        assert!(cascade_stays(true, room(false), room(true)));
        assert_eq!(asked.replace(0), 1);
        // Not given back: it stays only if the cascade's model is full and its own is not.
        assert!(cascade_stays(false, room(false), room(true)));
        assert!(!cascade_stays(false, room(true), room(true)));
        assert_eq!(
            asked.replace(0),
            3,
            "the asked model's room not asked when it goes"
        );
        // No room where it asked: it goes, whatever else.
        assert!(!cascade_stays(true, room(false), room(false)));
        assert!(!cascade_stays(false, room(false), room(false)));
    }

    #[test]
    fn the_released_share_of_draws_passes() {
        let passing = |released| (0..8).filter(|d| passes_release(released, *d)).count();
        assert_eq!([0, 1, 2, 3].map(passing), [0, 2, 4, 6]);
    }
}
