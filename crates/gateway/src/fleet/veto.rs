//! A worker's vetoes: the reasons, other than health and its circuit, it should get no new
//! request right now. Each has one writer (the load monitor for the overload and busy verdicts,
//! the forward stage for at-capacity answers, the liveness checker for liveness); the route stage
//! reads them all lock-free on every selection.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use serde::Serialize;
use sluice_core::admission::drain::Starts;
use sluice_core::liveness::LivenessVeto;
use sluice_core::load::LoadReport;
use sluice_core::overload::{OverloadCause, Projection, QueueGate, StartRoom, VetoClass};
use tokio::time::Instant;

use super::atomic::{AtomicEnum, AtomicInstant};

/// How long a worker's own at-capacity answer (429, 529, SGLang's full queue) keeps new requests
/// off it: about the time one of its running requests takes to free a slot.
pub const AT_CAPACITY_VETO: Duration = Duration::from_secs(1);

/// The last load report of a worker and what was concluded from it.
#[derive(Debug, Clone, Serialize)]
pub struct EngineLoad {
    #[serde(flatten)]
    pub(crate) report: LoadReport,
    /// Where it came from: `/metrics`, `/v1/loads` or `/get_load`.
    pub(crate) source: &'static str,
    #[serde(skip)]
    pub at: Instant,
    /// The ceiling it reached, if any.
    pub(crate) overload: Option<OverloadCause>,
    /// Every rank busy by the busy thresholds.
    pub(crate) busy: bool,
    /// Since when its token counter has stood still with requests running.
    #[serde(skip)]
    pub(crate) silent_since: Option<Instant>,
    /// The share of the KV cache a running request settles at on it, learnt from its reports
    /// (`RunningSize`); the interactive reserve counts room in it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) kv_per_request: Option<f64>,
    /// How fast requests start on it by its reports, and what the gateway had sent it and seen
    /// end at this one: how fast room frees on it (`--worker-overload-shed` waits only for room
    /// measured freeing).
    #[serde(skip)]
    pub(crate) starts: Starts,
}

/// The queue gate's fields packed in one word: KV full in the top bit, then three counts of 21
/// bits (a count saturates at 2^21 - 1, far past any ceiling): the room (plus one; 0 is
/// unknown), the waiting queue, this gateway's requests without a first byte.
const KV_FULL: u64 = 1 << 63;
/// In the packed `StartRoom`: the report left no room beyond the interactive reserve
/// (`StartRoom::tight`).
const TIGHT: u64 = 1 << 63;
const COUNT_BITS: u32 = 21;
const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;

/// One worker's vetoes.
#[derive(Debug)]
pub struct Vetoes {
    /// The last report reached a ceiling (what logs, `/loads` and the gauge show).
    overloaded: AtomicBool,
    /// The last report's queue gate in one word, so no reader sees half of a report (`KV_FULL`).
    queue: AtomicU64,
    /// The engine's running window as learned from its reports (`learned_window`); 0: unknown.
    window: AtomicU64,
    /// The last report's `StartRoom` in one word: three counts of 21 bits — the room (plus one;
    /// 0 is unknown), the capacity, the requests in flight at the report — and `TIGHT`.
    start_room: AtomicU64,
    /// The gate's ceiling; 0: off.
    queue_ceiling: AtomicU64,
    /// Pending requests at which the load monitor is asked for an early poll; `u64::MAX`: none.
    early_poll_at: AtomicU64,
    early_poll: tokio::sync::Notify,
    /// Wakes the requests waiting for this worker's answer when it is judged unresponsive; as
    /// many as `give_ups` say may then leave.
    unanswered: tokio::sync::Notify,
    give_ups: AtomicU64,
    busy: AtomicBool,
    /// Its engine reported itself asleep (vLLM's sleep mode): it serves nothing, so it is out of
    /// routing altogether, not a fallback (the load monitor).
    asleep: AtomicBool,
    /// Until when its own at-capacity answer keeps it out (the forward stage).
    at_capacity_until: AtomicInstant,
    /// The liveness checker's verdict.
    liveness: AtomicEnum<Option<LivenessVeto>>,
    load: ArcSwapOption<EngineLoad>,
}

