//! `sluice bench scenario <name>`: one command starts a simulated fleet, each gateway
//! configuration under test and the load, and tears everything down (processes stopped by PID).
//!
//! Configurations are named command templates (see `overhead::Template`), so any gateway can be
//! measured: `direct` (sluice in round robin with every protection and veto off: the naive
//! fleet; `direct-unreachable`, in the incident scenarios, keeps the unreachable veto),
//! `sluice` (its defaults), `sluice-shed` (defaults plus `--worker-overload-shed`), and `smg`
//! when it is on the PATH; scenarios add their own (`adaptive`: limits learned from latency and
//! CoDel on the gateway queue, for the slow-worker and spike incidents).
//!
//! The engines run a real-GPU profile with `--time-scale`: their clock runs that many times
//! faster than the wall clock, so a sweep finishes in minutes. Objectives and rates are stated in
//! engine time and converted for the run, and so are the load poll (every gateway's) and
//! sluice's queue timers (`queue_timers`); the gateways' other timers (probes, health checks) are
//! not scaled, which the report says.

mod adaptive;
mod degradation;
mod fleet;
mod liveness;
mod lora;
mod many_streams;
mod noisy;
mod pd_burst;
mod plot;
mod prediction;
mod routing;
mod sweep;
mod tiered;
mod timeline;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use sluice_core::slo::Slos;

pub use adaptive::{controlled_config, incident_configs, Controls};
pub use degradation::{
    api as degradation_api, configs as degradation_configs, degradation, shape as degradation_shape,
};
pub use fleet::{EngineTotals, FleetShape, SimFleet};
pub use liveness::{liveness, Clients, Failure, LivenessPlan, LivenessReport, Wait};
pub use lora::{configs as lora_configs, lora, LoraReport};
pub use many_streams::{many_streams, ManyStreamsPlan, ManyStreamsReport};
pub use noisy::{noisy_tenant, tenants_config, two_tenants, QUEUE_SIZES};
pub use pd_burst::{pd_burst, PdBurstPlan, PdBurstReport};
pub use prediction::{default_policy_configs, policy_configs, PredictionError};
pub use routing::{configs as routing_configs, routing, RoutingReport};
pub use sweep::{fleet_capacity, overload_sweep, SweepReport};
pub use tiered::{
    smg_priority_config, three_tiers, tiered_config, tiered_overload, tiered_policy_configs,
    TieredReport,
};
pub use timeline::{timeline, Incident, TimelineReport, Timing};

use crate::arrivals::{ArrivalError, Process, Schedule};
use crate::client::{Api, ClientKind};
use crate::goodput::{Report, Slo, Tier};
use crate::overhead::{
    free_ports, loopback, on_path, wait_until_answering, OverheadError, Template,
};
use crate::procs::{Launch, Proc, ProcError};
use crate::run::{execute, Mix, RunPlan};

/// The model the simulated engines serve.
pub const MODEL: &str = "llama-3.1-8b";

