//! `sluice bench scenario routing`: what each routing policy is worth on one fleet and one trace.
//!
//! Every point starts from cold: a fresh fleet (empty prefix caches) and a fresh gateway, so no
//! policy inherits the cache another one warmed (the trace is the same for all, from the seed,
//! so a warm cache would favour whoever ran second). C is measured the same way, on `direct`.
//! Per point: goodput, TTFT, the engines' prefix-cache hit rate (overall and per engine) and how
//! evenly the requests spread (the busiest engine's share against the mean).
//!
//! The engines publish their KV events and tokenize prompts as the simulated model (for every
//! configuration alike), so `sluice-cache-aware-precise` can score workers by the blocks their
//! engines hold: it is given the model's files and each worker's publisher in a discovery file
//! written for the fleet of its point.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::sweep::{attainment, search_capacity, Memo};
use super::{
    measure, plot, quiet_sluice, EngineTotals, Gateway, Point, ScenarioError, ScenarioPlan,
    SimFleet,
};
use crate::overhead::Template;

/// The loads measured, as multiples of C: below capacity, and past it.
pub const LOADS: [f64; 2] = [0.8, 1.2];

/// sluice's policies, by their `--policy` names.
const POLICIES: [&str; 5] = [
    "round_robin",
    "least_load",
    "power_of_two",
    "consistent_hash",
    "cache_aware",
];

/// The cache-aware policy scoring by the engines' KV events.
pub const PRECISE: &str = "sluice-cache-aware-precise";
/// Stand-ins in its command, filled for each point's fleet (`for_fleet`).
const MODEL_DIR: &str = "{model_dir}";
const DISCOVERY: &str = "{discovery}";

/// The configuration name of a gateway running `policy`.
fn config_name(gateway: &str, policy: &str) -> String {
    format!("{gateway}-{}", policy.replace('_', "-"))
}

/// The policies compared, each sluice with its defaults otherwise (load poll scaled with the
/// engines' clock), then SMG's round robin and cache-aware when SMG is installed. `direct` comes
/// first: it sets C.
pub fn configs(exe: &Path, time_scale: f64) -> Vec<Template> {
    let poll = super::load_poll(time_scale);
    let mut configs = vec![quiet_sluice("direct", exe, &super::naive_flags(false))];
    for policy in POLICIES {
        let name = config_name("sluice", policy);
        let flags = ["--load-monitor-interval", &poll, "--policy", policy];
        configs.push(quiet_sluice(&name, exe, &flags));
    }
    configs.push(precise(exe, &poll));
    // `predicted`, told the tiers' objectives in wall time (the others have no use for them).
    let ttft = super::wall_objectives(time_scale.max(1.0));
    let predicted = super::policy_configs("sluice", time_scale, |name, flags| {
        let flags: Vec<&str> = [
            "--load-monitor-interval",
            &poll,
            "--slo-ttft-ms-by-tier",
            &ttft,
        ]
        .into_iter()
        .chain(flags.iter().copied())
        .collect();
        quiet_sluice(name, exe, &flags)
    });
    configs.extend(
        predicted
            .into_iter()
            .filter(|c| c.name.ends_with("-predicted")),
    );
    if crate::overhead::on_path("smg") {
        for policy in ["round_robin", "cache_aware"] {
            let mut smg = super::smg_config(time_scale);
            smg.name = config_name("smg", policy);
            smg.argv
                .extend(["--policy".to_string(), policy.to_string()]);
            configs.push(smg);
        }
    }
    configs
}

/// The cache-aware policy with the model's files, its workers (and their publishers) from a
/// discovery file.
fn precise(exe: &Path, poll: &str) -> Template {
    let argv = [
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
        "--log-level",
        "warn",
        "--load-monitor-interval",
        poll,
        "--policy",
        "cache_aware",
        "--model-path",
        MODEL_DIR,
        "--discovery-file",
        DISCOVERY,
    ];
    Template {
        name: PRECISE.into(),
        argv: std::iter::once(exe.display().to_string())
            .chain(argv.iter().map(|a| a.to_string()))
            .collect(),
        launcher: crate::overhead::Launcher::Command,
    }
}

