//! The waiting ceiling judged per request between load reports: the queue projected from the
//! last report and this gateway's requests sent and started since (`QueueGate`).

use crate::load::LoadReport;

use super::Ceilings;

/// The overload ceilings as the route stage applies them to each request between two load
/// reports.
///
/// A report is a snapshot up to one poll interval old. Judged only when it arrives, a ceiling
/// lets a whole interval of arrivals in before the veto, then keeps everything out until the next
/// report however fast the engine drains: the protection oscillates with the poll period (the
/// goodput study in docs/benchmarks.md measured it). But each request this gateway sent the
/// worker that has no first byte yet is either waiting or in prefill, so the queue now is the
/// reported queue plus the change in that count since the report: it grows with each request
/// sent and shrinks with each that starts. Judged on that, the waiting ceiling holds the queue at
/// itself, request by request.
///
/// The projection runs only while the engine is saturated — the report showed a queue, or KV
/// usage at its ceiling — since an engine with room starts what it gets at once: a burst into an
/// idle engine is not a queue. KV usage at its ceiling therefore marks the engine saturated and
/// lets the waiting ceiling bound what joins its queue; it vetoes on its own only when the
/// waiting ceiling is off. (Judged alone, per report, a full batch that sits at the KV ceiling
/// shuts the worker until the next report while it drains to idle.)
///
/// That hope is right for requests that arrive one by one: an early poll checks it after a
/// ceiling's worth. It is wrong for the gateway queue, which can release a backlog of hundreds in
/// a millisecond into an engine whose last report showed room — measured: 194 waiting against a
/// ceiling of 8. A held request loses nothing by waiting for the next report, so the queue judges
/// warily (`Projection::Wary`): what was sent since a report with room waits beyond the room the
/// report showed — the engine's running window (`learned_window`) less what was running.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueGate {
    /// Waiting requests the report showed (summed over ranks).
    pub waiting: u64,
    /// This gateway's requests on the worker with no first byte, when the report arrived.
    pub pending_at_report: u64,
    /// `None`: the waiting ceiling is off.
    pub ceiling: Option<u64>,
    /// The report's mean KV usage was at or above its ceiling.
    pub kv_full: bool,
    /// Requests the engine could still start at the report (its running window less those
    /// running), when the window is known; none when saturated.
    pub room: Option<u64>,
}

/// How a worker's waiting queue is projected between reports (see `QueueGate`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Projection {
    /// An engine whose report showed room starts whatever it gets: requests that arrive one by
    /// one, checked by an early poll.
    #[default]
    Hopeful,
    /// Only the room the report showed is room: requests released from the gateway queue.
    Wary,
}

/// The engine's running window as reports reveal it: the most requests it ran while others
/// waited (a queue means the window was full). `None` until such a report.
pub fn learned_window(previous: Option<u64>, report: &LoadReport) -> Option<u64> {
    if report.waiting() == 0 || report.running() == 0 {
        return previous;
    }
    Some(previous.unwrap_or(0).max(report.running()))
}

impl QueueGate {
    /// The gate of `report`, given this gateway's requests without a first byte then and the
    /// engine's running window, if learned.
    pub fn new(
        report: &LoadReport,
        ceilings: &Ceilings,
        pending_at_report: u64,
        window: Option<u64>,
    ) -> Self {
        let mut gate = Self {
            waiting: report.waiting(),
            pending_at_report,
            ceiling: ceilings.waiting_requests,
            kv_full: ceilings
                .token_usage
                .is_some_and(|ceiling| report.mean_kv_usage() >= ceiling),
            room: None,
        };
        gate.room = if gate.saturated() {
            Some(0)
        } else {
            window.map(|w| w.saturating_sub(report.running()))
        };
        gate
    }

    /// The engine had no room at the report.
    pub fn saturated(&self) -> bool {
        self.waiting > 0 || self.kv_full
    }

    /// The waiting queue now, given how many of this gateway's requests have no first byte.
    pub fn projected(&self, pending_now: u64) -> u64 {
        if !self.saturated() {
            return 0;
        }
        (self.waiting + pending_now).saturating_sub(self.pending_at_report)
    }

