//! The `sluice bench` subcommands.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use sluice_sim::args::EngineArgs;

use crate::arrivals::{Process, Schedule, Segment};
use crate::capacity::{default_levels, default_workload, run_virtual, CapacityPlan};
use crate::http_capacity::run_http;
use crate::overhead::{resolve, OverheadPlan, Template};
use crate::run::RunPlan;
use crate::workload::Workload;

mod scenario;

use scenario::scenario;
pub use scenario::{ScenarioArgs, ScenarioName};

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Closed-loop concurrency sweep of one simulated engine: throughput, TTFT and preemptions
    /// per level, showing where the engine's knee is.
    Capacity(CapacityArgs),
    /// What a gateway costs: requests/s, CPU per request, added latency against going direct,
    /// memory and SSE relay rate, with instant simulated engines and the gateway pinned to one
    /// core. Measures sluice, nginx and SMG when they are on the PATH, and any --gateway template.
    Overhead(OverheadArgs),
    /// One open-loop run against any OpenAI-compatible endpoint: arrivals on a schedule (Poisson
    /// or bursty, with spikes and ramps), a named mix of request lengths, priority tiers and
    /// tenants, a client that retries like the OpenAI SDK or not; reports goodput.
    Run(RunArgs),
    /// A whole experiment: starts simulated engines, each gateway configuration in turn and the
    /// load, reports, and stops everything it started.
    Scenario(ScenarioArgs),
    /// The functions `sluice serve` runs starting, idle and serving, profiled with callgrind from
    /// this binary: a symbol ordering for the linker, which lays them out together so an idle
    /// gateway maps few pages of its binary (`scripts/release` builds with it).
    SymbolOrder(SymbolOrderArgs),
}

#[derive(Args)]
pub struct SymbolOrderArgs {
    /// Where to write the ordering: one symbol name a line.
    #[arg(long)]
    pub out: PathBuf,
    /// Small chat completions sent through the gateway (8 streams follow them).
    #[arg(long, default_value_t = 800)]
    pub requests: u64,
    /// Seconds the gateway is left idle before the requests (its probes and polls run).
    #[arg(long, default_value_t = 3.0)]
    pub idle_secs: f64,
}

