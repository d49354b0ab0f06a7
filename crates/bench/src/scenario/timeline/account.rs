//! The accounting of an incident run, as pure functions of its outcomes and of the readings of
//! the target engine's arrival counter: goodput over time, failures, and when the gateway
//! stopped and started sending the target work.

use std::time::Duration;

use serde::Serialize;

use crate::goodput::{Outcome, Tier};
use crate::stats::percentile;

/// Share of a slice within objectives that counts as recovered.
const RECOVERED: f64 = 0.9;

/// Arrivals that stop this long before the incident ends count as an exclusion; arrivals up to
/// the end mean the gateway never took the engine out.
pub const QUIET: Duration = Duration::from_secs(1);

/// What became of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Completed within every objective of its tier.
    Good,
    /// Completed, too late.
    Late,
    /// Refused on purpose: 429, 503 or 529.
    Refused,
    /// Anything else: another error status, no answer, a stream cut short.
    Failed,
}

pub fn fate(o: &Outcome, tiers: &[Tier]) -> Fate {
    if o.status == 200 && o.completed {
        if tiers.get(o.tier).is_some_and(|t| o.meets(&t.slo)) {
            Fate::Good
        } else {
            Fate::Late
        }
    } else if matches!(o.status, 429 | 503 | 529) {
        Fate::Refused
    } else {
        Fate::Failed
    }
}

/// When the incident starts and ends, from the start of the run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Phases {
    pub fault: Duration,
    pub restore: Duration,
    pub end: Duration,
}

impl Phases {
    /// `t` falls in the incident: from the fault up to, not including, the restore.
    pub fn during(&self, t: Duration) -> bool {
        t >= self.fault && t < self.restore
    }
}

/// Requests due in one slice of the run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Bucket {
    pub start_secs: f64,
    pub offered: u64,
    pub good: u64,
    pub refused: u64,
    pub failed: u64,
    /// Of the completed ones, wall seconds.
    pub ttft_p99: f64,
}

impl Bucket {
    pub fn attainment(&self) -> f64 {
        if self.offered == 0 {
            1.0
        } else {
            self.good as f64 / self.offered as f64
        }
    }
}

/// Slices of `width` by due time, up to `end`.
pub fn buckets(
    outcomes: &[Outcome],
    tiers: &[Tier],
    width: Duration,
    end: Duration,
) -> Vec<Bucket> {
    let n = (end.as_secs_f64() / width.as_secs_f64()).ceil().max(1.0) as usize;
    let mut ttfts: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut out: Vec<Bucket> = (0..n)
        .map(|i| Bucket {
            start_secs: (width * i as u32).as_secs_f64(),
            offered: 0,
            good: 0,
            refused: 0,
            failed: 0,
            ttft_p99: 0.0,
        })
        .collect();
    for o in outcomes {
        let i = ((o.due.as_secs_f64() / width.as_secs_f64()) as usize).min(n - 1);
        let b = &mut out[i];
        b.offered += 1;
        match fate(o, tiers) {
            Fate::Good => b.good += 1,
            Fate::Refused => b.refused += 1,
            Fate::Failed => b.failed += 1,
            Fate::Late => {}
        }
        if o.status == 200 && o.completed {
            ttfts[i].extend(o.ttft.map(|t| t.as_secs_f64()));
        }
    }
    for (b, t) in out.iter_mut().zip(&ttfts) {
        b.ttft_p99 = percentile(t, 0.99);
    }
    out
}

/// How long after the incident ended the first slice that was again at least 90% within
/// objectives began; `None` if none was.
pub fn recovered_after(buckets: &[Bucket], restore: Duration) -> Option<f64> {
    let restore = restore.as_secs_f64();
    buckets
        .iter()
        .filter(|b| b.start_secs + 1e-9 >= restore && b.offered > 0)
        .find(|b| b.attainment() >= RECOVERED)
        .map(|b| b.start_secs - restore)
}

/// One reading of the target engine's arrival counter (`None` while it is down).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    pub at: Duration,
    pub received: Option<u64>,
}

/// The times at which the counter had grown since the reading before. A count lower than the
/// last one seen is a new life of the engine, counted from zero.
pub fn arrivals(readings: &[Reading]) -> Vec<Duration> {
    let mut last: Option<u64> = None;
    let mut out = Vec::new();
    for r in readings {
        let Some(now) = r.received else { continue };
        let before = match last {
            Some(seen) if now >= seen => seen,
            Some(_) => 0,
            None => now,
        };
        if now > before {
            out.push(r.at);
        }
        last = Some(now);
    }
    out
}

