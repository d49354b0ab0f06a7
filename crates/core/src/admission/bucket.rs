//! Token buckets that are reserved from at admission and settled when the response ends.
//!
//! A request's cost is not known until it ends, so admission reserves an estimate (its prompt plus
//! the most it may generate) and the end settles the difference: refunded when it used less,
//! charged when it used more (the bucket may then go below zero, and later requests wait for the
//! debt to refill). A reservation only succeeds when the bucket holds it, and each one is taken in
//! one step, so requests admitted at the same time can never together spend more than the bucket
//! holds — the peers' known bug of limits bypassed by concurrency.
//!
//! A bucket holds one minute of its rate at most (`tokens_per_minute`, `requests_per_minute`),
//! refilled continuously.

use std::time::Duration;

use tokio::time::Instant;

/// A bucket of `capacity` refilled at `capacity` per `period`.
#[derive(Debug, Clone, PartialEq)]
pub struct Bucket {
    capacity: f64,
    /// Tokens per second.
    rate: f64,
    level: f64,
    updated: Instant,
}

/// Why a reservation was refused.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Refusal {
    /// The bucket will hold enough after this long.
    NotYet { retry_after: Duration },
    /// More than the bucket can ever hold: it will never be admitted.
    TooBig { capacity: u64 },
}

/// What the bucket shows a client (OpenAI's `x-ratelimit-*` headers).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Level {
    pub limit: u64,
    pub remaining: u64,
    /// Until the bucket is full again.
    pub reset: Duration,
}

impl Bucket {
    /// A full bucket of `capacity`, refilled at `capacity` per `period`.
    pub fn new(capacity: u64, period: Duration, now: Instant) -> Self {
        let capacity = capacity as f64;
        Self {
            capacity,
            rate: capacity / period.as_secs_f64().max(f64::MIN_POSITIVE),
            level: capacity,
            updated: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        self.level = (self.level + elapsed * self.rate).min(self.capacity);
        self.updated = now;
    }

    /// Takes `amount` now, or says when it could be taken.
    pub fn reserve(&mut self, amount: u64, now: Instant) -> Result<(), Refusal> {
        self.refill(now);
        let amount = amount as f64;
        if amount > self.capacity {
            return Err(Refusal::TooBig {
                capacity: self.capacity as u64,
            });
        }
        if self.level >= amount {
            self.level -= amount;
            return Ok(());
        }
        Err(Refusal::NotYet {
            retry_after: self.time_to(amount),
        })
    }

    /// The end of a request that reserved `reserved` and used `used`: the difference is given
    /// back, or taken (below zero if need be).
    pub fn settle(&mut self, reserved: u64, used: u64, now: Instant) {
        self.refill(now);
        self.level = (self.level + reserved as f64 - used as f64).min(self.capacity);
    }

    /// How long until the bucket holds `amount`.
    fn time_to(&self, amount: f64) -> Duration {
        let missing = (amount - self.level).max(0.0);
        Duration::from_secs_f64(missing / self.rate)
    }

    pub fn level(&mut self, now: Instant) -> Level {
        self.refill(now);
        Level {
            limit: self.capacity as u64,
            remaining: self.level.max(0.0) as u64,
            reset: self.time_to(self.capacity),
        }
    }
}

/// How a request that reserved tokens ended, as far as its settlement needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Spent {
    /// A worker got the request (else the gateway answered it alone).
    pub forwarded: bool,
    /// The tokens its response reported (`usage`: prompt plus completion), when it did.
    pub reported: Option<u64>,
    /// Events of its stream, `[DONE]` aside.
    pub events: u64,
    /// Its client left before any answer.
    pub left_unanswered: bool,
}

/// The tokens a request is charged at its end: what its response reported; else, for a stream,
/// the prompt estimate and one token per event; a client that left before any answer, the prompt
/// (its prefill may have run); else, when nothing says otherwise, all it reserved. A request the
/// gateway answered alone used none.
pub fn tokens_used(reserved: u64, prompt_estimate: u64, spent: Spent) -> u64 {
    if !spent.forwarded {
        return 0;
    }
    match spent.reported {
        Some(tokens) => tokens,
        None if spent.events > 0 => prompt_estimate + spent.events,
        None if spent.left_unanswered => prompt_estimate,
        None => reserved,
    }
}

