//! Room kept on each worker for the interactive tier (`--interactive-reserve`) while a model
//! has interactive traffic, and the interactive tier placed where that room is.
//!
//! An engine serves what it has admitted first and has no preemption by tier: on a worker whose
//! KV cache is the bound, whatever was admitted before an interactive request holds the cache for
//! tens of engine-seconds, and the interactive request waits for it. The gateway's queue orders
//! who goes next, but only a place the engine still has can be given. So while a model has
//! interactive traffic (`reserve_in_force`), a request of a less urgent tier goes to one of its
//! workers only if, by its last report, the worker could start a share of its capacity more
//! beyond it: the rest is left for the interactive tier.
//!
//! What a worker could start is read from its report: nothing while it has a waiting queue or
//! its KV usage is at its ceiling; otherwise the lesser of the room in its running window (when
//! known) and the room under its KV ceiling counted in requests of the size running now (the KV
//! the running requests hold, over how many they are) or of the size its requests settle at
//! (`RunningSize`), whichever is larger, requests running smaller counted as grown to it
//! (`kv_room`). Its capacity is what it runs plus that room. Between reports, the requests
//! every replica sent it since count against the room and those that ended add to it (each
//! freed a place, and the KV of a request). An engine with no
//! room at all may still take a less urgent request into its queue, up to its waiting ceiling
//! less the reserve (`keeps_off`).
//!
//! The room kept is of use only if the interactive request lands on it: while a reserve is set,
//! an interactive request goes to a worker where it starts at once when one exists
//! (`seeks_room`, `starts_now`), whatever the policy would have chosen among the others.

use std::time::Duration;

use crate::admission::Tier;
use crate::load::LoadReport;

use super::size::size_now;
use super::{Ceilings, Projection, QueueGate};

/// How long the reserve is kept after an interactive request for a model was answered:
/// interactive traffic comes in a person's turns, seconds to a minute apart, and a reserve
/// dropped between two turns would be gone, taken by less urgent work, when the next came.
///
/// Kept only once a request has run late, the reserve comes too late on a fleet whose answers
/// hold the KV for tens of seconds: the first misses are what switch it on (measured: 91.7-97.5%
/// of interactive requests in time at 1x against 100% kept from the first request). A model
/// with no interactive traffic keeps nothing back.
pub const RESERVE_HOLD: Duration = Duration::from_secs(60);

/// The share of each worker's capacity a request of `tier` must leave to the interactive tier,
/// `reserve` set and an interactive request for the model last answered `since_interactive`
/// ago (`None`: never): the reserve for a less urgent request within `RESERVE_HOLD` of it,
/// nothing otherwise.
pub fn reserve_in_force(reserve: f64, tier: Tier, since_interactive: Option<Duration>) -> f64 {
    let held = since_interactive.is_some_and(|ago| ago < RESERVE_HOLD);
    if tier > Tier::Interactive && held {
        reserve
    } else {
        0.0
    }
}

/// Whether a request of `tier` goes, when one exists, to a worker where it starts at once
/// (`StartRoom::starts_now`), `reserve` being the model's interactive reserve: an interactive
/// request while a reserve is set. The reserve keeps room on each worker, but room on one
/// worker is no help to a request the policy sends to another whose engine has a queue (or no
/// KV to start it): there it waits in the engine, behind requests admitted before it, for as
/// long as their answers hold their places — seconds on a fleet of long answers. Less urgent
/// requests are placed by the policy alone: the reserve already keeps them where there is room
/// for them.
pub fn seeks_room(tier: Tier, reserve: f64) -> bool {
    tier == Tier::Interactive && reserve > 0.0
}

/// What a worker could still start by its last report, and what it holds in all.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StartRoom {
    /// Requests it could start at the report; `None`: unknown (nothing running, and neither a
    /// window nor a request's size learnt), and then no reserve is judged.
    pub room: Option<u64>,
    /// Requests running at the report plus `room`.
    pub capacity: u64,
    /// Requests in flight on it from every replica when the report arrived.
    pub load_at_report: u64,
}

