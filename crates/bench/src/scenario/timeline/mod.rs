//! Incident scenarios: steady load on a fresh fleet per configuration, something goes wrong for
//! a while, then it stops. `spike` triples the offered load; `worker-crash` kills one engine
//! with SIGKILL and starts it again; `frozen-engine` wedges one engine's core inside a step (its
//! HTTP side keeps answering, its gauges stand at the last step's values, `sluice_sim::Fault::Wedge`); `slow-worker` makes one engine's steps four times longer.
//!
//! Each run reports goodput over time, failed and refused requests, when the gateway stopped
//! sending the target engine work (from the engine's own arrival counter, read every 50 ms;
//! for a killed engine, from the last request that failed while it was down), when it sent it
//! work again after the restore, and how long the fleet took to get back within objectives.

mod account;
mod table;

use std::time::Duration;

use serde::Serialize;
use sluice_sim::Fault;
use tokio::time::Instant;

pub use account::{Bucket, Phases};

use super::{
    load_plan, plot, wall_tiers, EngineTotals, Gateway, ScenarioError, ScenarioPlan, SimFleet,
};
use crate::arrivals::{Schedule, Segment};
use crate::goodput::{Outcome, Tier};
use crate::overhead::Template;
use crate::run::execute;
use account::Reading;

/// The engine the incident happens to.
const TARGET: usize = 0;
/// How much the spike multiplies the offered load by.
const SPIKE: f64 = 3.0;
/// How much longer a slow worker's steps take.
const SLOWDOWN: f64 = 4.0;
/// How often the target's arrival counter is read.
const READ_EVERY: Duration = Duration::from_millis(50);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Incident {
    Spike,
    WorkerCrash,
    FrozenEngine,
    SlowWorker,
    /// Nothing goes wrong: one request in twenty is a 32k-128k-token prompt (the long-context
    /// mix), whose prefill keeps an engine busy for seconds without a token. A gateway must not
    /// read that as a wedged engine.
    LongContext,
}

impl Incident {
    pub fn name(self) -> &'static str {
        match self {
            Incident::Spike => "spike",
            Incident::WorkerCrash => "worker-crash",
            Incident::FrozenEngine => "frozen-engine",
            Incident::SlowWorker => "slow-worker",
            Incident::LongContext => "long-context",
        }
    }

    /// The share of the fleet's capacity offered before and after the incident. A spike starts
    /// from more, so that tripled it is well past capacity.
    pub fn base_load(self) -> f64 {
        match self {
            Incident::Spike => 0.6,
            _ => 0.5,
        }
    }

    /// The base loads (x C) a run is asked for at `loads` (`--load`): the loads themselves,
    /// but for a spike, whose peak each is; the scenario's own base load without them.
    pub fn base_loads(self, loads: Option<&[f64]>) -> Vec<f64> {
        match loads {
            None => vec![self.base_load()],
            Some(loads) if self == Incident::Spike => loads.iter().map(|l| l / SPIKE).collect(),
            Some(loads) => loads.to_vec(),
        }
    }

    /// Whether the target's own counter shows when the gateway stopped sending it work.
    fn counter_readable(self) -> bool {
        matches!(
            self,
            Incident::FrozenEngine | Incident::SlowWorker | Incident::LongContext
        )
    }
}

/// Wall-clock lengths of the three phases (the gateways' own timers are not scaled).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Timing {
    pub before: Duration,
    pub during: Duration,
    pub after: Duration,
    pub bucket: Duration,
}

impl Timing {
    /// The phases, in wall seconds, sliced every 2 s (or the shortest phase).
    pub fn phases_of(before: f64, during: f64, after: f64) -> Option<Self> {
        let secs = |x: f64| Duration::try_from_secs_f64(x).ok();
        Some(Self {
            before: secs(before)?,
            during: secs(during).filter(|d| !d.is_zero())?,
            after: secs(after)?,
            // No longer than a phase, so each phase has slices of its own.
            bucket: [secs(before)?, secs(during)?, secs(after)?]
                .into_iter()
                .filter(|d| !d.is_zero())
                .fold(Duration::from_secs(2), Duration::min),
        })
    }

