//! `sluice bench scenario liveness`: each way an engine fails (`Failure`, each as the engine's
//! own source has it) against each kind of client (`Clients`: streaming or not, timeouts,
//! deadlines, one client or sixteen), through each gateway. Two engines; engine 0 fails.
//!
//! Every cell starts a fresh fleet and gateway and runs closed-loop clients for the three
//! phases (before, during, after the failure). It reports, from outside:
//!
//! - when the gateway took the engine out: sluice's (and the picker's) `worker vetoed by
//!   liveness` log line for it; for every gateway, the last request the engine received during
//!   the failure (its own arrival counter, read every 50 ms);
//! - the first request the engine received during the failure, and how long after it the veto
//!   came;
//! - requests the engine received during the failure, and after the veto (its arrival stamps,
//!   `readings`, place each one before or after the logged veto);
//! - requests that failed (an error, a refusal, a timeout, a stream cut short), by phase: with
//!   sixteen clients or fewer on two engines, the healthy engine had room for every one of them;
//! - seconds from the recovery to the engine's first request again.
//!
//! What the numbers say about today's rules is in docs/benchmarks.md; none is asserted in the
//! test suite, which checks only what must always hold (order and counts).

mod matrix;
mod readings;
mod table;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde::Serialize;
use tokio::time::Instant;

pub use matrix::{Clients, Failure, Wait, LONG_PROMPT_TOKENS};
use readings::{arrived_before, first_arrival, first_arrival_after, last_arrival, received_at};

use super::timeline::Timing;
use super::{Gateway, ScenarioError, ScenarioPlan, SimFleet, MODEL};
use crate::arrivals::{Process, Schedule};
use crate::goodput::Outcome;
use crate::overhead::Template;
use crate::run::{execute, Mix, RunPlan};

/// The engine that fails.
const TARGET: usize = 0;
/// How often the target's arrival counter is read.
const READ_EVERY: Duration = Duration::from_millis(50);
/// The harness's own cap on one request (no client kind waits this long but the patient).
const HARNESS_TIMEOUT: Duration = Duration::from_secs(120);

/// What to run.
#[derive(Debug, Clone)]
pub struct LivenessPlan {
    pub sluice_exe: PathBuf,
    pub out_dir: PathBuf,
    pub gateways: Vec<Template>,
    pub failures: Vec<Failure>,
    pub clients: Vec<Clients>,
    pub timing: Timing,
    pub seed: u64,
}

/// One cell: a failure, a kind of client, a gateway.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub failure: Failure,
    pub clients: String,
    pub gateway: String,
    pub requests: u64,
    /// Requests that failed: over before the failure; in flight when it came or sent while it
    /// lasted; sent after the recovery.
    pub failed: [u64; 3],
    /// The failed requests by what ended them: the gateway's code, the client's
    /// (`idle_timeout`, `client_timeout`), `status_<n>`, `no_answer`, or `cut` for a stream
    /// that ended early.
    pub failures: BTreeMap<String, u64>,
    /// Requests the engine received during the failure (`None`: its counter died with it).
    pub sent_during: Option<u64>,
    /// Wall seconds from the failure to the gateway's first liveness veto of the engine
    /// (`None`: none logged, or a gateway that logs none).
    pub vetoed_after: Option<f64>,
    /// Requests the engine received from that veto to the recovery.
    pub sent_after_veto: Option<u64>,
    /// Wall seconds from the failure to the first request the engine received during it, at
    /// the earliest it can have come (the counter's reading before it grew; read every 50 ms); the
    /// failure itself for a crash, whose engine takes nothing in.
    pub first_sent_after: Option<f64>,
    /// Wall seconds from that first request to the veto: the issue's "out within 5 s of its
    /// first unanswered request". `None` without a veto or a first request before it.
    pub vetoed_after_first_sent: Option<f64>,
    /// Liveness vetoes of the engine the gateway logged in the whole cell (`None`: not sluice).
    pub vetoes: Option<u64>,
    /// Wall seconds from the failure to the last request the engine received during it.
    pub last_sent_after: Option<f64>,
    /// Wall seconds from the recovery to the engine's first request after it.
    pub readmitted_after: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LivenessReport {
    pub timing: Timing,
    pub rows: Vec<Row>,
}

