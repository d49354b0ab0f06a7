//! `sluice bench overhead`: what a gateway costs on the request path.
//!
//! Simulated engines with the `instant` profile answer at once, so everything measured beyond
//! going direct is the gateway's. The gateway is pinned to one core and the load generator and
//! engines to the other, so the gateway's core saturates first and its own CPU time (from `/proc`)
//! divided by the requests it served is its cost per request. Both cores' busy shares are
//! reported, so a reader can check which side set each figure, and every ratio against the
//! run's plain proxy (nginx, else Envoy) says whether the two cores were in the same regime
//! (`compare`).

mod compare;
pub mod envoy;
mod instructions;
mod layout;
pub(crate) mod load;
mod report;
mod row;
mod targets;

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

pub use instructions::Instructions;
pub use layout::{symbol_order, LayoutPlan};
pub use report::OverheadReport;
pub use row::{Layout, Load, Row};
pub use targets::{
    envoy_plain, on_path, resolve, sluice as sluice_template, sluice_epp as sluice_epp_template,
    smg as smg_template, Launcher, Target, Template, TemplateError,
};

use crate::procs::{self, CoreTimes, Launch, Proc, ProcError};
use load::{closed_loop, LoadError, Shot};

/// The model the simulated engines serve.
const MODEL: &str = "llama-3.1-8b";
/// How long a target may take to answer its first request.
const STARTUP_LIMIT: Duration = Duration::from_secs(60);
/// How long a target may take to exit after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// What to measure and how long.
#[derive(Clone, Debug)]
pub struct OverheadPlan {
    pub targets: Vec<Target>,
    /// Connection counts for small non-streaming requests.
    pub connections: Vec<usize>,
    pub stream_connections: usize,
    /// Tokens (SSE events) per streamed answer.
    pub stream_tokens: u32,
    pub warmup: Duration,
    pub window: Duration,
    pub gateway_core: usize,
    pub load_core: usize,
    pub engines: usize,
    /// Also measure one connection with the gateway on the load's core: no request then waits
    /// for an idle core to wake, so the added latency is the gateway's own path.
    pub shared_core: bool,
    /// The `sluice` binary, which also runs the simulated engines.
    pub sluice_exe: PathBuf,
    /// Whether processes are pinned to their cores (set by `run` once it has checked).
    pub pinned: bool,
    /// Also count each target's instructions under callgrind, over this many small requests
    /// (`instructions`).
    pub instruction_requests: Option<u64>,
}

impl OverheadPlan {
    fn pin(&self, core: usize) -> Option<usize> {
        self.pinned.then_some(core)
    }
}

