//! The simulated fleet of a scenario: one `sluice sim` process per engine, each with its own
//! control listener, so that one engine can be killed with SIGKILL and started again on its port
//! while the others run on.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use sluice_sim::Fault;

use super::{ScenarioError, ScenarioPlan, MODEL};
use crate::client::HttpClient;
use crate::overhead::{free_ports, loopback, wait_until_listening, wait_until_serving};
use crate::procs::{Launch, Proc};

/// Engine totals that show wasted work, prefix caching, and whether the engines kept their clock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct EngineTotals {
    /// Requests received.
    pub requests: u64,
    pub preemptions: u64,
    /// Work thrown away: aborted and recomputed requests', and that of the requests an engine
    /// held when it was killed.
    pub wasted_tokens: u64,
    /// Prompt tokens looked up in the prefix cache, and those found there.
    pub prefix_queries: u64,
    pub prefix_hits: u64,
    pub aborted: u64,
    pub steps: u64,
    /// Steps that ended after their simulated time: this machine, not the engine model, set the
    /// pace then.
    pub late_steps: u64,
    /// LoRA adapters copied into a GPU slot, read from disk, and requests that waited for an
    /// adapter slot (`--enable-lora`).
    pub adapter_loads_from_cpu: u64,
    pub adapter_loads_from_disk: u64,
    pub adapter_slot_waits: u64,
}

impl EngineTotals {
    fn of(state: &serde_json::Value) -> Self {
        let read = |field: &str| state[field].as_u64().unwrap_or(0);
        Self {
            requests: read("requests_received"),
            preemptions: read("preemptions"),
            wasted_tokens: read("wasted_tokens"),
            prefix_queries: read("prefix_queries"),
            prefix_hits: read("prefix_hits"),
            aborted: read("aborted"),
            steps: read("steps"),
            late_steps: read("late_steps"),
            adapter_loads_from_cpu: state["adapters"]["loads_from_cpu"].as_u64().unwrap_or(0),
            adapter_loads_from_disk: state["adapters"]["loads_from_disk"].as_u64().unwrap_or(0),
            adapter_slot_waits: state["adapters"]["slot_waits"].as_u64().unwrap_or(0),
        }
    }

    /// The totals of an engine about to be killed: what it held in flight is wasted too.
    fn at_kill(state: &serde_json::Value) -> Self {
        let mut totals = Self::of(state);
        totals.wasted_tokens += state["work_in_flight"].as_u64().unwrap_or(0);
        totals
    }

    fn zip(self, other: Self, f: impl Fn(u64, u64) -> u64) -> Self {
        Self {
            requests: f(self.requests, other.requests),
            preemptions: f(self.preemptions, other.preemptions),
            wasted_tokens: f(self.wasted_tokens, other.wasted_tokens),
            prefix_queries: f(self.prefix_queries, other.prefix_queries),
            prefix_hits: f(self.prefix_hits, other.prefix_hits),
            aborted: f(self.aborted, other.aborted),
            steps: f(self.steps, other.steps),
            late_steps: f(self.late_steps, other.late_steps),
            adapter_loads_from_cpu: f(self.adapter_loads_from_cpu, other.adapter_loads_from_cpu),
            adapter_loads_from_disk: f(self.adapter_loads_from_disk, other.adapter_loads_from_disk),
            adapter_slot_waits: f(self.adapter_slot_waits, other.adapter_slot_waits),
        }
    }

    pub fn plus(self, other: Self) -> Self {
        self.zip(other, u64::saturating_add)
    }

    pub fn since(self, before: Self) -> Self {
        self.zip(before, u64::saturating_sub)
    }

    /// Share of prompt tokens found in the prefix cache (0 without any).
    pub fn hit_rate(&self) -> f64 {
        if self.prefix_queries == 0 {
            0.0
        } else {
            self.prefix_hits as f64 / self.prefix_queries as f64
        }
    }

    /// Share of the engines' steps that ran late (0 without steps).
    pub fn late_share(&self) -> f64 {
        if self.steps == 0 {
            0.0
        } else {
            self.late_steps as f64 / self.steps as f64
        }
    }
}

/// One engine process. `proc` is `None` while it is killed.
struct Engine {
    proc: Option<Proc>,
    port: u16,
    control: SocketAddr,
    /// Totals of its earlier lives, so a kill does not erase the work it had done.
    before_kill: EngineTotals,
}

/// What a scenario's engines serve.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetShape {
    /// The model the plan's engines serve, its profile, and more `sluice sim` flags for them.
    pub model: String,
    pub profile: String,
    pub extra: Vec<String>,
    /// More engines after them serving another model: how many, its model and its profile.
    pub also: Option<(usize, String, String)>,
    /// Every engine publishes its KV events over ZMQ (on the port two past its own) and
    /// tokenizes prompts with the simulated model's tokenizer, as precise prefix routing needs.
    pub kv_events: bool,
}

