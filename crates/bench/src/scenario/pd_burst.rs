//! `sluice bench scenario pd-burst`: a burst wider than the decode engines' running windows,
//! through a disaggregated fleet (seed 000's decode admission window).
//!
//! Two SGLang prefill engines and two decode engines (`sluice sim --pd-role`, each side one
//! process with its control listener), freshly started for every configuration. The burst is
//! four decode windows' worth of requests at once. Without a window at the gateway every request
//! is dispatched at once: the decode engines queue what their windows cannot hold, and the
//! prefill engines' bootstrap deadlines, running since each request landed, expire for those
//! waiting longest. With the window (sluice's default) the gateway holds them instead, and a
//! request's deadline starts only when it is dispatched with room to run.
//!
//! With `long_context` (`sluice bench scenario long-context --disaggregated`) one request in
//! twenty is a 32k-128k-token prompt, and the engines have their whole KV cache: the prefill
//! engines compute those for seconds while the decode engines wait for their KV, which both
//! engines report as waiting (SGLang's transfer queue) but which is not overload.
//!
//! The deadline is scaled down with the burst (`BOOTSTRAP_SECS` engine seconds, not SGLang's 300
//! or TokenSpeed's 120), so that eight windows' worth far outlasts it: what matters is the
//! burst's length against the deadline, not either alone.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use tokio::time::Instant;

use super::{ScenarioError, MODEL};
use crate::client::{self, Api, HttpClient, Job};
use crate::goodput::Outcome;
use crate::overhead::{free_ports, loopback, on_path, OverheadError};
use crate::procs::{Launch, Proc};
use crate::prompts::{Part, Prompt, Role};
use crate::stats::percentile;

/// Prefill and decode engines.
const ENGINES: usize = 2;
/// Each decode engine's running window (`--max-num-seqs`).
const WINDOW: usize = 8;
/// The burst: eight windows' worth of the whole decode side.
const BURST: usize = 8 * ENGINES * WINDOW;
const PROMPT_TOKENS: u32 = 1024;
const OUTPUT_TOKENS: u32 = 256;
/// The prefill engines' bootstrap deadline, in engine seconds.
const BOOTSTRAP_SECS: f64 = 4.0;
/// How long a process may take to serve.
const STARTUP: Duration = Duration::from_secs(60);

/// What to run.
#[derive(Debug, Clone)]
pub struct PdBurstPlan {
    pub sluice_exe: PathBuf,
    pub out_dir: PathBuf,
    pub time_scale: f64,
    pub seed: u64,
    /// Configurations by name (empty: every one that can run here).
    pub configs: Vec<String>,
    /// One prompt in twenty of 32k-128k tokens, on engines with their whole KV cache.
    pub long_context: bool,
}

/// The long-context burst's share of long prompts and their lengths (as the long-context mix).
const LONG_EVERY: u64 = 20;
const LONG_TOKENS: std::ops::RangeInclusive<u32> = 32_768..=130_000;

/// One configuration's burst.
#[derive(Debug, Clone, Serialize)]
pub struct PdBurstRow {
    pub config: String,
    pub requests: usize,
    pub completed: usize,
    /// Answered with an error (a failed KV transfer comes back as the decode engine's 500).
    pub failed: usize,
    /// Refused by the gateway (503: shed by the window).
    pub shed: usize,
    /// Prefill requests the engines failed at their bootstrap deadline.
    pub expired_bootstraps: u64,
    pub ttft_p50_secs: f64,
    pub ttft_p99_secs: f64,
    /// Completed requests per second, from the burst to its last answer.
    pub goodput_per_sec: f64,
    /// Share of the engines' steps that ran late (the machine, not the model, set their pace).
    pub late_steps: f64,
    /// Vetoes sluice logged over the burst (liveness, overload); `None` for SMG.
    pub vetoes: Option<(u64, u64)>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PdBurstReport {
    pub burst: usize,
    pub decode_window: usize,
    pub bootstrap_secs: f64,
    pub time_scale: f64,
    pub long_context: bool,
    pub rows: Vec<PdBurstRow>,
}

impl PdBurstReport {
    pub fn table(&self) -> String {
        let prompts = if self.long_context {
            format!("{PROMPT_TOKENS} prompt tokens, one in {LONG_EVERY} 32k-128k")
        } else {
            format!("{PROMPT_TOKENS} prompt")
        };
        let mut out = format!(
            "pd-burst: {} requests at once ({}, {} output tokens) on {ENGINES} prefill and \
             {ENGINES} decode engines (window {} each), bootstrap deadline {} engine s, time \
             scale {}; TTFT in wall seconds\n\n",
            self.burst,
            prompts,
            OUTPUT_TOKENS,
            self.decode_window,
            self.bootstrap_secs,
            self.time_scale
        );
        out += "| config | completed | failed | shed | expired bootstraps | TTFT p50 | TTFT p99 | goodput/s | vetoes: liveness, overload | late steps |\n";
        out += "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
        for r in &self.rows {
            out += &format!(
                "| {} | {}/{} | {} | {} | {} | {:.2} | {:.2} | {:.1} | {} | {:.1}% |\n",
                r.config,
                r.completed,
                r.requests,
                r.failed,
                r.shed,
                r.expired_bootstraps,
                r.ttft_p50_secs,
                r.ttft_p99_secs,
                r.goodput_per_sec,
                r.vetoes
                    .map_or("–".to_string(), |(l, o)| format!("{l}, {o}")),
                100.0 * r.late_steps
            );
        }
        out
    }
}

/// The configurations: sluice with its window, without it, and SMG in PD mode when installed.
fn configs(plan: &PdBurstPlan) -> Vec<&'static str> {
    let mut all = vec!["sluice", "sluice-no-window"];
    if on_path("smg") {
        all.push("smg");
    }
    all.retain(|c| plan.configs.is_empty() || plan.configs.iter().any(|w| w == c));
    all
}

