//! Several engines in one process, each on its own port, each able to crash and come back.
//!
//! An `EngineSlot` is one engine's place in the fleet: its address, its standing faults and the
//! ground-truth totals that survive its crashes. What runs in the slot (an `Engine` and its
//! server) is an incarnation: `crash` ends it, `restart` starts a new one on the same address.
//! Tests use this as a library (`SimFleet::start` on port 0); `sluice sim` is a thin shell over it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::api::{self, ApiState};
use crate::config::{ConfigError, EngineConfig, Flavor};
use crate::engine::{Engine, RankView, Totals};
use crate::faults::{Fault, FaultError, FaultSet};
use crate::grpc;
use crate::pd::{self, Disagg, PdRole};
use crate::server;

/// How to start a fleet.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// Number of engines.
    pub engines: usize,
    pub host: IpAddr,
    /// Port of the first engine; the others take the next ports. 0 gives each an ephemeral port.
    pub port: u16,
    /// Port of the first prefill engine's bootstrap server (`--pd-role prefill`); the others
    /// take the next ports. 0 gives each an ephemeral port.
    pub bootstrap_port: u16,
    pub engine: EngineConfig,
    /// More engines after those, each group serving another model (`--also-serve`): a fleet of
    /// two models of different sizes, so a gateway has somewhere to cascade to.
    pub also: Vec<(usize, EngineConfig)>,
    /// Faults applied at startup: to one engine (`Some(index)`) or to all.
    pub faults: Vec<(Option<usize>, Fault)>,
}

impl FleetConfig {
    /// `engines` engines on ephemeral loopback ports.
    pub fn local(engines: usize, engine: EngineConfig) -> Self {
        Self {
            engines,
            host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 0,
            bootstrap_port: 0,
            engine,
            also: Vec::new(),
            faults: Vec::new(),
        }
    }

    /// And `engines` more serving `engine`'s model.
    pub fn also(mut self, engines: usize, engine: EngineConfig) -> Self {
        self.also.push((engines, engine));
        self
    }

    /// Each engine's configuration, in order.
    fn each(&self) -> Vec<Arc<EngineConfig>> {
        let main = Arc::new(self.engine.clone());
        let mut all = vec![main; self.engines];
        for (count, cfg) in &self.also {
            let cfg = Arc::new(cfg.clone());
            all.extend(std::iter::repeat_n(cfg, *count));
        }
        all
    }
}

/// Why the fleet or one of its engines could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Fault(#[from] FaultError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("engine {index} does not exist (the fleet has {engines})")]
    NoSuchEngine { index: usize, engines: usize },
    #[error("engine {0} is already running")]
    AlreadyRunning(usize),
    #[error(transparent)]
    KvEvents(#[from] crate::zmq_events::KvEventsError),
}

struct Incarnation {
    engine: Arc<Engine>,
    kill: watch::Sender<bool>,
    /// The accept loop; it owns the listener, so the port is free once it has ended.
    server: tokio::task::JoinHandle<()>,
    /// A prefill engine's bootstrap server, killed with it.
    bootstrap: Option<tokio::task::JoinHandle<()>>,
    /// Where each rank publishes its KV events over ZMQ (`--kv-events-config`).
    kv_event_endpoints: Vec<String>,
    /// Batches each rank's publisher has sent.
    kv_event_batches: Vec<Arc<std::sync::atomic::AtomicU64>>,
    /// Each rank's publisher, killed with it (its port free once it has ended).
    kv_publishers: Vec<tokio::task::JoinHandle<()>>,
}