/// A duration as OpenAI writes it in `x-ratelimit-reset-*`: `20ms`, `1.5s`, `6m0s`, `1h2m3s`.
pub fn reset_text(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let secs = d.as_secs_f64();
    if secs < 60.0 {
        let tenths = (secs * 10.0).ceil() / 10.0;
        return format!("{tenths}s");
    }
    let total = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    let (h, m, s) = (total / 3600, total / 60 % 60, total % 60);
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else {
        format!("{m}m{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn reserve_then_refund_or_charge() {
        let t0 = Instant::now();
        let mut b = Bucket::new(600, MINUTE, t0);
        assert_eq!(b.reserve(500, t0), Ok(()));
        assert_eq!(b.level(t0).remaining, 100);
        // Used 200 of the 500 reserved: 300 back.
        b.settle(500, 200, t0);
        assert_eq!(b.level(t0).remaining, 400);
        // Used 450 of 100 reserved: 350 more taken.
        assert_eq!(b.reserve(100, t0), Ok(()));
        b.settle(100, 450, t0);
        assert_eq!(b.level(t0).remaining, 0);
    }

    #[test]
    fn an_overrun_is_a_debt_later_requests_wait_out() {
        let t0 = Instant::now();
        let mut b = Bucket::new(600, MINUTE, t0); // 10 a second
        assert_eq!(b.reserve(100, t0), Ok(()));
        b.settle(100, 700, t0); // 100 below zero
        assert_eq!(
            b.reserve(50, t0),
            Err(Refusal::NotYet {
                retry_after: Duration::from_secs(15)
            })
        );
        assert_eq!(b.reserve(50, t0 + Duration::from_secs(15)), Ok(()));
    }

    #[test]
    fn a_request_bigger_than_the_bucket_is_refused_for_good() {
        let t0 = Instant::now();
        let mut b = Bucket::new(1000, MINUTE, t0);
        assert_eq!(b.reserve(1001, t0), Err(Refusal::TooBig { capacity: 1000 }));
    }

    #[test]
    fn it_refills_continuously_up_to_its_capacity() {
        let t0 = Instant::now();
        let mut b = Bucket::new(60, MINUTE, t0);
        assert_eq!(b.reserve(60, t0), Ok(()));
        let level = b.level(t0 + Duration::from_secs(30));
        assert_eq!(
            (level.remaining, level.reset),
            (30, Duration::from_secs(30))
        );
        assert_eq!(b.level(t0 + Duration::from_secs(600)).remaining, 60);
    }

    #[test]
    fn a_request_is_charged_what_it_reported_else_what_can_be_told() {
        let forwarded = Spent {
            forwarded: true,
            ..Spent::default()
        };
        let charge = |spent| tokens_used(500, 40, spent);
        assert_eq!(charge(Spent::default()), 0, "answered by the gateway alone");
        assert_eq!(
            charge(Spent {
                reported: Some(123),
                events: 9,
                ..forwarded
            }),
            123
        );
        assert_eq!(
            charge(Spent {
                events: 9,
                ..forwarded
            }),
            49,
            "a stream without usage: prompt and one per event"
        );
        assert_eq!(
            charge(Spent {
                left_unanswered: true,
                ..forwarded
            }),
            40
        );
        assert_eq!(charge(forwarded), 500, "nothing says otherwise");
    }

    #[test]
    fn reset_reads_as_openai_writes_it() {
        assert_eq!(reset_text(Duration::from_millis(20)), "20ms");
        assert_eq!(reset_text(Duration::from_millis(1450)), "1.5s");
        assert_eq!(reset_text(Duration::from_secs(360)), "6m0s");
        assert_eq!(reset_text(Duration::from_secs(3723)), "1h2m3s");
    }

    proptest! {
        /// Reservations taken together, with none settled, never take more than the bucket held
        /// plus what refilled meanwhile.
        #[test]
        fn concurrent_reservations_never_overspend(
            capacity in 1u64..10_000,
            asks in proptest::collection::vec((1u64..2_000, 0u64..500), 1..200),
        ) {
            let t0 = Instant::now();
            let mut b = Bucket::new(capacity, MINUTE, t0);
            let (mut taken, mut at) = (0u64, t0);
            for (amount, wait_ms) in asks {
                at += Duration::from_millis(wait_ms);
                if b.reserve(amount, at).is_ok() {
                    taken += amount;
                }
            }
            let refilled = capacity as f64 * at.duration_since(t0).as_secs_f64() / 60.0;
            prop_assert!(taken as f64 <= capacity as f64 + refilled + 1e-6);
            prop_assert!(b.level(at).remaining <= capacity);
        }
    }
}