/// Runs every cell of the plan, gateway by gateway within each client kind and failure.
pub async fn liveness(plan: &LivenessPlan) -> Result<LivenessReport, ScenarioError> {
    let mut rows = Vec::new();
    for &failure in &plan.failures {
        for clients in &plan.clients {
            for gateway in &plan.gateways {
                let row = one_cell(plan, failure, clients, gateway).await?;
                tracing::info!(
                    failure = failure.name(),
                    clients = %row.clients,
                    gateway = %row.gateway,
                    failed_during = row.failed[1],
                    "liveness cell"
                );
                rows.push(row);
            }
        }
    }
    Ok(LivenessReport {
        timing: plan.timing,
        rows,
    })
}

/// The fleet of a cell: two engines of the failure's flavor with their whole KV cache (the
/// long prompt needs it), at full speed, as the gateways' timers are.
fn fleet_plan(plan: &LivenessPlan, failure: Failure, dir: &Path) -> ScenarioPlan {
    ScenarioPlan {
        adapters: None,
        loads: None,
        configs: Vec::new(),
        time_scale: 1.0,
        window: plan.timing.during,
        engines: 2,
        seed: plan.seed,
        client: crate::client::ClientKind::None,
        mix: Mix::Short,
        quick: false,
        capacity: None,
        sluice_exe: plan.sluice_exe.clone(),
        out_dir: dir.to_path_buf(),
        engine_args: ["--max-num-seqs", "64", "--flavor", failure.flavor()]
            .map(String::from)
            .to_vec(),
        tiers: crate::run::default_tiers(),
        fleet: Default::default(),
        api: crate::client::Api::Completions,
    }
}

async fn one_cell(
    plan: &LivenessPlan,
    failure: Failure,
    clients: &Clients,
    gateway: &Template,
) -> Result<Row, ScenarioError> {
    let dir = plan.out_dir.join(format!(
        "{}-{}-{}",
        failure.name(),
        clients.label().replace(' ', "-"),
        gateway.name
    ));
    std::fs::create_dir_all(&dir).map_err(|source| ScenarioError::Write {
        path: dir.clone(),
        source,
    })?;
    let mut fleet = SimFleet::start(&fleet_plan(plan, failure, &dir)).await?;
    let result = async {
        let started = Gateway::start(gateway, &fleet.workers, &dir).await?;
        wait_until_routing(&started.url).await;
        // One clock for the clients' times and the failure's.
        let start = Instant::now() + Duration::from_millis(50);
        let load = load_plan(plan, clients, &started.url, start);
        let load = tokio::spawn(async move { execute(&load).await.map(|(o, _)| o) });
        let run = drive(&mut fleet, failure, &plan.timing, load, start).await;
        started.stop().await;
        let run = run?;
        let log = dir.join(format!("{}.log", gateway.name));
        let target_id = sluice_core::WorkerId::for_url(&fleet.workers[TARGET]);
        // sluice, and the picker behind Envoy, log their vetoes; the others do not.
        let logs_vetoes = gateway.name.starts_with("sluice") || gateway.name.contains("epp");
        let vetoes = logs_vetoes.then(|| vetoes_in_log(&log, target_id.as_str()));
        Ok(run.row(failure, clients, &gateway.name, &plan.timing, vetoes))
    }
    .await;
    fleet.stop().await;
    result
}

/// The cell's load: closed-loop clients of one kind, short answers (a healthy engine answers
/// each within a second, so every client kind succeeds while nothing fails).
fn load_plan(plan: &LivenessPlan, clients: &Clients, url: &str, start: Instant) -> RunPlan {
    let behaviour = clients.behaviour();
    let t = &plan.timing;
    RunPlan {
        adapters: None,
        url: format!("{url}/v1/completions"),
        model: MODEL.into(),
        schedule: Schedule::constant(1.0),
        process: Process::Poisson,
        seed: plan.seed,
        max_requests: usize::MAX,
        duration: t.before + t.during + t.after,
        mix: Mix::Short,
        tiers: crate::run::default_tiers(),
        tenants: 4,
        tenant_keys: Vec::new(),
        client: behaviour.retries,
        patience: behaviour.patience,
        stream: behaviour.stream,
        closed_loop: Some(clients.count),
        request_timeout: HARNESS_TIMEOUT,
        starts_at: Some(start),
        api: crate::client::Api::Completions,
    }
}

type Load = tokio::task::JoinHandle<Result<Vec<Outcome>, crate::arrivals::ArrivalError>>;

