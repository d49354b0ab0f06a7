//! `overload-sweep`: the fleet's capacity C first (the highest rate at which `direct` keeps at
//! least 90% of requests within their objectives), then every configuration at 0.25x .. 4x C —
//! one goodput-versus-offered-load curve each, as a table and an SVG.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{measure, plot, Gateway, Point, ScenarioError, ScenarioPlan, SimFleet};

/// Share of requests within their objectives that counts as "serving".
const CAPACITY_ATTAINMENT: f64 = 0.9;

/// The sweep's result.
#[derive(Debug, Clone, Serialize)]
pub struct SweepReport {
    /// C, requests per engine-second.
    pub capacity: f64,
    pub levels: Vec<f64>,
    pub time_scale: f64,
    pub window_engine_secs: f64,
    pub points: Vec<Point>,
    pub svg: Option<PathBuf>,
}

pub(super) fn attainment(p: &Point) -> f64 {
    let r = &p.report;
    if r.requests == 0 {
        0.0
    } else {
        r.goodput_rps * r.window_secs / r.requests as f64
    }
}

/// Doubles the rate until `direct` misses, then bisects between the last rate it served and the
/// first it did not.
async fn capacity(
    plan: &ScenarioPlan,
    fleet: &SimFleet,
    direct: &Gateway,
) -> Result<f64, ScenarioError> {
    search_capacity(plan.quick, |rate| {
        measure(plan, fleet, "direct", &direct.url, rate)
    })
    .await
}

/// The capacity search over any way of measuring a rate (`probe`).
pub(super) async fn search_capacity<F, Fut>(quick: bool, mut probe: F) -> Result<f64, ScenarioError>
where
    F: FnMut(f64) -> Fut,
    Fut: std::future::Future<Output = Result<Point, ScenarioError>>,
{
    let mut served = 0.0;
    let mut missed = None;
    // A small engine serves a few requests per engine-second; start near there (a quick run
    // starts higher, at the cost of a coarser figure for very small engines).
    // Up from there while rates are served, or down while they are missed (a workload of long
    // prompts may be served only well below the start), until one of each is known.
    let mut rate = if quick { 16.0 } else { 4.0 };
    for _ in 0..12 {
        let p = probe(rate).await?;
        tracing::info!(rate, attainment = attainment(&p), "capacity probe");
        if attainment(&p) >= CAPACITY_ATTAINMENT {
            served = rate;
            if missed.is_some() {
                break;
            }
            rate *= 2.0;
        } else {
            missed = Some(rate);
            if served > 0.0 {
                break;
            }
            rate /= 2.0;
        }
    }
    let Some(mut high) = missed else {
        return Ok(served);
    };
    let mut low = served;
    for _ in 0..if quick { 1 } else { 3 } {
        let mid = (low + high) / 2.0;
        let p = probe(mid).await?;
        tracing::info!(rate = mid, attainment = attainment(&p), "capacity probe");
        if attainment(&p) >= CAPACITY_ATTAINMENT {
            low = mid;
        } else {
            high = mid;
        }
    }
    Ok(low.max(f64::MIN_POSITIVE))
}

/// C per engine, remembered in the output directory with what it depends on, so that an incident
/// scenario run after a sweep (or after another incident) need not search again.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub(super) struct Memo {
    engine_args: Vec<String>,
    mix: crate::run::Mix,
    time_scale: f64,
    seed: u64,
    per_engine: f64,
}

impl Memo {
    fn new(plan: &ScenarioPlan, capacity: f64) -> Self {
        Self {
            engine_args: plan.engine_args.clone(),
            mix: plan.mix,
            time_scale: plan.time_scale,
            seed: plan.seed,
            per_engine: capacity / plan.engines.max(1) as f64,
        }
    }

    fn path(plan: &ScenarioPlan) -> PathBuf {
        plan.out_dir.join("capacity.json")
    }

