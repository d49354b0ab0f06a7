//! The loop that runs one data-parallel rank: apply commands, step the scheduler, wait the step's
//! (scaled) duration, deliver tokens, publish the rank's state.
//!
//! Commands (new requests, aborts) are applied between steps, so a client that disconnects
//! aborts its request at the next step, as in vLLM. The loop is the only owner of its
//! `Scheduler`; everything else sees the rank through `RankGauges`, `Totals` and metrics.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::metrics::EngineMetrics;
use super::stats::{RankGauges, RankView, Totals};
use super::{ChoiceEvent, EventKind};
use crate::faults::FaultSet;
use crate::scheduler::{Counters, NewSeq, Scheduler, SeqEvent, SeqId, Step};

/// What the rest of the engine asks of a rank.
pub(crate) enum RankCommand {
    Add(NewSeq, Subscriber),
    Abort(SeqId),
    /// Abort everything and stop (the engine crashed).
    Shutdown,
}

/// Where a sequence's tokens go, and the timestamps its latency metrics need.
pub(crate) struct Subscriber {
    pub events: mpsc::UnboundedSender<ChoiceEvent>,
    pub choice: u32,
    pub arrived: Instant,
    pub last_token: Option<Instant>,
}

/// Everything a rank loop shares with the rest of the engine.
pub(crate) struct RankContext {
    pub index: usize,
    pub time_scale: f64,
    pub gauges: Arc<RankGauges>,
    pub totals: Arc<Totals>,
    pub metrics: Arc<EngineMetrics>,
    pub faults: watch::Receiver<FaultSet>,
    /// Host time of the engine's last step that produced a token (SGLang health reads it).
    pub progress: Arc<parking_lot::Mutex<Instant>>,
    /// Woken on every publish, for whoever awaits a change of state.
    pub published: Arc<tokio::sync::Notify>,
}

/// Keeps the modelled clock and the host clock together: steps are timed against absolute
/// deadlines, so timer granularity does not add up, and a late step is caught up, not repeated.
struct Pacer {
    scale: f64,
    origin: Instant,
    owed: Duration,
}

/// Beyond this much lag the pacer gives up catching up and starts a new origin.
const MAX_CATCH_UP: Duration = Duration::from_millis(100);

impl Pacer {
    fn new(scale: f64) -> Self {
        Self {
            scale,
            origin: Instant::now(),
            owed: Duration::ZERO,
        }
    }

    fn reset(&mut self) {
        self.origin = Instant::now();
        self.owed = Duration::ZERO;
    }

    /// Waits until `engine_time` more of modelled time has passed; true when the host was late.
    async fn wait(&mut self, engine_time: Duration) -> bool {
        if engine_time.is_zero() {
            tokio::task::yield_now().await;
            return false;
        }
        self.owed += engine_time.div_f64(self.scale);
        let deadline = self.origin + self.owed;
        let now = Instant::now();
        if deadline > now {
            tokio::time::sleep_until(deadline).await;
            return false;
        }
        let late = now - deadline;
        if late > MAX_CATCH_UP {
            self.reset();
        }
        late > Duration::from_millis(1)
    }
}

/// Prompt tokens SGLang's `cache_hit_rate` is taken over, about: past it, the older half is
/// forgotten, so the rate follows the traffic of the last minutes and does not wait on a clock.
const HIT_RATE_TOKENS: u64 = 1 << 16;

/// A one-second window for SGLang's `gen_throughput`, and the recent prompt tokens for its
/// `cache_hit_rate`.
struct Throughput {
    since: Instant,
    tokens: u64,
    rate: f64,
    queried: u64,
    hit: u64,
    hit_rate: f64,
}

impl Throughput {
    fn new() -> Self {
        Self {
            since: Instant::now(),
            tokens: 0,
            rate: 0.0,
            queried: 0,
            hit: 0,
            hit_rate: 0.0,
        }
    }