impl Default for Vetoes {
    fn default() -> Self {
        Self {
            overloaded: AtomicBool::new(false),
            queue: AtomicU64::new(0),
            window: AtomicU64::new(0),
            start_room: AtomicU64::new(0),
            queue_ceiling: AtomicU64::new(0),
            early_poll_at: AtomicU64::new(u64::MAX),
            early_poll: tokio::sync::Notify::new(),
            unanswered: tokio::sync::Notify::new(),
            give_ups: AtomicU64::new(0),
            busy: AtomicBool::new(false),
            asleep: AtomicBool::new(false),
            at_capacity_until: AtomicInstant::none(),
            liveness: AtomicEnum::default(),
            load: ArcSwapOption::empty(),
        }
    }
}

impl Vetoes {
    /// The veto in force, if any, given how many of this gateway's requests on the worker have
    /// no first byte (`Worker::veto_class` passes it): doubt (liveness) outranks fullness, so the
    /// all-vetoed rule takes a merely full worker first.
    pub(crate) fn class(&self, pending_now: u64, projection: Projection) -> Option<VetoClass> {
        if self.liveness.load().is_some() {
            return Some(VetoClass::Liveness);
        }
        let full = self.queue_gate().full_by(pending_now, projection)
            || self.busy.load(Ordering::Acquire)
            || self.at_capacity();
        full.then_some(VetoClass::Overload)
    }

    /// The last report's waiting-queue ceiling, as projected to each request.
    pub(crate) fn queue_gate(&self) -> QueueGate {
        let packed = self.queue.load(Ordering::Acquire);
        let ceiling = self.queue_ceiling.load(Ordering::Acquire);
        let count = |at: u32| (packed >> at) & COUNT_MAX;
        QueueGate {
            pending_at_report: count(0),
            waiting: count(COUNT_BITS),
            room: count(2 * COUNT_BITS).checked_sub(1),
            ceiling: (ceiling != 0).then_some(ceiling),
            kv_full: packed & KV_FULL != 0,
        }
    }

    /// What the last report says the worker could still start (`StartRoom`).
    pub(crate) fn start_room(&self) -> StartRoom {
        let packed = self.start_room.load(Ordering::Acquire);
        let count = |at: u32| (packed >> at) & COUNT_MAX;
        StartRoom {
            load_at_report: count(0),
            capacity: count(COUNT_BITS),
            room: count(2 * COUNT_BITS).checked_sub(1),
        }
    }

    /// A report's `StartRoom` (the load monitor, with the report), and whether it left no room
    /// beyond the interactive reserve (`StartRoom::tight`).
    pub(crate) fn set_start_room(&self, room: StartRoom, tight: bool) {
        let plus_one = room.room.map_or(0, |r| r.min(COUNT_MAX - 1) + 1);
        let packed = room.load_at_report.min(COUNT_MAX)
            | room.capacity.min(COUNT_MAX) << COUNT_BITS
            | plus_one << (2 * COUNT_BITS);
        let tight = if tight { TIGHT } else { 0 };
        self.start_room.store(packed | tight, Ordering::Release);
    }

    fn set_queue_gate(&self, gate: QueueGate) {
        self.queue_ceiling
            .store(gate.ceiling.unwrap_or(0), Ordering::Release);
        let room = gate.room.map_or(0, |r| r.min(COUNT_MAX - 1) + 1);
        let packed = gate.pending_at_report.min(COUNT_MAX)
            | gate.waiting.min(COUNT_MAX) << COUNT_BITS
            | room << (2 * COUNT_BITS)
            | if gate.kv_full { KV_FULL } else { 0 };
        self.queue.store(packed, Ordering::Release);
        self.early_poll_at
            .store(gate.early_poll_at().unwrap_or(u64::MAX), Ordering::Release);
    }

    /// This gateway's requests waiting for their first byte on the worker went from `before` to
    /// `after`: asks the load monitor for an early poll when that crosses the gate's mark
    /// (`QueueGate::early_poll_at`) — once, on the way up.
    pub(crate) fn pending_rose(&self, before: u64, after: u64) {
        let mark = self.early_poll_at.load(Ordering::Relaxed);
        if before < mark && mark <= after {
            self.early_poll.notify_one();
        }
    }