    /// How many of this gateway's requests without a first byte call for a fresh report before
    /// the next poll is due: a ceiling's worth more than at the report, sent to an engine that
    /// had room. An engine that had no room is already judged per request, so it needs none.
    pub fn early_poll_at(&self) -> Option<u64> {
        match self.ceiling {
            Some(c) if !self.saturated() => Some(self.pending_at_report.saturating_add(c)),
            _ => None,
        }
    }

    /// The waiting queue now by the wary projection: whatever was sent since the report beyond
    /// the room it showed waits (none known: none).
    pub fn projected_wary(&self, pending_now: u64) -> u64 {
        (self.waiting + pending_now)
            .saturating_sub(self.pending_at_report)
            .saturating_sub(self.room.unwrap_or(0))
    }

    /// The worker should get no new request now.
    pub fn full(&self, pending_now: u64) -> bool {
        self.full_by(pending_now, Projection::Hopeful)
    }

    /// The waiting queue now by `projection`.
    pub fn projected_by(&self, pending_now: u64, projection: Projection) -> u64 {
        match projection {
            Projection::Hopeful => self.projected(pending_now),
            Projection::Wary => self.projected_wary(pending_now),
        }
    }

    /// How many requests must start on it before it has room for one more, by `projection`:
    /// its projected queue past the waiting ceiling, plus one; 1 when it is full by KV usage
    /// alone (how much must finish is not counted in requests); 0 when it has room.
    pub fn short_by(&self, pending_now: u64, projection: Projection) -> u64 {
        if !self.full_by(pending_now, projection) {
            return 0;
        }
        match self.ceiling {
            Some(c) => (self.projected_by(pending_now, projection) + 1)
                .saturating_sub(c)
                .max(1),
            None => 1,
        }
    }

