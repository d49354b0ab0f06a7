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
use super::{ChoiceEvent, EventKind, KvBatch};
use crate::faults::FaultSet;
use crate::scheduler::{AdapterId, Counters, NewSeq, Scheduler, SeqEvent, SeqId};

/// What the rest of the engine asks of a rank.
pub(crate) enum RankCommand {
    Add(NewSeq, Subscriber),
    Abort(SeqId),
    /// Abort everything and stop (the engine crashed).
    Shutdown,
    /// An adapter loaded through the API: read it into host memory.
    Preload(AdapterId),
    /// An adapter unloaded through the API.
    Forget(AdapterId),
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
    /// Where the rank's KV events go, a batch per step that changed its cache.
    pub kv_events: tokio::sync::broadcast::Sender<Arc<KvBatch>>,
    /// Where the rank's adapter use goes (`--enable-lora`).
    pub adapters: Option<Arc<super::AdapterStats>>,
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

/// What the rank last published, to report each step's work once.
struct Reporter {
    published: Counters,
    throughput: Throughput,
    /// Preemptions when the last (modelled) stats log was written.
    logged_preemptions: u64,
}

impl Reporter {
    fn new(scheduler: &Scheduler) -> Self {
        Self {
            published: scheduler.counters(),
            throughput: Throughput::new(),
            logged_preemptions: 0,
        }
    }