/// What a cell saw: every request's outcome, the target's arrivals over time, and when the
/// failure began (wall clock, to meet the gateway's log) and ended.
struct Run {
    outcomes: Vec<Outcome>,
    readings: Vec<(Duration, Option<u64>)>,
    /// Each reading's count again, with when its last arrival came (Unix microseconds).
    stamps: Vec<(u64, u64)>,
    fault_at: SystemTime,
}

/// While the load runs: reads the target's counter, and starts and ends the failure on time.
async fn drive(
    fleet: &mut SimFleet,
    failure: Failure,
    timing: &Timing,
    mut load: Load,
    start: Instant,
) -> Result<Run, ScenarioError> {
    let (fault, restore) = (timing.before, timing.before + timing.during);
    tokio::time::sleep_until(start).await;
    let mut readings = Vec::new();
    let mut stamps = Vec::new();
    let mut fault_at = None;
    let mut restored = false;
    let mut long_prompt = None;
    let mut tick = tokio::time::interval(READ_EVERY);
    loop {
        tokio::select! {
            done = &mut load => {
                if let Some(task) = long_prompt {
                    let _ = tokio::time::timeout(HARNESS_TIMEOUT, task).await;
                }
                let outcomes = done.map_err(ScenarioError::Join)??;
                let fault_at = fault_at.unwrap_or_else(SystemTime::now);
                return Ok(Run { outcomes, readings, stamps, fault_at });
            }
            _ = tick.tick() => {}
        }
        let at = start.elapsed();
        if fault_at.is_none() && at >= fault {
            fault_at = Some(SystemTime::now());
            match failure {
                Failure::Crash => fleet.kill(TARGET).await,
                Failure::LongPrefill => {
                    long_prompt = Some(tokio::spawn(send_long_prompt(
                        fleet.workers[TARGET].clone(),
                    )));
                }
                _ => {
                    if let Some(f) = failure.fault() {
                        fleet.fault(TARGET, &f).await?;
                    }
                }
            }
        } else if fault_at.is_some() && !restored && at >= restore {
            restored = true;
            match failure {
                Failure::Crash => fleet.restart(TARGET).await?,
                Failure::LongPrefill => {}
                _ => fleet.fault(TARGET, &sluice_sim::Fault::Clear).await?,
            }
        }
        let arrivals = fleet.arrivals(TARGET).await;
        readings.push((start.elapsed(), arrivals.map(|(n, _)| n)));
        stamps.extend(arrivals);
    }
}

