//! The failed engine's arrivals as the scenario reads them: its counter, read every 50 ms, and
//! the stamp of its last arrival, which places an arrival before or after a logged veto exactly.

use std::time::{Duration, SystemTime};

/// How many requests had arrived before `moment`: the highest count whose last arrival came
/// before it (exact whatever the reading interval, the counter being monotonic).
pub(super) fn arrived_before(stamps: &[(u64, u64)], moment: SystemTime) -> u64 {
    let us = moment
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    stamps
        .iter()
        .filter(|(_, last)| *last < us)
        .map(|(n, _)| *n)
        .max()
        .unwrap_or(0)
}

/// The target's count at `at`: the last reading at or before it.
pub(super) fn received_at(readings: &[(Duration, Option<u64>)], at: Duration) -> Option<u64> {
    readings
        .iter()
        .take_while(|(t, _)| *t <= at)
        .filter_map(|(_, n)| *n)
        .last()
}

/// When the count last grew within `[from, to)`; the start of the window when it never did.
pub(super) fn last_arrival(
    readings: &[(Duration, Option<u64>)],
    from: Duration,
    to: Duration,
) -> Option<Duration> {
    let mut last = None;
    let mut seen = received_at(readings, from)?;
    for (t, n) in readings.iter().filter(|(t, _)| *t > from && *t < to) {
        if let Some(n) = *n {
            if n > seen {
                last = Some(*t);
            }
            seen = seen.max(n);
        }
    }
    Some(last.unwrap_or(from))
}

/// The reading just before the count first grew within `[from, to)` (`from` at the earliest):
/// the earliest the first arrival can have come. `None`: it never grew.
pub(super) fn first_arrival(
    readings: &[(Duration, Option<u64>)],
    from: Duration,
    to: Duration,
) -> Option<Duration> {
    let base = received_at(readings, from)?;
    let mut before = from;
    for (t, n) in readings.iter().filter(|(t, _)| *t > from && *t < to) {
        match *n {
            Some(n) if n > base => return Some(before),
            Some(_) => before = *t,
            None => {}
        }
    }
    None
}

/// The first reading after `from` whose count grew past its count at `from` (a restarted
/// engine counts from zero: `fresh`).
pub(super) fn first_arrival_after(
    readings: &[(Duration, Option<u64>)],
    from: Duration,
    fresh: bool,
) -> Option<Duration> {
    let base = if fresh {
        0
    } else {
        received_at(readings, from)?
    };
    readings
        .iter()
        .filter(|(t, _)| *t >= from)
        .find(|(_, n)| n.is_some_and(|n| n > base))
        .map(|(t, _)| *t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64, n: Option<u64>) -> (Duration, Option<u64>) {
        (Duration::from_millis(ms), n)
    }

    #[test]
    fn arrivals_are_read_from_the_engines_counter() {
        let readings = [
            at(0, Some(0)),
            at(1000, Some(4)),
            at(2000, Some(6)),
            at(2500, Some(7)),
            at(3000, Some(7)),
            at(4000, Some(7)),
            at(5000, Some(9)),
        ];
        let s = Duration::from_secs;
        assert_eq!(received_at(&readings, s(2)), Some(6));
        assert_eq!(
            last_arrival(&readings, s(2), s(4)),
            Some(Duration::from_millis(2500))
        );
        assert_eq!(
            last_arrival(&readings, s(3), s(4)),
            Some(s(3)),
            "nothing arrived: out from the start"
        );
        assert_eq!(first_arrival_after(&readings, s(3), false), Some(s(5)));
        assert_eq!(
            first_arrival(&readings, s(2), s(5)),
            Some(s(2)),
            "grew at the first reading after the start: at the start at the latest"
        );
        assert_eq!(first_arrival(&readings, s(3), s(6)), Some(s(4)));
        assert_eq!(first_arrival(&readings, s(3), s(5)), None);
        assert_eq!(first_arrival_after(&readings, s(5), false), None);
        let restarted = [
            at(0, Some(5)),
            at(1000, None),
            at(2000, Some(0)),
            at(3000, Some(1)),
        ];
        assert_eq!(first_arrival_after(&restarted, s(1), true), Some(s(3)));
    }

    #[test]
    fn arrivals_before_a_moment_are_told_by_their_stamps() {
        let us = |n: u64| SystemTime::UNIX_EPOCH + Duration::from_micros(n);
        // Read at counts 3, 5, 8: the fifth came at 1,000 us, the eighth at 2,000 us.
        let stamps = [(3, 500), (5, 1_000), (8, 2_000)];
        assert_eq!(
            arrived_before(&stamps, us(1_001)),
            5,
            "within a reading's interval"
        );
        assert_eq!(arrived_before(&stamps, us(1_000)), 3);
        assert_eq!(arrived_before(&stamps, us(5_000)), 8);
        assert_eq!(arrived_before(&stamps, us(100)), 0);
    }
}