/// `config` for `fleet`: the precise configuration's model files and discovery file written
/// (each worker's spec naming its engine's publisher), the others as they are.
fn for_fleet(config: &Template, fleet: &SimFleet, out: &Path) -> Result<Template, ScenarioError> {
    if !config.argv.iter().any(|a| a == DISCOVERY) {
        return Ok(config.clone());
    }
    let write = |path: &Path, result: std::io::Result<()>| {
        result.map_err(|source| ScenarioError::Write {
            path: path.into(),
            source,
        })
    };
    let model_dir = out.join("model");
    write(
        &model_dir,
        sluice_sim::vocab::Vocab::new().write_model_dir(&model_dir, super::MODEL),
    )?;
    let specs: Vec<serde_json::Value> = fleet
        .workers
        .iter()
        .zip(&fleet.kv_endpoints)
        .map(|(url, events)| serde_json::json!({"url": url, "kv_events_endpoint": events}))
        .collect();
    let discovery = out.join(format!("{PRECISE}-workers.json"));
    let body = serde_json::to_vec(&specs).expect("specs serialize");
    write(&discovery, std::fs::write(&discovery, body))?;
    let mut config = config.clone();
    for arg in &mut config.argv {
        if arg == MODEL_DIR {
            *arg = model_dir.display().to_string();
        } else if arg == DISCOVERY {
            *arg = discovery.display().to_string();
        }
    }
    Ok(config)
}

/// One configuration at one load, and what each engine saw.
#[derive(Debug, Clone, Serialize)]
pub struct RoutingPoint {
    pub point: Point,
    pub per_engine: Vec<EngineTotals>,
}