impl Default for FleetShape {
    fn default() -> Self {
        Self {
            model: MODEL.into(),
            profile: "llama3-8b-h100".into(),
            extra: Vec::new(),
            also: None,
            kv_events: false,
        }
    }
}

impl FleetShape {
    /// Engine `i`'s model, profile and own flags, the plan's `engines` first.
    fn of(&self, i: usize, engines: usize) -> (&str, &str, &[String]) {
        match &self.also {
            Some((_, model, profile)) if i >= engines => (model, profile, &[]),
            _ => (&self.model, &self.profile, &self.extra),
        }
    }
}

pub struct SimFleet {
    engines: Vec<Engine>,
    pub workers: Vec<String>,
    /// Each engine's KV-event publisher, when the shape publishes them.
    pub kv_endpoints: Vec<String>,
    http: HttpClient,
    exe: PathBuf,
    log_dir: PathBuf,
    time_scale: f64,
    seed: u64,
    engine_args: Vec<String>,
    shape: FleetShape,
    /// The plan's engines (the others serve the shape's other model).
    main: usize,
}

impl SimFleet {
    pub async fn start(plan: &ScenarioPlan) -> Result<Self, ScenarioError> {
        let total = plan.engines + plan.fleet.also.as_ref().map_or(0, |(n, _, _)| *n);
        // Its port, its control port and, with KV events, its publisher's.
        let span = if plan.fleet.kv_events { 3 } else { 2 };
        let ports = free_ports(span * total as u16)?;
        let mut fleet = Self {
            engines: Vec::new(),
            workers: Vec::new(),
            kv_endpoints: Vec::new(),
            http: Client::builder(TokioExecutor::new()).build_http(),
            exe: plan.sluice_exe.clone(),
            log_dir: plan.out_dir.clone(),
            time_scale: plan.time_scale,
            seed: plan.seed,
            engine_args: plan.engine_args.clone(),
            shape: plan.fleet.clone(),
            main: plan.engines,
        };
        for i in 0..total {
            let port = ports + span * i as u16;
            fleet.engines.push(Engine {
                proc: None,
                port,
                control: loopback(port + 1),
                before_kill: EngineTotals::default(),
            });
            let scheme = if fleet.grpc() { "grpc" } else { "http" };
            fleet.workers.push(format!("{scheme}://{}", loopback(port)));
            if fleet.shape.kv_events {
                fleet
                    .kv_endpoints
                    .push(format!("tcp://{}", loopback(port + 2)));
            }
            fleet.launch(i).await?;
        }
        Ok(fleet)
    }

    async fn launch(&mut self, i: usize) -> Result<(), ScenarioError> {
        let engine = &self.engines[i];
        let (model, profile, own) = self.shape.of(i, self.main);
        let argv: Vec<String> = [
            self.exe.display().to_string(),
            "sim".to_string(),
            "--profile".into(),
            profile.into(),
            "--model".into(),
            model.into(),
            "--port".into(),
            engine.port.to_string(),
            "--control-port".into(),
            engine.control.port().to_string(),
            "--time-scale".into(),
            self.time_scale.to_string(),
            "--seed".into(),
            self.seed.wrapping_add(i as u64).to_string(),
        ]
        .into_iter()
        .chain(self.engine_args.iter().cloned())
        .chain(own.iter().cloned())
        .chain(self.kv_event_flags(i))
        .collect();
        let mut proc = Proc::spawn(Launch {
            name: &format!("engine-{i}"),
            argv: &argv,
            core: None,
            log_dir: &self.log_dir,
        })?;
        let model = self.shape.of(i, self.main).0.to_string();
        if self.grpc() {
            // No OpenAI route to ask: the engine is up once its control listener answers.
            let control = engine.control;
            wait_until_listening(&mut proc, control).await?;
        } else {
            wait_until_serving(&mut proc, loopback(engine.port), &model).await?;
        }
        self.engines[i].proc = Some(proc);
        Ok(())
    }

    /// Engine `i`'s flags to publish its KV events and tokenize as the model, when the shape
    /// asks.
    fn kv_event_flags(&self, i: usize) -> Vec<String> {
        let Some(endpoint) = self.kv_endpoints.get(i) else {
            return Vec::new();
        };
        let config = serde_json::json!({"publisher": "zmq", "endpoint": endpoint});
        vec![
            "--model-tokenizer".into(),
            "--kv-events-config".into(),
            config.to_string(),
        ]
    }

    /// The engines serve SMG's gRPC protocol (`--grpc` among their flags).
    fn grpc(&self) -> bool {
        self.engine_args.iter().any(|a| a == "--grpc")
    }

    /// SIGKILL to engine `i`: its connections reset and its port refuses. The work it held
    /// (by its last report, read just before) is lost with the process: it counts as wasted.
    pub async fn kill(&mut self, i: usize) {
        let state = self.state(i).await;
        let engine = &mut self.engines[i];
        if let Some(state) = state {
            engine.before_kill = engine.before_kill.plus(EngineTotals::at_kill(&state));
        }
        if let Some(proc) = engine.proc.take() {
            proc.kill().await;
        }
    }