/// An incarnation's KV event publishers: where each rank publishes, its batches sent, its task.
#[derive(Default)]
struct KvPublishers {
    endpoints: Vec<String>,
    batches: Vec<Arc<std::sync::atomic::AtomicU64>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// One engine's place in the fleet.
pub struct EngineSlot {
    index: usize,
    addr: SocketAddr,
    /// A prefill engine's bootstrap server.
    bootstrap: Option<SocketAddr>,
    cfg: Arc<EngineConfig>,
    totals: Arc<Totals>,
    faults: Arc<watch::Sender<FaultSet>>,
    running: parking_lot::Mutex<Option<Incarnation>>,
    /// Where its ranks' publishers were first bound: a restart binds the same ports, as an
    /// engine restarted with its flags does (port 0 resolved once).
    kv_bound: parking_lot::Mutex<Vec<String>>,
    /// Woken whenever the engine publishes new state, faults change, or it crashes or restarts.
    changed: Arc<tokio::sync::Notify>,
}

/// Ground truth about one engine, for benchmarks and tests (`GET /engines/{i}/state`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EngineState {
    pub index: usize,
    pub url: String,
    pub up: bool,
    pub requests_received: u64,
    /// Liveness trials received (not in `requests_received`).
    pub trials_received: u64,
    /// When the last of `requests_received` came, microseconds since the Unix epoch (0: none).
    pub last_arrival_unix_us: u64,
    pub running: u64,
    pub waiting: u64,
    pub swapped: u64,
    pub kv_blocks_used: u64,
    pub kv_blocks_total: u64,
    pub preemptions: u64,
    pub aborted: u64,
    pub finished: u64,
    pub rejected: u64,
    pub prompt_tokens_computed: u64,
    pub tokens_generated: u64,
    pub tokens_delivered: u64,
    pub wasted_tokens: u64,
    /// Compute spent on the requests it holds now: wasted if the process is killed.
    pub work_in_flight: u64,
    /// Prompt tokens looked up in the prefix cache, and those found there.
    pub prefix_queries: u64,
    pub prefix_hits: u64,
    pub steps: u64,
    pub late_steps: u64,
    /// Requests inside the worker-side cap, when `--engine-request-limit` is set.
    pub engine_requests: Option<u32>,
    pub queued_requests: Option<u32>,
    pub ranks: Vec<RankView>,
    pub faults: FaultSet,
    /// The half of disaggregated requests it serves, if any.
    pub pd_role: Option<PdRole>,
    /// A prefill engine's requests failed because no decode engine claimed them in time.
    pub bootstrap_timeouts: u64,
    /// A decode engine's requests failed because their KV never came.
    pub transfer_failures: u64,
    /// `GetTokenizer` calls it answered (`--grpc`).
    pub tokenizer_fetches: u64,
    /// Connections open on its port now.
    pub open_connections: u64,
    /// Where each rank publishes its KV events over ZMQ (`--kv-events-config`), while up.
    pub kv_event_endpoints: Vec<String>,
    /// Batches each rank's publisher has sent since the engine (re)started: the next batch's
    /// number.
    pub kv_event_batches: Vec<u64>,
    /// Adapter loads and slot waits since it (re)started, over its ranks (`--enable-lora`).
    pub adapters: Option<crate::scheduler::AdapterCounters>,
}

impl EngineSlot {
    /// What it runs: its model, profile and flags.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    pub fn index(&self) -> usize {
        self.index
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A prefill engine's bootstrap server (`--pd-role prefill`).
    pub fn bootstrap_addr(&self) -> Option<SocketAddr> {
        self.bootstrap
    }

    /// `http://host:port`, or `grpc://host:port` for a gRPC engine: what a gateway is given.
    pub fn url(&self) -> String {
        let scheme = if self.cfg.grpc.is_some() {
            "grpc"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.addr)
    }

    pub fn is_up(&self) -> bool {
        self.running.lock().is_some()
    }

    /// The running engine, if the slot is not crashed.
    pub fn engine(&self) -> Option<Arc<Engine>> {
        self.running.lock().as_ref().map(|i| i.engine.clone())
    }

    /// Applies a fault: standing ones change the fault set, `crash` and `restart` act.
    pub async fn fault(&self, fault: Fault) -> Result<(), FleetError> {
        match fault {
            Fault::Crash => {
                self.crash().await;
                Ok(())
            }
            Fault::Restart => self.restart(Duration::ZERO).await,
            Fault::SlowStart { secs } => {
                FaultSet::new(1).apply(&fault)?;
                let warmup = Duration::from_secs_f64(secs / self.cfg.time_scale);
                self.restart(warmup).await
            }
            standing => {
                let mut result = Ok(());
                self.faults.send_modify(|f| result = f.apply(&standing));
                self.changed.notify_waiters();
                Ok(result?)
            }
        }
    }