/// Why a scenario could not finish.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error(transparent)]
    Harness(#[from] OverheadError),
    #[error(transparent)]
    Proc(#[from] ProcError),
    #[error(transparent)]
    Arrivals(#[from] ArrivalError),
    #[error("the simulated engines did not drain within {0:?}")]
    Drain(Duration),
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the sim control listener did not answer: {0}")]
    Control(#[source] hyper_util::client::legacy::Error),
    #[error("the sim refused the fault {fault:?}: status {status}")]
    Fault {
        fault: sluice_sim::Fault,
        status: u16,
    },
    #[error("the capacity search needs the `direct` configuration")]
    NoDirect,
    #[error("the load task failed: {0}")]
    Join(#[source] tokio::task::JoinError),
    #[error("cannot draw the plot: {0}")]
    Plot(String),
    #[error("not a URL: {0}")]
    Url(String),
}

/// How a scenario runs.
#[derive(Debug, Clone)]
pub struct ScenarioPlan {
    pub configs: Vec<Template>,
    /// Engine clock speed-up.
    pub time_scale: f64,
    /// Engine seconds measured per point.
    pub window: Duration,
    pub engines: usize,
    pub seed: u64,
    pub client: ClientKind,
    pub mix: Mix,
    pub quick: bool,
    /// The fleet's C when given (`--capacity`), instead of measuring it.
    pub capacity: Option<f64>,
    pub sluice_exe: PathBuf,
    /// Where plots and logs go.
    pub out_dir: PathBuf,
    /// Extra `sluice sim` flags (engine size).
    pub engine_args: Vec<String>,
    /// The requests' tiers, shares and objectives, in engine time.
    pub tiers: Vec<Tier>,
    /// What the engines serve (the requests ask for its model).
    pub fleet: FleetShape,
    /// Completions of exact lengths, or chats at the model's length.
    pub api: Api,
    /// The LoRA adapters requests ask for instead of the model (the `lora` scenario).
    pub adapters: Option<crate::run::AdapterMix>,
    /// `--load`: the loads to measure at, as multiples of C, instead of the scenario's own
    /// (spike: its peak).
    pub loads: Option<Vec<f64>>,
}

/// The load poll every gateway of a scenario gets, SMG included: both default to 10 s, so the
/// poll is 10 engine-seconds scaled with the engines' clock — every gateway's load signal as
/// fresh, in engine time, as it would be at full speed — in whole wall seconds, the only values
/// SMG's `--load-monitor-interval` takes (3 s at time scale 4: 12 engine-seconds).
pub fn load_poll(time_scale: f64) -> String {
    format!("{}", (10.0 / time_scale.max(1.0)).round().max(1.0))
}

/// CoDel's targets for tiers 0, 1 and 2 and its interval, in engine milliseconds: the gateway's
/// defaults.
const CODEL_TARGETS_MS: [f64; 3] = [200.0, 1000.0, 30_000.0];
const CODEL_INTERVAL_MS: f64 = 5000.0;
/// The gateway queue's default timeout, in engine seconds (SMG's).
const QUEUE_TIMEOUT_SECS: f64 = 60.0;

/// CoDel's default targets and interval in wall milliseconds under `time_scale` (whole, at
/// least 1): 50,250,7500 and 1250 at time scale 4.
pub(crate) fn codel_flags(time_scale: f64) -> [String; 4] {
    let scale = time_scale.max(1.0);
    let ms = |engine_ms: f64| format!("{}", (engine_ms / scale).round().max(1.0));
    [
        "--codel-target-ms-by-tier".into(),
        CODEL_TARGETS_MS.map(ms).join(","),
        "--codel-interval-ms".into(),
        ms(CODEL_INTERVAL_MS),
    ]
}

/// The gateway queue's default timers — CoDel's targets and interval, each tier's queue timeout
/// and the first-token objectives it follows — in engine time, as the load poll is
/// (`load_poll`): the gateway states them in wall time, and a queue that waits 5 wall seconds
/// before cutting, in front of engines four times faster than real ones, is a queue that waits
/// 20 seconds in front of real ones. The timeouts are the gateway's own rule
/// (`Slos::queue_waits`) applied in engine time and scaled, since its allowance for the engine's
/// first token is engine time too. Nothing at full speed: the defaults are then the defaults as
/// they are.
pub fn queue_timers(time_scale: f64) -> Vec<String> {
    if time_scale <= 1.0 {
        return Vec::new();
    }
    let waits = wall_waits(time_scale, Duration::from_secs_f64(QUEUE_TIMEOUT_SECS));
    let mut flags = codel_flags(time_scale).to_vec();
    flags.extend([
        "--queue-timeout-by-tier".into(),
        waits.join(","),
        "--slo-ttft-ms-by-tier".into(),
        wall_objectives(time_scale),
    ]);
    flags
}

/// Each tier's wait in the gateway queue, in wall seconds under `scale`: the gateway's rule
/// (`Slos::queue_waits`) in engine time, `longest` (engine time) the longest wait.
pub(crate) fn wall_waits(scale: f64, longest: Duration) -> [String; 3] {
    Slos::default()
        .queue_waits(longest)
        .map(|wait| format!("{}", wait.as_secs_f64() / scale))
}

/// The gateway's time-to-first-token objectives (its defaults, in engine time) in wall
/// milliseconds under `scale`: what it judges answers by, and the interactive tier's lateness
/// that keeps its reserve (`--interactive-reserve`).
pub(crate) fn wall_objectives(scale: f64) -> String {
    wall_ms(scale, |slo| slo.ttft)
}

/// The gateway's objectives read by `field` (its defaults, in engine time), in wall
/// milliseconds under `scale`, by tier (0: none).
pub(crate) fn wall_ms(scale: f64, field: fn(sluice_core::slo::Slo) -> Option<Duration>) -> String {
    let slos = Slos::default();
    sluice_core::admission::Tier::ALL
        .map(|tier| {
            field(slos.of(tier))
                .map_or(0, |t| (t.as_secs_f64() * 1000.0 / scale).round() as u64)
                .to_string()
        })
        .join(",")
}

/// The default configuration's flags (`sluice`): the load poll and the queue's timers in
/// engine time.
pub fn default_flags(time_scale: f64) -> Vec<String> {
    let mut flags = vec!["--load-monitor-interval".to_string(), load_poll(time_scale)];
    flags.extend(queue_timers(time_scale));
    flags
}

/// SMG with its defaults (its cache_aware policy: the overhead benchmark's round robin is for
/// comparing costs) but the scenario's load poll (`load_poll`).
pub fn smg_config(time_scale: f64) -> Template {
    let mut smg = crate::overhead::smg_template();
    if let Some(at) = smg.argv.iter().position(|a| a == "--policy") {
        smg.argv.drain(at..at + 2);
    }
    smg.argv
        .extend(["--load-monitor-interval".to_string(), load_poll(time_scale)]);
    smg
}

/// The configurations: `sluice` with its defaults first (only the scenario's load poll and its
/// queue timers in engine time given: `queue_timers`), sluice shedding, the plain proxy, and SMG
/// with its defaults when it is installed; every one but the plain proxy with the scenario's
/// load poll (`load_poll`).
pub fn default_configs(exe: &Path, time_scale: f64) -> Vec<Template> {
    let defaults = default_flags(time_scale);
    let defaults: Vec<&str> = defaults.iter().map(String::as_str).collect();
    let shed: Vec<&str> = defaults
        .iter()
        .copied()
        .chain(["--worker-overload-shed"])
        .collect();
    let sluice = |name: &str, extra: &[&str]| quiet_sluice(name, exe, extra);
    let mut configs = vec![
        sluice("sluice", &defaults),
        sluice("sluice-shed", &shed),
        sluice("direct", &naive_flags(false)),
    ];
    if on_path("smg") {
        configs.push(smg_config(time_scale));
    }
    configs
}

/// Envoy in the scenario: `envoy`, a plain round-robin Envoy, and `envoy-epp`, Envoy in front
/// of `sluice epp` with the same flags as `sluice` (the defaults, the scenario's load poll and
/// its queue timers in engine time).
pub fn envoy_configs(exe: &Path, time_scale: f64, envoy: PathBuf) -> Vec<Template> {
    let mut flags = vec![
        "--log-level".to_string(),
        "warn".to_string(),
        "--load-monitor-interval".to_string(),
        load_poll(time_scale),
    ];
    flags.extend(queue_timers(time_scale));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    vec![
        crate::overhead::envoy_plain(envoy.clone()),
        crate::overhead::sluice_epp_template("envoy-epp", exe, &flags, envoy),
    ]
}

/// The liveness scenario's gateways, each with its defaults: `sluice`, `envoy-epp` (the picker
/// behind Envoy, when Envoy is here), `smg` (when on the PATH) and `direct` (round robin, no
/// protection). Logging only warnings keeps sluice's veto lines, which the scenario reads.
pub fn liveness_configs(exe: &Path, envoy: Option<PathBuf>) -> Vec<Template> {
    let mut configs = vec![quiet_sluice("sluice", exe, &[])];
    if let Some(envoy) = envoy {
        configs.push(crate::overhead::sluice_epp_template(
            "envoy-epp",
            exe,
            &["--log-level", "warn"],
            envoy,
        ));
    }
    if on_path("smg") {
        configs.push(smg_config(1.0));
    }
    configs.push(quiet_sluice("direct", exe, &naive_flags(false)));
    configs
}

/// sluice with `extra` flags, logging only warnings: a log line per veto is kept, one per
/// request is not.
pub fn quiet_sluice(name: &str, exe: &Path, extra: &[&str]) -> Template {
    let argv: Vec<&str> = ["--log-level", "warn"]
        .iter()
        .chain(extra)
        .copied()
        .collect();
    crate::overhead::sluice_template(name, exe, &argv)
}

/// The flags of a gateway that only spreads requests: round robin, no gateway queue, no retries,
/// no health checks, no circuit breaker, no overload or liveness vetoes. With `keep_unreachable`, the liveness
/// checker stays on without its wedge and stale rules, so a worker whose connections fail is
/// left out after 2 s of silence (and an unresponsive one after 5 s): the `direct` of earlier
/// runs, kept as `direct-unreachable` for the incident scenarios.
pub fn naive_flags(keep_unreachable: bool) -> Vec<&'static str> {
    let mut flags = vec![
        "--policy",
        "round_robin",
        "--queue-size",
        "0",
        "--disable-worker-overload-protection",
        "--disable-health-check",
        "--disable-circuit-breaker",
        "--disable-retries",
        "--disable-adapter-routing",
    ];
    if keep_unreachable {
        flags.extend(["--worker-wedge-secs", "0", "--worker-stale-secs", "0"]);
    } else {
        flags.push("--disable-liveness-checks");
    }
    flags
}

/// A gateway configuration, running.
pub struct Gateway {
    proc: Proc,
    pub url: String,
}

impl Gateway {
    pub async fn start(
        template: &Template,
        workers: &[String],
        out_dir: &Path,
    ) -> Result<Self, ScenarioError> {
        let port = free_ports(1)?;
        let argv =
            template
                .launch(port, workers, out_dir)
                .map_err(|source| ScenarioError::Write {
                    path: out_dir.into(),
                    source,
                })?;
        let mut proc = Proc::spawn(Launch {
            name: &template.name,
            argv: &argv,
            core: None,
            log_dir: out_dir,
        })?;
        wait_until_answering(&mut proc, loopback(port)).await?;
        Ok(Self {
            proc,
            url: format!("http://{}", loopback(port)),
        })
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// Resident memory now and at its peak, in bytes.
    pub fn rss(&self) -> Result<(u64, u64), ProcError> {
        self.proc.rss()
    }

    /// CPU time used so far.
    pub fn cpu(&self) -> Result<Duration, ProcError> {
        self.proc.cpu()
    }

    pub async fn stop(self) {
        self.proc.stop(Duration::from_secs(10)).await;
    }
}

/// One measured point: a configuration at an offered rate, in engine time.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub config: String,
    /// Offered requests per engine-second.
    pub offered: f64,
    /// Completed within every objective, per engine-second.
    pub goodput: f64,
    pub report: Report,
    pub engines: EngineTotals,
    /// A sluice gateway's own prediction error over the point (`--policy predicted` learns and
    /// judges its predictions whatever the policy).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prediction: Option<PredictionError>,
}

/// The plan's tiers with objectives converted to wall time under its scale.
pub(crate) fn wall_tiers(plan: &ScenarioPlan) -> Vec<Tier> {
    let scale = plan.time_scale;
    let wall = |d: Option<Duration>| d.map(|d| d.div_f64(scale));
    plan.tiers
        .clone()
        .into_iter()
        .map(|t| Tier {
            slo: Slo {
                ttft: wall(t.slo.ttft),
                tpot: wall(t.slo.tpot),
                deadline: wall(t.slo.deadline),
            },
            ..t
        })
        .collect()
}

/// How long the client waits for an answer: the batch tier's deadline (120 engine-seconds),
/// after which no request can meet any objective, so waiting longer would only lengthen the run.
fn give_up_after(plan: &ScenarioPlan) -> Duration {
    let scale = plan.time_scale;
    let longest = plan
        .tiers
        .iter()
        .filter_map(|t| t.slo.deadline)
        .max()
        .unwrap_or(Duration::from_secs(120));
    longest.div_f64(scale).max(Duration::from_secs(1))
}

/// The scenario's load against `url`: arrivals on `schedule` (wall requests per second) for
/// `duration` of wall time, with the plan's mix, client and seed and the tiers in wall time.
pub(crate) fn load_plan(
    plan: &ScenarioPlan,
    url: &str,
    schedule: Schedule,
    duration: Duration,
) -> RunPlan {
    let path = match plan.api {
        Api::Completions => "/v1/completions",
        Api::Chat { .. } => "/v1/chat/completions",
    };
    RunPlan {
        adapters: plan.adapters.clone(),
        url: format!("{url}{path}"),
        model: plan.fleet.model.clone(),
        api: plan.api,
        schedule,
        process: Process::Poisson,
        seed: plan.seed,
        max_requests: usize::MAX,
        duration,
        mix: plan.mix,
        tiers: wall_tiers(plan),
        tenants: 4,
        tenant_keys: Vec::new(),
        client: plan.client,
        patience: crate::client::Patience::default(),
        stream: true,
        closed_loop: None,
        request_timeout: give_up_after(plan),
        starts_at: None,
    }
}

/// Offers `rate` requests per engine-second to `gateway` for the plan's window and measures it.
pub async fn measure(
    plan: &ScenarioPlan,
    fleet: &SimFleet,
    config: &str,
    url: &str,
    rate: f64,
) -> Result<Point, ScenarioError> {
    let scale = plan.time_scale;
    let before = fleet.totals().await;
    let run = load_plan(
        plan,
        url,
        Schedule::constant(rate * scale),
        plan.window.div_f64(scale),
    );
    let (_, report) = execute(&run).await?;
    fleet.drain(Duration::from_secs(120)).await?;
    let engines = fleet.totals().await.since(before);
    Ok(Point {
        config: config.into(),
        offered: report.offered_rps / scale,
        goodput: report.goodput_rps / scale,
        report,
        engines,
        prediction: PredictionError::read(url).await,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value after `--load-monitor-interval` in `config`'s command, if any.
    fn poll_of(config: &Template) -> Option<&str> {
        let at = config
            .argv
            .iter()
            .position(|a| a == "--load-monitor-interval")?;
        config.argv.get(at + 1).map(String::as_str)
    }

    #[test]
    fn every_gateway_gets_the_same_whole_second_load_poll_smg_included() {
        assert_eq!(load_poll(4.0), "3", "10 engine-s at time scale 4, rounded");
        assert_eq!(load_poll(1.0), "10");
        assert_eq!(load_poll(40.0), "1", "never under a second");
        assert_eq!(poll_of(&smg_config(4.0)), Some("3"));
        assert!(
            !smg_config(4.0).argv.iter().any(|a| a == "--policy"),
            "SMG with its own default policy"
        );
        for config in default_configs(Path::new("/bin/sluice"), 4.0)
            .iter()
            .filter(|c| c.name != "direct")
        {
            assert_eq!(poll_of(config), Some("3"), "{}", config.name);
        }
    }

    #[test]
    fn the_queue_timers_and_the_objectives_they_follow_are_the_defaults_in_engine_time() {
        assert_eq!(
            queue_timers(4.0),
            [
                "--codel-target-ms-by-tier",
                "50,250,7500",
                "--codel-interval-ms",
                "1250",
                "--queue-timeout-by-tier",
                "0.375,1.125,15",
                "--slo-ttft-ms-by-tier",
                "500,1250,0"
            ]
        );
        assert_eq!(wall_objectives(1.0), "2000,5000,0");
        assert!(queue_timers(1.0).is_empty(), "at full speed, the defaults");
        let at_full_speed = default_configs(Path::new("/bin/sluice"), 1.0);
        assert!(!at_full_speed[0]
            .argv
            .iter()
            .any(|a| a.starts_with("--codel")));
    }

    #[test]
    fn the_defaults_come_first_with_nothing_but_the_poll_given() {
        let configs = default_configs(Path::new("/bin/sluice"), 4.0);
        let first = &configs[0];
        assert_eq!(first.name, "sluice");
        let flags: Vec<&str> = first
            .argv
            .iter()
            .map(String::as_str)
            .filter(|a| a.starts_with("--"))
            .collect();
        for flag in flags {
            assert!(
                [
                    "--load-monitor-interval",
                    "--codel-target-ms-by-tier",
                    "--codel-interval-ms",
                    "--queue-timeout-by-tier",
                    "--slo-ttft-ms-by-tier",
                    "--log-level",
                    "--host",
                    "--port",
                    "--worker-urls"
                ]
                .contains(&flag),
                "the defaults are given {flag}"
            );
        }
    }
}