    fn add(&mut self, tokens: u64, queried: u64, hit: u64, now: Instant) {
        self.queried += queried;
        self.hit += hit;
        if self.queried > 0 {
            self.hit_rate = self.hit as f64 / self.queried as f64;
        }
        if self.queried > HIT_RATE_TOKENS {
            self.queried /= 2;
            self.hit /= 2;
        }
        self.tokens += tokens;
        let elapsed = now - self.since;
        if elapsed >= Duration::from_secs(1) {
            self.rate = self.tokens as f64 / elapsed.as_secs_f64();
            self.tokens = 0;
            self.since = now;
        }
    }
}

/// SGLang's scheduler logs its decode stats every 40 decode steps (`--decode-log-interval`) and
/// resets its retraction count at each log, so `/v1/loads` shows the retractions since then.
const DECODE_LOG_INTERVAL: u64 = 40;

/// The preemptions since the last (modelled) stats log.
#[derive(Default)]
struct RetractedSinceLog {
    steps: u64,
    retracted: u64,
}

impl RetractedSinceLog {
    fn step(&mut self, preempted: u64) {
        self.steps += 1;
        if self.steps % DECODE_LOG_INTERVAL == 0 {
            self.retracted = 0;
        }
        self.retracted += preempted;
    }
}

pub(crate) async fn run(
    mut scheduler: Scheduler,
    mut commands: mpsc::UnboundedReceiver<RankCommand>,
    mut ctx: RankContext,
) {
    let mut subscribers: HashMap<SeqId, Subscriber> = HashMap::new();
    let mut pacer = Pacer::new(ctx.time_scale);
    let mut published = scheduler.counters();
    let mut throughput = Throughput::new();
    let mut retracted = RetractedSinceLog::default();
    publish(
        &scheduler,
        &ctx,
        &mut published,
        &mut throughput,
        &retracted,
    );
    loop {
        // Apply whatever arrived during the last step.
        loop {
            match commands.try_recv() {
                Ok(cmd) => {
                    if !apply(cmd, &mut scheduler, &mut subscribers) {
                        return shut_down(
                            scheduler,
                            &ctx,
                            &mut published,
                            &mut throughput,
                            &retracted,
                        );
                    }
                }
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => return,
            }
        }
        let (stopped, slow) = {
            let faults = ctx.faults.borrow();
            (faults.frozen || faults.asleep.is_some(), faults.slow_factor)
        };
        let preemptions_before = scheduler.counters().preemptions;
        let step = if stopped { None } else { scheduler.step() };
        let Some(step) = step else {
            publish(
                &scheduler,
                &ctx,
                &mut published,
                &mut throughput,
                &retracted,
            );
            // Idle or frozen: wait for a command or a change of faults.
            tokio::select! {
                cmd = commands.recv() => match cmd {
                    Some(cmd) => {
                        if !apply(cmd, &mut scheduler, &mut subscribers) {
                            return shut_down(scheduler, &ctx, &mut published, &mut throughput, &retracted);
                        }
                    }
                    None => return,
                },
                changed = ctx.faults.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
            }
            pacer.reset();
            continue;
        };
        let duration = step.duration.mul_f64(slow);
        if pacer.wait(duration).await {
            ctx.totals.late_steps.fetch_add(1, Ordering::Relaxed);
        }
        retracted.step(scheduler.counters().preemptions - preemptions_before);
        record_iteration(&step, &ctx);
        deliver(&step.events, &mut subscribers, &ctx);
        publish(
            &scheduler,
            &ctx,
            &mut published,
            &mut throughput,
            &retracted,
        );
    }
}

/// Applies a command; false means the rank must shut down.
fn apply(
    cmd: RankCommand,
    scheduler: &mut Scheduler,
    subscribers: &mut HashMap<SeqId, Subscriber>,
) -> bool {
    match cmd {
        RankCommand::Add(seq, subscriber) => {
            subscribers.insert(seq.id, subscriber);
            scheduler.add(seq);
        }
        RankCommand::Abort(id) => {
            subscribers.remove(&id);
            scheduler.abort(id);
        }
        RankCommand::Shutdown => return false,
    }
    true
}