    /// Crashes the engine and brings it back empty, faults cleared, taking `warmup` (host time)
    /// to start. vLLM binds its socket before building the engine but listens only once it
    /// serves, so its port refuses connections until then, and this returns once it is up;
    /// SGLang serves at once and answers `/health` 503 until its warmup is done.
    async fn restart(&self, warmup: Duration) -> Result<(), FleetError> {
        self.crash().await;
        self.faults.send_modify(|f| {
            let _ = f.apply(&Fault::Clear);
        });
        let ready_at = Instant::now() + warmup;
        if self.cfg.flavor == Flavor::Vllm {
            tokio::time::sleep_until(ready_at).await;
        }
        let listener = bind(self.addr).await?;
        let bootstrap = match self.bootstrap {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        let publishers = self.bind_publishers().await?;
        self.launch(listener, bootstrap, publishers, ready_at)
    }

    /// Closes the listener, resets every connection and drops all work in flight; returns once
    /// the port is closed.
    pub async fn crash(&self) {
        if let Some(incarnation) = self.stop() {
            let _ = incarnation.server.await;
            if let Some(bootstrap) = incarnation.bootstrap {
                let _ = bootstrap.await;
            }
            for publisher in incarnation.kv_publishers {
                let _ = publisher.await;
            }
            incarnation.engine.stopped().await;
            self.changed.notify_waiters();
        }
    }

    /// Starts a crash without waiting for it to complete.
    fn stop(&self) -> Option<Incarnation> {
        let incarnation = self.running.lock().take()?;
        let _ = incarnation.kill.send(true);
        incarnation.engine.shut_down();
        self.changed.notify_waiters();
        Some(incarnation)
    }

    /// Each rank's KV event publisher, bound, when the engine publishes over ZMQ.
    async fn bind_publishers(&self) -> Result<Vec<crate::zmq_events::Publisher>, FleetError> {
        let Some(cfg) = &self.cfg.kv_events_zmq else {
            return Ok(Vec::new());
        };
        let bound = self.kv_bound.lock().clone();
        let mut publishers = Vec::new();
        for rank in 0..self.cfg.dp_size {
            let publisher = match bound.get(rank as usize) {
                Some(endpoint) => crate::zmq_events::Publisher::bind_at(endpoint).await?,
                None => crate::zmq_events::Publisher::bind(cfg, rank).await?,
            };
            publishers.push(publisher);
        }
        *self.kv_bound.lock() = publishers.iter().map(|p| p.endpoint.clone()).collect();
        Ok(publishers)
    }

    fn launch(
        &self,
        listener: TcpListener,
        bootstrap: Option<TcpListener>,
        publishers: Vec<crate::zmq_events::Publisher>,
        ready_at: Instant,
    ) -> Result<(), FleetError> {
        let mut running = self.running.lock();
        if running.is_some() {
            return Err(FleetError::AlreadyRunning(self.index));
        }
        let engine = Arc::new(
            Engine::start(
                self.cfg.clone(),
                self.totals.clone(),
                self.faults.clone(),
                self.changed.clone(),
            )
            .ready_at(ready_at),
        );
        let state = ApiState::new(engine.clone()).with_bootstrap(self.bootstrap);
        let state = Arc::new(state);
        let router = if self.cfg.grpc.is_some() {
            grpc::router(state)
        } else {
            api::router(state)
        };
        let (kill, killed) = watch::channel(false);
        let bootstrap = match (bootstrap, engine.disagg()) {
            (Some(listener), Some(Disagg::Prefill(rooms))) => Some(tokio::spawn(server::serve(
                listener,
                pd::bootstrap::router(rooms.clone()),
                self.faults.subscribe(),
                killed.clone(),
                None,
            ))),
            _ => None,
        };
        let kv = self.publish_kv_events(publishers, &engine, &killed);
        let server = tokio::spawn(server::serve(
            listener,
            router,
            self.faults.subscribe(),
            killed,
            Some(server::Tally {
                totals: self.totals.clone(),
                changed: self.changed.clone(),
            }),
        ));
        *running = Some(Incarnation {
            engine,
            kill,
            server,
            bootstrap,
            kv_event_endpoints: kv.endpoints,
            kv_event_batches: kv.batches,
            kv_publishers: kv.tasks,
        });
        Ok(())
    }

    /// Each rank's KV event publisher, started on `engine`'s events, killed with it.
    fn publish_kv_events(
        &self,
        publishers: Vec<crate::zmq_events::Publisher>,
        engine: &Engine,
        killed: &watch::Receiver<bool>,
    ) -> KvPublishers {
        let topic = bytes::Bytes::from(
            self.cfg
                .kv_events_zmq
                .as_ref()
                .map(|c| c.topic.clone())
                .unwrap_or_default(),
        );
        let mut kv = KvPublishers::default();
        for (rank, publisher) in publishers.into_iter().enumerate() {
            kv.endpoints.push(publisher.endpoint.clone());
            let sent = Arc::new(std::sync::atomic::AtomicU64::new(0));
            kv.batches.push(sent.clone());
            let publishing = crate::zmq_events::Publishing {
                rank: rank as u32,
                flavor: self.cfg.flavor,
                block_size: self.cfg.block_size,
                topic: topic.clone(),
                sent,
            };
            kv.tasks.push(tokio::spawn(crate::zmq_events::run(
                publisher,
                engine.subscribe_kv_events(),
                publishing,
                killed.clone(),
            )));
        }
        kv
    }

    /// Waits until the engine's state satisfies `done` (checked at every change), and returns it.
    /// For tests and benchmarks that must await an event instead of sleeping.
    pub async fn until(&self, mut done: impl FnMut(&EngineState) -> bool) -> EngineState {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let state = self.state();
            if done(&state) {
                return state;
            }
            changed.await;
        }
    }

