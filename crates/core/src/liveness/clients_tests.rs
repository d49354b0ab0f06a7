//! The liveness rules against clients as they behave, on injected time: two workers behind
//! round robin, closed-loop clients with timeouts of 1 s, 3 s, 30 s or none, 1 client or 16,
//! load polls every second, the checker five times a second, trials every two seconds. Worker 0
//! fails from 5 s to 20 s as a real engine fails (wedged: polls answer with figures that stand;
//! hung: polls go unanswered) or is busy (a long prefill that moves its KV usage; slow steps).
//! What must hold for every client: a failed worker out within 5 s of its first unanswered
//! request and nothing sent to it after, back within 2 s of recovery; a busy one never out.

use std::time::Duration;

use tokio::time::Instant;

use super::*;

const TICK: Duration = Duration::from_millis(50);
const FAIL_AT: Duration = Duration::from_secs(5);
const RECOVER_AT: Duration = Duration::from_secs(20);
const END: Duration = Duration::from_secs(30);
const POLL_EVERY: Duration = Duration::from_secs(1);
const POLL_TIMEOUT: Duration = Duration::from_secs(2);
const TRIAL_EVERY: Duration = Duration::from_secs(2);
const TTFT: Duration = Duration::from_millis(200);

#[derive(Debug, Clone, Copy, PartialEq)]
enum Failure {
    /// vLLM's engine core or SGLang's scheduler stuck in a step: no byte, no step, polls
    /// answered with standing figures.
    Wedged,
    /// The API process hung: no byte, polls unanswered.
    Hung,
    /// A 128k-token prompt sent by someone else: our requests wait behind it, its KV moves.
    LongPrefill,
    /// Every step four times slower: first bytes after 800 ms.
    Slow,
}

/// One request of ours on a worker: when it was sent, by which client, when its byte comes.
#[derive(Debug, Clone, Copy)]
struct Request {
    sent: Instant,
    client: usize,
    byte_at: Option<Instant>,
}

struct Worker {
    pending: Vec<Request>,
    silence: Silence,
    steps: u64,
    last_reading: Option<u64>,
    next_poll: Instant,
    poll_unanswered_at: Option<Instant>,
    last_contact: Instant,
    last_timeout: Option<Instant>,
    veto: Option<LivenessVeto>,
    vetoed_at: Option<Instant>,
    trial: Option<(Instant, Option<Instant>)>,
    last_trial: Option<Instant>,
}

impl Worker {
    fn new(t0: Instant) -> Self {
        Self {
            pending: Vec::new(),
            silence: Silence::default(),
            steps: 0,
            last_reading: None,
            next_poll: t0 + Duration::from_millis(300),
            poll_unanswered_at: None,
            last_contact: t0,
            last_timeout: None,
            veto: None,
            vetoed_at: None,
            trial: None,
            last_trial: None,
        }
    }
}

/// What happened to worker 0, for the assertions.
#[derive(Debug, Default)]
struct Record {
    first_unanswered: Option<Duration>,
    vetoed: Option<Duration>,
    sent_after_veto: u32,
    readmitted: Option<Duration>,
    vetoes: u32,
}

struct World {
    t0: Instant,
    now: Instant,
    failure: Failure,
    timeout: Option<Duration>,
    workers: [Worker; 2],
    turn: usize,
    record: Record,
}

impl World {
    fn at(&self) -> Duration {
        self.now - self.t0
    }

    fn failing(&self) -> bool {
        (FAIL_AT..RECOVER_AT).contains(&self.at())
    }

    /// When a request sent to worker `w` now gets its first byte, as far as is known now.
    fn byte_at(&self, w: usize) -> Option<Instant> {
        if w == 1 {
            return Some(self.now + TTFT);
        }
        match (self.failure, self.failing()) {
            (Failure::Slow, true) => Some(self.now + TTFT * 4),
            (_, true) => None,
            (_, false) => Some(self.now + TTFT),
        }
    }

    fn send(&mut self, client: usize) {
        let open: Vec<usize> = (0..2).filter(|&w| self.workers[w].veto.is_none()).collect();
        let w = if open.is_empty() {
            self.turn % 2
        } else {
            open[self.turn % open.len()]
        };
        self.turn += 1;
        let byte_at = self.byte_at(w);
        let worker = &mut self.workers[w];
        if worker.pending.is_empty() {
            worker
                .silence
                .sent(self.now, LivenessConfig::default().unresponsive);
        }
        worker.pending.push(Request {
            sent: self.now,
            client,
            byte_at,
        });
        if w == 0 && worker.veto.is_some() {
            self.record.sent_after_veto += 1;
        }
        if w == 0 && byte_at.is_none() && self.record.first_unanswered.is_none() {
            self.record.first_unanswered = Some(self.at());
        }
    }