#[derive(Args)]
pub struct RunArgs {
    /// Base URL of the gateway or engine, e.g. http://127.0.0.1:30000.
    #[arg(long)]
    pub url: String,
    /// Model to ask for.
    #[arg(long, default_value = "llama-3.1-8b")]
    pub model: String,
    /// Offered requests per second (the base of the schedule); not with --clients.
    #[arg(long, required_unless_present = "clients", conflicts_with = "clients")]
    pub rate: Option<f64>,
    /// A closed loop instead of a rate: this many clients, each sending its next request as
    /// soon as its last one ended (answered, refused, or given up on).
    #[arg(long)]
    pub clients: Option<u32>,
    /// Seconds of arrivals.
    #[arg(long, default_value_t = 60.0)]
    pub duration_secs: f64,
    /// Stop after this many requests.
    #[arg(long, default_value_t = 100_000)]
    pub max_requests: usize,
    /// Gamma-distributed gaps with this shape (1: Poisson; below 1: burstier).
    #[arg(long, default_value_t = 1.0)]
    pub burstiness: f64,
    /// A step change of the rate, `START:END:FACTOR` in seconds (e.g. 60:120:3). Repeatable.
    #[arg(long = "spike", value_name = "START:END:FACTOR")]
    pub spikes: Vec<String>,
    /// A linear change of the rate, `START:END:FROM:TO` (factors of the base). Repeatable.
    #[arg(long = "ramp", value_name = "START:END:FROM:TO")]
    pub ramps: Vec<String>,
    /// Request lengths.
    #[arg(long, value_enum, default_value = "chat")]
    pub mix: crate::run::Mix,
    /// How the client reacts to refusals.
    #[arg(long, value_enum, default_value = "none")]
    pub client: crate::client::ClientKind,
    #[command(flatten)]
    pub patience: PatienceArgs,
    /// Whole answers instead of streams.
    #[arg(long)]
    pub no_stream: bool,
    /// Tenants the requests are spread over (the body's `user`).
    #[arg(long, default_value_t = 4)]
    pub tenants: u32,
    /// API keys the tenants send, one per tenant in turn (`Authorization: Bearer`). Each request
    /// also names its tier in `x-sluice-priority` and SMG's `x-smg-priority`.
    #[arg(long, value_delimiter = ',', value_name = "KEY")]
    pub tenant_keys: Vec<String>,
    /// Seed of the arrivals and the request shapes (a run's load is reproducible from it).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Longest a request may take before it counts as a client timeout.
    #[arg(long, default_value_t = 300.0)]
    pub request_timeout_secs: f64,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// When the client gives up or leaves, as clients do.
#[derive(Args, Clone, Debug, Default)]
pub struct PatienceArgs {
    /// The client's timeout as the OpenAI SDK has it (httpx's read timeout): seconds without a
    /// byte, waiting for the answer's head and then between pieces of its body. With
    /// `--client sdk` one before the head is retried.
    #[arg(long, value_name = "SECS")]
    pub idle_timeout_secs: Option<f64>,
    /// Seconds the client gives each request as a whole, retries included.
    #[arg(long, value_name = "SECS")]
    pub total_timeout_secs: Option<f64>,
    /// Sends `X-Request-Deadline-Ms` with this budget, and gives up once it is spent.
    #[arg(long, value_name = "MS")]
    pub deadline_ms: Option<u64>,
    /// Leaves each stream after this many tokens (closes the connection).
    #[arg(long, value_name = "TOKENS")]
    pub leave_after_tokens: Option<u32>,
}

impl PatienceArgs {
    pub fn patience(&self) -> Result<crate::client::Patience, BenchError> {
        let secs = |flag, value: Option<f64>| value.map(|v| seconds(flag, v)).transpose();
        if self.deadline_ms == Some(0) {
            return Err(BenchError::Zero("deadline-ms"));
        }
        if self.leave_after_tokens == Some(0) {
            return Err(BenchError::Zero("leave-after-tokens"));
        }
        Ok(crate::client::Patience {
            idle: secs("idle-timeout-secs", self.idle_timeout_secs)?,
            total: secs("total-timeout-secs", self.total_timeout_secs)?,
            deadline: self.deadline_ms.map(Duration::from_millis),
            leave_after: self.leave_after_tokens,
        })
    }
}

#[derive(Args)]
pub struct OverheadArgs {
    /// Targets to measure, comma-separated: direct, nginx (plain keep-alive proxy), sluice
    /// (round_robin), sluice-cache-aware (its default policy), smg, or a name defined by
    /// --gateway [default: all that can run here].
    #[arg(long, value_delimiter = ',')]
    pub targets: Vec<String>,
    /// Another gateway to measure, `NAME=COMMAND`, where COMMAND contains `{port}` (where it must
    /// listen) and a `{workers}` argument (replaced by the engine URLs). Repeatable.
    #[arg(long = "gateway", value_name = "NAME=COMMAND")]
    pub gateways: Vec<String>,
    /// Connection counts for small non-streaming requests, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 64])]
    pub connections: Vec<usize>,
    /// Connections for the streaming window.
    #[arg(long, default_value_t = 64)]
    pub stream_connections: usize,
    /// Tokens per streamed answer (one SSE event each).
    #[arg(long, default_value_t = 1000)]
    pub stream_tokens: u32,
    /// Seconds of load before each measured window.
    #[arg(long, default_value_t = 2.0)]
    pub warmup_secs: f64,
    /// Seconds measured per window.
    #[arg(long, default_value_t = 10.0)]
    pub window_secs: f64,
    /// The core the gateway is pinned to.
    #[arg(long, default_value_t = 0)]
    pub gateway_core: usize,
    /// The core the load generator and the engines are pinned to.
    #[arg(long, default_value_t = 1)]
    pub load_core: usize,
    /// Simulated engines behind the gateway.
    #[arg(long, default_value_t = 2)]
    pub engines: usize,
    /// Skip the one-connection window with the gateway on the load's core (which shows the
    /// gateway's own added latency, without cross-core wake-ups).
    #[arg(long)]
    pub no_shared_core: bool,
    /// Also count each target's instructions per small request and per SSE event under
    /// callgrind (valgrind must be installed): a figure that does not move with the machine's
    /// load. Each target is started once more for it, on the gateway's core.
    #[arg(long)]
    pub instructions: bool,
    /// Small requests counted with --instructions (a quarter as many warm up first).
    #[arg(long, default_value_t = 3200)]
    pub instruction_requests: u64,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct CapacityArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Concurrency levels, comma-separated [default: 1,2,4,...,1024].
    #[arg(long, value_delimiter = ',')]
    pub levels: Vec<u32>,
    /// Engine seconds before each level is measured.
    #[arg(long, default_value_t = 300.0)]
    pub warmup_secs: f64,
    /// Engine seconds measured at each level.
    #[arg(long, default_value_t = 300.0)]
    pub window_secs: f64,
    /// Shortest prompt, in tokens.
    #[arg(long, default_value_t = default_workload().prompt_min)]
    pub prompt_min: u32,
    /// Longest prompt, in tokens.
    #[arg(long, default_value_t = default_workload().prompt_max)]
    pub prompt_max: u32,
    /// Median answer length, in tokens (log-normal).
    #[arg(long, default_value_t = default_workload().output_median)]
    pub output_median: f64,
    /// Spread of answer lengths (sigma of their logarithm).
    #[arg(long, default_value_t = default_workload().output_sigma)]
    pub output_sigma: f64,
    /// Longest answer, in tokens.
    #[arg(long, default_value_t = default_workload().output_max)]
    pub output_max: u32,
    /// Drive a real engine over loopback HTTP in scaled wall-clock time (use --time-scale),
    /// instead of stepping its scheduler on a virtual clock.
    #[arg(long)]
    pub http: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Why a bench command failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Args(#[from] sluice_sim::args::ArgsError),
    #[error(transparent)]
    Http(#[from] crate::http_capacity::HttpBenchError),
    #[error("--{0} must be a positive number of seconds")]
    Duration(&'static str),
    #[error(transparent)]
    Target(#[from] crate::overhead::TemplateError),
    #[error("--instructions and symbol-order profile with callgrind, and valgrind is not installed (apt-get install valgrind)")]
    NoValgrind,
    #[error(transparent)]
    Overhead(#[from] crate::overhead::OverheadError),
    #[error("--{0} must be a positive number")]
    Positive(&'static str),
    #[error("--{0} must be at least 1")]
    Zero(&'static str),
    #[error("--load is taken by routing, long-context, tiered-overload and spike")]
    LoadNotTaken,
    #[error("cannot find the sluice binary: {0}")]
    Exe(std::io::Error),
    #[error("the benchmark thread failed: {0}")]
    Thread(std::io::Error),
    #[error("the benchmark thread ended without an answer")]
    Lost,
    #[error("--spike takes START:END:FACTOR and --ramp START:END:FROM:TO, in seconds and factors: {0:?}")]
    Segment(String),
    #[error("--phases takes BEFORE:DURING:AFTER in seconds, DURING above 0: {0:?}")]
    Phases(String),
    #[error("--client-kinds takes the labels the liveness table prints, such as \"stream sdk 3s x16\" or \"whole deadline 2000ms x1\": {0:?}")]
    ClientKind(String),
    #[error("--rate must be a positive number of requests per second")]
    Rate,
    #[error(transparent)]
    Arrivals(#[from] crate::arrivals::ArrivalError),
    #[error(transparent)]
    Scenario(#[from] crate::scenario::ScenarioError),
    #[error("cannot create {0}: {1}")]
    OutDir(PathBuf, std::io::Error),
}

pub(crate) fn seconds(flag: &'static str, secs: f64) -> Result<Duration, BenchError> {
    Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or(BenchError::Duration(flag))
}

pub async fn run(command: BenchCommand) -> Result<(), BenchError> {
    match command {
        BenchCommand::Capacity(args) => capacity(args).await,
        BenchCommand::Overhead(args) => overhead(args).await,
        BenchCommand::Run(args) => open_loop(args).await,
        BenchCommand::Scenario(args) => scenario(args).await,
        BenchCommand::SymbolOrder(args) => symbol_order(args).await,
    }
}

async fn symbol_order(args: SymbolOrderArgs) -> Result<(), BenchError> {
    if !crate::overhead::on_path("valgrind") {
        return Err(BenchError::NoValgrind);
    }
    if args.requests == 0 {
        return Err(BenchError::Zero("requests"));
    }
    let plan = crate::overhead::LayoutPlan {
        exe: std::env::current_exe().map_err(BenchError::Exe)?,
        out: args.out,
        requests: args.requests,
        idle: seconds("idle-secs", args.idle_secs)?,
    };
    let functions = crate::overhead::symbol_order(&plan).await?;
    println!("{functions} functions written to {}", plan.out.display());
    Ok(())
}

fn segment(spec: &str, ramp: bool) -> Result<Segment, BenchError> {
    let parts: Vec<f64> = spec
        .split(':')
        .map(|p| p.trim().parse::<f64>())
        .collect::<Result<_, _>>()
        .map_err(|_| BenchError::Segment(spec.to_string()))?;
    let at =
        |x: f64| Duration::try_from_secs_f64(x).map_err(|_| BenchError::Segment(spec.to_string()));
    match (ramp, parts.as_slice()) {
        (false, [start, end, factor]) => Ok(Segment::Step {
            start: at(*start)?,
            end: at(*end)?,
            factor: *factor,
        }),
        (true, [start, end, from, to]) => Ok(Segment::Ramp {
            start: at(*start)?,
            end: at(*end)?,
            from: *from,
            to: *to,
        }),
        _ => Err(BenchError::Segment(spec.to_string())),
    }
}

async fn open_loop(args: RunArgs) -> Result<(), BenchError> {
    let rate = match (args.rate, args.clients) {
        (_, Some(0)) => return Err(BenchError::Zero("clients")),
        (_, Some(_)) => 1.0,
        (Some(rate), None) if rate > 0.0 && rate.is_finite() => rate,
        _ => return Err(BenchError::Rate),
    };
    let mut segments = Vec::new();
    for spec in &args.spikes {
        segments.push(segment(spec, false)?);
    }
    for spec in &args.ramps {
        segments.push(segment(spec, true)?);
    }
    let plan = RunPlan {
        adapters: None,
        url: format!("{}/v1/completions", args.url.trim_end_matches('/')),
        model: args.model.clone(),
        schedule: Schedule {
            base: rate,
            segments,
        },
        process: if args.burstiness == 1.0 {
            Process::Poisson
        } else {
            Process::Gamma {
                burstiness: args.burstiness,
            }
        },
        seed: args.seed,
        max_requests: args.max_requests,
        duration: seconds("duration-secs", args.duration_secs)?,
        mix: args.mix,
        tiers: crate::run::default_tiers(),
        tenants: args.tenants,
        tenant_keys: args.tenant_keys.clone(),
        client: args.client,
        patience: args.patience.patience()?,
        stream: !args.no_stream,
        closed_loop: args.clients,
        request_timeout: seconds("request-timeout-secs", args.request_timeout_secs)?,
        starts_at: None,
        api: crate::client::Api::Completions,
    };
    let (_, report) = crate::run::execute(&plan).await?;
    print_report(args.json, &report, || report.table());
    Ok(())
}

pub(crate) async fn overhead(args: OverheadArgs) -> Result<(), BenchError> {
    for (flag, counts) in [
        ("connections", args.connections.as_slice()),
        ("stream-connections", &[args.stream_connections]),
        ("engines", &[args.engines]),
    ] {
        if counts.is_empty() || counts.contains(&0) {
            return Err(BenchError::Zero(flag));
        }
    }
    if args.instructions
        && !(crate::overhead::on_path("valgrind") && crate::overhead::on_path("callgrind_control"))
    {
        return Err(BenchError::NoValgrind);
    }
    let exe = std::env::current_exe().map_err(BenchError::Exe)?;
    let custom = args
        .gateways
        .iter()
        .map(|g| Template::parse(g))
        .collect::<Result<Vec<_>, _>>()?;
    let plan = OverheadPlan {
        targets: resolve(&args.targets, &custom, &exe)?,
        connections: args.connections.clone(),
        stream_connections: args.stream_connections,
        stream_tokens: args.stream_tokens,
        warmup: seconds("warmup-secs", args.warmup_secs)?,
        window: seconds("window-secs", args.window_secs)?,
        gateway_core: args.gateway_core,
        load_core: args.load_core,
        engines: args.engines,
        shared_core: !args.no_shared_core,
        sluice_exe: exe,
        pinned: true,
        instruction_requests: args.instructions.then_some(args.instruction_requests),
    };
    // The load generator gets a single-threaded runtime of its own: it shares one core with
    // the engines, and work stealing there would only add cost.
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("overhead-load".into())
        .spawn(move || {
            let result = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(BenchError::Thread)
                .and_then(|rt| Ok(rt.block_on(crate::overhead::run(&plan))?));
            let _ = tx.send(result);
        })
        .map_err(BenchError::Thread)?;
    let report = rx.await.map_err(|_| BenchError::Lost)??;
    print_report(args.json, &report, || report.tables());
    Ok(())
}

/// JSON for machines (`--json`), else the Markdown tables.
pub(crate) fn print_report(
    json: bool,
    report: &impl serde::Serialize,
    tables: impl FnOnce() -> String,
) {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(report).unwrap_or_default()
        );
    } else {
        print!("{}", tables());
    }
}

/// The levels, windows and workload `sluice bench capacity` was asked for.
fn capacity_plan(args: &CapacityArgs, seed: u64) -> Result<CapacityPlan, BenchError> {
    Ok(CapacityPlan {
        levels: if args.levels.is_empty() {
            default_levels()
        } else {
            args.levels.clone()
        },
        warmup: seconds("warmup-secs", args.warmup_secs)?,
        window: seconds("window-secs", args.window_secs)?,
        workload: Workload {
            prompt_min: args.prompt_min,
            prompt_max: args.prompt_max,
            output_median: args.output_median,
            output_sigma: args.output_sigma,
            output_max: args.output_max,
        },
        seed,
    })
}

async fn capacity(args: CapacityArgs) -> Result<(), BenchError> {
    let engine = args.engine.config()?;
    let plan = capacity_plan(&args, engine.seed)?;
    let method = if args.http { "http" } else { "virtual" };
    let (report, late) = if args.http {
        let (report, levels) = run_http(&engine, &plan).await?;
        let late: Vec<(u64, u64)> = levels.iter().map(|l| (l.late_steps, l.steps)).collect();
        (report, Some(late))
    } else {
        (run_virtual(&engine, &plan), None)
    };
    if args.json {
        let mut json = serde_json::to_value(&report).unwrap_or_default();
        json["method"] = method.into();
        json["profile"] = engine.profile.name.into();
        json["time_scale"] = engine.time_scale.into();
        if let Some(late) = &late {
            json["late_steps"] = late.iter().map(|l| l.0).collect::<Vec<_>>().into();
        }
        println!("{json}");
        return Ok(());
    }
    println!(
        "capacity of one {} engine ({}, {} method{}), {}-{} token prompts, answers ~{} tokens\n",
        engine.flavor.owner(),
        engine.profile.name,
        method,
        if args.http {
            format!(", time scale {}", engine.time_scale)
        } else {
            String::new()
        },
        plan.workload.prompt_min,
        plan.workload.prompt_max,
        plan.workload.output_median
    );
    print!("{}", report.table());
    if let Some(late) = late {
        warn_late_steps(&plan.levels, &late);
    }
    Ok(())
}

/// Levels where more than one engine step in 20 started late: the host, not the modelled GPU,
/// limited them.
fn warn_late_steps(levels: &[u32], late: &[(u64, u64)]) {
    for (level, &(late_steps, steps)) in levels.iter().zip(late) {
        if steps > 0 && late_steps * 20 > steps {
            println!(
                "warning: at concurrency {level}, {late_steps} of {steps} engine steps started late: \
                 the host CPU, not the modelled GPU, limited that level (lower --time-scale)"
            );
        }
    }
}
