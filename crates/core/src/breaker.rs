//! A per-worker circuit breaker as a pure state machine.
//!
//! Why a breaker when health checks exist? Probes run every few seconds at best; a worker that
//! starts failing real requests should stop receiving them after a handful of failures, not after
//! the next probe cycle. The breaker is fed real outcomes and answers one question: may a request
//! go to this worker now?
//!
//! States: `Closed` (requests flow; outcomes are counted), `Open` (no requests until the open
//! timeout passes), `HalfOpen` (a bounded number of trial requests; enough consecutive successes
//! close it, one failure reopens it for a full timeout).
//!
//! Two rules open a closed circuit, whichever comes first: `failure_threshold` failures in a row
//! (a dead worker), or a failure rate — at least `rate` of at least `min_requests` outcomes within
//! the last `window` (a sick worker that fails every other request, which never fails ten in a
//! row). The window is ten buckets of a tenth of it each, so it costs a fixed few words and an
//! outcome is forgotten at most a tenth of the window late.
//!
//! Guardrails:
//! - Time is a parameter (`now`), never read here, so the gateway can drive the `Open -> HalfOpen`
//!   move from a timer at the exact deadline and tests can use paused time.
//! - Every admission carries the breaker's generation. An outcome from a request admitted before
//!   the last transition is ignored: a slow request admitted while `Closed` that fails after the
//!   circuit reopened must not cut short the next trial.
//! - In `HalfOpen` at most `half_open_trials` requests are in flight at once.

use std::time::Duration;

use tokio::time::Instant;

/// Thresholds of one breaker.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BreakerConfig {
    /// Consecutive failures that open a closed circuit.
    pub failure_threshold: u32,
    /// Consecutive trial successes that close a half-open circuit.
    pub success_threshold: u32,
    /// How long an open circuit refuses requests before its trial.
    pub open_timeout: Duration,
    /// Trial requests a half-open circuit lets through at once.
    pub half_open_trials: u32,
    /// The failure-rate rule; `None`: only consecutive failures open the circuit.
    pub failure_rate: Option<FailureRate>,
}

/// Opens a closed circuit when at least `rate` of at least `min_requests` outcomes within
/// `window` were failures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FailureRate {
    pub rate: f64,
    pub min_requests: u32,
    pub window: Duration,
}

impl Default for FailureRate {
    fn default() -> Self {
        Self {
            rate: 0.5,
            min_requests: 20,
            window: Duration::from_secs(120),
        }
    }
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            failure_threshold: 10,
            success_threshold: 3,
            open_timeout: Duration::from_secs(60),
            half_open_trials: 3,
            failure_rate: Some(FailureRate::default()),
        }
    }
}

/// Buckets of the failure-rate window.
const BUCKETS: usize = 10;

/// Outcomes of the last window, in `BUCKETS` buckets; each knows which tenth of time it counts.
#[derive(Debug, Clone, Copy, Default)]
struct Window {
    /// Where bucket numbers count from (the circuit's last close).
    epoch: Option<Instant>,
    /// (bucket number, successes, failures).
    buckets: [(u64, u32, u32); BUCKETS],
}

impl Window {
    fn width(window: Duration) -> Duration {
        (window / BUCKETS as u32).max(Duration::from_millis(1))
    }

    /// Counts one outcome at `now`; returns (outcomes, failures) within the window.
    fn add(&mut self, rule: &FailureRate, failed: bool, now: Instant) -> (u32, u32) {
        let epoch = *self.epoch.get_or_insert(now);
        let width = Self::width(rule.window).as_nanos();
        let number =
            u64::try_from(now.saturating_duration_since(epoch).as_nanos() / width).unwrap_or(0) + 1;
        let bucket = &mut self.buckets[(number % BUCKETS as u64) as usize];
        if bucket.0 != number {
            *bucket = (number, 0, 0);
        }
        if failed {
            bucket.2 += 1;
        } else {
            bucket.1 += 1;
        }
        self.buckets
            .iter()
            .filter(|(n, _, _)| *n != 0 && *n + BUCKETS as u64 > number)
            .fold((0, 0), |(all, bad), (_, ok, failed)| {
                (all + ok + failed, bad + failed)
            })
    }
}

/// What readers and metrics see.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

impl BreakerState {
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }

    /// The value of the `sluice_worker_circuit_state` gauge: 0 closed, 1 open, 2 half-open.
    pub fn gauge(self) -> i64 {
        match self {
            BreakerState::Closed => 0,
            BreakerState::Open => 1,
            BreakerState::HalfOpen => 2,
        }
    }
}

/// A request's outcome as the breaker counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Success,
    Failure,
}

/// Permission to send one request, to be handed back with its outcome (or released).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    generation: u64,
    trial: bool,
}

impl Ticket {
    pub fn is_trial(&self) -> bool {
        self.trial
    }
}