pub async fn pd_burst(plan: &PdBurstPlan) -> Result<PdBurstReport, ScenarioError> {
    let mut rows = Vec::new();
    for config in configs(plan) {
        rows.push(run_one(plan, config).await?);
    }
    Ok(PdBurstReport {
        burst: BURST,
        decode_window: WINDOW,
        bootstrap_secs: BOOTSTRAP_SECS,
        time_scale: plan.time_scale,
        long_context: plan.long_context,
        rows,
    })
}

/// Where one configuration's processes listen.
struct Ports {
    prefill: u16,
    bootstrap: u16,
    decode: u16,
    prefill_control: u16,
    decode_control: u16,
    gateway: u16,
}

impl Ports {
    fn pick() -> Result<Self, OverheadError> {
        let base = free_ports(9)?;
        Ok(Self {
            prefill: base,
            bootstrap: base + 2,
            decode: base + 4,
            prefill_control: base + 6,
            decode_control: base + 7,
            gateway: base + 8,
        })
    }

    fn prefills(&self) -> Vec<(String, u16)> {
        (0..ENGINES as u16)
            .map(|i| {
                let url = format!("http://{}", loopback(self.prefill + i));
                (url, self.bootstrap + i)
            })
            .collect()
    }

    fn decodes(&self) -> Vec<String> {
        (0..ENGINES as u16)
            .map(|i| format!("http://{}", loopback(self.decode + i)))
            .collect()
    }
}

/// One side's `sluice sim` command line: `ENGINES` SGLang engines of `role`.
fn sim_argv(plan: &PdBurstPlan, role: &str, port: u16, control: u16) -> Vec<String> {
    [
        plan.sluice_exe.display().to_string(),
        "sim".into(),
        "--flavor".into(),
        "sglang".into(),
        "--model".into(),
        MODEL.into(),
        "--pd-role".into(),
        role.into(),
        "--engines".into(),
        ENGINES.to_string(),
        "--port".into(),
        port.to_string(),
        "--control-port".into(),
        control.to_string(),
        "--time-scale".into(),
        plan.time_scale.to_string(),
        "--seed".into(),
        plan.seed.to_string(),
    ]
    .into_iter()
    .chain(
        // A smaller GPU, unless long prompts need the whole cache.
        (!plan.long_context)
            .then(|| ["--num-gpu-blocks".to_string(), "4096".into()])
            .into_iter()
            .flatten(),
    )
    .collect()
}

/// Both sides' engines for `config`, serving.
async fn start_engines(
    plan: &PdBurstPlan,
    config: &str,
    ports: &Ports,
    http: &HttpClient,
) -> Result<(Proc, Proc), ScenarioError> {
    let sim = |name: &str, role: &str, port: u16, control: u16, extra: &[String]| {
        let mut argv = sim_argv(plan, role, port, control);
        argv.extend(extra.iter().cloned());
        Proc::spawn(Launch {
            name: &format!("{config}-{name}"),
            argv: &argv,
            core: None,
            log_dir: &plan.out_dir,
        })
    };
    let prefill_args = [
        "--disaggregation-bootstrap-port".to_string(),
        ports.bootstrap.to_string(),
        "--pd-bootstrap-timeout-secs".into(),
        BOOTSTRAP_SECS.to_string(),
        "--max-num-seqs".into(),
        "64".into(),
    ];
    let decode_args = ["--max-num-seqs".to_string(), WINDOW.to_string()];
    let mut prefill = sim(
        "prefill",
        "prefill",
        ports.prefill,
        ports.prefill_control,
        &prefill_args,
    )?;
    let mut decode = sim(
        "decode",
        "decode",
        ports.decode,
        ports.decode_control,
        &decode_args,
    )?;
    for i in 0..ENGINES as u16 {
        until_ok(
            http,
            &mut prefill,
            loopback(ports.prefill + i),
            "/v1/models",
        )
        .await?;
        until_ok(http, &mut decode, loopback(ports.decode + i), "/v1/models").await?;
    }
    Ok((prefill, decode))
}