    pub fn state(&self) -> EngineState {
        let engine = self.engine();
        let ranks = engine.as_ref().map(|e| e.ranks()).unwrap_or_default();
        let sum = |f: fn(&RankView) -> u64| ranks.iter().map(f).sum::<u64>();
        let t = &self.totals;
        let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        // One look at the incarnation: its lock is not taken twice in one expression.
        let (kv_event_endpoints, kv_event_batches) = self
            .running
            .lock()
            .as_ref()
            .map(|r| {
                let batches = r.kv_event_batches.iter().map(|b| load(b)).collect();
                (r.kv_event_endpoints.clone(), batches)
            })
            .unwrap_or_default();
        let gate = engine
            .as_ref()
            .and_then(|e| e.gate().map(|g| (g.in_engine(), g.queued())));
        EngineState {
            index: self.index,
            url: self.url(),
            up: engine.is_some(),
            requests_received: load(&t.requests_received),
            trials_received: load(&t.trials_received),
            last_arrival_unix_us: load(&t.last_arrival_unix_us),
            running: sum(|r| r.running),
            waiting: sum(|r| r.waiting),
            swapped: sum(|r| r.swapped),
            kv_blocks_used: sum(|r| r.kv_blocks_used),
            kv_blocks_total: u64::from(self.cfg.num_gpu_blocks) * u64::from(self.cfg.dp_size),
            preemptions: load(&t.preemptions),
            aborted: load(&t.aborted),
            finished: load(&t.finished),
            rejected: load(&t.rejected),
            prompt_tokens_computed: load(&t.prompt_tokens_computed),
            tokens_generated: load(&t.tokens_generated),
            tokens_delivered: load(&t.tokens_delivered),
            wasted_tokens: load(&t.wasted_tokens),
            work_in_flight: sum(|r| r.work_in_flight),
            prefix_queries: load(&t.prefix_queries),
            prefix_hits: load(&t.prefix_hits),
            steps: load(&t.steps),
            late_steps: load(&t.late_steps),
            engine_requests: gate.map(|g| g.0),
            queued_requests: gate.map(|g| g.1),
            ranks,
            faults: self.faults.borrow().clone(),
            pd_role: self.cfg.pd_role,
            bootstrap_timeouts: load(&t.bootstrap_timeouts),
            transfer_failures: load(&t.transfer_failures),
            tokenizer_fetches: load(&t.tokenizer_fetches),
            open_connections: load(&t.open_connections),
            kv_event_endpoints,
            kv_event_batches,
            adapters: engine
                .as_ref()
                .and_then(|e| e.adapter_stats().map(|s| s.totals())),
        }
    }
}