    /// Starts a killed engine again, empty, on its port.
    pub async fn restart(&mut self, i: usize) -> Result<(), ScenarioError> {
        self.launch(i).await
    }

    /// Injects a sim fault into engine `i`.
    pub async fn fault(&self, i: usize, fault: &Fault) -> Result<(), ScenarioError> {
        let body = serde_json::to_vec(fault).expect("a fault serializes");
        let url = format!("http://{}/engines/0/fault", self.engines[i].control);
        let request = http::Request::post(url)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .expect("a control URL built from a socket address is valid");
        match self.http.request(request).await {
            Ok(response) if response.status().is_success() => Ok(()),
            Ok(response) => Err(ScenarioError::Fault {
                fault: fault.clone(),
                status: response.status().as_u16(),
            }),
            Err(source) => Err(ScenarioError::Control(source)),
        }
    }

    async fn state(&self, i: usize) -> Option<serde_json::Value> {
        self.engines[i].proc.as_ref()?;
        let url = format!("http://{}/engines/0/state", self.engines[i].control);
        let request = http::Request::get(url).body(Full::new(Bytes::new())).ok()?;
        let response = self.http.request(request).await.ok()?;
        let body = response.into_body().collect().await.ok()?.to_bytes();
        serde_json::from_slice(&body).ok()
    }

    /// The PIDs of the engines running now, with their names.
    pub fn pids(&self) -> Vec<(String, u32)> {
        self.engines
            .iter()
            .filter_map(|e| e.proc.as_ref())
            .map(|p| (p.name().to_string(), p.pid()))
            .collect()
    }

    /// Requests engine `i` has received in its current life (`None` while it is down).
    pub async fn received(&self, i: usize) -> Option<u64> {
        self.state(i).await?["requests_received"].as_u64()
    }

    /// Engine `i`'s arrivals, and when the last came (microseconds since the Unix epoch).
    pub async fn arrivals(&self, i: usize) -> Option<(u64, u64)> {
        let state = self.state(i).await?;
        Some((
            state["requests_received"].as_u64()?,
            state["last_arrival_unix_us"].as_u64()?,
        ))
    }

    /// The totals summed over the engines and their earlier lives.
    pub async fn totals(&self) -> EngineTotals {
        self.per_engine()
            .await
            .into_iter()
            .fold(EngineTotals::default(), EngineTotals::plus)
    }

    /// Each engine's totals, over its earlier lives too.
    pub async fn per_engine(&self) -> Vec<EngineTotals> {
        let mut all = Vec::with_capacity(self.engines.len());
        for (i, engine) in self.engines.iter().enumerate() {
            let mut t = engine.before_kill;
            if let Some(s) = self.state(i).await {
                t = t.plus(EngineTotals::of(&s));
            }
            all.push(t);
        }
        all
    }

    /// Waits until no engine holds work, so one point's queue does not leak into the next.
    pub async fn drain(&self, limit: Duration) -> Result<(), ScenarioError> {
        let give_up = tokio::time::Instant::now() + limit;
        loop {
            let mut busy = false;
            for i in 0..self.engines.len() {
                if let Some(s) = self.state(i).await {
                    busy |=
                        s["running"].as_u64().unwrap_or(0) + s["waiting"].as_u64().unwrap_or(0) > 0;
                }
            }
            if !busy {
                return Ok(());
            }
            if tokio::time::Instant::now() >= give_up {
                return Err(ScenarioError::Drain(limit));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn stop(self) {
        for engine in self.engines {
            if let Some(proc) = engine.proc {
                proc.stop(Duration::from_secs(10)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_add_across_lives_and_subtract_across_points() {
        let state = serde_json::json!({"preemptions": 2, "wasted_tokens": 40, "aborted": 1,
            "steps": 1000, "late_steps": 15, "running": 3, "requests_received": 9,
            "prefix_queries": 400, "prefix_hits": 100});
        let one = EngineTotals::of(&state);
        assert_eq!(one.late_share(), 0.015);
        assert_eq!(one.hit_rate(), 0.25);
        assert_eq!(one.requests, 9);
        let two = one.plus(one);
        assert_eq!((two.preemptions, two.steps, two.late_steps), (4, 2000, 30));
        assert_eq!(two.since(one), one);
        assert_eq!(one.since(two), EngineTotals::default(), "never below zero");
        assert_eq!(EngineTotals::default().late_share(), 0.0);
        assert_eq!(EngineTotals::default().hit_rate(), 0.0);
        let killed = serde_json::json!({"wasted_tokens": 40, "work_in_flight": 500});
        assert_eq!(
            EngineTotals::at_kill(&killed).wasted_tokens,
            540,
            "the work a SIGKILL takes with it is wasted"
        );
    }
}