async fn run_one(plan: &PdBurstPlan, config: &str) -> Result<PdBurstRow, ScenarioError> {
    let ports = Ports::pick()?;
    let http: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let (prefill, decode) = start_engines(plan, config, &ports, &http).await?;
    let mut gateway = Proc::spawn(Launch {
        name: config,
        argv: &gateway_argv(plan, config, &ports),
        core: None,
        log_dir: &plan.out_dir,
    })?;
    let at = loopback(ports.gateway);
    until_ok(&http, &mut gateway, at, "/readiness").await?;
    if config.starts_with("sluice") {
        until_windows_known(&http, &mut gateway, at).await?;
    }
    let before = engine_totals(&http, &ports).await?;
    let (outcomes, makespan) = burst(&http, at, plan.seed, plan.long_context).await;
    let after = engine_totals(&http, &ports).await?;
    let log = gateway.log().to_path_buf();
    gateway.stop(Duration::from_secs(5)).await;
    let vetoes = config
        .starts_with("sluice")
        .then(|| std::fs::read_to_string(&log).ok())
        .flatten()
        .map(|log| {
            let count = |line: &str| log.matches(line).count() as u64;
            (
                count("worker vetoed by liveness"),
                count("worker vetoed: overloaded"),
            )
        });
    prefill.stop(Duration::from_secs(5)).await;
    decode.stop(Duration::from_secs(5)).await;

    let completed: Vec<&Outcome> = outcomes.iter().filter(|o| o.completed).collect();
    let ttfts: Vec<f64> = completed
        .iter()
        .filter_map(|o| o.ttft.map(|t| t.as_secs_f64()))
        .collect();
    let steps = after.steps.saturating_sub(before.steps).max(1);
    Ok(PdBurstRow {
        config: config.to_string(),
        requests: outcomes.len(),
        completed: completed.len(),
        failed: outcomes
            .iter()
            .filter(|o| !o.completed && o.status != 503)
            .count(),
        shed: outcomes.iter().filter(|o| o.status == 503).count(),
        expired_bootstraps: after.expired.saturating_sub(before.expired),
        ttft_p50_secs: percentile(&ttfts, 0.5),
        ttft_p99_secs: percentile(&ttfts, 0.99),
        goodput_per_sec: completed.len() as f64 / makespan.as_secs_f64().max(1e-9),
        late_steps: after.late.saturating_sub(before.late) as f64 / steps as f64,
        vetoes,
    })
}

fn gateway_argv(plan: &PdBurstPlan, config: &str, ports: &Ports) -> Vec<String> {
    let mut argv: Vec<String> = match config {
        "smg" => vec!["smg".into(), "launch".into()],
        _ => vec![plan.sluice_exe.display().to_string(), "serve".into()],
    };
    argv.extend([
        "--host".into(),
        "127.0.0.1".into(),
        "--port".into(),
        ports.gateway.to_string(),
        "--pd-disaggregation".into(),
        "--policy".into(),
        "round_robin".into(),
    ]);
    for (url, bootstrap) in ports.prefills() {
        argv.extend(["--prefill".into(), url, bootstrap.to_string()]);
    }
    for url in ports.decodes() {
        argv.extend(["--decode".into(), url]);
    }
    if config == "sluice-no-window" {
        argv.push("--disable-pd-admission-window".into());
    }
    if config.starts_with("sluice") {
        // The window is read from the engines' reports: poll them often.
        argv.extend(["--load-monitor-interval".into(), "1".into()]);
    }
    argv
}

/// The length of the burst's `i`th prompt: one in `LONG_EVERY` long, when asked for.
fn prompt_tokens(i: u64, seed: u64, long_context: bool) -> u32 {
    if !long_context || i % LONG_EVERY != LONG_EVERY - 1 {
        return PROMPT_TOKENS;
    }
    let span = u64::from(LONG_TOKENS.end() - LONG_TOKENS.start()) + 1;
    let draw = (seed ^ i).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 11;
    LONG_TOKENS.start() + (draw % span) as u32
}