impl StartRoom {
    /// The room `report` shows under `ceilings`, with the engine's running window when learned,
    /// the requests in flight on it then, and the size its running requests settle at
    /// (`RunningSize::remembered`).
    pub fn new(
        report: &LoadReport,
        ceilings: &Ceilings,
        window: Option<u64>,
        load_at_report: u64,
        settled: Option<f64>,
    ) -> Self {
        let running = report.running();
        let saturated = report.waiting() > 0
            || ceilings
                .token_usage
                .is_some_and(|c| report.mean_kv_usage() >= c);
        let room = if saturated {
            Some(0)
        } else {
            let by_window = window.map(|w| w.saturating_sub(running));
            let by_kv = kv_room(report, ceilings.token_usage, settled);
            match (by_window, by_kv) {
                (Some(w), Some(k)) => Some(w.min(k)),
                (w, k) => w.or(k),
            }
        };
        Self {
            room,
            capacity: running + room.unwrap_or(0),
            load_at_report,
        }
    }

    /// The room when the report shows the engine preempted `preempted` requests since the one
    /// before: none. Its KV was overcommitted — the running requests grew into more than it
    /// holds, and long answers keep growing — and the engine puts a preempted request back at
    /// the front of its queue and schedules no waiting request in a step that preempted (vLLM,
    /// `vllm/v1/core/sched/scheduler.py` `schedule` and `_preempt_request`, read at `00024d3`),
    /// so it is recomputed before any new one: an interactive request would wait behind them.
    /// SGLang's retractions count the same (`preempted_since`). The capacity is kept, so the
    /// reserve is still measured on it (measured on the long-answer fleet, in one run:
    /// interactive requests 100 / 99.6 / 100 / 100% in time at 1x-4x against 100 / 98.3 /
    /// 98.9 / 100%, goodput the same).
    pub fn after_preemptions(self, preempted: u64) -> Self {
        if preempted == 0 {
            return self;
        }
        Self {
            room: self.room.map(|_| 0),
            ..self
        }
    }

    /// The room left now, with `load_now` requests in flight: what was sent since the report
    /// takes from it, what ended gives back. Without the second, an engine of short answers,
    /// which turns over much of its batch between two reports, would look fuller with every
    /// request sent until the next report, and the reserve would keep its freed places idle.
    pub fn left(&self, load_now: u64) -> Option<u64> {
        self.room
            .map(|room| (room + self.load_at_report).saturating_sub(load_now))
    }

    /// Whether a request sent now, `load_now` in flight, would start at once: room left by the
    /// report, or no opinion when the room is unknown (nothing running, or no report).
    pub fn starts_now(&self, load_now: u64) -> bool {
        self.left(load_now).is_none_or(|left| left > 0)
    }

    /// Whether the report left no room beyond `reserve` for a less urgent request: then each
    /// request that ends on the worker asks for an early report, so the room it frees is seen
    /// within the load monitor's spacing rather than an interval later.
    pub fn tight(&self, reserve: f64) -> bool {
        self.within_reserve(self.load_at_report, reserve)
    }

    /// Whether a request of a less urgent tier should keep off the worker now, `reserve` kept
    /// for the interactive tier. On a saturated engine (its report showed a queue, or its KV
    /// usage at the ceiling: no room to start anything) it may still join the engine's queue,
    /// projected as `gate` projects it, up to the waiting ceiling less the reserve: an
    /// interactive request then finds at most that ahead of it, and the engine refills from its
    /// own queue as requests end instead of idling until the next report. Otherwise it keeps off
    /// while the room left is no more than the reserve (`within_reserve`).
    pub fn keeps_off(
        &self,
        gate: &QueueGate,
        pending_now: u64,
        load_now: u64,
        projection: Projection,
        reserve: f64,
    ) -> bool {
        if reserve <= 0.0 {
            return false;
        }
        match gate.ceiling {
            Some(ceiling) if gate.saturated() => {
                gate.projected_by(pending_now, projection) + self.kept(reserve) >= ceiling
            }
            _ => self.within_reserve(load_now, reserve),
        }
    }