    /// The remembered C of `plan`'s fleet, if it was measured for the same engines and load.
    pub(super) fn recall(plan: &ScenarioPlan) -> Option<f64> {
        let text = std::fs::read(Self::path(plan)).ok()?;
        let memo: Memo = serde_json::from_slice(&text).ok()?;
        (Memo {
            per_engine: memo.per_engine,
            ..Memo::new(plan, 0.0)
        } == memo)
            .then_some(memo.per_engine * plan.engines as f64)
    }

    pub(super) fn keep(plan: &ScenarioPlan, capacity: f64) -> Result<(), ScenarioError> {
        let path = Self::path(plan);
        let json =
            serde_json::to_vec_pretty(&Memo::new(plan, capacity)).expect("a memo serializes");
        std::fs::write(&path, json).map_err(|source| ScenarioError::Write { path, source })
    }
}

/// C of `plan`'s fleet: as given, or remembered from an earlier run on the same engines and
/// load, else measured on `direct` and remembered.
pub async fn fleet_capacity(plan: &ScenarioPlan) -> Result<f64, ScenarioError> {
    if let Some(c) = plan.capacity {
        return Ok(c);
    }
    if let Some(c) = Memo::recall(plan) {
        tracing::info!(capacity = c, "capacity from an earlier run");
        return Ok(c);
    }
    let direct = plan
        .configs
        .iter()
        .find(|t| t.name == "direct")
        .ok_or(ScenarioError::NoDirect)?;
    let fleet = SimFleet::start(plan).await?;
    let measured = async {
        let gateway = Gateway::start(direct, &fleet.workers, &plan.out_dir).await?;
        let c = capacity(plan, &fleet, &gateway).await;
        gateway.stop().await;
        c
    }
    .await;
    fleet.stop().await;
    let c = measured?;
    Memo::keep(plan, c)?;
    Ok(c)
}

pub async fn overload_sweep(plan: &ScenarioPlan) -> Result<SweepReport, ScenarioError> {
    let levels: Vec<f64> = if plan.quick {
        vec![1.0, 2.0, 3.0]
    } else {
        vec![0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0]
    };
    let fleet = SimFleet::start(plan).await?;
    // C as given; a quick run reuses it from an earlier run on the same engines and load.
    let known = plan
        .capacity
        .or_else(|| plan.quick.then(|| Memo::recall(plan)).flatten());
    let result = sweep(plan, &fleet, &levels, known).await;
    fleet.stop().await;
    let (capacity, points) = result?;
    Memo::keep(plan, capacity)?;
    let svg = plan.out_dir.join("overload-sweep.svg");
    draw(&svg, capacity, &points)?;
    Ok(SweepReport {
        capacity,
        levels,
        time_scale: plan.time_scale,
        window_engine_secs: plan.window.as_secs_f64(),
        points,
        svg: Some(svg),
    })
}

/// Every configuration at every level (multiples of C). C is `known`, or measured on the first
/// configuration (`direct`).
pub(super) async fn sweep(
    plan: &ScenarioPlan,
    fleet: &SimFleet,
    levels: &[f64],
    known: Option<f64>,
) -> Result<(f64, Vec<Point>), ScenarioError> {
    let mut capacity_c = known;
    let mut points = Vec::new();
    for config in &plan.configs {
        let gateway = Gateway::start(config, &fleet.workers, &plan.out_dir).await?;
        let measured = async {
            let c = match capacity_c {
                Some(c) => c,
                None => capacity(plan, fleet, &gateway).await?,
            };
            capacity_c = Some(c);
            let mut mine = Vec::new();
            for level in levels {
                let mut p = measure(plan, fleet, &config.name, &gateway.url, level * c).await?;
                p.offered = level * c;
                mine.push(p);
            }
            Ok::<_, ScenarioError>(mine)
        }
        .await;
        gateway.stop().await;
        points.extend(measured?);
    }
    Ok((capacity_c.unwrap_or(0.0), points))
}