/// A state change, for metrics and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    pub from: BreakerState,
    pub to: BreakerState,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen { successes: u32, in_flight: u32 },
}

/// One worker's breaker.
#[derive(Debug, Clone)]
pub struct Breaker {
    cfg: BreakerConfig,
    phase: Phase,
    /// Outcomes while closed, for the failure-rate rule.
    window: Window,
    /// Bumped on every transition, so outcomes of earlier admissions can be told apart.
    generation: u64,
}

impl Breaker {
    pub fn new(cfg: BreakerConfig) -> Self {
        Self {
            cfg,
            phase: Phase::Closed { failures: 0 },
            window: Window::default(),
            generation: 0,
        }
    }

    pub fn config(&self) -> BreakerConfig {
        self.cfg
    }

    pub fn state(&self) -> BreakerState {
        match self.phase {
            Phase::Closed { .. } => BreakerState::Closed,
            Phase::Open { .. } => BreakerState::Open,
            Phase::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// Consecutive failures counted while closed.
    pub fn consecutive_failures(&self) -> u32 {
        match self.phase {
            Phase::Closed { failures } => failures,
            _ => 0,
        }
    }

    /// When an open circuit is due to go half-open.
    pub fn open_until(&self) -> Option<Instant> {
        match self.phase {
            Phase::Open { until } => Some(until),
            _ => None,
        }
    }

    /// Asks to send one request. `None` when the circuit is open or its trials are all taken.
    pub fn try_admit(&mut self) -> Option<Ticket> {
        let generation = self.generation;
        match &mut self.phase {
            Phase::Closed { .. } => Some(Ticket {
                generation,
                trial: false,
            }),
            Phase::Open { .. } => None,
            Phase::HalfOpen { in_flight, .. } => {
                if *in_flight >= self.cfg.half_open_trials {
                    return None;
                }
                *in_flight += 1;
                Some(Ticket {
                    generation,
                    trial: true,
                })
            }
        }
    }

    /// Hands a ticket back without an outcome (the client went away first).
    pub fn release(&mut self, ticket: Ticket) {
        if ticket.generation != self.generation {
            return;
        }
        if let Phase::HalfOpen { in_flight, .. } = &mut self.phase {
            *in_flight = in_flight.saturating_sub(1);
        }
    }

    /// Counts the outcome of an admitted request.
    pub fn record(&mut self, ticket: Ticket, outcome: Outcome, now: Instant) -> Option<Transition> {
        if ticket.generation != self.generation {
            return None;
        }
        match (&mut self.phase, outcome) {
            (Phase::Closed { failures }, Outcome::Success) => {
                *failures = 0;
                if let Some(rule) = &self.cfg.failure_rate {
                    self.window.add(rule, false, now);
                }
                None
            }
            (Phase::Closed { failures }, Outcome::Failure) => {
                *failures += 1;
                let in_a_row = *failures >= self.cfg.failure_threshold;
                let too_often = self.cfg.failure_rate.is_some_and(|rule| {
                    let (all, failed) = self.window.add(&rule, true, now);
                    all >= rule.min_requests && f64::from(failed) >= rule.rate * f64::from(all)
                });
                if in_a_row || too_often {
                    self.open(now)
                } else {
                    None
                }
            }
            (
                Phase::HalfOpen {
                    successes,
                    in_flight,
                },
                Outcome::Success,
            ) => {
                *in_flight = in_flight.saturating_sub(1);
                *successes += 1;
                if *successes >= self.cfg.success_threshold {
                    self.go(Phase::Closed { failures: 0 })
                } else {
                    None
                }
            }
            (Phase::HalfOpen { .. }, Outcome::Failure) => self.open(now),
            (Phase::Open { .. }, _) => None,
        }
    }

    /// Moves an open circuit to half-open once its timeout has passed.
    pub fn poll_timeout(&mut self, now: Instant) -> Option<Transition> {
        match self.phase {
            Phase::Open { until } if now >= until => self.half_open(),
            _ => None,
        }
    }

    /// The worker was just shown to be back (a health promotion): an open circuit starts its trial
    /// at once, and a closed one forgets the failures the outage left.
    pub fn readmit(&mut self) -> Option<Transition> {
        match &mut self.phase {
            Phase::Open { .. } => self.half_open(),
            Phase::Closed { failures } => {
                *failures = 0;
                self.window = Window::default();
                None
            }
            Phase::HalfOpen { .. } => None,
        }
    }

    fn open(&mut self, now: Instant) -> Option<Transition> {
        self.go(Phase::Open {
            until: now + self.cfg.open_timeout,
        })
    }

    fn half_open(&mut self) -> Option<Transition> {
        self.go(Phase::HalfOpen {
            successes: 0,
            in_flight: 0,
        })
    }

    fn go(&mut self, next: Phase) -> Option<Transition> {
        let from = self.state();
        self.phase = next;
        self.generation += 1;
        // A closed circuit judges its rate afresh: what led to the last opening is history.
        self.window = Window::default();
        Some(Transition {
            from,
            to: self.state(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cfg() -> BreakerConfig {
        BreakerConfig {
            failure_threshold: 3,
            success_threshold: 2,
            open_timeout: Duration::from_secs(30),
            half_open_trials: 2,
            failure_rate: None,
        }
    }

    fn rated() -> Breaker {
        Breaker::new(BreakerConfig {
            failure_threshold: 100,
            failure_rate: Some(FailureRate::default()),
            ..cfg()
        })
    }

    #[test]
    fn a_worker_failing_every_other_request_opens_on_its_rate() {
        let now = Instant::now();
        let mut b = rated();
        for i in 0..19 {
            let t = if i % 2 == 0 {
                fail(&mut b, now)
            } else {
                succeed(&mut b, now)
            };
            assert_eq!(t, None, "fewer than 20 outcomes: no verdict yet ({i})");
        }
        assert_eq!(b.consecutive_failures(), 1, "never many in a row");
        let opened = succeed(&mut b, now).or_else(|| fail(&mut b, now));
        assert_eq!(
            opened.map(|t| t.to),
            Some(BreakerState::Open),
            "10 of 20 or 11 of 21 failed"
        );
    }

    #[test]
    fn a_rate_under_the_threshold_or_outcomes_out_of_the_window_do_not_open() {
        let start = Instant::now();
        let mut b = rated();
        for i in 0..40 {
            let t = if i % 3 == 0 {
                fail(&mut b, start)
            } else {
                succeed(&mut b, start)
            };
            assert_eq!(t, None, "a third failed: under 0.5");
        }
        let mut b = rated();
        for _ in 0..15 {
            fail(&mut b, start);
        }
        let later = start + Duration::from_secs(121);
        for _ in 0..10 {
            assert_eq!(
                fail(&mut b, later),
                None,
                "the first 15 are out of the window"
            );
        }
        assert_eq!(
            fail(&mut b, later + Duration::from_secs(1)),
            None,
            "11 in the window"
        );
        for _ in 0..8 {
            assert_eq!(fail(&mut b, later + Duration::from_secs(2)), None);
        }
        assert!(fail(&mut b, later + Duration::from_secs(2)).is_some());
        assert_eq!(
            b.state(),
            BreakerState::Open,
            "20 in the window, all failed"
        );
    }

    #[test]
    fn a_readmission_forgets_the_outages_failures() {
        let now = Instant::now();
        let mut b = rated();
        for _ in 0..19 {
            fail(&mut b, now);
        }
        assert_eq!(b.readmit(), None);
        assert_eq!(fail(&mut b, now), None, "the window starts afresh");
        assert_eq!(b.state(), BreakerState::Closed);
    }

    fn fail(b: &mut Breaker, now: Instant) -> Option<Transition> {
        let t = b.try_admit().expect("admitted");
        b.record(t, Outcome::Failure, now)
    }

    fn succeed(b: &mut Breaker, now: Instant) -> Option<Transition> {
        let t = b.try_admit().expect("admitted");
        b.record(t, Outcome::Success, now)
    }

    fn opened(now: Instant) -> Breaker {
        let mut b = Breaker::new(cfg());
        for _ in 0..3 {
            fail(&mut b, now);
        }
        assert_eq!(b.state(), BreakerState::Open);
        b
    }

    #[test]
    fn opens_after_consecutive_failures_only() {
        let now = Instant::now();
        let mut b = Breaker::new(cfg());
        fail(&mut b, now);
        fail(&mut b, now);
        succeed(&mut b, now);
        assert_eq!(b.consecutive_failures(), 0);
        fail(&mut b, now);
        fail(&mut b, now);
        assert_eq!(b.state(), BreakerState::Closed);
        let t = fail(&mut b, now);
        assert_eq!(
            t,
            Some(Transition {
                from: BreakerState::Closed,
                to: BreakerState::Open
            })
        );
        assert_eq!(b.open_until(), Some(now + Duration::from_secs(30)));
        assert!(b.try_admit().is_none());
    }

    #[test]
    fn goes_half_open_exactly_at_the_timeout() {
        let now = Instant::now();
        let mut b = opened(now);
        assert_eq!(b.poll_timeout(now + Duration::from_millis(29_999)), None);
        assert_eq!(b.state(), BreakerState::Open);
        let t = b.poll_timeout(now + Duration::from_secs(30));
        assert_eq!(t.map(|t| t.to), Some(BreakerState::HalfOpen));
    }

    #[test]
    fn half_open_admits_a_bounded_trial_and_closes_on_successes() {
        let now = Instant::now();
        let mut b = opened(now);
        b.poll_timeout(now + Duration::from_secs(30));
        let t1 = b.try_admit().unwrap();
        let t2 = b.try_admit().unwrap();
        assert!(t1.is_trial() && t2.is_trial());
        assert!(b.try_admit().is_none(), "only two trials at once");
        assert_eq!(b.record(t1, Outcome::Success, now), None);
        let t3 = b.try_admit().expect("a finished trial frees its place");
        assert_eq!(
            b.record(t2, Outcome::Success, now).map(|t| t.to),
            Some(BreakerState::Closed)
        );
        // The third trial's outcome belongs to the half-open generation: ignored once closed.
        assert_eq!(b.record(t3, Outcome::Failure, now), None);
        assert_eq!(b.consecutive_failures(), 0);
    }

    #[test]
    fn a_trial_failure_reopens_for_a_full_timeout() {
        let now = Instant::now();
        let mut b = opened(now);
        let later = now + Duration::from_secs(30);
        b.poll_timeout(later);
        let t = fail(&mut b, later);
        assert_eq!(t.map(|t| t.to), Some(BreakerState::Open));
        assert_eq!(b.open_until(), Some(later + Duration::from_secs(30)));
    }

    #[test]
    fn outcomes_of_requests_admitted_before_opening_are_ignored() {
        let now = Instant::now();
        let mut b = Breaker::new(cfg());
        let slow = b.try_admit().unwrap();
        for _ in 0..3 {
            fail(&mut b, now);
        }
        b.poll_timeout(now + Duration::from_secs(30));
        assert_eq!(b.record(slow, Outcome::Failure, now), None);
        assert_eq!(b.state(), BreakerState::HalfOpen);
    }

    #[test]
    fn released_trials_free_their_place() {
        let now = Instant::now();
        let mut b = opened(now);
        b.poll_timeout(now + Duration::from_secs(30));
        let t1 = b.try_admit().unwrap();
        let _t2 = b.try_admit().unwrap();
        b.release(t1);
        assert!(b.try_admit().is_some());
    }

    #[test]
    fn readmit_moves_open_to_half_open_and_clears_closed_failures() {
        let now = Instant::now();
        let mut b = opened(now);
        assert_eq!(b.readmit().map(|t| t.to), Some(BreakerState::HalfOpen));
        assert_eq!(b.readmit(), None, "a half-open trial is not restarted");

        let mut c = Breaker::new(cfg());
        fail(&mut c, now);
        fail(&mut c, now);
        assert_eq!(c.readmit(), None);
        assert_eq!(c.consecutive_failures(), 0);
    }

    #[derive(Debug, Clone)]
    enum Step {
        Admit,
        Finish(usize, bool),
        Release(usize),
        Advance(u64),
        Readmit,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            3 => Just(Step::Admit),
            3 => (0usize..8, any::<bool>()).prop_map(|(i, ok)| Step::Finish(i, ok)),
            1 => (0usize..8).prop_map(Step::Release),
            2 => (0u64..40).prop_map(Step::Advance),
            1 => Just(Step::Readmit),
        ]
    }

    proptest! {
        /// Whatever happens, a half-open circuit never has more trials in flight than allowed,
        /// an open one admits nothing, and it never stays open past its deadline once polled.
        #[test]
        fn trials_are_bounded(steps in proptest::collection::vec(step(), 1..200)) {
            let start = Instant::now();
            let mut now = start;
            let mut b = Breaker::new(cfg());
            let mut held: Vec<Ticket> = Vec::new();
            for s in steps {
                match s {
                    Step::Admit => {
                        let was_open = b.state() == BreakerState::Open;
                        match b.try_admit() {
                            Some(t) => { prop_assert!(!was_open); held.push(t); }
                            None => prop_assert!(b.state() != BreakerState::Closed),
                        }
                    }
                    Step::Finish(i, ok) if !held.is_empty() => {
                        let t = held.remove(i % held.len());
                        let outcome = if ok { Outcome::Success } else { Outcome::Failure };
                        b.record(t, outcome, now);
                    }
                    Step::Release(i) if !held.is_empty() => {
                        let t = held.remove(i % held.len());
                        b.release(t);
                    }
                    Step::Advance(secs) => {
                        now += Duration::from_secs(secs);
                        b.poll_timeout(now);
                        if let Some(until) = b.open_until() {
                            prop_assert!(until > now);
                        }
                    }
                    Step::Readmit => { b.readmit(); }
                    _ => {}
                }
                if b.state() == BreakerState::HalfOpen {
                    let live_trials = held
                        .iter()
                        .filter(|t| t.trial && t.generation == b.generation)
                        .count() as u32;
                    prop_assert!(live_trials <= b.cfg.half_open_trials);
                }
            }
        }
    }
}
