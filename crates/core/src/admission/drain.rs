//! How fast the gateway queue drains, and what follows from it: how long an arrival may expect
//! to wait, whether waiting is hopeless (under shedding), and when a refused client should come
//! back.
//!
//! Tiers are served in strict order, so a waiter leaves at the queue's drain rate less the rate
//! at which more urgent requests arrive and pass it (`QueueRates::tier_rate`). Counting the queue
//! ahead over the drain rate alone promised agent requests at three times capacity a wait 2.5
//! times too short: they were queued, and timed out instead of being refused at arrival.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use super::tier::Tier;

/// How far back a rate looks. Counted over a time span rather than over the last so many events:
/// the queue releases requests in bursts as reports open room, and the last 64 of a burst span a
/// moment, which read as a rate many times the real one (measured: a noisy tenant's requests were
/// queued on it, and a third of them timed out).
const SPAN: Duration = Duration::from_secs(2);

/// Events remembered for a rate at most (a bound on memory at any rate).
const MAX_EVENTS: usize = 4096;

/// A refused client is told to come back after the queue's length over its rate, within these.
const RETRY_AFTER_MIN: Duration = Duration::from_secs(1);
const RETRY_AFTER_MAX: Duration = Duration::from_secs(60);

/// The rate of one kind of event: those of the last `SPAN`, over the time since the oldest of
/// them, so it decays while none come.
#[derive(Debug, Clone, Default)]
pub struct EventRate {
    recent: VecDeque<Instant>,
}

/// The rate at which the queue sends waiters out.
pub type DrainRate = EventRate;

impl EventRate {
    /// One happened at `at`.
    pub fn record(&mut self, at: Instant) {
        while self.recent.len() >= MAX_EVENTS
            || self
                .recent
                .front()
                .is_some_and(|t| at.saturating_duration_since(*t) > SPAN)
        {
            self.recent.pop_front();
        }
        self.recent.push_back(at);
    }

    /// Events per second over those of the last `SPAN`; `None` until two were.
    pub fn per_sec(&self, now: Instant) -> Option<f64> {
        let stale = match now.checked_sub(SPAN) {
            Some(horizon) => self.recent.partition_point(|t| *t < horizon),
            None => 0,
        };
        let count = self.recent.len() - stale;
        let oldest = *self.recent.get(stale)?;
        let span = now.saturating_duration_since(oldest).as_secs_f64();
        (count >= 2 && span > 0.0).then(|| count as f64 / span)
    }
}

/// The queue's rates: requests that took room, and arrivals by tier.
#[derive(Debug, Clone, Default)]
pub struct QueueRates {
    drained: EventRate,
    arrived: [EventRate; 3],
}

impl QueueRates {
    /// A request took room: sent out of the queue, or on without waiting.
    pub fn dispatched(&mut self, at: Instant) {
        self.drained.record(at);
    }

    /// A request of `tier` joined the queue.
    pub fn arrived(&mut self, tier: Tier, at: Instant) {
        self.arrived[tier.index()].record(at);
    }

    /// Waiters sent out per second; `None` before the queue has drained.
    pub fn drain(&self, now: Instant) -> Option<f64> {
        self.drained.per_sec(now)
    }

    /// How fast a waiter of `tier` moves up: the drain rate less the arrivals of more urgent
    /// tiers, which pass it. `Some(0.0)`: they take everything; `None`: no drain measured yet.
    pub fn tier_rate(&self, tier: Tier, now: Instant) -> Option<f64> {
        let drain = self.drain(now)?;
        let passing: f64 = self.arrived[..tier.index()]
            .iter()
            .filter_map(|r| r.per_sec(now))
            .sum();
        Some((drain - passing).max(0.0))
    }
}