    /// The worker should get no new request now, by `projection`.
    pub fn full_by(&self, pending_now: u64, projection: Projection) -> bool {
        let projected = self.projected_by(pending_now, projection);
        match self.ceiling {
            Some(c) => projected >= c,
            None => self.kv_full,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::RankLoad;
    use crate::overload::tests::report;

    #[test]
    fn the_projected_queue_moves_with_requests_sent_and_started() {
        let ceilings = Ceilings {
            waiting_requests: Some(8),
            token_usage: None,
        };
        // The report: 8 waiting, while 10 of ours had no first byte.
        let gate = QueueGate::new(&report(&[(8, 0.5)]), &ceilings, 10, None);
        assert!(gate.full(10), "at the ceiling as reported");
        assert_eq!(gate.projected(9), 7, "one started since");
        assert!(!gate.full(9), "so one more may go");
        assert!(gate.full(9 + 1), "and then it is full again");
        assert_eq!(gate.projected(0), 0, "the queue cannot go below empty");
        assert_eq!(
            gate.projected(25),
            23,
            "sent since the report and not started"
        );
    }

    #[test]
    fn a_full_engine_is_short_of_room_by_its_queue_past_the_ceiling() {
        let ceilings = Ceilings {
            waiting_requests: Some(4),
            token_usage: Some(0.9),
        };
        let gate = QueueGate::new(&report(&[(5, 0.5)]), &ceilings, 0, None);
        assert_eq!(
            gate.short_by(0, Projection::Hopeful),
            2,
            "5 waiting: 2 must start"
        );
        assert_eq!(
            gate.short_by(1, Projection::Hopeful),
            3,
            "one more of ours since"
        );
        let roomy = QueueGate::new(&report(&[(2, 0.5)]), &ceilings, 0, None);
        assert_eq!(roomy.short_by(0, Projection::Hopeful), 0);
        let kv_only = Ceilings {
            waiting_requests: None,
            token_usage: Some(0.9),
        };
        let kv = QueueGate::new(&report(&[(1, 0.95)]), &kv_only, 0, None);
        assert_eq!(
            kv.short_by(0, Projection::Hopeful),
            1,
            "full by KV usage alone"
        );
    }

    #[test]
    fn an_engine_with_room_has_no_queue_to_project() {
        let ceilings = Ceilings {
            waiting_requests: Some(8),
            token_usage: Some(0.9),
        };
        let idle = QueueGate::new(&report(&[(0, 0.2)]), &ceilings, 0, None);
        assert!(!idle.saturated());
        assert!(!idle.full(50), "a burst into an idle engine is not a queue");
    }

    fn running(running: u64, waiting: u64) -> LoadReport {
        LoadReport {
            ranks: vec![RankLoad {
                running,
                waiting,
                kv_usage: 0.5,
                ..RankLoad::default()
            }],
            ..LoadReport::default()
        }
    }

    #[test]
    fn the_running_window_is_learned_from_reports_with_a_queue() {
        assert_eq!(
            learned_window(None, &running(40, 0)),
            None,
            "room: no window"
        );
        assert_eq!(learned_window(None, &running(64, 3)), Some(64));
        assert_eq!(
            learned_window(Some(64), &running(50, 9)),
            Some(64),
            "the most"
        );
        assert_eq!(learned_window(Some(64), &running(10, 0)), Some(64), "kept");
        assert_eq!(
            learned_window(None, &running(0, 5)),
            None,
            "nothing running"
        );
    }

    #[test]
    fn the_wary_projection_counts_only_the_room_a_report_showed() {
        let ceilings = Ceilings {
            waiting_requests: Some(8),
            token_usage: None,
        };
        // 60 of a 64 window running, no queue, 2 of ours without a first byte.
        let gate = QueueGate::new(&running(60, 0), &ceilings, 2, Some(64));
        assert_eq!(gate.room, Some(4));
        assert!(!gate.full(500), "hopeful: room is room");
        assert_eq!(gate.projected_wary(2 + 4), 0, "four fit the window");
        assert_eq!(gate.projected_wary(2 + 4 + 7), 7);
        assert!(!gate.full_by(2 + 4 + 7, Projection::Wary));
        assert!(
            gate.full_by(2 + 4 + 8, Projection::Wary),
            "then the ceiling"
        );
        let unknown = QueueGate::new(&running(60, 0), &ceilings, 2, None);
        assert!(
            unknown.full_by(2 + 8, Projection::Wary),
            "no window known: no room counted"
        );
        let queued = QueueGate::new(&running(64, 5), &ceilings, 5, Some(64));
        assert_eq!(queued.room, Some(0), "a queue leaves no room");
        for pending in 0..20 {
            assert_eq!(
                queued.full_by(pending, Projection::Wary),
                queued.full(pending),
                "a saturated engine is judged alike"
            );
        }
    }

    #[test]
    fn a_ceilings_worth_of_requests_sent_to_an_engine_with_room_asks_for_a_fresh_report() {
        let ceilings = Ceilings {
            waiting_requests: Some(8),
            token_usage: Some(0.9),
        };
        assert_eq!(
            QueueGate::new(&report(&[(0, 0.2)]), &ceilings, 3, None).early_poll_at(),
            Some(11)
        );
        assert_eq!(
            QueueGate::new(&report(&[(2, 0.2)]), &ceilings, 3, None).early_poll_at(),
            None,
            "a queue: already judged per request"
        );
        let kv_only = Ceilings {
            waiting_requests: None,
            token_usage: Some(0.9),
        };
        assert_eq!(
            QueueGate::new(&report(&[(0, 0.2)]), &kv_only, 3, None).early_poll_at(),
            None
        );
    }

    #[test]
    fn kv_at_its_ceiling_saturates_the_engine_and_the_waiting_ceiling_bounds_its_queue() {
        let both = Ceilings {
            waiting_requests: Some(8),
            token_usage: Some(0.9),
        };
        let full_batch = QueueGate::new(&report(&[(0, 0.9)]), &both, 2, None);
        assert!(full_batch.kv_full && full_batch.saturated(), "inclusive");
        assert!(!full_batch.full(2), "no queue yet");
        assert_eq!(full_batch.projected(2 + 8), 8, "what we send now waits");
        assert!(full_batch.full(2 + 8));
        let kv_only = Ceilings {
            waiting_requests: None,
            token_usage: Some(0.9),
        };
        assert!(QueueGate::new(&report(&[(0, 0.95)]), &kv_only, 0, None).full(0));
        assert!(!QueueGate::new(&report(&[(0, 0.89)]), &kv_only, 0, None).full(0));
        let off = QueueGate::new(
            &report(&[(30, 0.99)]),
            &Ceilings {
                waiting_requests: None,
                token_usage: None,
            },
            0,
            None,
        );
        assert!(!off.full(30), "both ceilings off");
    }
}
