//! A running engine: its data-parallel ranks, the way requests get in, and what it reports.
//!
//! `Engine::start` spawns one loop per rank (see `rank`). A request becomes one sequence per
//! choice on the least-loaded rank; its `Submission` yields the choices' events and, when dropped
//! (the client went away), aborts whatever is still running so the rank frees its KV blocks at
//! the next step.

mod adapters;
mod gate;
mod metrics;
mod rank;
mod stats;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

pub use adapters::{AdapterStats, Slots};
pub use gate::{AdmissionGate, GateTicket};
pub use metrics::EngineMetrics;
pub(crate) use stats::COUNTED_WHILE_HUNG;
pub use stats::{RankGauges, RankView, Totals, TRIAL_HEADER};

use crate::config::EngineConfig;
use crate::faults::FaultSet;
use crate::lora::{AdapterError, Loaded, Registry};
use crate::pd::Disagg;
use crate::scheduler::prefix::{block_hashes_under, CacheEvent};
use crate::scheduler::{Adapter, FinishReason, NewSeq, Scheduler, SeqId};
use rank::{RankCommand, RankContext, Subscriber};

/// Something that happened to one choice of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChoiceEvent {
    pub choice: u32,
    pub kind: EventKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Token,
    Finished(FinishReason),
}

/// One choice to generate.
#[derive(Debug, Clone)]
pub struct SeqSpec {
    /// The prompt's token ids, for the prefix cache (empty: nothing to share).
    pub prompt: Arc<[u32]>,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    pub finish: FinishReason,
    /// Prompt tokens whose KV arrives computed from a prefill engine.
    pub preloaded: u32,
    /// The LoRA adapter it runs under; `None`: the base model.
    pub adapter: Option<Adapter>,
}

/// One step's changes to a rank's prefix cache: a batch of KV events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvBatch {
    pub rank: u32,
    /// Numbered from 1 per rank, one more per batch.
    pub sequence: u64,
    pub events: Vec<CacheEvent>,
}

/// Batches a slow subscriber may fall behind by before it loses events.
const KV_EVENT_BACKLOG: usize = 4096;

/// Why the engine refused a request.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SubmitError {
    #[error("the waiting queue is full ({waiting} requests waiting)")]
    QueueFull { waiting: u64 },
    #[error("the engine is shut down")]
    ShutDown,
}