    /// The room left now beyond the reserve (see `within_reserve`): what less urgent requests may
    /// still take. `None` when the room is unknown.
    pub fn beyond_reserve(&self, load_now: u64, reserve: f64) -> Option<u64> {
        let kept = self.kept(reserve);
        self.left(load_now).map(|left| left.saturating_sub(kept))
    }

    /// The requests `reserve` keeps of the capacity: rounded up, at least one (none without a
    /// reserve).
    fn kept(&self, reserve: f64) -> u64 {
        if reserve <= 0.0 {
            return 0;
        }
        (reserve * self.capacity as f64).ceil().max(1.0) as u64
    }

    /// Whether a request of a less urgent tier should keep off the worker now, `reserve` (a
    /// share of its capacity, rounded up, at least one) kept for the interactive tier: the room
    /// left is no more than the reserve. Never with no reserve or no known room.
    pub fn within_reserve(&self, load_now: u64, reserve: f64) -> bool {
        if reserve <= 0.0 {
            return false;
        }
        let kept = self.kept(reserve);
        self.left(load_now).is_some_and(|left| left <= kept)
    }
}

/// Requests that fit under the KV `ceiling`, counted in the KV a running request holds: the
/// larger of the size running now and the size the worker's requests settle at (`settled`,
/// learnt from its earlier reports). Requests running smaller than that were started lately and
/// will grow to it: each rank's usage is counted as if they had, so a burst of fresh requests
/// is not read as room beside them, and the cache holds no more than the ceiling over the
/// settled size, whatever runs now. `None` without a ceiling or any size to count in.
///
/// Counting growth only up to the whole cache instead (the ceiling's margin left for growth,
/// which would spare a fleet of short answers) was tried in one run on the long-answer fleet:
/// 88% of interactive requests in time at 2x against 100% for this rule, in a run too noisy to
/// settle it (docs/benchmarks.md).
fn kv_room(report: &LoadReport, ceiling: Option<f64>, settled: Option<f64>) -> Option<u64> {
    let ceiling = ceiling?;
    let now = size_now(report);
    let size = match (now, settled) {
        (Some(now), Some(settled)) => now.max(settled),
        (now, settled) => now.or(settled)?,
    };
    if size <= 0.0 {
        return None;
    }
    let growth = now.map_or(1.0, |now| size / now);
    let free: f64 = report
        .ranks
        .iter()
        .map(|r| (ceiling - r.kv_usage * growth).max(0.0))
        .sum();
    Some((free / size).floor() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::RankLoad;

    fn report(ranks: &[(u64, u64, f64)]) -> LoadReport {
        LoadReport {
            ranks: ranks
                .iter()
                .enumerate()
                .map(|(i, &(running, waiting, kv_usage))| RankLoad {
                    rank: i as u32,
                    running,
                    waiting,
                    kv_usage,
                    ..RankLoad::default()
                })
                .collect(),
            ..LoadReport::default()
        }
    }

    const CEILINGS: Ceilings = Ceilings {
        waiting_requests: Some(8),
        token_usage: Some(0.8),
    };

    #[test]
    fn an_interactive_request_seeks_room_only_while_a_reserve_is_set() {
        assert!(seeks_room(Tier::Interactive, 0.1));
        assert!(
            !seeks_room(Tier::Interactive, 0.0),
            "no reserve: the policy alone"
        );
        assert!(
            !seeks_room(Tier::Agent, 0.1),
            "the reserve places less urgent work"
        );
        assert!(!seeks_room(Tier::Batch, 0.1));
    }

    #[test]
    fn a_request_starts_now_where_the_report_left_room_or_nothing_is_known() {
        // 20 running, 12 more fit; 7 in flight then.
        let room = StartRoom::new(&report(&[(20, 0, 0.5)]), &CEILINGS, None, 7, None);
        assert!(room.starts_now(7));
        assert!(room.starts_now(18), "11 sent since: one place left");
        assert!(!room.starts_now(19), "12 sent since: none left");
        let queued = StartRoom::new(&report(&[(20, 1, 0.5)]), &CEILINGS, None, 7, None);
        assert!(!queued.starts_now(7), "a queue: nothing starts at once");
        assert!(queued.starts_now(6), "one ended since: its place is free");
        let unknown = StartRoom::new(&report(&[(0, 0, 0.0)]), &CEILINGS, None, 0, None);
        assert!(unknown.starts_now(5), "nothing running: no opinion");
        assert!(StartRoom::default().starts_now(3), "no report: no opinion");
    }

    #[test]
    fn the_room_is_the_kv_under_its_ceiling_in_requests_of_the_running_size() {
        // 20 running hold 0.5: 0.025 each; 0.3 more fits under 0.8, 12 of them.
        let room = StartRoom::new(&report(&[(20, 0, 0.5)]), &CEILINGS, None, 7, None);
        assert_eq!((room.room, room.capacity), (Some(12), 32));
        // Two ranks: the free KV of both, in requests of the mean size.
        let two = StartRoom::new(
            &report(&[(10, 0, 0.5), (10, 0, 0.3)]),
            &CEILINGS,
            None,
            0,
            None,
        );
        assert_eq!(two.room, Some(20), "0.8 free over 0.04 a request");
    }

    #[test]
    fn requests_running_smaller_than_they_settle_at_are_counted_as_grown() {
        // 20 fresh requests hold 0.2, 0.01 each; this worker's requests settle at 0.025, and
        // grown to it they hold 0.5: room for 12 more, not 60 — 32 in all, the 0.8 ceiling
        // over the settled size.
        let fresh = report(&[(20, 0, 0.2)]);
        let room = StartRoom::new(&fresh, &CEILINGS, None, 0, Some(0.025));
        assert_eq!((room.room, room.capacity), (Some(12), 32));
        let unknown = StartRoom::new(&fresh, &CEILINGS, None, 0, None);
        assert_eq!(unknown.room, Some(60), "nothing learnt: the size now");
        // Larger now than remembered: the size now.
        let grown = StartRoom::new(&report(&[(20, 0, 0.5)]), &CEILINGS, None, 0, Some(0.01));
        assert_eq!(grown.room, Some(12));
        // An idle worker whose requests' size is known has a known room: a burst sent to it
        // before its next report is counted against that room.
        let idle = StartRoom::new(&report(&[(0, 0, 0.0)]), &CEILINGS, None, 0, Some(0.04));
        assert_eq!((idle.room, idle.capacity), (Some(20), 20));
        assert!(idle.within_reserve(18, 0.1), "18 sent: the 2 left are kept");
    }

    #[test]
    fn a_learned_window_bounds_the_room_too() {
        let room = StartRoom::new(&report(&[(60, 0, 0.2)]), &CEILINGS, Some(64), 0, None);
        assert_eq!((room.room, room.capacity), (Some(4), 64));
    }

    #[test]
    fn a_queue_or_a_full_cache_leaves_no_room_and_an_idle_engine_an_unknown_one() {
        for full in [report(&[(30, 1, 0.5)]), report(&[(30, 0, 0.85)])] {
            let room = StartRoom::new(&full, &CEILINGS, None, 0, None);
            assert_eq!(room.room, Some(0));
            assert!(room.within_reserve(0, 0.1));
        }
        let idle = StartRoom::new(&report(&[(0, 0, 0.0)]), &CEILINGS, None, 0, None);
        assert_eq!(idle.room, None);
        assert!(!idle.within_reserve(100, 0.5), "nothing known: no reserve");
    }

    #[test]
    fn a_saturated_engine_takes_a_less_urgent_request_into_its_queue_short_of_the_reserve() {
        // 36 running at the KV ceiling: no room, capacity 36, a reserve of 0.1 keeps 4 of the
        // waiting ceiling's 8 places.
        let full = report(&[(36, 0, 0.85)]);
        let room = StartRoom::new(&full, &CEILINGS, None, 36, None);
        let gate = QueueGate::new(&full, &CEILINGS, 2, None);
        let keeps_off = |pending| room.keeps_off(&gate, pending, 36, Projection::Hopeful, 0.1);
        assert!(!keeps_off(2 + 3), "3 queued: a fourth may join");
        assert!(keeps_off(2 + 4), "4 queued: the rest of the queue is kept");
        assert!(
            !room.keeps_off(&gate, 2 + 4, 36, Projection::Hopeful, 0.0),
            "no reserve"
        );
        // With room, the room rule: 20 running and room for 12, 4 of the 32 kept.
        let roomy = report(&[(20, 0, 0.5)]);
        let room = StartRoom::new(&roomy, &CEILINGS, None, 5, None);
        let gate = QueueGate::new(&roomy, &CEILINGS, 0, None);
        assert!(!room.keeps_off(&gate, 0, 12, Projection::Wary, 0.1));
        assert!(room.keeps_off(&gate, 0, 13, Projection::Wary, 0.1));
    }

    #[test]
    fn preemptions_since_the_last_report_leave_no_room() {
        let room = StartRoom::new(&report(&[(20, 0, 0.5)]), &CEILINGS, None, 20, None);
        assert_eq!(room.after_preemptions(0), room);
        let preempted = room.after_preemptions(3);
        assert_eq!((preempted.room, preempted.capacity), (Some(0), 32));
        assert!(preempted.tight(0.1));
        let idle = StartRoom::new(&report(&[(0, 0, 0.0)]), &CEILINGS, None, 0, None);
        assert_eq!(
            idle.after_preemptions(1).room,
            None,
            "nothing known stays unknown"
        );
    }

    #[test]
    fn a_report_with_no_room_beyond_the_reserve_is_tight() {
        let roomy = StartRoom::new(&report(&[(20, 0, 0.5)]), &CEILINGS, None, 20, None);
        assert!(!roomy.tight(0.1), "12 places, 4 kept");
        assert!(roomy.tight(0.4), "12 places, 13 kept");
        assert!(!roomy.tight(0.0), "no reserve");
        let full = StartRoom::new(&report(&[(30, 1, 0.5)]), &CEILINGS, None, 30, None);
        assert!(full.tight(0.1), "a queue: no room at all");
        let idle = StartRoom::new(&report(&[(0, 0, 0.0)]), &CEILINGS, None, 0, None);
        assert!(!idle.tight(0.1), "nothing known");
    }

    #[test]
    fn the_reserve_holds_for_less_urgent_tiers_for_a_while_after_an_interactive_request() {
        let just = Some(Duration::from_secs(1));
        assert_eq!(reserve_in_force(0.1, Tier::Batch, just), 0.1);
        assert_eq!(reserve_in_force(0.1, Tier::Agent, just), 0.1);
        assert_eq!(reserve_in_force(0.1, Tier::Interactive, just), 0.0);
        assert_eq!(reserve_in_force(0.1, Tier::Batch, None), 0.0, "never one");
        assert_eq!(
            reserve_in_force(0.1, Tier::Batch, Some(RESERVE_HOLD)),
            0.0,
            "a minute on"
        );
    }

    #[test]
    fn the_reserve_is_a_share_of_the_capacity_and_what_was_sent_since_counts() {
        // 20 running, room for 12: capacity 32, a reserve of 0.1 keeps 4 (3.2 rounded up).
        let room = StartRoom::new(&report(&[(20, 0, 0.5)]), &CEILINGS, None, 5, None);
        assert!(!room.within_reserve(5, 0.1), "8 may still go");
        assert!(!room.within_reserve(12, 0.1), "7 sent: one more may go");
        assert!(room.within_reserve(13, 0.1), "8 sent: the 4 left are kept");
        assert!(!room.within_reserve(100, 0.0), "no reserve");
        assert!(
            !room.within_reserve(0, 0.1),
            "fewer in flight than at the report"
        );
        assert_eq!(
            room.left(2),
            Some(15),
            "3 ended since: their places are free"
        );
        assert_eq!(room.beyond_reserve(5, 0.1), Some(8));
        assert_eq!(room.beyond_reserve(13, 0.1), Some(0));
        assert_eq!(room.beyond_reserve(5, 0.0), Some(12));
    }
}
