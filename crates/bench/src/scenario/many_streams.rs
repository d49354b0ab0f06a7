//! `sluice bench scenario many-streams`: thousands of slow streams held open through one
//! gateway, and as many idle keep-alive connections: what each costs the gateway in memory.
//!
//! The engines are one `sluice sim` process with the `slow` profile: every step takes a second
//! whatever it holds, so each stream gets a token a second however many there are. Every
//! configuration gets two fresh gateways. The first, once idle, is given `streams` keep-alive
//! connections, each answered once (`GET /v1/models`, which the gateway answers itself) and then
//! left open. The second takes the streams, opened at `rate` a second, each a streaming
//! completion of `tokens` tokens. Memory is the gateway's resident set (`VmRSS`), read while
//! every stream has had its first event and none has ended; a stream's or a connection's share
//! is the growth over the same gateway's idle RSS, divided by their number.
//!
//! Over HTTP/1.1 every stream also holds a connection to its engine, so a gateway under an
//! open-file limit takes half as many (`sluice_core::room`); `sluice-http1` runs as many streams
//! as fit, and the report says how many. Over HTTP/2 (`sluice-http2`) an engine takes one
//! connection for all of its streams. `envoy` is Envoy as the plain proxy (one worker thread,
//! HTTP/1.1 to the engines, `overhead::envoy::plain_config`), under the same limit as
//! `sluice-http1`, when an Envoy is installed or the configuration is named.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::HOST;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use serde::Serialize;
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};

use super::{quiet_sluice, Gateway, ScenarioError, MODEL};
use crate::overhead::load::{connect, EventEnds, Sender, Shot};
use crate::overhead::{spawn_engines, OverheadError, Template};
use crate::procs::{processor, Proc};

/// A gateway the scenario measures.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Config {
    /// sluice with its defaults but overload protection (see `template`), speaking HTTP/2 or
    /// HTTP/1.1 to the engines.
    Sluice { http2: bool },
    /// Envoy as the plain proxy (HTTP/1.1 to the engines).
    Envoy,
}

impl Config {
    fn http2(self) -> bool {
        matches!(self, Config::Sluice { http2: true })
    }
}

/// The configurations, by name.
const CONFIGS: [(&str, Config); 3] = [
    ("sluice-http2", Config::Sluice { http2: true }),
    ("sluice-http1", Config::Sluice { http2: false }),
    ("envoy", Config::Envoy),
];
/// How long the streams may take to all have their first event once the last is opened.
const SETTLE: Duration = Duration::from_secs(60);
/// How often memory is read while every stream is open.
const SAMPLE_EVERY: Duration = Duration::from_millis(500);
/// The gateway's grace to stop.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// What to run.
#[derive(Debug, Clone)]
pub struct ManyStreamsPlan {
    pub sluice_exe: PathBuf,
    pub out_dir: PathBuf,
    pub streams: usize,
    pub engines: usize,
    /// Tokens per stream: about as many seconds.
    pub tokens: u32,
    /// Streams opened per second.
    pub rate: f64,
    /// Configurations by name (empty: every one that can run here).
    pub configs: Vec<String>,
    /// The Envoy to run as `envoy`; without one that configuration is left out.
    pub envoy: Option<PathBuf>,
}

/// Every configuration's figures.
#[derive(Debug, Clone, Serialize)]
pub struct ManyStreamsReport {
    pub processor: String,
    /// The soft open-file limit the gateways ran under.
    pub open_files: Option<usize>,
    pub engines: usize,
    pub tokens: u32,
    pub rows: Vec<StreamsRow>,
}

/// One configuration.
#[derive(Debug, Clone, Serialize)]
pub struct StreamsRow {
    pub config: String,
    /// Whether the gateway spoke HTTP/2 to the engines.
    pub http2: bool,
    /// Client connections the open-file limit leaves this gateway (its `--max-connections`).
    pub room: Option<usize>,
    pub idle: IdleConnections,
    pub streams: Streams,
}

/// Keep-alive connections answered once and left open.
#[derive(Debug, Clone, Serialize)]
pub struct IdleConnections {
    pub rss_idle_bytes: u64,
    pub connections: usize,
    /// Connections still open when memory was read.
    pub still_open: usize,
    pub rss_bytes: u64,
    pub per_connection_bytes: u64,
}

