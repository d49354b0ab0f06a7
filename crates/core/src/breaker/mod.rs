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

mod rate;

use std::time::Duration;

use tokio::time::Instant;

pub use rate::FailureRate;
use rate::Window;

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

impl Outcome {
    /// How a worker's answer counts in its breaker — the one rule, for an answer retried
    /// elsewhere and one relayed alike. A 5xx (or an engine's error event, judged as the status
    /// it names) is the worker's failure; anything under 500 is a working worker, whether it
    /// answered or refused the request. An answer saying the engine is full (`at_capacity`: 429,
    /// 529, SGLang's full queue) is not counted at all: backpressure is not sickness. Which
    /// statuses are retried (`--retry-status-codes`) is another question, decided apart.
    pub fn of_answer(status: u16, at_capacity: bool) -> Option<Self> {
        if at_capacity {
            None
        } else if status >= 500 {
            Some(Outcome::Failure)
        } else {
            Some(Outcome::Success)
        }
    }
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
                let too_often = self
                    .cfg
                    .failure_rate
                    .is_some_and(|rule| self.window.add(&rule, true, now));
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
mod tests;
