//! A worker's health: the Pending / Ready / NotReady / Failed / Draining state machine that
//! background probes drive.
//!
//! | from | to | when |
//! | --- | --- | --- |
//! | Pending | Ready | registration reached the worker, or `success` consecutive passes |
//! | Pending | Failed | `10 x failure` probes without reaching `success` passes |
//! | Ready | NotReady | `failure` consecutive failures |
//! | NotReady | Ready | `success` consecutive passes |
//! | NotReady | Failed | `3 x failure` further consecutive failures (the count restarts on entering NotReady) |
//! | Failed | Ready | `success` consecutive passes |
//! | Ready | Draining | the worker is being removed |
//!
//! Failed is not terminal: a failed worker that is kept goes on being probed and comes back in
//! place. Draining is: a draining worker is not probed and leaves the fleet.
//!
//! Only a promotion *to* Ready readmits the worker's circuit breaker; passes on a worker that is
//! already Ready change nothing, so a flapping worker gets one breaker trial per cycle.

use std::fmt;

use serde::Serialize;
use tokio::time::Instant;

/// Where a worker is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthState {
    /// Registered, not yet verified: no requests.
    Pending,
    /// Passing its checks: takes requests.
    Ready,
    /// Failed `failure` probes in a row: no requests, still probed.
    NotReady,
    /// Kept failing (or never came up): no requests; removed when auto-recovery is on, otherwise
    /// still probed.
    Failed,
    /// Being removed: no new requests, not probed.
    Draining,
}

impl HealthState {
    pub fn as_str(self) -> &'static str {
        match self {
            HealthState::Pending => "pending",
            HealthState::Ready => "ready",
            HealthState::NotReady => "not_ready",
            HealthState::Failed => "failed",
            HealthState::Draining => "draining",
        }
    }
}

/// The thresholds in force for one probe (per-worker overrides already applied).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    /// Consecutive failures that take a Ready worker to NotReady (x3: NotReady to Failed; x10:
    /// the Pending probe cap). At least 1.
    pub failure: u32,
    /// Consecutive passes that make a worker Ready. At least 1.
    pub success: u32,
}

/// What moved a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// Registration reached the worker (it answered `/v1/models`).
    Registered,
    /// This many probes passed in a row.
    Passed(u32),
    /// This many probes failed in a row.
    Failed(u32),
    /// This many probes while Pending without reaching the success threshold.
    NeverReady(u32),
    /// Registration did not reach it within the startup timeout.
    NeverRegistered(std::time::Duration),
    /// Probing was turned off for the worker, so nothing else would ever bring it back.
    ChecksDisabled,
    /// It is being removed.
    Removal,
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cause::Registered => write!(f, "registration reached it"),
            Cause::Passed(n) => write!(f, "{n} consecutive probes passed"),
            Cause::Failed(n) => write!(f, "{n} consecutive probes failed"),
            Cause::NeverReady(n) => write!(f, "{n} probes without becoming ready"),
            Cause::NeverRegistered(d) => write!(f, "not registered within {d:?}"),
            Cause::ChecksDisabled => write!(f, "health checks disabled"),
            Cause::Removal => write!(f, "being removed"),
        }
    }
}

/// A state change, for logs, metrics and the breaker coupling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthTransition {
    pub from: HealthState,
    pub to: HealthState,
    pub cause: Cause,
}

impl HealthTransition {
    /// A move back to Ready: the breaker is readmitted.
    pub fn is_promotion(&self) -> bool {
        self.to == HealthState::Ready
    }
}

/// One probe's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    Pass,
    Fail,
}

/// One worker's health.
#[derive(Debug, Clone)]
pub struct Health {
    state: HealthState,
    since: Instant,
    /// Consecutive failed probes counted in this state.
    failures: u32,
    /// Consecutive passed probes.
    passes: u32,
    /// Probes while Pending.
    pending_probes: u32,
}

impl Health {
    pub fn new(now: Instant) -> Self {
        Self {
            state: HealthState::Pending,
            since: now,
            failures: 0,
            passes: 0,
            pending_probes: 0,
        }
    }

    pub fn state(&self) -> HealthState {
        self.state
    }

    /// When it entered its state.
    pub fn since(&self) -> Instant {
        self.since
    }

    pub fn consecutive_failures(&self) -> u32 {
        self.failures
    }

    pub fn consecutive_passes(&self) -> u32 {
        self.passes
    }

    /// Registration reached the worker: a Pending worker is Ready at once (HTTP registration
    /// already proves what a probe would).
    pub fn registered(&mut self, now: Instant) -> Option<HealthTransition> {
        (self.state == HealthState::Pending)
            .then(|| self.go(HealthState::Ready, Cause::Registered, now))
    }