    /// A request on the worker ended. When the last report found the worker full, or with no
    /// room beyond the interactive reserve, its end freed some of what the report counted, so
    /// the load monitor is asked for an early poll: the veto lifts as soon as the engine has
    /// room, not an interval later (with the gateway queue on, its waiters would otherwise wait
    /// out the interval — longer than an interactive tier's timeout at the default 10 s; and an
    /// engine of short answers would idle behind the reserve). At most one poll per the load
    /// monitor's `EARLY_POLL_SPACING` follows.
    pub(crate) fn request_ended(&self) {
        if self.overloaded.load(Ordering::Relaxed)
            || self.busy.load(Ordering::Relaxed)
            || self.start_room.load(Ordering::Relaxed) & TIGHT != 0
        {
            self.early_poll.notify_one();
        }
    }

    /// Resolves when a request asked for an early poll (`pending_rose`, `request_ended`).
    pub(crate) async fn early_poll_wanted(&self) {
        self.early_poll.notified().await;
    }

    /// Lets `n` of the requests waiting for this worker's answer (`given_up`) go elsewhere.
    pub(crate) fn release_unanswered(&self, n: u64) {
        self.give_ups.store(n, Ordering::Release);
        self.unanswered.notify_waiters();
    }

    /// Resolves when this request, waiting for the worker's answer, may give up on it: the worker
    /// was judged unresponsive and this request got one of the places to leave.
    pub(crate) async fn given_up(&self) {
        loop {
            self.unanswered.notified().await;
            let took = self
                .give_ups
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
            if took.is_ok() {
                return;
            }
        }
    }

    pub(crate) fn overloaded(&self) -> bool {
        self.overloaded.load(Ordering::Acquire)
    }

    pub(crate) fn busy(&self) -> bool {
        self.busy.load(Ordering::Acquire)
    }

    pub(crate) fn asleep(&self) -> bool {
        self.asleep.load(Ordering::Acquire)
    }

    /// The last report says the engine is (or is not) asleep; returns what was known before.
    pub(crate) fn set_asleep(&self, asleep: bool) -> bool {
        self.asleep.swap(asleep, Ordering::AcqRel)
    }

    pub(crate) fn at_capacity(&self) -> bool {
        self.at_capacity_until
            .load()
            .is_some_and(|until| Instant::now() < until)
    }

    /// When its at-capacity veto ends, if one is in force: nothing else announces that moment.
    pub(crate) fn at_capacity_until(&self) -> Option<Instant> {
        self.at_capacity_until
            .load()
            .filter(|until| Instant::now() < *until)
    }

    pub(crate) fn liveness(&self) -> Option<LivenessVeto> {
        self.liveness.load()
    }

    pub fn load(&self) -> Option<Arc<EngineLoad>> {
        self.load.load_full()
    }

    /// The engine's running window, once a report showed it full.
    pub(crate) fn window(&self) -> Option<u64> {
        Some(self.window.load(Ordering::Acquire)).filter(|w| *w > 0)
    }

    /// Learns the window from a report (the load monitor, before it builds the report's gate).
    pub(crate) fn learn_window(&self, report: &sluice_core::load::LoadReport) -> Option<u64> {
        let window = sluice_core::overload::learned_window(self.window(), report);
        self.window.store(window.unwrap_or(0), Ordering::Release);
        window
    }

    /// A report arrived (the load monitor), with its queue gate; returns the previous verdicts
    /// (overloaded, busy).
    pub(crate) fn report(&self, load: EngineLoad, gate: QueueGate) -> (bool, bool) {
        self.set_queue_gate(gate);
        let overloaded = self
            .overloaded
            .swap(load.overload.is_some(), Ordering::AcqRel);
        let busy = self.busy.swap(load.busy, Ordering::AcqRel);
        self.load.store(Some(Arc::new(load)));
        (overloaded, busy)
    }

