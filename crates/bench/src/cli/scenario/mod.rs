//! `sluice bench scenario <name>`.
//!
//! ## Layout
//!
//! - `plan` — the plan a scenario runs from: its fleet, loads and configurations.

use std::path::PathBuf;

use clap::Args;

use super::{overhead, print_report, seconds, BenchError, OverheadArgs};
use crate::overhead::Template;
use plan::plan;

mod plan;

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum ScenarioName {
    /// Capacity C from `direct`, then every configuration at 0.25x .. 4x C: goodput curves.
    OverloadSweep,
    /// 1x .. 4x C with 20% interactive, 30% agent and 50% batch requests, each naming its tier:
    /// per-tier attainment for sluice with admission (tiers, the gateway queue, shedding),
    /// sluice-shed (no tiers) and direct.
    TieredOverload,
    /// Two tenants of equal weight: A offers ten times its share of C, B half of its own; per
    /// tenant attainment for sluice with tenants (sluice-tenants), sluice-shed and direct.
    NoisyTenant,
    /// A reasoning 70B model and an 8B beside it, chats for the 70B at 1x .. 4x C in three
    /// tiers: the degradation ladder on (sluice-ladder) against off (sluice-tiers), direct, SMG.
    Degradation,
    /// One trace (--mix, shared prefixes by default) through every routing policy at 0.8x and
    /// 1.2x C, each point from cold caches on 4 engines: sluice's round_robin, least_load,
    /// power_of_two, consistent_hash (on x-session-id) and cache_aware, SMG's round_robin and
    /// cache_aware; prefix hit rate per engine, TTFT, goodput, evenness.
    Routing,
    /// 32 LoRA adapters (Zipf) over 4 engines with --max-loras 4, at 0.8x and 1.5x C, with fast
    /// and slow adapter loads: round_robin, least_load, power_of_two and cache_aware routing by
    /// adapter, least_load and power_of_two blind to adapters (-blind), SMG's round_robin and
    /// cache_aware; goodput, TTFT, adapter loads and slot waits per engine.
    Lora,
    /// 0.6x C, tripled for a while: refusals, goodput over time, recovery.
    Spike,
    /// 0.5x C on 3 engines; one is killed with SIGKILL and started again later.
    WorkerCrash,
    /// 0.5x C on 3 engines; one engine's scheduler freezes while its HTTP side answers.
    FrozenEngine,
    /// 0.5x C on 3 engines; one engine's steps take 4x longer for a while.
    SlowWorker,
    /// 0.5x C on 3 engines of the full KV cache (--engine-args "--flavor sglang" for SGLang's
    /// wire), one request in twenty a 32k-128k-token prompt: no healthy engine taken out,
    /// goodput against direct's.
    LongContext,
    /// A burst eight decode windows wide through 2 prefill and 2 decode engines (SGLang's
    /// bootstrap protocol): sluice with its decode admission window, without it
    /// (sluice-no-window), and SMG in PD mode; expired bootstraps, TTFT, goodput.
    PdBurst,
    /// Each way an engine fails (wedged vLLM and SGLang, a hung API process, a crash, a slow
    /// engine, a long prefill) x clients as they behave (streaming or not; SDK timeouts of 1, 3
    /// and 30 s, none, a 2000-ms deadline; 1 client and 16) x gateways (sluice, envoy-epp, smg,
    /// direct), 2 engines at full speed: when the faulty engine was vetoed, what it still got,
    /// what failed, when it came back. --quick runs one client kind (16 streaming SDK clients,
    /// 3 s) per failure.
    Liveness,
    /// `sluice bench overhead` (instant engines, the gateway pinned to one core); --configs
    /// names its targets (direct, nginx, sluice, sluice-cache-aware, smg).
    Overhead,
    /// --streams slow streams (a token a second each) held open through one gateway speaking
    /// HTTP/2 to the engines (sluice-http2) and HTTP/1.1 (sluice-http1, as many as its
    /// open-file limit leaves room for), and as many idle keep-alive connections: the
    /// gateway's memory per stream and per connection, failures, CPU per event.
    ManyStreams,
}