/// The `n`th port after `first`; 0 stays 0 (ephemeral).
fn nth_port(first: u16, n: u16) -> u16 {
    if first == 0 {
        0
    } else {
        first.saturating_add(n)
    }
}

/// A listener on `host:port` and the address it got.
async fn listen(host: IpAddr, port: u16) -> Result<(TcpListener, SocketAddr), FleetError> {
    let wanted = SocketAddr::new(host, port);
    let listener = bind(wanted).await?;
    let addr = listener.local_addr().map_err(|source| FleetError::Bind {
        addr: wanted,
        source,
    })?;
    Ok((listener, addr))
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, FleetError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| FleetError::Bind { addr, source })
}

/// A running fleet of simulated engines.
pub struct SimFleet {
    slots: Vec<Arc<EngineSlot>>,
}

impl SimFleet {
    /// Validates the configuration, binds every engine and starts them.
    pub async fn start(mut cfg: FleetConfig) -> Result<Self, FleetError> {
        cfg.engine.fit_context();
        for (_, other) in &mut cfg.also {
            other.fit_context();
        }
        cfg.engine.validate()?;
        for (_, other) in &cfg.also {
            other.validate()?;
        }
        let each = cfg.each();
        let mut slots = Vec::with_capacity(each.len());
        let mut prefills = 0u16;
        for (index, engine_cfg) in each.into_iter().enumerate() {
            let (listener, addr) = listen(cfg.host, nth_port(cfg.port, index as u16)).await?;
            let (bootstrap, bootstrap_addr) = if engine_cfg.pd_role == Some(PdRole::Prefill) {
                let port = nth_port(cfg.bootstrap_port, prefills);
                prefills += 1;
                let (listener, addr) = listen(cfg.host, port).await?;
                (Some(listener), Some(addr))
            } else {
                (None, None)
            };
            let (faults, _) = watch::channel(FaultSet::new(engine_cfg.dp_size));
            let slot = Arc::new(EngineSlot {
                index,
                addr,
                bootstrap: bootstrap_addr,
                cfg: engine_cfg,
                totals: Arc::new(Totals::default()),
                faults: Arc::new(faults),
                running: parking_lot::Mutex::new(None),
                kv_bound: parking_lot::Mutex::default(),
                changed: Arc::new(tokio::sync::Notify::new()),
            });
            let publishers = slot.bind_publishers().await?;
            slot.launch(listener, bootstrap, publishers, Instant::now())?;
            slots.push(slot);
        }
        let fleet = Self { slots };
        for (target, fault) in cfg.faults {
            match target {
                Some(index) => fleet.engine(index)?.fault(fault).await?,
                None => {
                    for slot in &fleet.slots {
                        slot.fault(fault.clone()).await?;
                    }
                }
            }
        }
        Ok(fleet)
    }

    pub fn engines(&self) -> &[Arc<EngineSlot>] {
        &self.slots
    }

    pub fn engine(&self, index: usize) -> Result<&Arc<EngineSlot>, FleetError> {
        self.slots.get(index).ok_or(FleetError::NoSuchEngine {
            index,
            engines: self.slots.len(),
        })
    }

    /// Every engine's URL, in order.
    pub fn urls(&self) -> Vec<String> {
        self.slots.iter().map(|s| s.url()).collect()
    }
}

impl Drop for SimFleet {
    fn drop(&mut self) {
        for slot in &self.slots {
            slot.stop();
        }
    }
}