    pub fn new(quick: bool) -> Self {
        let secs = Duration::from_secs;
        if quick {
            Self {
                before: secs(4),
                during: secs(10),
                after: secs(10),
                bucket: secs(2),
            }
        } else {
            Self {
                before: secs(10),
                during: secs(20),
                after: secs(20),
                bucket: secs(2),
            }
        }
    }

    fn phases(&self) -> Phases {
        Phases {
            fault: self.before,
            restore: self.before + self.during,
            end: self.before + self.during + self.after,
        }
    }
}

/// One configuration through the incident.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub config: String,
    pub requests: u64,
    /// Within objectives, over the whole run.
    pub attainment: f64,
    /// Within objectives, of the requests due during the incident.
    pub attainment_during: f64,
    pub failed: u64,
    pub refused: u64,
    /// Of the requests due during the incident and completed, engine seconds.
    pub ttft_p99_during: f64,
    /// Time per output token after the first, of the same requests, engine seconds.
    pub tpot_p99_during: f64,
    /// Wall seconds from the fault to the last request the target got (`None`: never).
    pub excluded_after: Option<f64>,
    /// Wall seconds from the restore to the target's first request after it.
    pub rejoined_after: Option<f64>,
    /// The target's share of the requests due during the incident.
    pub target_share: Option<f64>,
    /// Wall seconds from the restore to the first slice again >= 90% within objectives.
    pub recovered_after: Option<f64>,
    pub engines: EngineTotals,
    /// Vetoes sluice logged (`worker vetoed by liveness`, `worker vetoed: overloaded`), read from
    /// its log after the run; `None` for a gateway that is not sluice.
    pub vetoes: Option<Vetoes>,
    pub buckets: Vec<Bucket>,
    /// Over the whole run: requests offered and within objectives per engine-second, and the
    /// time to a first token of those answered (engine seconds).
    pub offered: f64,
    pub goodput: f64,
    pub ttft_p50: f64,
    pub ttft_p99: f64,
    /// A sluice gateway's prediction error over the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prediction: Option<super::PredictionError>,
}

/// The vetoes a sluice gateway logged over one run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Vetoes {
    pub liveness: u64,
    pub overload: u64,
}