/// Streams held open at once.
#[derive(Debug, Clone, Serialize)]
pub struct Streams {
    pub rss_idle_bytes: u64,
    pub streams: usize,
    /// From the first stream opened to every one having had its first event.
    pub all_open_after_secs: f64,
    /// The most RSS read while every stream was open.
    pub rss_bytes: u64,
    pub per_stream_bytes: u64,
    /// Streams answered 200 with every token and `[DONE]`.
    pub completed: u64,
    pub failed: u64,
    /// Why streams failed, by reason (`connect`, `status 429`, `cut`, `short`, `timeout`).
    pub failures: std::collections::BTreeMap<String, u64>,
    pub events: u64,
    /// The gateway's CPU time over the events relayed while every stream was open.
    pub cpu_us_per_event: Option<f64>,
}

/// Runs every configuration asked for on one fleet of slow engines.
pub async fn many_streams(plan: &ManyStreamsPlan) -> Result<ManyStreamsReport, ScenarioError> {
    let open_files = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|l| sluice_core::room::open_file_limit(&l));
    let (engines, workers) = start_engines(plan).await?;
    let mut rows = Vec::new();
    for (name, config) in CONFIGS {
        if !plan.configs.is_empty() && !plan.configs.iter().any(|c| c == name) {
            continue;
        }
        let room = open_files.map(|files| {
            sluice_core::room::client_connections(files, config.http2(), workers.len())
        });
        let Some(template) = template(plan, name, config, room) else {
            continue;
        };
        let row = measure(plan, &template, config.http2(), room, &workers).await;
        match row {
            Ok(row) => rows.push(row),
            Err(e) => {
                engines.stop(STOP_GRACE).await;
                return Err(e);
            }
        }
    }
    engines.stop(STOP_GRACE).await;
    Ok(ManyStreamsReport {
        processor: processor(),
        open_files,
        engines: plan.engines,
        tokens: plan.tokens,
        rows,
    })
}

async fn start_engines(plan: &ManyStreamsPlan) -> Result<(Proc, Vec<String>), ScenarioError> {
    let (sim, addrs) =
        spawn_engines(&plan.sluice_exe, "slow", plan.engines, None, &plan.out_dir).await?;
    Ok((sim, addrs.iter().map(|a| format!("http://{a}")).collect()))
}

/// How `config` is started, taking at most `room` client connections (None: Envoy without an
/// Envoy installed).
fn template(
    plan: &ManyStreamsPlan,
    name: &str,
    config: Config,
    room: Option<usize>,
) -> Option<Template> {
    let cap = room.unwrap_or(plan.streams).to_string();
    match config {
        Config::Sluice { http2 } => {
            // The slow engines take new requests only as each one-second step starts, so by
            // their reports each holds a queue of about a second's arrivals: overload
            // protection would read that as a full engine and hold the streams in the gateway's
            // queue, refusing those that wait past its timeout. Right for such engines, but not
            // what is measured here: the memory of streams in progress.
            let mut flags = vec![
                "--max-connections",
                &cap,
                "--disable-worker-overload-protection",
            ];
            if http2 {
                flags.push("--upstream-http2");
            }
            Some(quiet_sluice(name, &plan.sluice_exe, &flags))
        }
        Config::Envoy => plan.envoy.clone().map(crate::overhead::envoy_plain),
    }
}

async fn measure(
    plan: &ManyStreamsPlan,
    template: &Template,
    http2: bool,
    room: Option<usize>,
    workers: &[String],
) -> Result<StreamsRow, ScenarioError> {
    let streams = room.map_or(plan.streams, |room| plan.streams.min(room));
    let name = template.name.as_str();

    let gateway = Gateway::start(template, workers, &plan.out_dir).await?;
    tracing::info!(
        config = name,
        connections = streams,
        "idle keep-alive connections"
    );
    let idle = idle_connections(&gateway, streams).await;
    gateway.stop().await;

    let gateway = Gateway::start(template, workers, &plan.out_dir).await?;
    tracing::info!(config = name, streams, "streams");
    let held = hold_streams(plan, &gateway, streams).await;
    gateway.stop().await;
    Ok(StreamsRow {
        config: name.into(),
        http2,
        room,
        idle: idle?,
        streams: held?,
    })
}

fn address(gateway: &Gateway) -> Result<SocketAddr, ScenarioError> {
    gateway
        .url
        .trim_start_matches("http://")
        .parse()
        .map_err(|_| ScenarioError::Url(gateway.url.clone()))
}

fn rss_now(gateway: &Gateway) -> Result<u64, ScenarioError> {
    Ok(gateway.rss()?.0)
}