/// How long an arrival with `ahead` waiters before it should count on waiting, moving up at `rate`
/// a second: forever at 0, unknown without a rate. Departures are taken as a Poisson process, so
/// the wait for `k` of them has mean `k / rate` and deviation `sqrt(k) / rate`; this is two
/// deviations above the mean. An arrival admitted on the mean alone outlives its timeout about
/// half the time once the queue stands at the timeout (measured: 223 agent requests timed out,
/// each a refusal that took the whole timeout); on this, about 2% of the time.
pub fn likely_wait(ahead: usize, rate: Option<f64>) -> Option<Duration> {
    let rate = rate?;
    if rate <= 0.0 {
        return Some(Duration::MAX);
    }
    let k = (ahead + 1) as f64;
    Some(Duration::try_from_secs_f64((k + 2.0 * k.sqrt()) / rate).unwrap_or(Duration::MAX))
}

/// Why an arrival would wait in the gateway queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// The fleet or the gateway has no room for any request now: overload.
    Full,
    /// The fleet has room, but only within the interactive reserve (or behind waiters who wait
    /// for room beyond it): it waits for room beyond the reserve, which requests ending and
    /// fresh reports open, not for the overload to pass.
    Reserve,
}

/// Under shedding, whether an arrival of `tier` that would have to wait is refused rather than
/// queued: a batch request when the fleet is full (`Hold::Full`: shedding refuses it rather than
/// let it wait on an overload); any other when its likely wait (`likely_wait`) outlives its
/// tier's `timeout` (unknown before the queue has drained at all: it waits). A batch request
/// held only by the interactive reserve waits as the others do: the reserve is room kept back,
/// not room missing, and shedding what it holds would cost the goodput the fleet has room for.
pub fn hopeless(tier: Tier, hold: Hold, expected: Option<Duration>, timeout: Duration) -> bool {
    (tier == Tier::Batch && hold == Hold::Full) || expected.is_some_and(|wait| wait > timeout)
}

/// What the gateway knew of a worker when a load report of it came: the engine's waiting queue
/// as reported, and this gateway's requests sent to it and ended on it so far (running counts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtReport {
    pub waiting: u64,
    pub sent: u64,
    pub ended: u64,
    pub at: Instant,
}

impl AtReport {
    /// A report of `waiting` at `at`, when this gateway had sent and seen end `(sent, ended)`.
    pub fn new(waiting: u64, (sent, ended): (u64, u64), at: Instant) -> Self {
        Self {
            waiting,
            sent,
            ended,
            at,
        }
    }

    /// Requests a second that left the engine's waiting queue between `earlier` and this
    /// report: its queue then, plus what this gateway sent it since, less its queue now. What
    /// others sent it is not seen, so this is a floor: a queue that others keep full shows
    /// nothing leaving it, which is what a request of ours waiting for room would see. An
    /// engine that had no queue then started what it got because it had room, which says
    /// nothing of how fast room frees once it is full: none counted.
    pub fn started_since(&self, earlier: &AtReport) -> f64 {
        let span = self.at.saturating_duration_since(earlier.at).as_secs_f64();
        if span <= 0.0 || earlier.waiting == 0 {
            return 0.0;
        }
        let arrived = earlier.waiting + self.sent.saturating_sub(earlier.sent);
        arrived.saturating_sub(self.waiting) as f64 / span
    }
}

/// How fast requests start on a worker, by its load reports: what the gateway knew at the last
/// one, the smoothed start rate, and when a report last showed a request start.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Starts {
    pub at_report: AtReport,
    rate: f64,
    last_start: Option<Instant>,
}

impl Starts {
    /// The first report of a worker: nothing measured yet.
    pub fn first(at_report: AtReport) -> Self {
        Self {
            at_report,
            rate: 0.0,
            last_start: None,
        }
    }

    /// After the next report, `at_report`. The rate is smoothed over about `SPAN`: polled
    /// often, most intervals see no request start and one sees several, and a wait is judged on
    /// the rate, not on the last interval's luck.
    pub fn next(&self, at_report: AtReport) -> Self {
        let started = at_report.started_since(&self.at_report);
        let dt = at_report
            .at
            .saturating_duration_since(self.at_report.at)
            .as_secs_f64();
        let weight = 1.0 - (-dt / SPAN.as_secs_f64()).exp();
        Self {
            at_report,
            rate: self.rate + weight * (started - self.rate),
            last_start: if started > 0.0 {
                Some(at_report.at)
            } else {
                self.last_start
            },
        }
    }