/// The whole burst at once; the outcomes and the time to the last answer.
async fn burst(
    http: &HttpClient,
    at: SocketAddr,
    seed: u64,
    long_context: bool,
) -> (Vec<Outcome>, Duration) {
    let url = format!("http://{at}/v1/completions");
    let start = Instant::now();
    let jobs = (0..BURST as u64).map(|i| {
        let tokens = prompt_tokens(i, seed, long_context);
        Job {
            model: None,
            due: Duration::ZERO,
            tier: 0,
            prompt_tokens: tokens,
            output_tokens: OUTPUT_TOKENS,
            prompt: Prompt {
                parts: vec![Part {
                    role: Role::User,
                    seed: seed ^ (i << 20),
                    tokens,
                }],
                conversation: i,
            },
            tenant: 0,
            priority: 0,
            headers: Vec::new(),
        }
    });
    let tasks: Vec<_> = jobs
        .map(|job| {
            let (http, url) = (http.clone(), url.clone());
            tokio::spawn(async move {
                client::run(
                    &http,
                    &url,
                    (Api::Completions, MODEL),
                    &job,
                    client::Behaviour::default(),
                    start,
                )
                .await
            })
        })
        .collect();
    let mut outcomes = Vec::with_capacity(BURST);
    for task in tasks {
        if let Ok(outcome) = task.await {
            outcomes.push(outcome);
        }
    }
    (outcomes, start.elapsed())
}

/// Sums over both sides' engines.
#[derive(Debug, Default, Clone, Copy)]
struct Totals {
    expired: u64,
    steps: u64,
    late: u64,
}

async fn engine_totals(http: &HttpClient, ports: &Ports) -> Result<Totals, ScenarioError> {
    let mut totals = Totals::default();
    for control in [ports.prefill_control, ports.decode_control] {
        for i in 0..ENGINES {
            let url = format!("http://{}/engines/{i}/state", loopback(control));
            let state = get_json(http, &url).await?;
            let read = |field: &str| state[field].as_u64().unwrap_or(0);
            totals.expired += read("bootstrap_timeouts");
            totals.steps += read("steps");
            totals.late += read("late_steps");
        }
    }
    Ok(totals)
}

async fn get_json(http: &HttpClient, url: &str) -> Result<serde_json::Value, ScenarioError> {
    let request = hyper::Request::get(url)
        .body(Full::new(Bytes::new()))
        .map_err(|_| ScenarioError::Url(url.to_string()))?;
    let response = http
        .request(request)
        .await
        .map_err(ScenarioError::Control)?;
    let body = response
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    Ok(serde_json::from_slice(&body).unwrap_or_default())
}

/// Polls `path` on `addr` until it answers 200, the process exits, or the startup time runs out
/// (a harness wait for a process to start, not a measurement).
async fn until_ok(
    http: &HttpClient,
    proc: &mut Proc,
    addr: SocketAddr,
    path: &str,
) -> Result<(), ScenarioError> {
    let give_up = Instant::now() + STARTUP;
    let url = format!("http://{addr}{path}");
    loop {
        let request = hyper::Request::get(&url).body(Full::new(Bytes::new()));
        if let Ok(request) = request {
            if let Ok(Ok(response)) =
                tokio::time::timeout(Duration::from_secs(2), http.request(request)).await
            {
                if response.status().is_success() {
                    return Ok(());
                }
            }
        }
        not_yet(proc, give_up)?;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until sluice's `/workers` shows both decode workers' windows (from their reports).
async fn until_windows_known(
    http: &HttpClient,
    proc: &mut Proc,
    addr: SocketAddr,
) -> Result<(), ScenarioError> {
    let give_up = Instant::now() + STARTUP;
    let url = format!("http://{addr}/workers");
    loop {
        let view = get_json(http, &url).await?;
        let known = view["workers"].as_array().is_some_and(|ws| {
            ws.iter()
                .filter(|w| w["role"] == "decode")
                .filter(|w| w["decode_window"]["size"].as_u64() == Some(WINDOW as u64))
                .count()
                == ENGINES
        });
        if known {
            return Ok(());
        }
        not_yet(proc, give_up)?;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn not_yet(proc: &mut Proc, give_up: Instant) -> Result<(), ScenarioError> {
    if proc.exited() {
        return Err(OverheadError::Exited {
            name: proc.name().into(),
            log: proc.log().into(),
        }
        .into());
    }
    if Instant::now() >= give_up {
        return Err(OverheadError::NotReady {
            name: proc.name().into(),
            secs: STARTUP.as_secs(),
            log: proc.log().into(),
        }
        .into());
    }
    Ok(())
}