impl RoutingPoint {
    /// The busiest engine's requests over the mean (1.0: perfectly even).
    pub fn busiest_over_mean(&self) -> f64 {
        let counts: Vec<f64> = self.per_engine.iter().map(|e| e.requests as f64).collect();
        let mean = counts.iter().sum::<f64>() / counts.len().max(1) as f64;
        let max = counts.iter().copied().fold(0.0, f64::max);
        if mean > 0.0 {
            max / mean
        } else {
            0.0
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct RoutingReport {
    pub mix: crate::run::Mix,
    /// Share of the trace's prompt tokens an earlier request already began with.
    pub prefix_sharing: f64,
    pub capacity: f64,
    pub engines: usize,
    pub time_scale: f64,
    pub window_engine_secs: f64,
    pub points: Vec<RoutingPoint>,
    pub svg: Option<PathBuf>,
}

/// Measures `config` at `rate` on a fleet and gateway of its own, stopped after.
pub(super) async fn cold_point(
    plan: &ScenarioPlan,
    config: &Template,
    rate: f64,
) -> Result<RoutingPoint, ScenarioError> {
    let fleet = SimFleet::start(plan).await?;
    let measured = async {
        let config = &for_fleet(config, &fleet, &plan.out_dir)?;
        let gateway = Gateway::start(config, &fleet.workers, &plan.out_dir).await?;
        let point = measure(plan, &fleet, &config.name, &gateway.url, rate).await;
        gateway.stop().await;
        Ok::<_, ScenarioError>(RoutingPoint {
            point: point?,
            per_engine: fleet.per_engine().await,
        })
    }
    .await;
    fleet.stop().await;
    measured
}

pub async fn routing(plan: &ScenarioPlan) -> Result<RoutingReport, ScenarioError> {
    let direct = plan
        .configs
        .iter()
        .find(|t| t.name == "direct")
        .ok_or(ScenarioError::NoDirect)?;
    let capacity = match plan.capacity.or_else(|| Memo::recall(plan)) {
        Some(c) => c,
        None => {
            let c = search_capacity(plan.quick, |rate| async move {
                Ok(cold_point(plan, direct, rate).await?.point)
            })
            .await?;
            Memo::keep(plan, c)?;
            c
        }
    };
    let mut points = Vec::new();
    let loads = plan.loads.clone().unwrap_or(LOADS.to_vec());
    for config in &plan.configs {
        for &load in &loads {
            let mut p = cold_point(plan, config, load * capacity).await?;
            tracing::info!(
                config = %config.name,
                load,
                goodput = p.point.goodput,
                hit_rate = p.point.engines.hit_rate(),
                "routing point"
            );
            p.point.offered = load * capacity;
            points.push(p);
        }
    }
    let prefix_sharing = points
        .first()
        .map_or(0.0, |p| p.point.report.prefix_sharing);
    let svg = plan
        .out_dir
        .join(format!("routing-{}.svg", mix_name(plan.mix)));
    draw(&svg, capacity, &points)?;
    Ok(RoutingReport {
        mix: plan.mix,
        prefix_sharing,
        capacity,
        engines: plan.engines,
        time_scale: plan.time_scale,
        window_engine_secs: plan.window.as_secs_f64(),
        points,
        svg: Some(svg),
    })
}

fn mix_name(mix: crate::run::Mix) -> String {
    serde_json::to_value(mix)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}

/// Goodput against load, one line per configuration.
fn draw(path: &Path, capacity: f64, points: &[RoutingPoint]) -> Result<(), ScenarioError> {
    let lines = plot::lines_by_config(points.iter().map(|p| &p.point), capacity);
    plot::draw(
        path,
        &plot::Chart {
            caption: "Goodput by routing policy",
            x_desc: "offered load (x capacity C of direct)",
            y_desc: "goodput (requests per engine-second within SLO)",
            lines: &lines,
            band: None,
            y_floor: capacity,
        },
    )
}

impl RoutingReport {
    /// Markdown: one row per configuration and load.
    pub fn table(&self) -> String {
        let mut out = format!(
            "mix {}: {:.0}% of prompt tokens shared with an earlier request; {} engines; \
             C = {:.2} requests per engine-second (direct keeps >= 90% within SLO); time scale \
             {}, {} engine-s per point, every point from cold caches\n\n\
             | config | load | goodput (req/s) | goodput / arrived | within SLO | TTFT p50 / p99 (s) | prefix hit rate | per engine | busiest / mean | preemptions | rejected | late engine steps |\n\
             | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |\n",
            mix_name(self.mix),
            100.0 * self.prefix_sharing,
            self.engines,
            self.capacity,
            self.time_scale,
            self.window_engine_secs
        );
        for p in &self.points {
            let (point, r) = (&p.point, &p.point.report);
            let per_engine: Vec<String> = p
                .per_engine
                .iter()
                .map(|e| format!("{:.0}", 100.0 * e.hit_rate()))
                .collect();
            let _ = writeln!(
                out,
                "| {} | {:.1}x | {:.2} | {:.0}% | {:.0}% | {:.2} / {:.2} | {:.0}% | {} | {:.2} | {} | {:.0}% | {:.1}% |",
                point.config,
                point.offered / self.capacity,
                point.goodput,
                100.0 * r.goodput_rps / r.offered_rps.max(f64::MIN_POSITIVE),
                100.0 * attainment(point),
                r.ttft_p50 * self.time_scale,
                r.ttft_p99 * self.time_scale,
                100.0 * point.engines.hit_rate(),
                per_engine.join(" / "),
                p.busiest_over_mean(),
                point.engines.preemptions,
                100.0 * r.rejection_rate,
                100.0 * point.engines.late_share(),
            );
        }
        out + &super::prediction::foot(self.points.iter().map(|p| {
            (
                p.point.config.as_str(),
                p.point.offered / self.capacity,
                p.point.prediction.as_ref(),
            )
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine(requests: u64, queries: u64, hits: u64) -> EngineTotals {
        EngineTotals {
            requests,
            prefix_queries: queries,
            prefix_hits: hits,
            ..EngineTotals::default()
        }
    }

    #[test]
    fn every_policy_is_compared_and_direct_comes_first() {
        let configs = configs(Path::new("/bin/sluice"), 4.0);
        assert_eq!(configs[0].name, "direct");
        for policy in POLICIES {
            let name = config_name("sluice", policy);
            let config = configs.iter().find(|c| c.name == name).expect(&name);
            let at = config.argv.iter().position(|a| a == "--policy").unwrap();
            assert_eq!(config.argv[at + 1], policy);
        }
        for smg in configs.iter().filter(|c| c.name.starts_with("smg-")) {
            let policy = smg.name.trim_start_matches("smg-").replace('-', "_");
            assert!(smg.argv.contains(&policy), "{:?}", smg.argv);
        }
    }

    #[test]
    fn evenness_is_the_busiest_engine_over_the_mean() {
        let mut point = RoutingPoint {
            point: Point {
                config: "x".into(),
                offered: 1.0,
                goodput: 1.0,
                report: crate::goodput::summarize(&[], &[], std::time::Duration::from_secs(1)),
                engines: EngineTotals::default(),
                prediction: None,
            },
            per_engine: vec![engine(10, 100, 50), engine(30, 100, 0)],
        };
        assert_eq!(point.busiest_over_mean(), 1.5);
        point.per_engine = vec![engine(0, 0, 0); 2];
        assert_eq!(point.busiest_over_mean(), 0.0, "nothing served");
        assert!(
            RoutingReport {
                mix: crate::run::Mix::Shared,
                prefix_sharing: 0.88,
                capacity: 1.0,
                engines: 2,
                time_scale: 4.0,
                window_engine_secs: 60.0,
                points: vec![point],
                svg: None,
            }
            .table()
            .contains("mix shared: 88%"),
            "the table names the mix and its sharing"
        );
    }
}