/// Goodput against offered load (as multiples of C), one line per configuration.
fn draw(path: &Path, capacity: f64, points: &[Point]) -> Result<(), ScenarioError> {
    let lines = plot::lines_by_config(points, capacity);
    plot::draw(
        path,
        &plot::Chart {
            caption: "Goodput under overload",
            x_desc: "offered load (x capacity C)",
            y_desc: "goodput (requests per engine-second within SLO)",
            lines: &lines,
            band: None,
            y_floor: capacity,
        },
    )
}

impl SweepReport {
    /// Markdown: one row per configuration and load.
    pub fn table(&self) -> String {
        let mut out = format!(
            "capacity C = {:.2} requests per engine-second (direct keeps >= 90% within SLO); \
             time scale {}, {} engine-s per point\n\n\
             | config | load | offered (req/s) | goodput (req/s) | goodput / C | within SLO | TTFT p99 (s) | rejected | reject p99 (ms) | retries | preemptions | wasted tokens | late engine steps |\n\
             | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
            self.capacity, self.time_scale, self.window_engine_secs
        );
        for p in &self.points {
            let r = &p.report;
            let _ = writeln!(
                out,
                "| {} | {:.2}x | {:.2} | {:.2} | {:.0}% | {:.0}% | {:.2} | {:.0}% | {:.1} | {:.2} | {} | {} | {:.1}% |",
                p.config,
                p.offered / self.capacity,
                p.offered,
                p.goodput,
                100.0 * p.goodput / self.capacity,
                100.0 * attainment(p),
                r.ttft_p99 * self.time_scale,
                100.0 * r.rejection_rate,
                r.time_to_reject_p99 * 1e3,
                r.retry_amplification,
                p.engines.preemptions,
                p.engines.wasted_tokens,
                100.0 * p.engines.late_share(),
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::goodput::{summarize, Tier};
    use crate::scenario::EngineTotals;
    use std::time::Duration;

    fn point(config: &str, offered: f64, goodput: f64) -> Point {
        let tiers: Vec<Tier> = Vec::new();
        let mut report = summarize(&[], &tiers, Duration::from_secs(10));
        report.goodput_rps = goodput;
        Point {
            config: config.into(),
            offered,
            goodput,
            report,
            engines: EngineTotals::default(),
            prediction: None,
        }
    }

    #[tokio::test]
    async fn the_capacity_search_goes_down_when_its_first_rate_is_missed() {
        let probe = |rate: f64| async move {
            let mut p = point("direct", rate, 0.0);
            p.report.requests = 100;
            p.report.window_secs = 10.0;
            // Every request within objectives up to 3 a second, half of them above.
            p.report.goodput_rps = if rate <= 3.0 { 10.0 } else { 5.0 };
            Ok(p)
        };
        // 4 missed, 2 served; then 3 served, 3.5 and 3.25 missed.
        assert_eq!(search_capacity(false, probe).await.unwrap(), 3.0);
        // Up from 16 the quick way: 16 and 8 missed, 4 missed, 2 served, then 3 served.
        assert_eq!(search_capacity(true, probe).await.unwrap(), 3.0);
    }

    #[test]
    fn the_plot_is_an_svg_with_one_line_per_configuration() {
        let dir = std::env::temp_dir().join(format!("sluice-sweep-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("sweep.svg");
        let points = vec![
            point("direct", 5.0, 5.0),
            point("direct", 10.0, 9.5),
            point("direct", 20.0, 2.0),
            point("sluice-shed", 5.0, 5.0),
            point("sluice-shed", 10.0, 9.6),
            point("sluice-shed", 20.0, 9.4),
        ];
        draw(&path, 10.0, &points).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80.min(svg.len())]);
        assert!(svg.contains("direct") && svg.contains("sluice-shed"));
        assert_eq!(svg.matches("<circle").count(), 6, "one marker per point");
        assert!(svg.contains("Goodput under overload"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