    /// Preemptions since the last stats log, which is written every `DECODE_LOG_INTERVAL`
    /// steps.
    fn retracted(&mut self, now: &Counters) -> u64 {
        let interval = |steps: u64| steps / DECODE_LOG_INTERVAL;
        if interval(now.steps) != interval(self.published.steps) {
            self.logged_preemptions = self.published.preemptions;
        }
        now.preemptions - self.logged_preemptions
    }
}

/// What applying the commands that arrived came to.
enum Applied {
    /// Go on stepping.
    Go,
    /// A command shut the engine down.
    ShutDown,
    /// Every handle to the engine is gone.
    Gone,
}

impl Applied {
    /// After a command: go on, unless it shut the engine down.
    fn of(go_on: bool) -> Self {
        if go_on {
            Applied::Go
        } else {
            Applied::ShutDown
        }
    }
}

/// Idle, paused or asleep: waits for a command (and applies it) or a change of faults.
async fn wait_idle(
    (commands, faults): (
        &mut mpsc::UnboundedReceiver<RankCommand>,
        &mut watch::Receiver<FaultSet>,
    ),
    scheduler: &mut Scheduler,
    subscribers: &mut HashMap<SeqId, Subscriber>,
) -> Applied {
    tokio::select! {
        cmd = commands.recv() => match cmd {
            Some(cmd) => Applied::of(apply(cmd, scheduler, subscribers)),
            None => Applied::Gone,
        },
        changed = faults.changed() => match changed {
            Ok(()) => Applied::Go,
            Err(_) => Applied::Gone,
        },
    }
}

/// Applies whatever arrived during the last step, waiting for nothing.
fn apply_arrived(
    commands: &mut mpsc::UnboundedReceiver<RankCommand>,
    scheduler: &mut Scheduler,
    subscribers: &mut HashMap<SeqId, Subscriber>,
) -> Applied {
    loop {
        match commands.try_recv() {
            Ok(cmd) => match Applied::of(apply(cmd, scheduler, subscribers)) {
                Applied::Go => {}
                stop => return stop,
            },
            Err(mpsc::error::TryRecvError::Empty) => return Applied::Go,
            Err(mpsc::error::TryRecvError::Disconnected) => return Applied::Gone,
        }
    }
}

pub(crate) async fn run(
    mut scheduler: Scheduler,
    mut commands: mpsc::UnboundedReceiver<RankCommand>,
    mut ctx: RankContext,
) {
    let mut subscribers: HashMap<SeqId, Subscriber> = HashMap::new();
    let mut pacer = Pacer::new(ctx.time_scale);
    let mut reporter = Reporter::new(&scheduler);
    let mut batches = 0;
    publish(&scheduler, &ctx, &mut reporter);
    loop {
        if ctx.faults.borrow().wedged.is_some() {
            // Stuck inside a step: nothing is taken in and nothing published, so every gauge
            // stands where the last step left it. What arrives meanwhile waits its turn.
            let Some(held) = sit_out_wedge(&mut commands, &mut ctx.faults).await else {
                return shut_down(scheduler, &ctx, &mut reporter);
            };
            if !held
                .into_iter()
                .all(|cmd| apply(cmd, &mut scheduler, &mut subscribers))
            {
                return shut_down(scheduler, &ctx, &mut reporter);
            }
            pacer.reset();
        }
        match apply_arrived(&mut commands, &mut scheduler, &mut subscribers) {
            Applied::Go => {}
            Applied::ShutDown => return shut_down(scheduler, &ctx, &mut reporter),
            Applied::Gone => return,
        }
        let (stopped, slow) = {
            let faults = ctx.faults.borrow();
            (faults.stops_steps(), faults.slow_factor)
        };
        let step = if stopped { None } else { scheduler.step() };
        let Some(step) = step else {
            if ctx.faults.borrow().wedged.is_some() {
                continue;
            }
            publish(&scheduler, &ctx, &mut reporter);
            let idle = (&mut commands, &mut ctx.faults);
            match wait_idle(idle, &mut scheduler, &mut subscribers).await {
                Applied::Go => {}
                Applied::ShutDown => return shut_down(scheduler, &ctx, &mut reporter),
                Applied::Gone => return,
            }
            pacer.reset();
            continue;
        };
        let duration = step.duration.mul_f64(slow);
        if pacer.wait(duration).await {
            ctx.totals.late_steps.fetch_add(1, Ordering::Relaxed);
        }
        deliver(&step.events, &mut subscribers, &ctx);
        publish(&scheduler, &ctx, &mut reporter);
        publish_cache_events(&mut scheduler, &ctx, &mut batches);
    }
}

/// Waits out a wedge, keeping what arrives (the engine core's input queue) to be applied in
/// order once it clears; `None` when the engine is shut down meanwhile (a crash ends a wedge).
async fn sit_out_wedge(
    commands: &mut mpsc::UnboundedReceiver<RankCommand>,
    faults: &mut watch::Receiver<FaultSet>,
) -> Option<Vec<RankCommand>> {
    let mut held = Vec::new();
    while faults.borrow_and_update().wedged.is_some() {
        tokio::select! {
            cmd = commands.recv() => match cmd {
                Some(RankCommand::Shutdown) | None => return None,
                Some(cmd) => held.push(cmd),
            },
            changed = faults.changed() => {
                if changed.is_err() {
                    return None;
                }
            }
        }
    }
    Some(held)
}

/// Sends the step's cache changes as one numbered batch, as SGLang's and vLLM's event
/// publishers send one per scheduler step (numbered per rank). Nobody listening costs nothing
/// but the drain.
fn publish_cache_events(scheduler: &mut Scheduler, ctx: &RankContext, batches: &mut u64) {
    let events = scheduler.take_cache_events();
    if events.is_empty() || ctx.kv_events.receiver_count() == 0 {
        return;
    }
    *batches += 1;
    let _ = ctx.kv_events.send(Arc::new(KvBatch {
        rank: ctx.index as u32,
        sequence: *batches,
        events,
    }));
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
        RankCommand::Preload(adapter) => {
            scheduler.preload_adapter(adapter);
        }
        RankCommand::Forget(adapter) => scheduler.forget_adapter(adapter),
    }
    true
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

fn publish(scheduler: &Scheduler, ctx: &RankContext, reporter: &mut Reporter) {
    let now = scheduler.counters();
    let published = reporter.published;
    ctx.totals.add_progress(&published, &now);
    let (prompt, generated) = (
        now.prompt_tokens_counted - published.prompt_tokens_counted,
        now.tokens_generated - published.tokens_generated,
    );
    ctx.metrics.progress(
        ctx.index,
        prompt,
        generated,
        now.preemptions - published.preemptions,
    );
    if generated > 0 {
        // vLLM's iteration stats: only a step with outputs records its tokens.
        ctx.metrics.iteration(ctx.index, prompt + generated);
    }
    let (queried, hit) = (
        now.prefix_queries - published.prefix_queries,
        now.prefix_hits - published.prefix_hits,
    );
    ctx.metrics.prefix_lookups(ctx.index, queried, hit);
    // SGLang's `cache_hit_rate` still counts a retracted request's lookup again, as the
    // simulator always has: whether a release leaves those out was not read in its source.
    let (again, again_hit) = (
        now.preempted_queries - published.preempted_queries,
        now.preempted_hits - published.preempted_hits,
    );
    let throughput = &mut reporter.throughput;
    throughput.add(generated, queried + again, hit + again_hit, Instant::now());
    let (rate, hit_rate) = (throughput.rate, throughput.hit_rate);
    let retracted = reporter.retracted(&now);
    reporter.published = now;
    let pool = scheduler.pool();
    ctx.gauges.publish(RankView {
        running: scheduler.running_len() as u64,
        waiting: scheduler.waiting_len() as u64,
        swapped: scheduler.swapped_len() as u64,
        kv_blocks_used: u64::from(pool.used()),
        kv_blocks_total: u64::from(pool.total()),
        pending_prefill_tokens: scheduler.pending_prefill_tokens(),
        work_in_flight: scheduler.work_in_flight(),
        gen_throughput: rate,
        cache_hit_rate: hit_rate,
        chunked: scheduler.chunked_len() as u64,
        retracted,
        prealloc: 0,
        transfer: 0,
    });
    if let (Some(stats), Some(adapter_use)) = (&ctx.adapters, scheduler.adapter_use()) {
        stats.record(ctx.index, adapter_use);
    }
    ctx.published.notify_waiters();
}

/// Aborts every sequence (their work is wasted, as in a real crash) and publishes the result.
fn shut_down(mut scheduler: Scheduler, ctx: &RankContext, reporter: &mut Reporter) {
    for id in scheduler.live_ids() {
        scheduler.abort(id);
    }
    publish(&scheduler, ctx, reporter);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters(steps: u64, preemptions: u64) -> Counters {
        Counters {
            steps,
            preemptions,
            ..Counters::default()
        }
    }

    #[tokio::test]
    async fn a_wedge_holds_what_arrives_in_order_until_it_clears_and_a_crash_ends_it() {
        let (commands, mut inbox) = mpsc::unbounded_channel();
        let (faults, mut watched) = watch::channel(FaultSet::new(1));
        faults.send_modify(|f| f.wedged = Some(crate::faults::WedgedPolls::Stale));
        commands.send(RankCommand::Abort(SeqId(7))).unwrap();
        commands.send(RankCommand::Abort(SeqId(8))).unwrap();
        let waiting = tokio::spawn(async move {
            let held = sit_out_wedge(&mut inbox, &mut watched).await;
            (held, inbox, watched)
        });
        tokio::task::yield_now().await;
        faults.send_modify(|f| f.wedged = None);
        let (held, mut inbox, mut watched) = waiting.await.unwrap();
        let ids: Vec<SeqId> = held
            .unwrap()
            .into_iter()
            .map(|cmd| match cmd {
                RankCommand::Abort(id) => id,
                _ => panic!("only aborts were sent"),
            })
            .collect();
        assert_eq!(ids, [SeqId(7), SeqId(8)], "held, in order");
        faults.send_modify(|f| f.wedged = Some(crate::faults::WedgedPolls::Stale));
        commands.send(RankCommand::Shutdown).unwrap();
        assert!(sit_out_wedge(&mut inbox, &mut watched).await.is_none());
    }

    #[test]
    fn retractions_count_since_the_last_stats_log_every_forty_steps() {
        let mut reporter = Reporter {
            published: Counters::default(),
            throughput: Throughput::new(),
            logged_preemptions: 0,
        };
        let mut at = |steps, preemptions| {
            let now = counters(steps, preemptions);
            let retracted = reporter.retracted(&now);
            reporter.published = now;
            retracted
        };
        assert_eq!(at(1, 2), 2);
        assert_eq!(at(39, 5), 5, "no log yet");
        assert_eq!(at(40, 6), 1, "the log at step 40 kept only this step's");
        assert_eq!(at(79, 9), 4);
        assert_eq!(at(80, 9), 0, "logged again");
    }
}
