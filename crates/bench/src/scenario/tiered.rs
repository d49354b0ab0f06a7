//! `tiered-overload`: 1x .. 4x C with 20% interactive, 30% agent and 50% batch requests, each
//! naming its tier (`x-sluice-priority`, and SMG's `x-smg-priority`). Per configuration and load:
//! goodput against C, and each tier's share within its objectives — whether overload is spent on
//! the requests that matter most.

use std::fmt::Write;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use super::sweep::{attainment, sweep};
use super::{Point, ScenarioError, ScenarioPlan, SimFleet};
use crate::goodput::{Slo, Tier};
use crate::overhead::Template;
use sluice_core::admission::Tier as GatewayTier;

/// The three tiers of seed 003, objectives in engine time: the gateway's (`--slo-*-ms-by-tier`),
/// and a deadline for batch.
pub fn three_tiers() -> Vec<Tier> {
    let chat = |name: &str, share: f64, tier| Tier {
        name: name.into(),
        share,
        tenant: None,
        slo: Slo::gateways(tier),
    };
    vec![
        chat("interactive", 0.2, GatewayTier::Interactive),
        chat("agent", 0.3, GatewayTier::Agent),
        Tier {
            name: "batch".into(),
            share: 0.5,
            tenant: None,
            slo: Slo {
                deadline: Some(Duration::from_secs(120)),
                ..Slo::gateways(GatewayTier::Batch)
            },
        },
    ]
}

/// sluice with admission: requests wait in the gateway queue by tier, each tier at most its
/// time-to-first-token objective less the engine's own time to a first token (batch: its
/// deadline), and waiting that cannot help is shed by tier. Every request may ask for any tier.
/// Timers in wall time under `time_scale`.
pub fn tiered_config(exe: &Path, time_scale: f64) -> Template {
    admission_config(
        "sluice-tiers",
        exe,
        time_scale,
        &["--default-priority", "0"],
    )
}

/// `sluice-tiers` with each other policy `predicted` is measured against, and `predicted`
/// (`sluice-tiers` itself is cache_aware, the default).
pub fn tiered_policy_configs(exe: &Path, time_scale: f64) -> Vec<Template> {
    super::policy_configs("sluice-tiers", time_scale, |name, flags| {
        let flags: Vec<&str> = ["--default-priority", "0"]
            .into_iter()
            .chain(flags.iter().copied())
            .collect();
        admission_config(name, exe, time_scale, &flags)
    })
}

/// The gateway queue's size in the admission configurations: more than the waits by tier let
/// stand at these rates, so the timeouts and shedding decide, not the size.
pub const ADMISSION_QUEUE: usize = 1024;

/// sluice with the gateway queue (`ADMISSION_QUEUE`), shedding by tier, and `extra` flags.
pub(super) fn admission_config(
    name: &str,
    exe: &Path,
    time_scale: f64,
    extra: &[&str],
) -> Template {
    queue_config(name, exe, time_scale, ADMISSION_QUEUE, extra)
}

/// sluice with a gateway queue of `size`, shedding by tier, and `extra` flags.
pub(super) fn queue_config(
    name: &str,
    exe: &Path,
    time_scale: f64,
    size: usize,
    extra: &[&str],
) -> Template {
    let scale = time_scale.max(1.0);
    let size = size.to_string();
    let poll = super::load_poll(scale);
    // Batch waits out its deadline.
    let timeouts = super::wall_waits(scale, Duration::from_secs(120)).join(",");
    let objectives = super::wall_objectives(scale);
    let mut argv = vec![
        "--log-level",
        "warn",
        "--load-monitor-interval",
        &poll,
        "--worker-overload-shed",
        "--queue-size",
        &size,
        "--queue-timeout-by-tier",
        &timeouts,
        "--slo-ttft-ms-by-tier",
        &objectives,
    ];
    argv.extend_from_slice(extra);
    crate::overhead::sluice_template(name, exe, &argv)
}

/// SMG 1.13 with its priority scheduler: every request may ask for any class (its header,
/// `x-smg-priority`, is sent with sluice's), at most as many in flight as the fleet holds at its
/// waiting ceilings (2 x 64 running + 8 waiting per engine), the rest in its queue for at most
/// the agent tier's wait (SMG has one timeout for every class, in whole seconds: rounded, at
/// least 1). Timers in wall time.
pub fn smg_priority_config(engines: usize, time_scale: f64) -> Template {
    let scale = time_scale.max(1.0);
    let mut smg = super::smg_config(scale);
    smg.name = "smg-priority".into();
    let in_flight = (engines * (64 + 8)).to_string();
    let agent_wait = sluice_core::slo::Slos::default().queue_waits(Duration::MAX)[1];
    let timeout = ((agent_wait.as_secs_f64() / scale).round().max(1.0) as u64).to_string();
    smg.argv.extend(
        [
            "--priority-scheduler-enabled",
            "--priority-scheduler-default-max-class",
            "system",
            "--max-concurrent-requests",
            &in_flight,
            "--queue-size",
            "1024",
            "--queue-timeout-secs",
            &timeout,
        ]
        .map(String::from),
    );
    smg
}