    /// Counts one probe.
    pub fn probe(&mut self, probe: Probe, t: Thresholds, now: Instant) -> Option<HealthTransition> {
        let (failure, success) = (t.failure.max(1), t.success.max(1));
        if self.state == HealthState::Draining {
            return None;
        }
        if self.state == HealthState::Pending {
            self.pending_probes += 1;
        }
        match probe {
            Probe::Pass => {
                self.failures = 0;
                self.passes += 1;
            }
            Probe::Fail => {
                self.passes = 0;
                self.failures += 1;
            }
        }
        let (passes, failures) = (self.passes, self.failures);
        match (self.state, probe) {
            (HealthState::Ready, Probe::Pass) => None,
            (_, Probe::Pass) if passes >= success => {
                Some(self.go(HealthState::Ready, Cause::Passed(passes), now))
            }
            (HealthState::Pending, _) if self.pending_probes >= failure.saturating_mul(10) => {
                let probes = self.pending_probes;
                Some(self.go(HealthState::Failed, Cause::NeverReady(probes), now))
            }
            (HealthState::Ready, Probe::Fail) if failures >= failure => {
                Some(self.go(HealthState::NotReady, Cause::Failed(failures), now))
            }
            (HealthState::NotReady, Probe::Fail) if failures >= failure.saturating_mul(3) => {
                Some(self.go(HealthState::Failed, Cause::Failed(failures), now))
            }
            _ => None,
        }
    }

    /// Registration has not reached a Pending worker within `timeout`
    /// (`--worker-startup-timeout-secs`): it is Failed, and no longer waited for.
    pub fn startup_expired(
        &mut self,
        timeout: std::time::Duration,
        now: Instant,
    ) -> Option<HealthTransition> {
        (self.state == HealthState::Pending)
            .then(|| self.go(HealthState::Failed, Cause::NeverRegistered(timeout), now))
    }

    /// Probing was turned off: a worker that only probes could bring back is Ready again.
    pub fn checks_disabled(&mut self, now: Instant) -> Option<HealthTransition> {
        matches!(self.state, HealthState::NotReady | HealthState::Failed)
            .then(|| self.go(HealthState::Ready, Cause::ChecksDisabled, now))
    }

    /// The worker is being removed: a Ready one drains (the others go at once).
    pub fn drain(&mut self, now: Instant) -> Option<HealthTransition> {
        (self.state == HealthState::Ready)
            .then(|| self.go(HealthState::Draining, Cause::Removal, now))
    }

