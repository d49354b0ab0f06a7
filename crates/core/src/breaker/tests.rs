//! The breaker's transitions, on injected time.

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

#[test]
fn an_answer_is_a_failure_from_500_and_backpressure_is_not_counted() {
    assert_eq!(Outcome::of_answer(200, false), Some(Outcome::Success));
    assert_eq!(Outcome::of_answer(400, false), Some(Outcome::Success));
    // A 4xx a user chose to retry is still no failure of the worker.
    assert_eq!(Outcome::of_answer(408, false), Some(Outcome::Success));
    assert_eq!(Outcome::of_answer(500, false), Some(Outcome::Failure));
    assert_eq!(Outcome::of_answer(503, false), Some(Outcome::Failure));
    for full in [429, 503, 529] {
        assert_eq!(Outcome::of_answer(full, true), None, "{full}");
    }
}