/// vLLM's iteration stats: the tokens of a step that had outputs (a step that only prefilled
/// part of a prompt records none).
fn record_iteration(step: &Step, ctx: &RankContext) {
    if step.events.is_empty() {
        return;
    }
    let generated = step
        .events
        .iter()
        .filter(|e| matches!(e, SeqEvent::Token(_)))
        .count() as u64;
    ctx.metrics
        .iteration(ctx.index, u64::from(step.prompt_tokens_counted) + generated);
}

fn deliver(events: &[SeqEvent], subscribers: &mut HashMap<SeqId, Subscriber>, ctx: &RankContext) {
    let now = Instant::now();
    let mut produced = false;
    for event in events {
        match *event {
            SeqEvent::Token(id) => {
                produced = true;
                let Some(sub) = subscribers.get_mut(&id) else {
                    continue;
                };
                match sub.last_token {
                    None => ctx
                        .metrics
                        .observe_ttft(ctx.index, (now - sub.arrived).as_secs_f64()),
                    Some(last) => ctx
                        .metrics
                        .observe_itl(ctx.index, (now - last).as_secs_f64()),
                }
                sub.last_token = Some(now);
                let sent = sub.events.send(ChoiceEvent {
                    choice: sub.choice,
                    kind: EventKind::Token,
                });
                if sent.is_ok() {
                    ctx.totals.tokens_delivered.fetch_add(1, Ordering::Relaxed);
                }
            }
            SeqEvent::Finished(id, reason) => {
                if let Some(sub) = subscribers.remove(&id) {
                    let e2e = (now - sub.arrived).as_secs_f64();
                    ctx.metrics.finished(ctx.index, reason, e2e);
                    let _ = sub.events.send(ChoiceEvent {
                        choice: sub.choice,
                        kind: EventKind::Finished(reason),
                    });
                }
            }
            SeqEvent::Preempted(_) => {}
        }
    }
    if produced {
        *ctx.progress.lock() = now;
    }
}

fn publish(
    scheduler: &Scheduler,
    ctx: &RankContext,
    published: &mut Counters,
    throughput: &mut Throughput,
    retracted: &RetractedSinceLog,
) {
    let now = scheduler.counters();
    ctx.totals.add_progress(published, &now);
    ctx.metrics.progress(
        ctx.index,
        now.prompt_tokens_counted - published.prompt_tokens_counted,
        now.tokens_generated - published.tokens_generated,
        now.preemptions - published.preemptions,
    );
    let (queried, hit) = (
        now.prefix_queries - published.prefix_queries,
        now.prefix_hits - published.prefix_hits,
    );
    ctx.metrics.prefix_lookups(ctx.index, queried, hit);
    throughput.add(
        now.tokens_generated - published.tokens_generated,
        queried,
        hit,
        Instant::now(),
    );
    *published = now;
    let pool = scheduler.pool();
    ctx.gauges.publish(RankView {
        running: scheduler.running_len() as u64,
        waiting: scheduler.waiting_len() as u64,
        swapped: scheduler.swapped_len() as u64,
        kv_blocks_used: u64::from(pool.used()),
        kv_blocks_total: u64::from(pool.total()),
        pending_prefill_tokens: scheduler.pending_prefill_tokens(),
        work_in_flight: scheduler.work_in_flight(),
        gen_throughput: throughput.rate,
        cache_hit_rate: throughput.hit_rate,
        chunked: scheduler.chunked_len() as u64,
        retracted: retracted.retracted,
        prealloc: 0,
        transfer: 0,
    });
    ctx.published.notify_waiters();
}

/// Aborts every sequence (their work is wasted, as in a real crash) and publishes the result.
fn shut_down(
    mut scheduler: Scheduler,
    ctx: &RankContext,
    published: &mut Counters,
    throughput: &mut Throughput,
    retracted: &RetractedSinceLog,
) {
    for id in scheduler.live_ids() {
        scheduler.abort(id);
    }
    publish(&scheduler, ctx, published, throughput, retracted);
}