    /// Bytes due, and clients giving up: each client whose request ended sends the next.
    fn answers(&mut self) {
        let mut next = Vec::new();
        let holds = self.failing() && self.failure != Failure::Slow;
        if holds && !self.workers[0].pending.is_empty() {
            // A request sent before the failure is unanswered from the failure on.
            self.record.first_unanswered.get_or_insert(self.at());
        }
        for r in &mut self.workers[0].pending {
            if holds {
                // Failed, or busy before them: what it holds gets no byte until it recovers.
                r.byte_at = None;
            } else {
                r.byte_at.get_or_insert(self.now + TTFT);
            }
        }
        for w in 0..2 {
            let now = self.now;
            let timeout = self.timeout;
            let worker = &mut self.workers[w];
            let (done, kept): (Vec<Request>, Vec<Request>) =
                worker.pending.drain(..).partition(|r| {
                    r.byte_at.is_some_and(|b| b <= now)
                        || timeout.is_some_and(|t| now.saturating_duration_since(r.sent) >= t)
                });
            worker.pending = kept;
            let answered = done.iter().any(|r| r.byte_at.is_some_and(|b| b <= now));
            if answered {
                worker.silence.answered(now, !worker.pending.is_empty());
            } else if !done.is_empty() && worker.pending.is_empty() {
                worker.silence.abandoned(now);
            }
            next.extend(done.iter().map(|r| r.client));
        }
        for client in next {
            self.send(client);
        }
    }

    /// Each engine steps while it has work, unless it has failed; the long prefill is work.
    fn step(&mut self) {
        for w in 0..2 {
            let failing = w == 0 && self.failing();
            let worker = &mut self.workers[w];
            let work = !worker.pending.is_empty() || worker.trial.is_some();
            let working = match (failing, self.failure) {
                (true, Failure::Wedged | Failure::Hung) => false,
                (true, Failure::LongPrefill) => true,
                _ => work,
            };
            if working {
                worker.steps += 1;
            }
        }
    }

    fn poll(&mut self, w: usize) {
        let now = self.now;
        let failing = w == 0 && self.failing();
        let worker = &mut self.workers[w];
        if let Some(at) = worker.poll_unanswered_at {
            if now >= at {
                worker.poll_unanswered_at = None;
                worker.last_timeout = Some(now);
                let pending = !worker.pending.is_empty();
                worker.silence.polled(now, PollShowed::Unanswered, pending);
                worker.next_poll = now + POLL_EVERY;
            }
            return;
        }
        if now < worker.next_poll {
            return;
        }
        if failing && self.failure == Failure::Hung {
            worker.poll_unanswered_at = Some(now + POLL_TIMEOUT);
            return;
        }
        worker.last_contact = now;
        let showed = match worker.last_reading.replace(worker.steps) {
            None => PollShowed::Baseline,
            Some(before) if before == worker.steps => PollShowed::Stood,
            Some(_) => PollShowed::Stepped,
        };
        let pending = !worker.pending.is_empty();
        worker.silence.polled(now, showed, pending);
        worker.next_poll = now + POLL_EVERY;
    }

    /// A trial on a vetoed worker: answered once the engine generates, else it times out.
    fn trial(&mut self, w: usize) {
        let now = self.now;
        let byte_at = self.byte_at(w);
        let recovered = !(w == 0 && self.failing());
        let worker = &mut self.workers[w];
        match worker.trial {
            Some((began, answer)) => {
                let answer = answer.or_else(|| recovered.then_some(now + TTFT));
                worker.trial = Some((began, answer));
                if answer.is_some_and(|a| a <= now) {
                    worker.trial = None;
                    worker.silence.answered(now, !worker.pending.is_empty());
                } else if now.saturating_duration_since(began) >= TRIAL_EVERY {
                    worker.trial = None;
                }
            }
            None if worker.veto.is_some_and(LivenessVeto::awaits_progress)
                && worker
                    .last_trial
                    .is_none_or(|t| now.saturating_duration_since(t) >= TRIAL_EVERY) =>
            {
                worker.trial = Some((now, byte_at));
                worker.last_trial = Some(now);
            }
            None => {}
        }
    }