/// Seconds from the fault to the last request the target got before the gateway stopped sending
/// it any: 0 if it got none, `None` if it got some within `QUIET` of the restore (never taken
/// out).
pub fn excluded_after(arrivals: &[Duration], phases: &Phases) -> Option<f64> {
    let last = arrivals
        .iter()
        .filter(|&&t| t > phases.fault && t < phases.restore)
        .max();
    match last {
        None => Some(0.0),
        Some(&t) if t + QUIET >= phases.restore => None,
        Some(&t) => Some((t - phases.fault).as_secs_f64()),
    }
}

/// Seconds from the restore to the first request the target got after it; `None` if none came.
pub fn rejoined_after(arrivals: &[Duration], phases: &Phases) -> Option<f64> {
    arrivals
        .iter()
        .find(|&&t| t >= phases.restore)
        .map(|&t| (t - phases.restore).as_secs_f64())
}

/// For a crashed engine, whose counter cannot be read: seconds from the kill to the due time of
/// the last request that failed while it was down; 0 if none did.
pub fn last_failure_after(outcomes: &[Outcome], tiers: &[Tier], phases: &Phases) -> f64 {
    outcomes
        .iter()
        .filter(|o| phases.during(o.due))
        .filter(|o| fate(o, tiers) == Fate::Failed)
        .map(|o| (o.due - phases.fault).as_secs_f64())
        .fold(0.0, f64::max)
}

/// When the failing worker stopped getting requests, and its share of them: read from its
/// arrivals where its counter can be read, from the last failure a client saw where it crashed.
pub fn exclusion(
    incident: super::Incident,
    (arrived, readings, outcomes): (&[Duration], &[Reading], &[Outcome]),
    tiers: &[Tier],
    phases: &Phases,
) -> (Option<f64>, Option<f64>) {
    if incident.counter_readable() {
        (
            excluded_after(arrived, phases),
            target_share(readings, outcomes, phases),
        )
    } else if incident == super::Incident::WorkerCrash {
        (Some(last_failure_after(outcomes, tiers, phases)), None)
    } else {
        (None, target_share(readings, outcomes, phases))
    }
}