struct Rank {
    commands: mpsc::UnboundedSender<RankCommand>,
    gauges: Arc<RankGauges>,
    /// The rank's loop; taken when the engine shuts down, to wait for it.
    task: parking_lot::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// One incarnation of a simulated engine (a crash ends it; a restart makes a new one).
pub struct Engine {
    cfg: Arc<EngineConfig>,
    ranks: Vec<Rank>,
    metrics: Arc<EngineMetrics>,
    totals: Arc<Totals>,
    faults: watch::Receiver<FaultSet>,
    next_seq: AtomicU64,
    gate: Option<AdmissionGate>,
    /// Requests being served over HTTP, as vLLM's `/load` reports them.
    server_load: Arc<AtomicU64>,
    progress: Arc<parking_lot::Mutex<Instant>>,
    published: Arc<tokio::sync::Notify>,
    /// Its half of disaggregated requests (`--pd-role`).
    disagg: Option<Disagg>,
    /// Where sleep and wake are written (vLLM's `/sleep`, `/wake_up`).
    fault_control: Arc<watch::Sender<FaultSet>>,
    /// When its (modelled) startup ends: SGLang's `/health` answers 503 until then.
    ready_at: Instant,
    /// The W3C trace context the last generation request carried: the headers vLLM and SGLang
    /// read to join a caller's trace (`TRACE_HEADERS`, traceparent and tracestate, in
    /// vllm/tracing.py and sglang/srt/tracing/trace.py).
    trace_context: parking_lot::Mutex<Option<String>>,
    /// Every rank's KV events.
    kv_events: tokio::sync::broadcast::Sender<Arc<KvBatch>>,
    /// The LoRA adapters loaded (`--enable-lora`); `None`: the base model only.
    adapters: Option<parking_lot::Mutex<Registry>>,
    /// What the ranks' adapters are doing, for the metrics (`--enable-lora`).
    adapter_stats: Option<Arc<AdapterStats>>,
}

impl Engine {
    /// Starts the ranks' loops on the current tokio runtime; `published` is woken whenever a
    /// rank publishes new state. `cfg` must be validated.
    pub fn start(
        cfg: Arc<EngineConfig>,
        totals: Arc<Totals>,
        fault_control: Arc<watch::Sender<FaultSet>>,
        published: Arc<tokio::sync::Notify>,
    ) -> Self {
        let faults = fault_control.subscribe();
        let metrics = Arc::new(EngineMetrics::new(&cfg));
        let progress = Arc::new(parking_lot::Mutex::new(Instant::now()));
        let (kv_events, _) = tokio::sync::broadcast::channel(KV_EVENT_BACKLOG);
        let adapter_stats = cfg
            .lora
            .as_ref()
            .map(|_| Arc::new(AdapterStats::new(cfg.dp_size as usize)));
        let ranks = (0..cfg.dp_size as usize)
            .map(|index| {
                let (tx, rx) = mpsc::unbounded_channel();
                let gauges = Arc::new(RankGauges::default());
                let ctx = RankContext {
                    index,
                    time_scale: cfg.time_scale,
                    gauges: gauges.clone(),
                    totals: totals.clone(),
                    metrics: metrics.clone(),
                    faults: faults.clone(),
                    progress: progress.clone(),
                    published: published.clone(),
                    kv_events: kv_events.clone(),
                    adapters: adapter_stats.clone(),
                };
                let task = tokio::spawn(rank::run(Scheduler::new(cfg.scheduler()), rx, ctx));
                Rank {
                    commands: tx,
                    gauges,
                    task: parking_lot::Mutex::new(Some(task)),
                }
            })
            .collect();
        let gate = cfg
            .engine_request_limit
            .map(|n| AdmissionGate::new(n, cfg.request_queue_limit));
        let disagg = cfg.pd_role.map(|role| {
            let window = cfg.max_num_seqs.saturating_mul(cfg.dp_size);
            Disagg::new(role, window, cfg.bootstrap_deadline())
        });
        Self {
            disagg,
            fault_control,
            ready_at: Instant::now(),
            trace_context: parking_lot::Mutex::new(None),
            kv_events,
            adapter_stats,
            adapters: registry_of(&cfg),
            cfg,
            ranks,
            metrics,
            totals,
            faults,
            next_seq: AtomicU64::new(0),
            gate,
            server_load: Arc::new(AtomicU64::new(0)),
            progress,
            published,
        }
    }

    /// The engine still starting until `at` (the `slow-start` fault).
    pub fn ready_at(mut self, at: Instant) -> Self {
        self.ready_at = at;
        self
    }

    /// True until its startup (warmup) is over.
    pub fn starting(&self) -> bool {
        Instant::now() < self.ready_at
    }