/// Opens `count` connections one after the other, each answered once, and reads the gateway's
/// memory with all of them open.
async fn idle_connections(
    gateway: &Gateway,
    count: usize,
) -> Result<IdleConnections, ScenarioError> {
    let addr = address(gateway)?;
    let rss_idle = rss_now(gateway)?;
    let mut open: Vec<Sender> = Vec::with_capacity(count);
    for _ in 0..count {
        let mut sender = connect(addr).await.map_err(OverheadError::from)?;
        let request = Request::get("/v1/models")
            .header(HOST, addr.to_string())
            .body(Full::new(Bytes::new()))
            .map_err(|_| ScenarioError::Url(gateway.url.clone()))?;
        if let Ok(response) = sender.send_request(request).await {
            let _ = response.into_body().collect().await;
        }
        open.push(sender);
    }
    let rss = rss_now(gateway)?;
    let still_open = open.iter().filter(|s| !s.is_closed()).count();
    Ok(IdleConnections {
        rss_idle_bytes: rss_idle,
        connections: count,
        still_open,
        rss_bytes: rss,
        per_connection_bytes: rss.saturating_sub(rss_idle) / count.max(1) as u64,
    })
}

/// How the streams are getting on, counted by the streams themselves.
#[derive(Default)]
struct Progress {
    /// Streams that have had their first event, or ended without one.
    settled: AtomicUsize,
    /// Streams that ended after their first event.
    finished: AtomicUsize,
    events: AtomicU64,
}

/// Opens `count` streams at the plan's rate, reads memory and CPU while all are open, and waits
/// for every one to end.
async fn hold_streams(
    plan: &ManyStreamsPlan,
    gateway: &Gateway,
    count: usize,
) -> Result<Streams, ScenarioError> {
    let addr = address(gateway)?;
    let rss_idle = rss_now(gateway)?;
    let shot = stream_shot(plan.tokens);
    let progress = Arc::new(Progress::default());
    let mut tasks = JoinSet::new();
    let start = Instant::now();
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / plan.rate.max(1.0)));
    ticks.set_missed_tick_behavior(MissedTickBehavior::Burst);
    for _ in 0..count {
        ticks.tick().await;
        tasks.spawn(stream(addr, shot.clone(), plan.tokens, progress.clone()));
    }
    let give_up = Instant::now() + SETTLE;
    while progress.settled.load(Ordering::Relaxed) < count && Instant::now() < give_up {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let all_open_after = start.elapsed();
    tracing::info!(
        settled = progress.settled.load(Ordering::Relaxed),
        secs = all_open_after.as_secs_f64(),
        "every stream has had its first event, or ended"
    );
    let (rss, cpu_us_per_event) = while_all_open(gateway, &progress).await?;
    let (mut completed, mut failed) = (0, 0);
    let mut failures = std::collections::BTreeMap::new();
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(Ok(())) => completed += 1,
            Ok(Err(why)) => {
                failed += 1;
                *failures.entry(why.to_string()).or_insert(0) += 1;
            }
            Err(_) => {
                failed += 1;
                *failures.entry("panicked".to_string()).or_insert(0) += 1;
            }
        }
    }
    Ok(Streams {
        rss_idle_bytes: rss_idle,
        streams: count,
        all_open_after_secs: all_open_after.as_secs_f64(),
        rss_bytes: rss,
        per_stream_bytes: rss.saturating_sub(rss_idle) / count.max(1) as u64,
        completed,
        failed,
        failures,
        events: progress.events.load(Ordering::Relaxed),
        cpu_us_per_event,
    })
}

/// The most RSS read, and CPU per event relayed, from now until the first stream ends.
async fn while_all_open(
    gateway: &Gateway,
    progress: &Progress,
) -> Result<(u64, Option<f64>), ScenarioError> {
    let cpu_before = gateway.cpu()?;
    let events_before = progress.events.load(Ordering::Relaxed);
    let mut rss = rss_now(gateway)?;
    let mut cpu_us_per_event = None;
    loop {
        tokio::time::sleep(SAMPLE_EVERY).await;
        if progress.finished.load(Ordering::Relaxed) > 0 {
            return Ok((rss, cpu_us_per_event));
        }
        rss = rss.max(rss_now(gateway)?);
        let events = progress.events.load(Ordering::Relaxed) - events_before;
        if events > 0 {
            let cpu = gateway.cpu()?.saturating_sub(cpu_before);
            cpu_us_per_event = Some(cpu.as_secs_f64() * 1e6 / events as f64);
        }
    }
}

fn stream_shot(tokens: u32) -> Shot {
    let body = serde_json::json!({
        "model": MODEL,
        "prompt": "Tell me a long story.",
        "max_tokens": tokens,
        "ignore_eos": true,
        "stream": true,
    });
    Shot {
        path: "/v1/completions",
        body: Bytes::from(body.to_string()),
    }
}