impl Vetoes {
    /// Counts the veto lines of a sluice log (`None`: the log is not sluice's or is missing).
    fn in_log(config: &str, log: &std::path::Path) -> Option<Self> {
        if !config.starts_with("sluice") {
            return None;
        }
        let text = std::fs::read_to_string(log).ok()?;
        Some(Self {
            liveness: text.matches("worker vetoed by liveness").count() as u64,
            overload: text.matches("worker vetoed: overloaded").count() as u64,
        })
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct TimelineReport {
    pub incident: Incident,
    pub time_scale: f64,
    pub engines: usize,
    /// Requests per engine-second the fleet serves within objectives (C).
    pub capacity: f64,
    /// Offered before and after the incident, requests per engine-second.
    pub base_rate: f64,
    pub timing: Timing,
    pub rows: Vec<Row>,
    pub svg: Option<std::path::PathBuf>,
}

/// Runs `incident` for every configuration of `plan` against a fleet whose capacity is
/// `capacity` requests per engine-second, `base_load` x C offered before and after it.
pub async fn timeline(
    plan: &ScenarioPlan,
    incident: Incident,
    capacity: f64,
    timing: Timing,
    base_load: f64,
) -> Result<TimelineReport, ScenarioError> {
    let base_rate = base_load * capacity;
    let mut rows = Vec::new();
    for config in &plan.configs {
        let row = one_config(plan, incident, config, base_rate, &timing).await?;
        tracing::info!(config = %config.name, attainment = row.attainment, "incident run");
        rows.push(row);
    }
    let svg = match plan.loads {
        Some(_) => format!("{}-{base_load:.2}x.svg", incident.name()),
        None => format!("{}.svg", incident.name()),
    };
    let svg = plan.out_dir.join(svg);
    draw(&svg, incident, plan.time_scale, &timing, &rows)?;
    Ok(TimelineReport {
        incident,
        time_scale: plan.time_scale,
        engines: plan.engines,
        capacity,
        base_rate,
        timing,
        rows,
        svg: Some(svg),
    })
}

async fn one_config(
    plan: &ScenarioPlan,
    incident: Incident,
    config: &Template,
    base_rate: f64,
    timing: &Timing,
) -> Result<Row, ScenarioError> {
    let mut fleet = SimFleet::start(plan).await?;
    let result = async {
        let gateway = Gateway::start(config, &fleet.workers, &plan.out_dir).await?;
        let load = start_load(plan, incident, base_rate, timing, &gateway.url);
        let run = drive(&mut fleet, incident, timing, load).await;
        let prediction = super::PredictionError::read(&gateway.url).await;
        gateway.stop().await;
        let (outcomes, readings) = run?;
        let run = Run {
            config: &config.name,
            incident,
            scale: plan.time_scale,
            timing,
            tiers: &wall_tiers(plan),
        };
        let vetoes = Vetoes::in_log(
            &config.name,
            &plan.out_dir.join(format!("{}.log", config.name)),
        );
        Ok(Row {
            vetoes,
            prediction,
            ..run.row(&outcomes, &readings, fleet.totals().await)
        })
    }
    .await;
    fleet.stop().await;
    result
}

type Load = tokio::task::JoinHandle<Result<Vec<Outcome>, crate::arrivals::ArrivalError>>;

/// Starts the load: the base rate throughout, tripled during a spike.
fn start_load(
    plan: &ScenarioPlan,
    incident: Incident,
    base_rate: f64,
    timing: &Timing,
    url: &str,
) -> Load {
    let phases = timing.phases();
    let mut schedule = Schedule::constant(base_rate * plan.time_scale);
    if incident == Incident::Spike {
        schedule.segments.push(Segment::Step {
            start: phases.fault,
            end: phases.restore,
            factor: SPIKE,
        });
    }
    let run = load_plan(plan, url, schedule, phases.end);
    tokio::spawn(async move { execute(&run).await.map(|(o, _)| o) })
}

/// While the load runs: reads the target's counter, and starts and ends the incident on time.
async fn drive(
    fleet: &mut SimFleet,
    incident: Incident,
    timing: &Timing,
    mut load: Load,
) -> Result<(Vec<Outcome>, Vec<Reading>), ScenarioError> {
    let phases = timing.phases();
    let start = Instant::now();
    let mut readings = Vec::new();
    let (mut faulted, mut restored) = (false, false);
    let mut tick = tokio::time::interval(READ_EVERY);
    loop {
        tokio::select! {
            done = &mut load => {
                let outcomes = done.map_err(ScenarioError::Join)??;
                return Ok((outcomes, readings));
            }
            _ = tick.tick() => {}
        }
        let at = start.elapsed();
        if !faulted && at >= phases.fault {
            begin(fleet, incident).await?;
            faulted = true;
        } else if faulted && !restored && at >= phases.restore {
            end(fleet, incident).await?;
            restored = true;
        }
        readings.push(Reading {
            at: start.elapsed(),
            received: fleet.received(TARGET).await,
        });
    }
}

async fn begin(fleet: &mut SimFleet, incident: Incident) -> Result<(), ScenarioError> {
    match incident {
        Incident::Spike | Incident::LongContext => Ok(()),
        Incident::WorkerCrash => {
            fleet.kill(TARGET).await;
            Ok(())
        }
        Incident::FrozenEngine => {
            fleet
                .fault(
                    TARGET,
                    &Fault::Wedge {
                        polls: Default::default(),
                    },
                )
                .await
        }
        Incident::SlowWorker => fleet.fault(TARGET, &Fault::Slow { factor: SLOWDOWN }).await,
    }
}

async fn end(fleet: &mut SimFleet, incident: Incident) -> Result<(), ScenarioError> {
    match incident {
        Incident::Spike | Incident::LongContext => Ok(()),
        Incident::WorkerCrash => fleet.restart(TARGET).await,
        Incident::FrozenEngine | Incident::SlowWorker => fleet.fault(TARGET, &Fault::Clear).await,
    }
}

/// What one configuration's run was, for summing it up.
struct Run<'a> {
    config: &'a str,
    incident: Incident,
    scale: f64,
    timing: &'a Timing,
    tiers: &'a [Tier],
}

impl Run<'_> {
    fn row(&self, outcomes: &[Outcome], readings: &[Reading], engines: EngineTotals) -> Row {
        use account::*;
        let Run {
            config,
            incident,
            scale,
            timing,
            tiers,
        } = *self;
        let phases = timing.phases();
        let buckets = buckets(outcomes, tiers, timing.bucket, phases.end);
        let during: Vec<Outcome> = outcomes
            .iter()
            .filter(|o| phases.during(o.due))
            .cloned()
            .collect();
        let count =
            |set: &[Outcome], f: Fate| set.iter().filter(|o| fate(o, tiers) == f).count() as u64;
        let share = |set: &[Outcome]| {
            if set.is_empty() {
                0.0
            } else {
                count(set, Fate::Good) as f64 / set.len() as f64
            }
        };
        // The 99th percentile of a time of the answers completed during the incident.
        let p99_during = |time: fn(&Outcome) -> Option<Duration>| {
            let times: Vec<f64> = during
                .iter()
                .filter(|o| o.status == 200 && o.completed)
                .filter_map(|o| time(o).map(|t| t.as_secs_f64() * scale))
                .collect();
            crate::stats::percentile(&times, 0.99)
        };
        let whole = crate::goodput::summarize(outcomes, tiers, phases.end);
        let arrived = arrivals(readings);
        let (excluded, share_of_target) =
            exclusion(incident, (&arrived, readings, outcomes), tiers, &phases);
        Row {
            config: config.into(),
            requests: outcomes.len() as u64,
            attainment: share(outcomes),
            attainment_during: share(&during),
            failed: count(outcomes, Fate::Failed),
            refused: count(outcomes, Fate::Refused),
            ttft_p99_during: p99_during(|o| o.ttft),
            tpot_p99_during: p99_during(Outcome::tpot),
            excluded_after: excluded,
            rejoined_after: (incident != Incident::Spike)
                .then(|| rejoined_after(&arrived, &phases))
                .flatten(),
            target_share: share_of_target,
            recovered_after: recovered_after(&buckets, phases.restore),
            engines,
            vetoes: None,
            buckets,
            offered: whole.offered_rps / scale,
            goodput: whole.goodput_rps / scale,
            ttft_p50: whole.ttft_p50 * scale,
            ttft_p99: whole.ttft_p99 * scale,
            prediction: None,
        }
    }
}

/// Goodput (requests per engine-second within objectives) over wall time, the incident shaded.
fn draw(
    path: &std::path::Path,
    incident: Incident,
    scale: f64,
    timing: &Timing,
    rows: &[Row],
) -> Result<(), ScenarioError> {
    let width = timing.bucket.as_secs_f64();
    let lines: Vec<(String, Vec<(f64, f64)>)> = rows
        .iter()
        .map(|r| {
            let line = r
                .buckets
                .iter()
                .map(|b| (b.start_secs + width / 2.0, b.good as f64 / width / scale))
                .collect();
            (r.config.clone(), line)
        })
        .collect();
    let phases = timing.phases();
    let caption = format!("Goodput through {}", incident.name());
    plot::draw(
        path,
        &plot::Chart {
            caption: &caption,
            x_desc: "wall seconds (requests by due time)",
            y_desc: "goodput (requests per engine-second within SLO)",
            lines: &lines,
            band: Some((phases.fault.as_secs_f64(), phases.restore.as_secs_f64())),
            y_floor: 1.0,
        },
    )
}