/// The target's share of the requests due during the incident (a fair share is 1/engines).
pub fn target_share(readings: &[Reading], outcomes: &[Outcome], phases: &Phases) -> Option<f64> {
    let during = |r: &&Reading| r.at >= phases.fault && r.at <= phases.restore;
    let counts: Vec<u64> = readings
        .iter()
        .filter(during)
        .map(|r| r.received)
        .collect::<Option<_>>()?;
    let got = counts.last()?.checked_sub(*counts.first()?)?;
    let offered = outcomes.iter().filter(|o| phases.during(o.due)).count();
    (offered > 0).then(|| got as f64 / offered as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::goodput::Slo;

    fn s(x: f64) -> Duration {
        Duration::from_secs_f64(x)
    }

    fn tiers() -> Vec<Tier> {
        vec![Tier {
            name: "interactive".into(),
            share: 1.0,
            tenant: None,
            slo: Slo {
                ttft: Some(s(1.0)),
                ..Slo::default()
            },
        }]
    }

    fn outcome(due: f64, status: u16, ttft: Option<f64>) -> Outcome {
        Outcome {
            due: s(due),
            tier: 0,
            status,
            code: None,
            completed: status == 200,
            ttft: ttft.map(s),
            e2e: s(ttft.unwrap_or(0.0) + 1.0),
            output_tokens: 10,
            attempts: 1,
            rejected_after: None,
            sent_late: Duration::ZERO,
        }
    }

    fn phases() -> Phases {
        Phases {
            fault: s(10.0),
            restore: s(20.0),
            end: s(30.0),
        }
    }

    #[test]
    fn fates_separate_refusals_from_failures() {
        let t = tiers();
        assert_eq!(fate(&outcome(0.0, 200, Some(0.5)), &t), Fate::Good);
        assert_eq!(fate(&outcome(0.0, 200, Some(1.5)), &t), Fate::Late);
        for refused in [429, 503, 529] {
            assert_eq!(fate(&outcome(0.0, refused, None), &t), Fate::Refused);
        }
        assert_eq!(fate(&outcome(0.0, 502, None), &t), Fate::Failed);
        assert_eq!(fate(&outcome(0.0, 0, None), &t), Fate::Failed);
        let cut = Outcome {
            completed: false,
            ..outcome(0.0, 200, Some(0.1))
        };
        assert_eq!(fate(&cut, &t), Fate::Failed, "a stream cut short");
    }

    #[test]
    fn buckets_count_by_due_time() {
        let outcomes = vec![
            outcome(0.5, 200, Some(0.2)),
            outcome(1.5, 200, Some(2.0)),
            outcome(1.6, 503, None),
            outcome(2.1, 0, None),
            outcome(9.0, 200, Some(0.1)), // past the end: the last slice
        ];
        let b = buckets(&outcomes, &tiers(), s(1.0), s(3.0));
        assert_eq!(b.len(), 3);
        assert_eq!((b[0].offered, b[0].good), (1, 1));
        assert_eq!((b[1].offered, b[1].good, b[1].refused), (2, 0, 1));
        assert_eq!(b[1].ttft_p99, 2.0);
        assert_eq!((b[2].offered, b[2].good, b[2].failed), (2, 1, 1));
        assert_eq!(b[2].start_secs, 2.0);
    }

    #[test]
    fn recovery_is_the_first_good_slice_after_the_restore() {
        let b = |start: f64, offered: u64, good: u64| Bucket {
            start_secs: start,
            offered,
            good,
            refused: 0,
            failed: 0,
            ttft_p99: 0.0,
        };
        let slices = vec![
            b(18.0, 10, 10),
            b(20.0, 10, 2),
            b(22.0, 10, 8),
            b(24.0, 10, 9),
        ];
        assert_eq!(recovered_after(&slices, s(20.0)), Some(4.0));
        assert_eq!(recovered_after(&slices[..3], s(20.0)), None);
        assert_eq!(recovered_after(&slices, s(17.0)), Some(1.0));
    }

    fn readings(counts: &[(f64, Option<u64>)]) -> Vec<Reading> {
        counts
            .iter()
            .map(|&(at, received)| Reading {
                at: s(at),
                received,
            })
            .collect()
    }

    #[test]
    fn arrivals_are_growths_of_the_counter_across_lives() {
        let r = readings(&[
            (0.0, Some(5)),
            (1.0, Some(7)),
            (2.0, Some(7)),
            (3.0, None), // killed
            (4.0, Some(0)),
            (5.0, Some(2)), // a new life from zero
            (6.0, Some(1)), // a third life
        ]);
        assert_eq!(arrivals(&r), vec![s(1.0), s(5.0), s(6.0)]);
    }

    #[test]
    fn exclusion_is_the_last_arrival_during_the_incident() {
        let p = phases();
        assert_eq!(excluded_after(&[s(9.0), s(11.5), s(13.0)], &p), Some(3.0));
        assert_eq!(
            excluded_after(&[s(9.0)], &p),
            Some(0.0),
            "none after the fault"
        );
        assert_eq!(
            excluded_after(&[s(11.0), s(19.5)], &p),
            None,
            "still getting work at the end: never taken out"
        );
        assert_eq!(
            rejoined_after(&[s(11.0), s(21.25), s(22.0)], &p),
            Some(1.25)
        );
        assert_eq!(rejoined_after(&[s(11.0)], &p), None);
    }

    #[test]
    fn crash_exclusion_is_the_last_failure_while_down() {
        let outcomes = vec![
            outcome(9.0, 0, None),  // cut at the kill, due before it
            outcome(10.5, 0, None), // sent to the dead engine
            outcome(12.0, 502, None),
            outcome(14.0, 200, Some(0.1)),
            outcome(21.0, 0, None), // after the restart
        ];
        assert_eq!(last_failure_after(&outcomes, &tiers(), &phases()), 2.0);
        assert_eq!(
            last_failure_after(&outcomes[3..4], &tiers(), &phases()),
            0.0
        );
    }

    #[test]
    fn the_target_share_is_its_arrivals_over_the_offered_during_the_incident() {
        let r = readings(&[
            (9.0, Some(100)),
            (10.0, Some(100)),
            (15.0, Some(104)),
            (20.0, Some(110)),
        ]);
        let outcomes: Vec<Outcome> = (0..40)
            .map(|i| outcome(10.0 + i as f64 / 4.0, 200, Some(0.1)))
            .collect();
        assert_eq!(target_share(&r, &outcomes, &phases()), Some(0.25));
        let down = readings(&[(10.0, Some(3)), (15.0, None), (20.0, Some(1))]);
        assert_eq!(
            target_share(&down, &outcomes, &phases()),
            None,
            "unreadable while down"
        );
    }
}