    /// No opinion: a poll without a report, a worker that left Ready, a replacement. Returns the
    /// previous verdicts (overloaded, busy).
    pub(crate) fn clear_load(&self) -> (bool, bool) {
        self.load.store(None);
        self.asleep.store(false, Ordering::Release);
        self.set_queue_gate(QueueGate::default());
        self.set_start_room(StartRoom::default(), false);
        (
            self.overloaded.swap(false, Ordering::AcqRel),
            self.busy.swap(false, Ordering::AcqRel),
        )
    }

    /// The worker answered "at capacity": keep it out for `period`.
    pub(crate) fn at_capacity_for(&self, period: Duration) {
        self.at_capacity_until.store(Instant::now() + period);
    }

    pub(crate) fn set_liveness(&self, veto: Option<LivenessVeto>) {
        self.liveness.store(veto);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::admission::drain::AtReport;

    fn load(overload: Option<OverloadCause>, busy: bool) -> EngineLoad {
        EngineLoad {
            report: LoadReport::default(),
            source: "/metrics",
            at: Instant::now(),
            overload,
            busy,
            silent_since: None,
            kv_per_request: None,
            starts: Starts::first(AtReport::new(0, (0, 0), Instant::now())),
        }
    }

    impl Vetoes {
        fn class_hopeful(&self, pending_now: u64) -> Option<VetoClass> {
            self.class(pending_now, Projection::Hopeful)
        }
    }

    #[test]
    fn the_gate_with_its_room_is_read_back_whole() {
        let v = Vetoes::default();
        for room in [None, Some(0), Some(5), Some(COUNT_MAX + 7)] {
            let gate = QueueGate {
                room,
                kv_full: true,
                ..gate(3, 70_000)
            };
            v.report(load(None, false), gate);
            let expected = QueueGate {
                room: room.map(|r| r.min(COUNT_MAX - 1)),
                ..gate
            };
            assert_eq!(v.queue_gate(), expected);
        }
    }

    #[test]
    fn the_start_room_is_read_back_whole_and_cleared_with_the_load() {
        let v = Vetoes::default();
        assert_eq!(v.start_room(), StartRoom::default());
        for room in [None, Some(0), Some(12), Some(COUNT_MAX + 3)] {
            let sent = StartRoom {
                room,
                capacity: 40,
                load_at_report: 70_000,
            };
            v.set_start_room(sent, true);
            let expected = StartRoom {
                room: room.map(|r| r.min(COUNT_MAX - 1)),
                ..sent
            };
            assert_eq!(v.start_room(), expected);
        }
        v.clear_load();
        assert_eq!(v.start_room().room, None, "no report, no reserve judged");
    }

    #[test]
    fn a_worker_with_room_by_hope_can_be_full_by_wariness() {
        let v = Vetoes::default();
        v.report(
            load(None, false),
            QueueGate {
                room: Some(2),
                ..gate(0, 4)
            },
        );
        assert_eq!(v.class_hopeful(4 + 10), None);
        assert_eq!(v.class(4 + 9, Projection::Wary), None, "2 start, 7 wait");
        assert_eq!(
            v.class(4 + 10, Projection::Wary),
            Some(VetoClass::Overload),
            "2 start, 8 wait"
        );
    }

    fn gate(waiting: u64, pending_at_report: u64) -> QueueGate {
        QueueGate {
            waiting,
            pending_at_report,
            ceiling: Some(8),
            kv_full: false,
            room: None,
        }
    }

    #[test]
    fn verdicts_come_and_go_with_reports() {
        let v = Vetoes::default();
        assert_eq!(v.class_hopeful(0), None);
        let cause = OverloadCause::Waiting {
            waiting: 9,
            ceiling: 8,
        };
        assert_eq!(
            v.report(load(Some(cause), false), gate(9, 0)),
            (false, false)
        );
        assert_eq!(v.class_hopeful(0), Some(VetoClass::Overload));
        assert!(v.overloaded());
        assert_eq!(v.report(load(None, true), gate(0, 0)), (true, false));
        assert_eq!(
            v.class_hopeful(0),
            Some(VetoClass::Overload),
            "busy is full too"
        );
        let saturated = QueueGate {
            kv_full: true,
            ..gate(0, 3)
        };
        assert_eq!(v.report(load(None, false), saturated), (false, true));
        assert_eq!(v.queue_gate(), saturated, "packed and unpacked whole");
        assert_eq!(
            v.class_hopeful(3 + 7),
            None,
            "KV at its ceiling: what we send waits"
        );
        assert_eq!(
            v.class_hopeful(3 + 8),
            Some(VetoClass::Overload),
            "up to the waiting ceiling"
        );
        assert_eq!(v.clear_load(), (false, false));
        assert_eq!(v.class_hopeful(0), None);
        assert_eq!(v.queue_gate(), QueueGate::default());
        assert!(v.load().is_none());
    }

    #[test]
    fn the_queue_veto_lifts_as_requests_start_and_returns_as_they_are_sent() {
        let v = Vetoes::default();
        let cause = OverloadCause::Waiting {
            waiting: 8,
            ceiling: 8,
        };
        v.report(load(Some(cause), false), gate(8, 12));
        assert_eq!(v.queue_gate(), gate(8, 12), "packed and unpacked whole");
        assert_eq!(v.class_hopeful(12), Some(VetoClass::Overload));
        assert_eq!(
            v.class_hopeful(11),
            None,
            "one of ours started: room for one"
        );
        assert_eq!(v.class_hopeful(14), Some(VetoClass::Overload));
        assert!(
            v.overloaded(),
            "the report's own verdict stands for logs and /loads"
        );
    }

    #[test]
    fn liveness_outranks_fullness() {
        let v = Vetoes::default();
        v.report(load(None, true), gate(0, 0));
        v.set_liveness(Some(LivenessVeto::WedgedPile));
        assert_eq!(v.class_hopeful(0), Some(VetoClass::Liveness));
        assert_eq!(v.liveness(), Some(LivenessVeto::WedgedPile));
        v.set_liveness(None);
        assert_eq!(v.class_hopeful(0), Some(VetoClass::Overload));
    }

    #[test]
    fn a_ceilings_worth_more_pending_on_an_engine_with_room_wants_an_early_poll() {
        use futures_util::FutureExt;
        let v = Vetoes::default();
        v.report(load(None, false), gate(0, 2));
        for pending in 3..10 {
            v.pending_rose(pending - 1, pending);
        }
        assert!(
            v.early_poll_wanted().now_or_never().is_none(),
            "not before 2 + 8"
        );
        v.pending_rose(9, 10);
        assert!(v.early_poll_wanted().now_or_never().is_some());
        v.pending_rose(8, 12);
        assert!(
            v.early_poll_wanted().now_or_never().is_some(),
            "a request of n = 4 crosses the mark too"
        );
        v.report(load(None, false), gate(3, 2));
        v.pending_rose(9, 10);
        assert!(
            v.early_poll_wanted().now_or_never().is_none(),
            "a queue is judged per request: no early poll"
        );
    }

    #[test]
    fn a_request_ending_on_a_worker_with_no_room_beyond_the_reserve_wants_an_early_poll() {
        use futures_util::FutureExt;
        let v = Vetoes::default();
        let room = StartRoom {
            room: Some(1),
            capacity: 20,
            load_at_report: 19,
        };
        v.set_start_room(room, false);
        v.request_ended();
        assert!(
            v.early_poll_wanted().now_or_never().is_none(),
            "room enough"
        );
        v.set_start_room(room, true);
        assert_eq!(v.start_room(), room, "the mark is not read as a count");
        v.request_ended();
        assert!(v.early_poll_wanted().now_or_never().is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn an_at_capacity_answer_keeps_the_worker_out_briefly() {
        let v = Vetoes::default();
        v.at_capacity_for(Duration::from_secs(1));
        assert_eq!(v.class_hopeful(0), Some(VetoClass::Overload));
        tokio::time::advance(Duration::from_millis(999)).await;
        assert!(v.at_capacity());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(!v.at_capacity());
        assert_eq!(v.class_hopeful(0), None);
    }
}