    fn go(&mut self, to: HealthState, cause: Cause, now: Instant) -> HealthTransition {
        let from = self.state;
        self.state = to;
        self.since = now;
        self.failures = 0;
        self.passes = 0;
        HealthTransition { from, to, cause }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use HealthState::*;

    const T: Thresholds = Thresholds {
        failure: 3,
        success: 2,
    };
    const INTERVAL: Duration = Duration::from_secs(60);

    #[test]
    fn only_a_pending_worker_expires_at_the_startup_timeout() {
        let now = Instant::now();
        let timeout = Duration::from_secs(1800);
        let mut h = Health::new(now);
        let t = h.startup_expired(timeout, now).unwrap();
        assert_eq!((t.from, t.to), (Pending, Failed));
        assert_eq!(t.cause, Cause::NeverRegistered(timeout));
        let mut ready = Health::new(now);
        ready.registered(now);
        assert_eq!(ready.startup_expired(timeout, now), None);
    }

    /// Probes once per interval on paused time; returns the transitions, with the time since
    /// `start` at which each happened.
    async fn run(h: &mut Health, probes: &[Probe], start: Instant) -> Vec<(HealthState, Duration)> {
        let mut seen = Vec::new();
        for &p in probes {
            tokio::time::advance(INTERVAL).await;
            if let Some(t) = h.probe(p, T, Instant::now()) {
                seen.push((t.to, Instant::now() - start));
            }
        }
        seen
    }

    fn ready(now: Instant) -> Health {
        let mut h = Health::new(now);
        assert_eq!(h.registered(now).map(|t| t.to), Some(Ready));
        h
    }

    use Probe::{Fail, Pass};

    #[tokio::test(start_paused = true)]
    async fn a_dead_ready_worker_is_not_ready_after_threshold_probes_and_failed_after_four_times() {
        let start = Instant::now();
        let mut h = ready(start);
        let seen = run(&mut h, &[Fail; 12], start).await;
        assert_eq!(seen, [(NotReady, INTERVAL * 3), (Failed, INTERVAL * 12)]);
        assert_eq!(h.since(), start + INTERVAL * 12);
        assert_eq!(
            run(&mut h, &[Fail; 20], start).await,
            [],
            "Failed stays Failed"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_pass_restarts_the_failure_count() {
        let start = Instant::now();
        let mut h = ready(start);
        assert_eq!(
            run(&mut h, &[Fail, Fail, Pass, Fail, Fail], start).await,
            []
        );
        assert_eq!(h.consecutive_failures(), 2);
        assert_eq!(
            run(&mut h, &[Fail], start).await,
            [(NotReady, INTERVAL * 6)]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn not_ready_recovers_after_success_threshold_passes() {
        let start = Instant::now();
        let mut h = ready(start);
        run(&mut h, &[Fail; 3], start).await;
        assert_eq!(h.state(), NotReady);
        assert_eq!(
            run(&mut h, &[Pass, Fail, Pass], start).await,
            [],
            "passes must be consecutive"
        );
        let t = h.probe(Pass, T, Instant::now());
        assert_eq!(
            t.map(|t| (t.from, t.to, t.cause)),
            Some((NotReady, Ready, Cause::Passed(2)))
        );
        assert!(t.is_some_and(|t| t.is_promotion()));
    }

    #[tokio::test(start_paused = true)]
    async fn failed_rejoins_in_place_after_success_threshold_passes() {
        let start = Instant::now();
        let mut h = ready(start);
        run(&mut h, &[Fail; 12], start).await;
        assert_eq!(h.state(), Failed);
        let seen = run(&mut h, &[Pass, Pass], start).await;
        assert_eq!(seen, [(Ready, INTERVAL * 14)]);
    }

    #[tokio::test(start_paused = true)]
    async fn pending_becomes_ready_on_passes_or_failed_after_ten_times_the_threshold() {
        let start = Instant::now();
        let mut h = Health::new(start);
        assert_eq!(
            run(&mut h, &[Pass, Pass], start).await,
            [(Ready, INTERVAL * 2)]
        );

        let mut h = Health::new(start);
        let mut probes = vec![Fail; 29];
        probes[5] = Pass; // a lone pass does not reach the success threshold
        assert_eq!(run(&mut h, &probes, start).await, []);
        assert_eq!(h.state(), Pending);
        let seen = run(&mut h, &[Fail], start).await;
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].0, Failed);
    }

    #[test]
    fn pending_gives_up_with_the_probe_count_as_cause() {
        let now = Instant::now();
        let mut h = Health::new(now);
        let mut last = None;
        for _ in 0..30 {
            last = h.probe(Fail, T, now).or(last);
        }
        assert_eq!(last.map(|t| t.cause), Some(Cause::NeverReady(30)));
    }

    #[test]
    fn registration_only_promotes_a_pending_worker() {
        let now = Instant::now();
        let mut h = ready(now);
        assert_eq!(h.registered(now), None);
        for _ in 0..3 {
            h.probe(Fail, T, now);
        }
        assert_eq!(h.registered(now), None, "NotReady needs passing probes");
        assert_eq!(h.state(), NotReady);
    }

    #[test]
    fn passes_on_a_ready_worker_are_not_promotions() {
        let now = Instant::now();
        let mut h = ready(now);
        for _ in 0..5 {
            assert_eq!(h.probe(Pass, T, now), None);
        }
    }

    #[test]
    fn draining_is_only_for_ready_workers_and_ends_probing() {
        let now = Instant::now();
        let mut pending = Health::new(now);
        assert_eq!(pending.drain(now), None);
        let mut h = ready(now);
        assert_eq!(h.drain(now).map(|t| t.to), Some(Draining));
        assert_eq!(h.probe(Fail, T, now), None);
        assert_eq!(h.probe(Pass, T, now), None);
        assert_eq!(h.checks_disabled(now), None);
        assert_eq!(h.state(), Draining);
    }

    #[test]
    fn disabling_checks_brings_back_what_only_probes_could() {
        let now = Instant::now();
        let mut h = ready(now);
        assert_eq!(h.checks_disabled(now), None);
        for _ in 0..3 {
            h.probe(Fail, T, now);
        }
        let t = h.checks_disabled(now);
        assert_eq!(
            t.map(|t| (t.to, t.cause)),
            Some((Ready, Cause::ChecksDisabled))
        );
        let mut pending = Health::new(now);
        assert_eq!(
            pending.checks_disabled(now),
            None,
            "pending waits for registration"
        );
    }

    #[test]
    fn thresholds_of_one_act_on_a_single_probe() {
        let now = Instant::now();
        let one = Thresholds {
            failure: 1,
            success: 1,
        };
        let mut h = ready(now);
        assert_eq!(h.probe(Fail, one, now).map(|t| t.to), Some(NotReady));
        assert_eq!(h.probe(Fail, one, now), None);
        assert_eq!(h.probe(Fail, one, now), None);
        assert_eq!(h.probe(Fail, one, now).map(|t| t.to), Some(Failed));
        assert_eq!(h.probe(Pass, one, now).map(|t| t.to), Some(Ready));
    }
}