    fn check(&mut self) {
        let cfg = LivenessConfig::default();
        let now = self.now;
        for w in 0..2 {
            let worker = &mut self.workers[w];
            let pending = !worker.pending.is_empty();
            let o = Observed {
                last_contact: worker.last_contact,
                last_failure: None,
                last_timeout: worker.last_timeout,
                last_progress: worker
                    .silence
                    .span(now, pending, cfg.unresponsive)
                    .last_life
                    .unwrap_or(self.t0),
                last_token: None,
                pile: 0,
                pile_at_progress: 0,
                pile_rule: false,
                in_flight: worker.pending.len() as u64,
                queue: Some(0),
                engine_stalled_since: None,
                prefill_allowance: Duration::ZERO,
                silence: worker.silence.span(now, pending, cfg.unresponsive),
                vetoed_at: worker.vetoed_at,
                pushed_load: false,
            };
            let next = judge(worker.veto, &o, &cfg, now);
            if next == worker.veto {
                continue;
            }
            worker.veto = next;
            worker.vetoed_at = next.map(|_| now);
            if w != 0 {
                continue;
            }
            match next {
                Some(_) => {
                    self.record.vetoes += 1;
                    self.record.vetoed.get_or_insert(now - self.t0);
                }
                None => self.record.readmitted = Some(now - self.t0),
            }
        }
        if self.workers[0].veto == Some(LivenessVeto::Unresponsive) {
            // Its requests still waiting go elsewhere.
            let moved: Vec<usize> = self.workers[0]
                .pending
                .iter()
                .filter(|r| r.byte_at.is_none())
                .map(|r| r.client)
                .collect();
            self.workers[0].pending.retain(|r| r.byte_at.is_some());
            for client in moved {
                self.send(client);
            }
        }
    }
}

fn run(failure: Failure, clients: usize, timeout: Option<Duration>) -> Record {
    let t0 = Instant::now();
    let mut world = World {
        t0,
        now: t0,
        failure,
        timeout,
        workers: [Worker::new(t0), Worker::new(t0)],
        turn: 0,
        record: Record::default(),
    };
    for client in 0..clients {
        world.send(client);
    }
    let mut ticks = 0u32;
    while world.at() < END {
        world.now += TICK;
        ticks += 1;
        world.answers();
        world.step();
        for w in 0..2 {
            world.poll(w);
            world.trial(w);
        }
        if ticks % 4 == 0 {
            world.check();
        }
    }
    world.record
}

const CLIENTS: [(usize, Option<Duration>); 8] = [
    (1, Some(Duration::from_secs(1))),
    (16, Some(Duration::from_secs(1))),
    (1, Some(Duration::from_secs(2))),
    (16, Some(Duration::from_secs(3))),
    (1, Some(Duration::from_secs(30))),
    (16, Some(Duration::from_secs(30))),
    (1, None),
    (16, None),
];

#[test]
fn a_wedged_or_hung_worker_is_out_within_5_s_of_its_first_unanswered_request_for_every_client() {
    for failure in [Failure::Wedged, Failure::Hung] {
        for (clients, timeout) in CLIENTS {
            let r = run(failure, clients, timeout);
            let case = format!("{failure:?}, {clients} clients, timeout {timeout:?}: {r:?}");
            let first = r.first_unanswered.expect(&case);
            let vetoed = r.vetoed.expect(&case);
            assert!(vetoed >= first, "{case}");
            assert!(vetoed - first <= Duration::from_secs(5), "{case}");
            assert_eq!(r.sent_after_veto, 0, "{case}");
            assert_eq!(r.vetoes, 1, "out once, for the whole failure: {case}");
            let back = r.readmitted.expect(&case);
            assert!(back >= RECOVER_AT, "not before it recovered: {case}");
            assert!(back - RECOVER_AT <= Duration::from_secs(2), "{case}");
        }
    }
}

#[test]
fn a_busy_worker_is_never_out_whatever_its_clients_do() {
    for failure in [Failure::LongPrefill, Failure::Slow] {
        for (clients, timeout) in CLIENTS {
            let r = run(failure, clients, timeout);
            assert_eq!(
                r.vetoed, None,
                "{failure:?}, {clients} clients, timeout {timeout:?}: {r:?}"
            );
        }
    }
}