    /// Puts the engine to sleep (`Some(level)`) or wakes it, as vLLM's `/sleep` and `/wake_up`.
    pub fn set_sleep(&self, level: Option<crate::faults::SleepLevel>) {
        self.fault_control.send_modify(|f| f.asleep = level);
        self.notify_changed();
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    pub fn metrics(&self) -> &EngineMetrics {
        &self.metrics
    }

    pub fn totals(&self) -> &Totals {
        &self.totals
    }

    /// A generation request arrived with this `traceparent` (or none).
    pub fn saw_trace_context(&self, traceparent: Option<&str>) {
        *self.trace_context.lock() = traceparent.map(str::to_string);
    }

    /// The `traceparent` of the last generation request, if it had one.
    pub fn last_trace_context(&self) -> Option<String> {
        self.trace_context.lock().clone()
    }

    pub fn faults(&self) -> FaultSet {
        self.faults.borrow().clone()
    }

    /// The standing faults as they change, for whoever must wait until one is lifted.
    pub fn fault_watch(&self) -> watch::Receiver<FaultSet> {
        self.faults.clone()
    }

    pub fn gate(&self) -> Option<&AdmissionGate> {
        self.gate.as_ref()
    }

    /// Each rank's state as it last published it. A decode engine's requests waiting for a
    /// running slot or for their KV are counted as waiting on its first rank, as both engines
    /// count their disaggregation queues.
    pub fn ranks(&self) -> Vec<RankView> {
        let mut views: Vec<RankView> = self.ranks.iter().map(|r| r.gauges.view()).collect();
        if let (Some(first), Some(disagg)) = (views.first_mut(), &self.disagg) {
            first.prealloc = disagg.waiting();
            first.transfer = disagg.transferring();
            first.waiting += first.prealloc + first.transfer;
        }
        views
    }

    /// Its half of disaggregated requests, if it serves one.
    pub fn disagg(&self) -> Option<&Disagg> {
        self.disagg.as_ref()
    }

    /// Wakes whoever awaits a change of the engine's state (see `EngineSlot::until`).
    pub fn notify_changed(&self) {
        self.published.notify_waiters();
    }

    /// Host time of the last step that produced a token.
    pub fn last_progress(&self) -> Instant {
        *self.progress.lock()
    }

    /// Counts an HTTP request for `/load` until the returned guard drops.
    pub fn track_request(&self) -> LoadGuard {
        self.server_load.fetch_add(1, Ordering::Relaxed);
        LoadGuard(self.server_load.clone())
    }

    pub fn server_load(&self) -> u64 {
        self.server_load.load(Ordering::Relaxed)
    }

    /// Queues a request's choices on the least-loaded rank.
    pub fn submit(&self, choices: &[SeqSpec]) -> Result<Submission, SubmitError> {
        let views = self.ranks();
        if let Some(limit) = self.cfg.max_queued_requests {
            let waiting: u64 = views.iter().map(RankView::queued).sum();
            if waiting >= u64::from(limit) {
                return Err(SubmitError::QueueFull { waiting });
            }
        }
        let rank = views
            .iter()
            .enumerate()
            .min_by_key(|(i, v)| (v.running + v.waiting, *i))
            .map(|(i, _)| i)
            .ok_or(SubmitError::ShutDown)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let commands = self.ranks[rank].commands.clone();
        let arrived = Instant::now();
        let mut ids = Vec::with_capacity(choices.len());
        // The choices of one prompt share its tokens: hash them once.
        let mut hashed = PromptHashes::default();
        for (choice, spec) in choices.iter().enumerate() {
            let id = SeqId(self.next_seq.fetch_add(1, Ordering::Relaxed));
            let prefix = hashed.of(spec, self.cfg.prefix_caching, self.cfg.block_size);
            let seq = NewSeq {
                id,
                prompt_tokens: spec.prompt_tokens,
                output_tokens: spec.output_tokens,
                finish: spec.finish,
                prompt: if prefix.is_empty() {
                    Arc::from([])
                } else {
                    spec.prompt.clone()
                },
                prefix,
                preloaded: spec.preloaded,
                adapter: spec.adapter.clone(),
            };
            let subscriber = Subscriber {
                events: tx.clone(),
                choice: choice as u32,
                arrived,
                last_token: None,
            };
            commands
                .send(RankCommand::Add(seq, subscriber))
                .map_err(|_| SubmitError::ShutDown)?;
            ids.push(id);
        }
        Ok(Submission {
            events: rx,
            abort: AbortOnDrop { commands, ids },
        })
    }

    /// The loaded adapter called `name`; `None` also when the engine serves no adapters.
    pub fn adapter(&self, name: &str) -> Option<Adapter> {
        self.adapters.as_ref()?.lock().get(name)
    }

    /// What the ranks' adapters are doing; `None` without `--enable-lora`.
    pub fn adapter_stats(&self) -> Option<&AdapterStats> {
        self.adapter_stats.as_deref()
    }

    /// Every loaded adapter, in load order (empty without `--enable-lora`).
    pub fn loaded_adapters(&self) -> Vec<Loaded> {
        self.adapters
            .as_ref()
            .map(|r| r.lock().loaded().to_vec())
            .unwrap_or_default()
    }

    /// Loads an adapter through the API: every rank reads it into host memory between steps.
    /// `None` when the engine serves no adapters.
    pub fn load_adapter(&self, name: &str, path: &str) -> Option<Result<Adapter, AdapterError>> {
        let loaded = self.adapters.as_ref()?.lock().load(name, path);
        if let Ok(adapter) = &loaded {
            self.tell_ranks(|| RankCommand::Preload(adapter.id));
        }
        Some(loaded)
    }

    /// Unloads an adapter through the API; `None` when the engine serves no adapters.
    pub fn unload_adapter(&self, name: &str) -> Option<Result<Adapter, AdapterError>> {
        let unloaded = self.adapters.as_ref()?.lock().unload(name);
        if let Ok(adapter) = &unloaded {
            self.tell_ranks(|| RankCommand::Forget(adapter.id));
        }
        Some(unloaded)
    }

    fn tell_ranks(&self, command: impl Fn() -> RankCommand) {
        for rank in &self.ranks {
            // A rank that is gone has nothing to load into.
            let _ = rank.commands.send(command());
        }
    }

    /// The KV events of every rank from now on; a subscriber that falls more than a few thousand
    /// batches behind is told it lagged.
    pub fn subscribe_kv_events(&self) -> tokio::sync::broadcast::Receiver<Arc<KvBatch>> {
        self.kv_events.subscribe()
    }

    /// Tells every rank to stop, aborting what it was doing (a crash).
    pub fn shut_down(&self) {
        for rank in &self.ranks {
            let _ = rank.commands.send(RankCommand::Shutdown);
        }
    }

    /// Waits until every rank's loop has ended (after `shut_down`), so its work is accounted for.
    pub async fn stopped(&self) {
        for rank in &self.ranks {
            let task = rank.task.lock().take();
            if let Some(task) = task {
                let _ = task.await;
            }
        }
    }
}

/// The adapters named at start, loaded; `None` without `--enable-lora`.
fn registry_of(cfg: &EngineConfig) -> Option<parking_lot::Mutex<Registry>> {
    let lora = cfg.lora.as_ref()?;
    Some(parking_lot::Mutex::new(Registry::new(&lora.modules)))
}

/// A request inside the engine: its events, and its abort when dropped.
pub struct Submission {
    pub events: mpsc::UnboundedReceiver<ChoiceEvent>,
    abort: AbortOnDrop,
}

impl Submission {
    /// Abandons the request now (as dropping it would).
    pub fn abort(self) {
        drop(self.abort);
    }
}

struct AbortOnDrop {
    commands: mpsc::UnboundedSender<RankCommand>,
    ids: Vec<SeqId>,
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        // Finished sequences are unknown to the rank by now; aborting them does nothing.
        for id in self.ids.drain(..) {
            let _ = self.commands.send(RankCommand::Abort(id));
        }
    }
}

/// Holds one unit of `/load` while an HTTP request is being served.
pub struct LoadGuard(Arc<AtomicU64>);

impl Drop for LoadGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The block hashes of the last prompt seen, so the `n` choices of one request
/// hash its tokens once.
#[derive(Default)]
struct PromptHashes {
    tokens: Option<Arc<[u32]>>,
    hashes: Option<Arc<[u64]>>,
}

impl PromptHashes {
    /// The block hashes of a choice's prompt, under its adapter (every choice of one request
    /// has the same one).
    fn of(&mut self, spec: &SeqSpec, caching: bool, block_size: u32) -> Arc<[u64]> {
        let prompt = &spec.prompt;
        if let (Some(tokens), Some(hashes)) = (&self.tokens, &self.hashes) {
            if Arc::ptr_eq(tokens, prompt) {
                return hashes.clone();
            }
        }
        let prefix: Arc<[u64]> = if caching {
            let adapter = spec.adapter.as_ref().map(|a| a.name.as_ref());
            block_hashes_under(prompt, block_size, adapter).into()
        } else {
            Arc::from([])
        };
        self.tokens = Some(prompt.clone());
        self.hashes = Some(prefix.clone());
        prefix
    }
}