impl ScenarioName {
    fn incident(self) -> Option<crate::scenario::Incident> {
        use crate::scenario::Incident;
        match self {
            ScenarioName::Spike => Some(Incident::Spike),
            ScenarioName::WorkerCrash => Some(Incident::WorkerCrash),
            ScenarioName::FrozenEngine => Some(Incident::FrozenEngine),
            ScenarioName::SlowWorker => Some(Incident::SlowWorker),
            ScenarioName::LongContext => Some(Incident::LongContext),
            ScenarioName::OverloadSweep
            | ScenarioName::TieredOverload
            | ScenarioName::NoisyTenant
            | ScenarioName::Degradation
            | ScenarioName::Routing
            | ScenarioName::Lora
            | ScenarioName::PdBurst
            | ScenarioName::Liveness
            | ScenarioName::Overhead
            | ScenarioName::ManyStreams => None,
        }
    }
}

#[derive(Args)]
pub struct ScenarioArgs {
    #[arg(value_enum)]
    pub name: ScenarioName,
    /// A reduced run, under 2 minutes here: fewer load levels (1x, 2x, 3x C), shorter windows
    /// and phases, and C reused from an earlier run in --out.
    #[arg(long)]
    pub quick: bool,
    /// Engine clock speed-up of the simulated engines.
    #[arg(long, default_value_t = 4.0)]
    pub time_scale: f64,
    /// Engine seconds measured per point [default: 120, or 20 with --quick].
    #[arg(long)]
    pub window_secs: Option<f64>,
    /// Configurations to measure: direct, sluice, sluice-shed, smg, the scenario's own
    /// (incidents: direct-unreachable, the naive fleet that still leaves out a worker it cannot
    /// reach; tiered-overload: sluice-tiers, smg-priority; noisy-tenant: sluice-tenants and
    /// sluice-tenants-q<N> (--queue-size);
    /// slow-worker: sluice-adaptive, sluice-rr, sluice-rr-adaptive; spike: sluice-queue,
    /// sluice-codel, sluice-adaptive, sluice-adaptive-slo, and as long-context:
    /// sluice-least-load, sluice-power-of-two, sluice-predicted (sluice is cache_aware);
    /// tiered-overload: sluice-tiers-least-load, sluice-tiers-power-of-two,
    /// sluice-tiers-predicted; routing: direct and only its own, sluice-round-robin,
    /// sluice-least-load, sluice-power-of-two, sluice-consistent-hash, sluice-cache-aware,
    /// sluice-cache-aware-precise, sluice-predicted, smg-round-robin, smg-cache-aware; lora: the routing names and
    /// sluice-least-load-blind, sluice-power-of-two-blind; many-streams: sluice-http2,
    /// sluice-http1, envoy), or names from --gateway [default:
    /// all that can run here; direct always runs first, it sets C].
    #[arg(long, value_delimiter = ',')]
    pub configs: Vec<String>,
    /// Another gateway, `NAME=COMMAND` with `{port}` and `{workers}`. Repeatable.
    #[arg(long = "gateway", value_name = "NAME=COMMAND")]
    pub gateways: Vec<String>,
    /// Simulated engines [default: 2 for overload-sweep, tiered-overload, noisy-tenant and
    /// degradation, 4 for routing and many-streams, 3 for the incident scenarios].
    #[arg(long)]
    pub engines: Option<usize>,
    /// Requests per engine-second one engine serves within objectives, instead of measuring it
    /// (an incident scenario, or a quick sweep, otherwise reuses the figure of an earlier run
    /// with the same engines, mix, scale and seed, kept in --out, or searches for it).
    #[arg(long)]
    pub capacity: Option<f64>,
    /// Incident scenarios: wall seconds before, during and after the incident [default:
    /// 10:20:20, or 4:10:10 with --quick; liveness: 5:15:10].
    #[arg(long, value_name = "BEFORE:DURING:AFTER")]
    pub phases: Option<String>,
    /// How the client reacts to refusals.
    #[arg(long, value_enum, default_value = "none")]
    pub client: crate::client::ClientKind,
    /// liveness: the failures to run [default: all].
    #[arg(long, value_enum, value_delimiter = ',')]
    pub failures: Vec<crate::scenario::Failure>,
    /// liveness: the client kinds to run, by the label the table prints (`stream sdk 3s x16`,
    /// `whole deadline 2000ms x1`, `stream patient x1`) [default: all 20, or `stream sdk 3s x16`
    /// with --quick].
    #[arg(long, value_delimiter = ',')]
    pub client_kinds: Vec<String>,
    /// noisy-tenant: gateway queue sizes to measure sluice with tenants at, each a configuration
    /// (sluice-tenants at 1024, sluice-tenants-q<N> at N) [default: 1024,64].
    #[arg(long, value_delimiter = ',')]
    pub queue_size: Vec<usize>,
    /// Request lengths and what the prompts share [default: chat; shared for routing].
    #[arg(long, value_enum)]
    pub mix: Option<crate::run::Mix>,
    /// Seed of the arrivals, the request shapes and the engines (a run's load is reproducible
    /// from it).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Extra flags for every simulated engine [default: `--max-num-seqs 64 --num-gpu-blocks
    /// 2048`, a smaller GPU with fewer tokens per second for this machine to relay; for
    /// long-context `--max-num-seqs 64`, the whole KV cache, which a 128k prompt needs].
    #[arg(long, allow_hyphen_values = true)]
    pub engine_args: Option<String>,
    /// many-streams: streams held open at once [default: 10000, or 1000 with --quick].
    #[arg(long)]
    pub streams: Option<usize>,
    /// many-streams: tokens per stream, a second each [default: the seconds it takes to open
    /// them all, plus 20].
    #[arg(long)]
    pub stream_tokens: Option<u32>,
    /// many-streams: streams opened per second.
    #[arg(long, default_value_t = 500.0)]
    pub stream_rate: f64,
    /// long-context: through a disaggregated fleet instead (pd-burst's: 2 SGLang prefill and 2
    /// decode engines with their whole KV cache), one prompt in twenty of 32k-128k tokens.
    #[arg(long)]
    pub disaggregated: bool,
    /// The engines serve SMG's gRPC protocol (`sluice sim --grpc --flavor sglang`) and every
    /// gateway reaches them as `grpc://` workers, fetching the model's tokenizer from them.
    #[arg(long)]
    pub grpc: bool,
    /// routing, long-context, tiered-overload and spike: the loads to measure at, as multiples
    /// of C, instead of the scenario's own (spike: its peak, the base load a third of it), e.g.
    /// `0.8,1.5,3`. Each load of an incident scenario is a run of its own.
    #[arg(long, value_delimiter = ',')]
    pub load: Vec<f64>,
    /// Where the plot and the processes' logs go.
    #[arg(long, default_value = "sluice-bench-out")]
    pub out: PathBuf,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

pub(super) async fn scenario(args: ScenarioArgs) -> Result<(), BenchError> {
    let long_context_pd = matches!(args.name, ScenarioName::LongContext) && args.disaggregated;
    match args.name {
        ScenarioName::Overhead => overhead_scenario(args).await,
        ScenarioName::ManyStreams => many_streams(&args).await,
        ScenarioName::Liveness => liveness(&args).await,
        ScenarioName::PdBurst => pd_burst(&args, false).await,
        _ if long_context_pd => pd_burst(&args, true).await,
        _ => planned(&args).await,
    }
}

/// `overhead` as a scenario: the overhead benchmark at its usual rows, shorter with `--quick`.
async fn overhead_scenario(args: ScenarioArgs) -> Result<(), BenchError> {
    overhead(OverheadArgs {
        targets: args.configs,
        gateways: args.gateways,
        connections: vec![1, 64],
        stream_connections: 64,
        stream_tokens: 1000,
        warmup_secs: if args.quick { 1.0 } else { 2.0 },
        window_secs: if args.quick { 3.0 } else { 10.0 },
        gateway_core: 0,
        load_core: 1,
        engines: 2,
        no_shared_core: false,
        instructions: false,
        instruction_requests: 3200,
        json: args.json,
    })
    .await
}

/// `pd-burst`, or `long-context --disaggregated`: prefill/decode pairs under a burst.
async fn pd_burst(args: &ScenarioArgs, long_context: bool) -> Result<(), BenchError> {
    std::fs::create_dir_all(&args.out).map_err(|e| BenchError::OutDir(args.out.clone(), e))?;
    let exe = std::env::current_exe().map_err(BenchError::Exe)?;
    let report = crate::scenario::pd_burst(&crate::scenario::PdBurstPlan {
        sluice_exe: exe,
        out_dir: args.out.clone(),
        time_scale: args.time_scale,
        seed: args.seed,
        configs: args.configs.clone(),
        long_context,
    })
    .await?;
    print_report(args.json, &report, || report.table());
    Ok(())
}

/// The scenarios run from one plan of fleet, configs and load.
async fn planned(args: &ScenarioArgs) -> Result<(), BenchError> {
    let plan = plan(args)?;
    std::fs::create_dir_all(&args.out).map_err(|e| BenchError::OutDir(args.out.clone(), e))?;
    let plot = |svg: &Option<PathBuf>| {
        svg.as_ref()
            .map(|svg| format!("\nplot: {}\n", svg.display()))
            .unwrap_or_default()
    };
    if let Some(incident) = args.name.incident() {
        let timing = match &args.phases {
            Some(spec) => phases(spec)?,
            None => crate::scenario::Timing::new(args.quick),
        };
        let capacity = crate::scenario::fleet_capacity(&plan).await?;
        for base in incident.base_loads(plan.loads.as_deref()) {
            let report = crate::scenario::timeline(&plan, incident, capacity, timing, base).await?;
            print_report(args.json, &report, || report.table() + &plot(&report.svg));
        }
    } else if let ScenarioName::TieredOverload = args.name {
        let report = crate::scenario::tiered_overload(&plan).await?;
        print_report(args.json, &report, || report.table());
    } else if let ScenarioName::NoisyTenant = args.name {
        let report = crate::scenario::noisy_tenant(&plan).await?;
        print_report(args.json, &report, || report.table());
    } else if let ScenarioName::Degradation = args.name {
        let report = crate::scenario::degradation(&plan).await?;
        print_report(args.json, &report, || report.table());
    } else if let ScenarioName::Routing = args.name {
        let report = crate::scenario::routing(&plan).await?;
        print_report(args.json, &report, || report.table() + &plot(&report.svg));
    } else if let ScenarioName::Lora = args.name {
        let report = crate::scenario::lora(&plan).await?;
        print_report(args.json, &report, || report.table());
    } else {
        let report = crate::scenario::overload_sweep(&plan).await?;
        print_report(args.json, &report, || report.table() + &plot(&report.svg));
    }
    Ok(())
}

async fn many_streams(args: &ScenarioArgs) -> Result<(), BenchError> {
    std::fs::create_dir_all(&args.out).map_err(|e| BenchError::OutDir(args.out.clone(), e))?;
    let streams = args
        .streams
        .unwrap_or(if args.quick { 1000 } else { 10_000 });
    if streams == 0 {
        return Err(BenchError::Zero("streams"));
    }
    if !(args.stream_rate > 0.0 && args.stream_rate.is_finite()) {
        return Err(BenchError::Positive("stream-rate"));
    }
    let opening = (streams as f64 / args.stream_rate).ceil() as u32;
    let envoy = envoy_for(args.configs.iter().any(|c| c == "envoy"))?;
    let report = crate::scenario::many_streams(&crate::scenario::ManyStreamsPlan {
        sluice_exe: std::env::current_exe().map_err(BenchError::Exe)?,
        out_dir: args.out.clone(),
        streams,
        engines: args.engines.unwrap_or(4),
        tokens: args.stream_tokens.unwrap_or(opening + 20).max(1),
        rate: args.stream_rate,
        configs: args.configs.clone(),
        envoy,
    })
    .await?;
    print_report(args.json, &report, || report.table());
    Ok(())
}

async fn liveness(args: &ScenarioArgs) -> Result<(), BenchError> {
    use crate::scenario::{Failure, LivenessPlan, Timing};
    std::fs::create_dir_all(&args.out).map_err(|e| BenchError::OutDir(args.out.clone(), e))?;
    let exe = std::env::current_exe().map_err(BenchError::Exe)?;
    let envoy = envoy_for(args.configs.iter().any(|c| c == "envoy-epp"))?;
    let mut gateways = crate::scenario::liveness_configs(&exe, envoy);
    for g in &args.gateways {
        gateways.push(Template::parse(g)?);
    }
    if !args.configs.is_empty() {
        if let Some(unknown) = args
            .configs
            .iter()
            .find(|c| !gateways.iter().any(|t| &t.name == *c))
        {
            return Err(crate::overhead::TemplateError::Unknown(unknown.clone()).into());
        }
        gateways.retain(|t| args.configs.contains(&t.name));
    }
    let timing = match &args.phases {
        Some(spec) => phases(spec)?,
        None => Timing::phases_of(5.0, 15.0, 10.0).ok_or(BenchError::Phases("5:15:10".into()))?,
    };
    let report = crate::scenario::liveness(&LivenessPlan {
        sluice_exe: exe,
        out_dir: args.out.clone(),
        gateways,
        failures: if args.failures.is_empty() {
            Failure::ALL.to_vec()
        } else {
            args.failures.clone()
        },
        clients: client_kinds(args)?,
        timing,
        seed: args.seed,
    })
    .await?;
    print_report(args.json, &report, || report.table());
    Ok(())
}

/// The liveness scenario's client kinds: those named, else `--quick`'s one, else all.
fn client_kinds(args: &ScenarioArgs) -> Result<Vec<crate::scenario::Clients>, BenchError> {
    use crate::scenario::Clients;
    if args.client_kinds.is_empty() {
        return Ok(if args.quick {
            vec![Clients::quick()]
        } else {
            Clients::all()
        });
    }
    let all = Clients::all();
    args.client_kinds
        .iter()
        .map(|label| {
            all.iter()
                .find(|c| c.label() == label.trim())
                .copied()
                .ok_or_else(|| BenchError::ClientKind(label.clone()))
        })
        .collect()
}

/// The Envoy a scenario runs: the one installed, else, only when a configuration of it was asked
/// for by name, one installed now; none otherwise.
fn envoy_for(named: bool) -> Result<Option<std::path::PathBuf>, BenchError> {
    Ok(match crate::overhead::envoy::installed() {
        Some(envoy) => Some(envoy),
        None if named => {
            Some(crate::overhead::envoy::binary().map_err(crate::overhead::TemplateError::from)?)
        }
        None => None,
    })
}

fn phases(spec: &str) -> Result<crate::scenario::Timing, BenchError> {
    let bad = || BenchError::Phases(spec.to_string());
    let parts: Vec<f64> = spec
        .split(':')
        .map(|p| p.trim().parse::<f64>())
        .collect::<Result<_, _>>()
        .map_err(|_| bad())?;
    match parts.as_slice() {
        [before, during, after] => {
            crate::scenario::Timing::phases_of(*before, *during, *after).ok_or_else(bad)
        }
        _ => Err(bad()),
    }
}