/// The scenario's result.
#[derive(Debug, Clone, Serialize)]
pub struct TieredReport {
    /// C, requests per engine-second (direct keeps >= 90% within the tiers' objectives).
    pub capacity: f64,
    pub levels: Vec<f64>,
    pub time_scale: f64,
    pub window_engine_secs: f64,
    pub points: Vec<Point>,
}

pub async fn tiered_overload(plan: &ScenarioPlan) -> Result<TieredReport, ScenarioError> {
    let levels = match &plan.loads {
        Some(loads) => loads.clone(),
        None if plan.quick => vec![1.0, 3.0],
        None => vec![1.0, 2.0, 3.0, 4.0],
    };
    classes_at(plan, levels).await
}

/// Every configuration at each of `levels` x C, with the plan's classes of requests (tiers or
/// tenants), reported per class.
pub(super) async fn classes_at(
    plan: &ScenarioPlan,
    levels: Vec<f64>,
) -> Result<TieredReport, ScenarioError> {
    let fleet = SimFleet::start(plan).await?;
    // C measured against these classes' objectives: a figure kept from another scenario was
    // measured against others, so only a given one is used.
    let result = sweep(plan, &fleet, &levels, plan.capacity).await;
    fleet.stop().await;
    let (capacity, points) = result?;
    Ok(TieredReport {
        capacity,
        levels,
        time_scale: plan.time_scale,
        window_engine_secs: plan.window.as_secs_f64(),
        points,
    })
}

impl TieredReport {
    /// Markdown: one row per configuration and load, a column per class (tier or tenant) with
    /// its share within its objectives.
    pub fn table(&self) -> String {
        let classes: Vec<String> = self
            .points
            .first()
            .map(|p| p.report.tiers.iter().map(|t| t.name.clone()).collect())
            .unwrap_or_default();
        let mut out = format!(
            "capacity C = {:.2} requests per engine-second; time scale {}, {} engine-s per point\n\n\
             | config | load | goodput / C | within SLO | TTFT p50 / p99 (s) | {} | rejected | reject p99 (ms) | from send (ms) | late engine steps |\n\
             | --- | ---: | ---: | ---: | ---: | {}---: | ---: | ---: | ---: |\n",
            self.capacity,
            self.time_scale,
            self.window_engine_secs,
            classes.join(" | "),
            "---: | ".repeat(classes.len()),
        );
        for p in &self.points {
            let r = &p.report;
            let per_class: Vec<String> = classes
                .iter()
                .map(|name| {
                    r.tiers
                        .iter()
                        .find(|t| &t.name == name)
                        .map_or("-".to_string(), |t| format!("{:.0}%", 100.0 * t.attainment))
                })
                .collect();
            let _ = writeln!(
                out,
                "| {} | {:.2}x | {:.0}% | {:.0}% | {:.2} / {:.2} | {} | {:.0}% | {:.1} | {:.1} | {:.1}% |",
                p.config,
                p.offered / self.capacity,
                100.0 * p.goodput / self.capacity,
                100.0 * attainment(p),
                r.ttft_p50 * self.time_scale,
                r.ttft_p99 * self.time_scale,
                per_class.join(" | "),
                100.0 * r.rejection_rate,
                r.time_to_reject_p99 * 1e3,
                r.time_to_reject_sent_p99 * 1e3,
                100.0 * p.engines.late_share(),
            );
        }
        out + &self.classes_table()
            + &super::prediction::foot(self.points.iter().map(|p| {
                (
                    p.config.as_str(),
                    p.offered / self.capacity,
                    p.prediction.as_ref(),
                )
            }))
    }

    /// Markdown: one row per configuration, load and class — how much of it got through, how
    /// much within its objectives, its time to a first token, and how the rest was refused.
    fn classes_table(&self) -> String {
        let mut out = "\n| config | load | class | requests | through | within SLO | TTFT p95 (engine s) | refused with |\n\
             | --- | ---: | --- | ---: | ---: | ---: | ---: | --- |\n"
            .to_string();
        for p in &self.points {
            for t in &p.report.tiers {
                let refused: Vec<String> = t
                    .rejections
                    .iter()
                    .map(|(code, n)| format!("{code} {n}"))
                    .collect();
                let _ = writeln!(
                    out,
                    "| {} | {:.2}x | {} | {} | {:.1}% | {:.1}% | {:.2} | {} |",
                    p.config,
                    p.offered / self.capacity,
                    t.name,
                    t.requests,
                    100.0 * t.completed as f64 / t.requests.max(1) as f64,
                    100.0 * t.attainment,
                    t.ttft_p95 * self.time_scale,
                    refused.join(", "),
                );
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_tier_waits_its_objective_less_the_engines_first_token_in_wall_time() {
        let batch_deadline = Duration::from_secs(120);
        assert_eq!(
            super::super::wall_waits(4.0, batch_deadline),
            ["0.375", "1.125", "30"]
        );
        assert_eq!(
            super::super::wall_waits(1.0, batch_deadline),
            ["1.5", "4.5", "120"],
            "batch: its deadline"
        );
    }
}
