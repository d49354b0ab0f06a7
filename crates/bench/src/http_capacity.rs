//! The capacity sweep over HTTP: a real simulated engine on loopback, time-scaled, driven by
//! streaming `/v1/completions` requests exactly as a gateway would send them.
//!
//! Wall-clock times are multiplied by the time scale to report engine time. The engine counts the
//! steps it started late (`late_steps`); when those grow, the host CPU rather than the modelled GPU
//! set the pace, and the report says so.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::task::JoinSet;
use tokio::time::Instant;

use sluice_sim::{EngineConfig, FleetConfig, SimFleet};

use crate::capacity::{CapacityPlan, CapacityReport, LevelResult, LevelTally};
use crate::workload::ShapeSource;

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

/// Why an HTTP sweep could not run.
#[derive(Debug, thiserror::Error)]
pub enum HttpBenchError {
    #[error("could not start the simulated engine: {0}")]
    Fleet(#[from] sluice_sim::FleetError),
}

/// One level's figures plus how far the host fell behind the modelled clock.
pub struct HttpLevel {
    pub result: LevelResult,
    pub late_steps: u64,
    pub steps: u64,
}

/// Runs the sweep against a fresh engine per level.
pub async fn run_http(
    engine: &EngineConfig,
    plan: &CapacityPlan,
) -> Result<(CapacityReport, Vec<HttpLevel>), HttpBenchError> {
    let mut levels = Vec::new();
    for &concurrency in &plan.levels {
        levels.push(http_level(engine, plan, concurrency).await?);
    }
    let report = CapacityReport {
        levels: levels.iter().map(|l| l.result.clone()).collect(),
    };
    Ok((report, levels))
}

struct Window {
    start: Instant,
    end: Instant,
}

impl Window {
    fn contains(&self, t: Instant) -> bool {
        t >= self.start && t < self.end
    }
}

async fn http_level(
    engine: &EngineConfig,
    plan: &CapacityPlan,
    concurrency: u32,
) -> Result<HttpLevel, HttpBenchError> {
    let fleet = SimFleet::start(FleetConfig::local(1, engine.clone())).await?;
    let slot = fleet.engine(0)?.clone();
    let url: Arc<str> = format!("{}/v1/completions", slot.url()).into();
    let client: HttpClient = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(usize::MAX)
        .build_http();
    let scale = engine.time_scale;
    let now = Instant::now();
    let window = Arc::new(Window {
        start: now + plan.warmup.div_f64(scale),
        end: now + (plan.warmup + plan.window).div_f64(scale),
    });
    let shapes = Arc::new(parking_lot::Mutex::new(ShapeSource::new(
        plan.workload,
        plan.seed,
    )));
    let tally = Arc::new(parking_lot::Mutex::new(LevelTally::default()));
    let model: Arc<str> = engine.model.clone().into();
    let max_prompt = engine.max_model_len.saturating_sub(1);
    let mut clients = JoinSet::new();
    for _ in 0..concurrency {
        let (client, url, window, shapes, tally, model) = (
            client.clone(),
            url.clone(),
            window.clone(),
            shapes.clone(),
            tally.clone(),
            model.clone(),
        );
        clients.spawn(async move {
            while Instant::now() < window.end {
                let shape = shapes.lock().next_shape();
                let body = request_body(
                    &model,
                    shape.prompt_tokens.min(max_prompt),
                    shape.output_tokens,
                );
                one_request(&client, &url, body, &window, &tally, scale).await;
            }
        });
    }
    tokio::time::sleep_until(window.start).await;
    let before = slot.state();
    tokio::time::sleep_until(window.end).await;
    let after = slot.state();
    clients.abort_all();
    drop(fleet);
    let mut tally = std::mem::take(&mut *tally.lock());
    tally.preemptions = after.preemptions - before.preemptions;
    Ok(HttpLevel {
        result: tally.result(concurrency, plan.window),
        late_steps: after.late_steps - before.late_steps,
        steps: after.steps - before.steps,
    })
}

fn request_body(model: &str, prompt_tokens: u32, output_tokens: u32) -> Bytes {
    let prompt: Vec<u32> = (0..prompt_tokens).map(|i| 1000 + i % 30_000).collect();
    let body = serde_json::json!({
        "model": model,
        "prompt": prompt,
        "max_tokens": output_tokens,
        "ignore_eos": true,
        "stream": true,
    });
    Bytes::from(body.to_string())
}

/// Sends one streaming request and tallies its tokens (and TTFT) that fall in the window.
async fn one_request(
    client: &HttpClient,
    url: &str,
    body: Bytes,
    window: &Window,
    tally: &parking_lot::Mutex<LevelTally>,
    scale: f64,
) {
    let Ok(request) = http::Request::post(url)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(body))
    else {
        return;
    };
    let sent = Instant::now();
    let Ok(response) = client.request(request).await else {
        return;
    };
    let mut body = response.into_body();
    let mut first = true;
    while let Some(Ok(frame)) = body.frame().await {
        let Some(data) = frame.data_ref() else {
            continue;
        };
        let now = Instant::now();
        // Every token event carries `"finish_reason":null`; the finishing event does not.
        let tokens = count(data, b"\"finish_reason\":null") as u64;
        if tokens == 0 || !window.contains(now) {
            first &= tokens == 0;
            continue;
        }
        let mut t = tally.lock();
        t.tokens += tokens;
        if first {
            t.ttfts.push((now - sent).as_secs_f64() * scale);
            first = false;
        }
        if count(data, b"[DONE]") > 0 {
            t.completed += 1;
        }
    }
}

fn count(haystack: &[u8], needle: &[u8]) -> usize {
    haystack
        .windows(needle.len())
        .filter(|w| *w == needle)
        .count()
}