/// Waits (up to 30 s) until the gateway serves a one-token completion: a gateway answers its
/// port before it has found its workers ready, and a cell must start on a fleet in service.
async fn wait_until_routing(url: &str) {
    let http: crate::client::HttpClient =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let body = serde_json::json!({"model": MODEL, "prompt": "ping", "max_tokens": 1});
    let give_up = Instant::now() + Duration::from_secs(30);
    while Instant::now() < give_up {
        let request = http::Request::post(format!("{url}/v1/completions"))
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.to_string())));
        let Ok(request) = request else { return };
        if let Ok(response) = http.request(request).await {
            let ok = response.status().is_success();
            let _ = response.into_body().collect().await;
            if ok {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tracing::warn!(
        url,
        "the gateway served no completion within 30 s; the cell runs anyway"
    );
}

/// A 128k-token prompt sent straight to the engine and read to its end, as another replica's
/// client would: the engine prefills it for seconds without a byte.
async fn send_long_prompt(worker: String) {
    let prompt = "lorm".repeat(LONG_PROMPT_TOKENS);
    let body = serde_json::json!({
        "model": MODEL, "prompt": prompt, "max_tokens": 1, "stream": true,
    });
    let http: crate::client::HttpClient =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let Ok(request) = http::Request::post(format!("{worker}/v1/completions"))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
    else {
        return;
    };
    match http.request(request).await {
        Ok(response) if response.status().is_success() => {
            let _ = response.into_body().collect().await;
        }
        Ok(response) => tracing::warn!(status = %response.status(), "the long prompt was refused"),
        Err(error) => tracing::warn!(%error, "the long prompt was not sent"),
    }
}

/// The wall-clock times of the liveness vetoes of `worker` a sluice log holds.
fn vetoes_in_log(log: &Path, worker: &str) -> Vec<SystemTime> {
    let Ok(text) = std::fs::read_to_string(log) else {
        return Vec::new();
    };
    let field = format!("worker={worker}");
    text.lines()
        .filter(|l| l.contains("worker vetoed by liveness") && l.contains(&field))
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(|stamp| humantime::parse_rfc3339_weak(stamp.trim_end_matches('Z')).ok())
        .collect()
}

impl Run {
    /// The requests that failed in each phase — before: over before the failure; during: in
    /// flight when it came, or sent while it lasted; after: sent after the recovery — and the
    /// failures by code.
    fn failures(&self, fault: Duration, restore: Duration) -> ([u64; 3], BTreeMap<String, u64>) {
        let phase = |o: &Outcome| {
            if o.due + o.e2e < fault {
                0
            } else if o.due < restore {
                1
            } else {
                2
            }
        };
        let mut failed = [0u64; 3];
        let mut failures = BTreeMap::new();
        for o in self
            .outcomes
            .iter()
            .filter(|o| !(o.status == 200 && o.completed))
        {
            failed[phase(o)] += 1;
            *failures.entry(o.failure_code()).or_insert(0) += 1;
        }
        (failed, failures)
    }

    fn row(
        &self,
        failure: Failure,
        clients: &Clients,
        gateway: &str,
        timing: &Timing,
        vetoes: Option<Vec<SystemTime>>,
    ) -> Row {
        let (fault, restore) = (timing.before, timing.before + timing.during);
        let (failed, failures) = self.failures(fault, restore);
        let seconds_after = |t: SystemTime| {
            t.duration_since(self.fault_at)
                .map(|d| d.as_secs_f64())
                .ok()
        };
        let vetoed_after = vetoes
            .as_ref()
            .and_then(|v| v.iter().filter_map(|&t| seconds_after(t)).reduce(f64::min));
        let readable = failure.counter_readable();
        let sent_between = |from: Duration, to: Duration| {
            Some(
                received_at(&self.readings, to)?.saturating_sub(received_at(&self.readings, from)?),
            )
        };
        let first_sent_after = if readable {
            first_arrival(&self.readings, fault, restore).map(|d| d.saturating_sub(fault))
        } else {
            Some(Duration::ZERO)
        }
        .map(|d| d.as_secs_f64());
        let vetoed_after_first_sent = match (vetoed_after, first_sent_after) {
            (Some(v), Some(f)) if f <= v => Some(v - f),
            _ => None,
        };
        Row {
            failure,
            clients: clients.label(),
            gateway: gateway.to_string(),
            requests: self.outcomes.len() as u64,
            failed,
            failures,
            sent_during: readable.then(|| sent_between(fault, restore)).flatten(),
            vetoed_after,
            sent_after_veto: vetoes
                .as_ref()
                .and_then(|v| v.iter().copied().filter(|&t| t >= self.fault_at).min())
                .filter(|_| readable)
                .and_then(|veto| {
                    let during = received_at(&self.readings, restore)?;
                    Some(during.saturating_sub(arrived_before(&self.stamps, veto)))
                }),
            first_sent_after,
            vetoed_after_first_sent,
            vetoes: vetoes.map(|v| v.len() as u64),
            last_sent_after: readable
                .then(|| last_arrival(&self.readings, fault, restore))
                .flatten()
                .map(|d| d.saturating_sub(fault).as_secs_f64()),
            readmitted_after: first_arrival_after(
                &self.readings,
                restore,
                failure == Failure::Crash,
            )
            .map(|d| d.saturating_sub(restore).as_secs_f64()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sluice_log_gives_the_times_of_one_workers_vetoes() {
        let dir = std::env::temp_dir().join(format!("liveness-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("sluice.log");
        std::fs::write(
            &log,
            "2026-12-05T10:00:01.250000Z  WARN sluice_gateway::control::liveness: worker vetoed by liveness worker=wabc reason=\"wedged\"\n\
             2026-12-05T10:00:02.000000Z  WARN sluice_gateway::control::liveness: worker vetoed by liveness worker=wdef reason=\"wedged\"\n\
             2026-12-05T10:00:03.000000Z  INFO sluice_gateway::control::liveness: worker re-admitted by liveness worker=wabc\n",
        )
        .unwrap();
        let times = vetoes_in_log(&log, "wabc");
        assert_eq!(times.len(), 1);
        let base = humantime::parse_rfc3339_weak("2026-12-05T10:00:00").unwrap();
        assert_eq!(
            times[0].duration_since(base).unwrap(),
            Duration::from_millis(1250)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