/// Why a stream did not complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
enum StreamFailure {
    #[error("connect")]
    Connect,
    #[error("request")]
    Request,
    #[error("status {0}")]
    Status(u16),
    /// The body ended in an error (the connection was cut).
    #[error("cut")]
    Cut,
    /// It ended without every token or without `[DONE]`.
    #[error("short")]
    Short,
    #[error("timeout")]
    Timeout,
}

/// One stream on its own connection; complete when it was answered 200 with every token and
/// the closing `[DONE]`.
async fn stream(
    addr: SocketAddr,
    shot: Shot,
    tokens: u32,
    progress: Arc<Progress>,
) -> Result<(), StreamFailure> {
    let mut started = false;
    // Three times its length and then some: a stream that takes longer has failed.
    let limit = Duration::from_secs(3 * u64::from(tokens)) + SETTLE;
    let complete = tokio::time::timeout(
        limit,
        read_stream(addr, &shot, tokens, &progress, &mut started),
    )
    .await
    .unwrap_or(Err(StreamFailure::Timeout));
    if started {
        progress.finished.fetch_add(1, Ordering::Relaxed);
    } else {
        progress.settled.fetch_add(1, Ordering::Relaxed);
    }
    complete
}

async fn read_stream(
    addr: SocketAddr,
    shot: &Shot,
    tokens: u32,
    progress: &Progress,
    started: &mut bool,
) -> Result<(), StreamFailure> {
    let mut sender = connect(addr).await.map_err(|_| StreamFailure::Connect)?;
    let request = shot
        .request(&addr.to_string())
        .ok_or(StreamFailure::Request)?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|_| StreamFailure::Request)?;
    if response.status() != StatusCode::OK {
        return Err(StreamFailure::Status(response.status().as_u16()));
    }
    let mut body = response.into_body();
    let (mut ends, mut events, mut done) = (EventEnds::default(), 0u64, false);
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(|_| StreamFailure::Cut)?.into_data() else {
            continue;
        };
        let n = ends.count(&data);
        if n > 0 && !*started {
            *started = true;
            progress.settled.fetch_add(1, Ordering::Relaxed);
        }
        events += n;
        progress.events.fetch_add(n, Ordering::Relaxed);
        done |= data.windows(12).any(|w| w == b"data: [DONE]");
    }
    if done && events > u64::from(tokens) {
        Ok(())
    } else {
        Err(StreamFailure::Short)
    }
}

/// The failed count, with its reasons when there are any.
fn failed(s: &Streams) -> String {
    if s.failures.is_empty() {
        return s.failed.to_string();
    }
    let why: Vec<String> = s
        .failures
        .iter()
        .map(|(k, n)| format!("{k}: {n}"))
        .collect();
    format!("{} ({})", s.failed, why.join(", "))
}

impl ManyStreamsReport {
    /// Markdown tables.
    pub fn table(&self) -> String {
        let mb = |b: u64| b as f64 / 1e6;
        let kb = |b: u64| b as f64 / 1e3;
        let mut out = format!(
            "processor: {}\nopen-file limit: {}\nengines: {} (slow: a token a second per stream), {} tokens a stream\n\n",
            self.processor,
            self.open_files.map_or("unlimited".into(), |n| n.to_string()),
            self.engines,
            self.tokens,
        );
        out += "| config | upstream | room | streams | all open after (s) | RSS idle (MB) | RSS with all open (MB) | per stream (KB) | completed | failed | CPU-µs / event |\n\
                | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
        for r in &self.rows {
            let s = &r.streams;
            out += &format!(
                "| {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {} | {} |\n",
                r.config,
                if r.http2 { "HTTP/2" } else { "HTTP/1.1" },
                r.room.map_or("–".into(), |n| n.to_string()),
                s.streams,
                s.all_open_after_secs,
                mb(s.rss_idle_bytes),
                mb(s.rss_bytes),
                kb(s.per_stream_bytes),
                s.completed,
                failed(s),
                s.cpu_us_per_event.map_or("–".into(), |c| format!("{c:.1}")),
            );
        }
        out += "\n| config | idle keep-alive connections | still open | RSS idle (MB) | RSS with them (MB) | per connection (KB) |\n\
                | --- | ---: | ---: | ---: | ---: | ---: |\n";
        for r in &self.rows {
            let i = &r.idle;
            out += &format!(
                "| {} | {} | {} | {:.1} | {:.1} | {:.1} |\n",
                r.config,
                i.connections,
                i.still_open,
                mb(i.rss_idle_bytes),
                mb(i.rss_bytes),
                kb(i.per_connection_bytes),
            );
        }
        out
    }
}