    /// Requests a second starting as of `now`: nothing once no report has shown one start for
    /// `SPAN` (reports that stand still over a ceiling free no room, however fast they did).
    pub fn rate(&self, now: Instant) -> f64 {
        match self.last_start {
            Some(at) if now.saturating_duration_since(at) <= SPAN => self.rate,
            _ => 0.0,
        }
    }
}

/// A worker over its ceiling, and how fast room frees on it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OverCeiling {
    /// Requests that must start on it before it has room (`QueueGate::short_by`).
    pub short_by: u64,
    /// Requests a second that left its waiting queue, by its reports (`Starts::rate`).
    pub started: f64,
    /// This gateway's requests that ended on it since its last report, and the time since: each
    /// end lets a waiting request start.
    pub ended_since_report: u64,
    pub since_report: Duration,
}

impl OverCeiling {
    /// Room freeing on it, requests a second: the faster of what its reports show leaving its
    /// queue and what ended on it since the last one. Nothing measured is 0.
    pub fn freeing(&self) -> f64 {
        let secs = self.since_report.as_secs_f64();
        let ended = if secs > 0.0 {
            self.ended_since_report as f64 / secs
        } else {
            0.0
        };
        self.started.max(ended)
    }
}

/// How long a request behind `ahead` others should count on waiting when every candidate is over
/// its ceiling (`workers`): until the least short of them has room and the `ahead` have gone, at
/// the rate room frees on them all, two deviations up as `likely_wait` counts. Forever when no
/// room is measured freeing: the reports stand still over the ceiling and nothing ended since.
pub fn overload_wait(ahead: usize, workers: &[OverCeiling]) -> Duration {
    let rate: f64 = workers.iter().map(OverCeiling::freeing).sum();
    let short = workers.iter().map(|w| w.short_by).min().unwrap_or(1).max(1);
    let ahead = ahead.saturating_add(usize::try_from(short - 1).unwrap_or(usize::MAX));
    likely_wait(ahead, Some(rate)).unwrap_or(Duration::MAX)
}

/// Under `--worker-overload-shed`, whether a request of `tier` that every candidate is too full
/// for is shed rather than queued: a batch request always (as `hopeless`); any other unless its
/// likely wait (`overload_wait`) fits in what is `left` of its tier's wait and its deadline. The
/// queue's own drain rate is not trusted here: it counts room that opened before the fleet
/// filled, and promised a wait the fleet never ended.
pub fn overload_hopeless(tier: Tier, wait: Duration, left: Duration) -> bool {
    tier == Tier::Batch || wait > left
}