/// Why the benchmark could not finish.
#[derive(Debug, thiserror::Error)]
pub enum OverheadError {
    #[error(transparent)]
    Proc(#[from] ProcError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("no free loopback port: {0}")]
    Port(std::io::Error),
    #[error("could not create {path}: {source}")]
    LogDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{name} exited before answering; its output is in {log}")]
    Exited { name: String, log: PathBuf },
    #[error("callgrind_control {flag} was refused by every process of {name}")]
    CallgrindControl { name: String, flag: String },
    #[error("no instruction count in callgrind's dump {path}")]
    CallgrindOutput { path: PathBuf },
    #[error("{failed} requests to {name} failed while its instructions were counted")]
    CountedFailures { name: String, failed: u64 },
    #[error("{name} did not answer within {secs} s; its output is in {log}")]
    NotReady {
        name: String,
        secs: u64,
        log: PathBuf,
    },
}

/// Runs every target in turn against one set of engines and returns the figures.
pub async fn run(plan: &OverheadPlan) -> Result<OverheadReport, OverheadError> {
    let log_dir =
        std::env::temp_dir().join(format!("sluice-bench-overhead-{}", std::process::id()));
    std::fs::create_dir_all(&log_dir).map_err(|source| OverheadError::LogDir {
        path: log_dir.clone(),
        source,
    })?;
    // Without the cores to pin to (or without taskset), run unpinned and say so in the report.
    let pinned = procs::can_pin(plan.gateway_core) && procs::pin_self(plan.load_core);
    let plan = &OverheadPlan {
        pinned,
        ..plan.clone()
    };
    let (engines, engine_addrs) = start_engines(plan, &log_dir).await?;
    let mut report = OverheadReport::new(plan, log_dir.clone());
    for target in &plan.targets {
        let measured = measure(plan, target, &engine_addrs, &log_dir).await;
        match measured {
            Ok(measured) => report.add(measured),
            Err(e) => {
                engines.stop(STOP_GRACE).await;
                return Err(e);
            }
        }
    }
    engines.stop(STOP_GRACE).await;
    report.compare_with_direct();
    Ok(report)
}

fn small_shot() -> Shot {
    hello_shot(MODEL)
}

/// A one-token chat for `model`.
fn hello_shot(model: &str) -> Shot {
    let body = format!(
        r#"{{"model":"{model}","messages":[{{"role":"user","content":"Say hello."}}],"max_tokens":1}}"#
    );
    Shot {
        path: "/v1/chat/completions",
        body: Bytes::from(body),
    }
}

fn stream_shot(tokens: u32) -> Shot {
    let body = format!(
        r#"{{"model":"{MODEL}","prompt":"hello","max_tokens":{tokens},"ignore_eos":true,"stream":true}}"#
    );
    Shot {
        path: "/v1/completions",
        body: Bytes::from(body),
    }
}

pub(crate) fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

/// Listening ports are looked for below the kernel's ephemeral range (32768 and up by default):
/// a run's hundreds of thousands of client connections leave their ports in TIME_WAIT for a
/// minute, and a port taken from that range (`bind` to port 0) can find none free — a spike run
/// failed so after two configurations.
const LISTEN_PORTS: std::ops::Range<u16> = 20_000..32_000;

/// A port nothing listens on now (and, for `span` > 1, the ports after it too).
pub(crate) fn free_ports(span: u16) -> Result<u16, OverheadError> {
    let mut last_error = std::io::Error::other("no free run of ports");
    let width = LISTEN_PORTS.end - LISTEN_PORTS.start - span.max(1);
    for _ in 0..256 {
        let base = LISTEN_PORTS.start + rand::random::<u16>() % width;
        let run: Result<Vec<_>, _> = (0..span.max(1))
            .map(|i| TcpListener::bind(loopback(base + i)))
            .collect();
        match run {
            Ok(_) => return Ok(base),
            Err(e) => last_error = e,
        }
    }
    Err(OverheadError::Port(last_error))
}

async fn start_engines(
    plan: &OverheadPlan,
    log_dir: &Path,
) -> Result<(Proc, Vec<SocketAddr>), OverheadError> {
    let core = plan.pin(plan.load_core);
    spawn_engines(&plan.sluice_exe, "instant", plan.engines, core, log_dir).await
}

/// `sluice sim` serving `engines` engines of `profile` on consecutive free ports, answering.
pub(crate) async fn spawn_engines(
    exe: &Path,
    profile: &str,
    engines: usize,
    core: Option<usize>,
    log_dir: &Path,
) -> Result<(Proc, Vec<SocketAddr>), OverheadError> {
    let engines = engines.max(1);
    let base = free_ports(engines as u16)?;
    let argv: Vec<String> = [
        exe.display().to_string(),
        "sim".into(),
        "--profile".into(),
        profile.into(),
        "--model".into(),
        MODEL.into(),
        "--engines".into(),
        engines.to_string(),
        "--port".into(),
        base.to_string(),
    ]
    .into();
    let mut sim = Proc::spawn(Launch {
        name: "engines",
        argv: &argv,
        core,
        log_dir,
    })?;
    let addrs: Vec<SocketAddr> = (0..engines as u16).map(|i| loopback(base + i)).collect();
    for addr in &addrs {
        wait_until_answering(&mut sim, *addr).await?;
    }
    Ok((sim, addrs))
}

/// Sends the small request until it is answered 200, or the process exits, or time runs out.
pub(crate) async fn wait_until_answering(
    proc: &mut Proc,
    addr: SocketAddr,
) -> Result<(), OverheadError> {
    wait_until_serving(proc, addr, MODEL).await
}

/// Waits until the process at `addr` answers a one-token chat for `model`.
pub(crate) async fn wait_until_serving(
    proc: &mut Proc,
    addr: SocketAddr,
    model: &str,
) -> Result<(), OverheadError> {
    wait_until_serving_within(proc, addr, model, STARTUP_LIMIT).await
}

/// `wait_until_serving`, giving up after `limit`.
async fn wait_until_serving_within(
    proc: &mut Proc,
    addr: SocketAddr,
    model: &str,
    limit: Duration,
) -> Result<(), OverheadError> {
    let shot = hello_shot(model);
    wait_for(proc, limit, || load::answers(addr, &shot)).await
}

/// Waits until something accepts connections at `addr` (a process with no OpenAI route to ask).
pub(crate) async fn wait_until_listening(
    proc: &mut Proc,
    addr: SocketAddr,
) -> Result<(), OverheadError> {
    let listening = || async move { tokio::net::TcpStream::connect(addr).await.is_ok() };
    wait_for(proc, STARTUP_LIMIT, listening).await
}

/// Polls `ready` until it holds, failing when `proc` exits or `limit` passes.
async fn wait_for<F: std::future::Future<Output = bool>>(
    proc: &mut Proc,
    limit: Duration,
    mut ready: impl FnMut() -> F,
) -> Result<(), OverheadError> {
    let give_up = Instant::now() + limit;
    loop {
        if ready().await {
            return Ok(());
        }
        if proc.exited() {
            return Err(OverheadError::Exited {
                name: proc.name().into(),
                log: proc.log().into(),
            });
        }
        if Instant::now() >= give_up {
            return Err(OverheadError::NotReady {
                name: proc.name().into(),
                secs: limit.as_secs(),
                log: proc.log().into(),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Everything measured on one target.
pub struct Measured {
    pub target: String,
    pub rows: Vec<Row>,
    pub rss_idle: Option<u64>,
    pub rss_peak: Option<u64>,
    pub instructions: Option<Instructions>,
}

/// A target that answers: the gateway process (none when direct) and where to send load.
struct Started {
    gateway: Option<Proc>,
    addrs: Vec<SocketAddr>,
}

impl Started {
    async fn stop(self) {
        if let Some(gateway) = self.gateway {
            gateway.stop(STOP_GRACE).await;
        }
    }
}

async fn start(
    target: &Target,
    core: Option<usize>,
    engines: &[SocketAddr],
    log_dir: &Path,
) -> Result<Started, OverheadError> {
    let port = free_ports(1)?;
    let command =
        target
            .command(port, engines, log_dir)
            .map_err(|source| OverheadError::LogDir {
                path: log_dir.into(),
                source,
            })?;
    let Some(argv) = command else {
        return Ok(Started {
            gateway: None,
            addrs: engines.to_vec(),
        });
    };
    let mut proc = Proc::spawn(Launch {
        name: target.name(),
        argv: &argv,
        core,
        log_dir,
    })?;
    wait_until_answering(&mut proc, loopback(port)).await?;
    Ok(Started {
        gateway: Some(proc),
        addrs: vec![loopback(port)],
    })
}

/// The gateway on its own core (throughput, CPU, memory, streaming), then, when asked, on the
/// load's core for the one-connection latency without cross-core wake-ups.
async fn measure(
    plan: &OverheadPlan,
    target: &Target,
    engines: &[SocketAddr],
    log_dir: &Path,
) -> Result<Measured, OverheadError> {
    let own = start(target, plan.pin(plan.gateway_core), engines, log_dir).await?;
    let layout = match own.gateway {
        None => Layout::Direct,
        Some(_) => Layout::OwnCore,
    };
    let rss_idle = own
        .gateway
        .as_ref()
        .map(Proc::rss)
        .transpose()?
        .map(|r| r.0);
    let window = Window {
        plan,
        target: target.name(),
        layout,
        started: &own,
    };
    let mut rows = Vec::new();
    let small = small_shot();
    for &connections in &plan.connections {
        rows.push(window.run(Load::Small, connections, &small).await?);
    }
    let stream = stream_shot(plan.stream_tokens);
    rows.push(
        window
            .run(Load::Stream, plan.stream_connections, &stream)
            .await?,
    );
    let rss_peak = own
        .gateway
        .as_ref()
        .map(Proc::rss)
        .transpose()?
        .map(|r| r.1);
    own.stop().await;
    if plan.shared_core && layout == Layout::OwnCore {
        let shared = start(target, plan.pin(plan.load_core), engines, log_dir).await?;
        let window = Window {
            plan,
            target: target.name(),
            layout: Layout::SharedCore,
            started: &shared,
        };
        rows.push(window.run(Load::Small, 1, &small).await?);
        shared.stop().await;
    }
    let instructions = instructions::count(plan, target, engines, log_dir, &small, &stream).await?;
    Ok(Measured {
        target: target.name().into(),
        rows,
        rss_idle,
        rss_peak,
        instructions,
    })
}

/// One measured window of one load on one target.
struct Window<'a> {
    plan: &'a OverheadPlan,
    target: &'a str,
    layout: Layout,
    started: &'a Started,
}

impl Window<'_> {
    async fn run(&self, load: Load, connections: usize, shot: &Shot) -> Result<Row, OverheadError> {
        let gateway = self.started.gateway.as_ref();
        let addrs = &self.started.addrs;
        closed_loop(addrs, connections, shot, self.plan.warmup).await?;
        let cpu_before = gateway.map(Proc::cpu).transpose()?;
        let cores_before = CoreTimes::read();
        let tally = closed_loop(addrs, connections, shot, self.plan.window).await?;
        let cores_after = CoreTimes::read();
        let cpu_after = gateway.map(Proc::cpu).transpose()?;
        let gateway_core = match self.layout {
            Layout::Direct => None,
            Layout::OwnCore => Some(self.plan.gateway_core),
            Layout::SharedCore => Some(self.plan.load_core),
        };
        Ok(Row::new(row::Sample {
            target: self.target,
            layout: self.layout,
            load,
            connections,
            tally: &tally,
            gateway_cpu: cpu_before
                .zip(cpu_after)
                .map(|(before, after)| after.saturating_sub(before)),
            gateway_core_busy: gateway_core.and_then(|c| cores_after.busy_since(&cores_before, c)),
            load_core_busy: cores_after.busy_since(&cores_before, self.plan.load_core),
        }))
    }
}