/// When a client refused by the queue should come back: the waiters over the drain rate, within
/// 1 to 60 s (1 s before there is a rate).
pub fn retry_after(waiting: usize, rate: Option<f64>) -> Duration {
    rate.filter(|r| *r > 0.0).map_or(RETRY_AFTER_MIN, |r| {
        Duration::from_secs_f64(waiting as f64 / r).clamp(RETRY_AFTER_MIN, RETRY_AFTER_MAX)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_rate_is_the_remembered_dispatches_over_their_span() {
        let t0 = Instant::now();
        let mut rate = DrainRate::default();
        assert_eq!(rate.per_sec(t0), None);
        rate.record(t0);
        assert_eq!(rate.per_sec(t0 + 100 * MS), None, "one dispatch is no rate");
        for i in 1..=400u32 {
            rate.record(t0 + i * 10 * MS);
        }
        // 10 ms apart for four seconds, seen 10 ms after the last: the last two seconds' 200.
        let r = rate.per_sec(t0 + 4010 * MS).unwrap();
        assert!((r - 100.0).abs() < 1.0, "{r}");
        // A burst of 64 in a millisecond, seen a second later, is 64 a second, not 64,000.
        let mut burst = DrainRate::default();
        for i in 0..64u32 {
            burst.record(t0 + i * Duration::from_micros(15));
        }
        let r = burst.per_sec(t0 + 1000 * MS).unwrap();
        assert!((r - 64.0).abs() < 0.1, "{r}");
        assert_eq!(burst.per_sec(t0 + 3000 * MS), None, "gone past the span");
    }

    #[test]
    fn a_tier_moves_up_at_the_drain_rate_less_the_more_urgent_arrivals() {
        let t0 = Instant::now();
        let mut rates = QueueRates::default();
        assert_eq!(
            rates.tier_rate(Tier::Agent, t0),
            None,
            "nothing drained yet"
        );
        // Over one second: 100 sent out, 60 interactive and 90 agent arrivals.
        for i in 0..100u32 {
            rates.dispatched(t0 + i * 10 * MS);
        }
        for i in 0..60u32 {
            rates.arrived(Tier::Interactive, t0 + i * 16 * MS);
        }
        for i in 0..90u32 {
            rates.arrived(Tier::Agent, t0 + i * 11 * MS);
        }
        let now = t0 + 1000 * MS;
        let drain = rates.drain(now).unwrap();
        let interactive = 60.0 / 1.0;
        let tier0 = rates.tier_rate(Tier::Interactive, now).unwrap();
        assert!((tier0 - drain).abs() < 1e-9, "nothing passes tier 0");
        let agent = rates.tier_rate(Tier::Agent, now).unwrap();
        assert!(
            (agent - (drain - interactive)).abs() < 1.0,
            "{agent} {drain}"
        );
        let batch = rates.tier_rate(Tier::Batch, now).unwrap();
        assert_eq!(batch, 0.0, "interactive and agent arrivals take it all");
        assert_eq!(likely_wait(3, Some(0.0)), Some(Duration::MAX));
        assert!(hopeless(
            Tier::Agent,
            Hold::Full,
            likely_wait(0, Some(0.0)),
            Duration::from_secs(3600)
        ));
    }

    #[test]
    fn waiting_is_hopeless_for_batch_or_past_the_tiers_timeout() {
        // Ten in line at 20 a second: 500 ms on average, 816 ms two deviations up.
        let wait = likely_wait(9, Some(20.0)).unwrap();
        assert!((wait.as_secs_f64() - (10.0 + 2.0 * 10f64.sqrt()) / 20.0).abs() < 1e-9);
        assert!(hopeless(
            Tier::Batch,
            Hold::Full,
            None,
            Duration::from_secs(60)
        ));
        assert!(hopeless(Tier::Agent, Hold::Full, Some(wait), 800 * MS));
        assert!(!hopeless(Tier::Agent, Hold::Full, Some(wait), 820 * MS));
        assert!(
            !hopeless(Tier::Interactive, Hold::Full, None, MS),
            "no rate yet: it waits"
        );
    }

    #[test]
    fn a_batch_request_held_by_the_reserve_waits_while_its_wait_fits_its_timeout() {
        let minute = Duration::from_secs(60);
        let wait = likely_wait(9, Some(20.0)).unwrap();
        assert!(!hopeless(Tier::Batch, Hold::Reserve, Some(wait), minute));
        assert!(!hopeless(Tier::Batch, Hold::Reserve, None, minute));
        assert!(
            hopeless(Tier::Batch, Hold::Reserve, Some(wait), 800 * MS),
            "past its timeout"
        );
        assert!(hopeless(Tier::Batch, Hold::Full, Some(wait), minute));
        assert_eq!(
            hopeless(Tier::Agent, Hold::Reserve, Some(wait), 800 * MS),
            hopeless(Tier::Agent, Hold::Full, Some(wait), 800 * MS),
            "other tiers by their wait alone"
        );
    }

    fn over(short_by: u64, started: f64, ended: u64, since_ms: u64) -> OverCeiling {
        OverCeiling {
            short_by,
            started,
            ended_since_report: ended,
            since_report: Duration::from_millis(since_ms),
        }
    }

    #[test]
    fn a_fleet_whose_reports_stand_still_over_the_ceiling_frees_no_room() {
        let t0 = Instant::now();
        let at = |waiting, sent, ended, ms: u64| AtReport {
            waiting,
            sent,
            ended,
            at: t0 + Duration::from_millis(ms),
        };
        // 5 waiting twice, nothing of ours sent: nothing left the queue.
        assert_eq!(at(5, 0, 0, 1000).started_since(&at(5, 0, 0, 0)), 0.0);
        // 5, then 3 after we sent 2 more in a second: 4 started.
        assert_eq!(at(3, 12, 7, 1000).started_since(&at(5, 10, 7, 0)), 4.0);
        // Others filled it faster than it emptied: the floor is nothing.
        assert_eq!(at(9, 10, 0, 500).started_since(&at(5, 10, 0, 0)), 0.0);
        assert_eq!(
            at(9, 10, 0, 0).started_since(&at(5, 10, 0, 0)),
            0.0,
            "no span"
        );
        assert_eq!(
            at(5, 18, 8, 50).started_since(&at(0, 10, 0, 0)),
            0.0,
            "an engine with room started what it got: no measure of room freeing"
        );
        // Polled every 50 ms, one start in five polls: the smoothed rate settles near 4 a
        // second; reports that then stand still free nothing once `SPAN` has passed.
        let mut starts = Starts::first(at(10, 0, 0, 0));
        for poll in 1..=200u64 {
            starts = starts.next(at(10 - poll / 5 % 10, 0, 0, poll * 50));
        }
        let now = t0 + Duration::from_millis(200 * 50);
        assert!((starts.rate(now) - 4.0).abs() < 1.5, "{}", starts.rate(now));
        let waiting = starts.at_report.waiting;
        for poll in 201..=250u64 {
            starts = starts.next(at(waiting, 0, 0, poll * 50));
        }
        let later = t0 + Duration::from_millis(250 * 50);
        assert_eq!(starts.rate(later), 0.0, "2.5 s standing");
        assert_eq!(Starts::first(at(5, 0, 0, 0)).rate(t0), 0.0);

        let standing = [over(2, 0.0, 0, 400), over(1, 0.0, 0, 900)];
        assert_eq!(overload_wait(0, &standing), Duration::MAX);
        assert!(overload_hopeless(
            Tier::Interactive,
            overload_wait(0, &standing),
            Duration::from_secs(3600)
        ));
    }

    #[test]
    fn room_freeing_fast_enough_is_waited_for_and_slow_is_not() {
        // One short of room on the second worker, 4 a second freeing in all: k = 1 + 3 ahead.
        let draining = [over(3, 2.0, 0, 500), over(1, 0.0, 1, 500)];
        assert_eq!(draining[1].freeing(), 2.0, "one end in half a second");
        let wait = overload_wait(3, &draining);
        assert!(
            (wait.as_secs_f64() - (4.0 + 2.0 * 2.0) / 4.0).abs() < 1e-9,
            "{wait:?}"
        );
        assert!(!overload_hopeless(
            Tier::Agent,
            wait,
            Duration::from_secs(3)
        ));
        assert!(overload_hopeless(Tier::Agent, wait, Duration::from_secs(1)));
        assert!(
            overload_hopeless(Tier::Batch, wait, Duration::from_secs(3600)),
            "batch never waits on an overload"
        );
        // The least short worker sets how many must start first.
        let far = [over(9, 4.0, 0, 500)];
        assert!(overload_wait(0, &far) > overload_wait(0, &[over(1, 4.0, 0, 500)]));
        assert_eq!(
            over(1, 0.0, 3, 0).freeing(),
            0.0,
            "no time since the report"
        );
    }

    #[test]
    fn a_refused_client_comes_back_when_the_queue_has_drained() {
        assert_eq!(retry_after(100, Some(10.0)), Duration::from_secs(10));
        assert_eq!(retry_after(1, Some(10.0)), Duration::from_secs(1));
        assert_eq!(retry_after(100_000, Some(1.0)), Duration::from_secs(60));
        assert_eq!(retry_after(5, None), Duration::from_secs(1));
    }
}
