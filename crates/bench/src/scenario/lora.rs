//! `sluice bench scenario lora`: what adapter-blind routing costs when requests name LoRA
//! adapters.
//!
//! Four engines serve 32 adapters of one base model (each loaded at start, as
//! `--lora-modules` does), at most 4 distinct ones in a running batch (`--max-loras 4`) and 16
//! in host memory (`--max-cpu-loras 16`); requests name an adapter each, the popular ones most
//! (Zipf, exponent 1). Two load-time settings (`sluice_sim::lora::FAST_LOAD`, `SLOW_LOAD`, each
//! cited there); per setting, C is measured on `direct` with the same requests, and every
//! configuration runs at 0.8x and 1.5x C, each point from cold engines (no adapter in a slot,
//! empty caches) and a fresh gateway. sluice's policies run as they are (routing by adapter:
//! where it runs, then a free slot) and, for the two best without it, blind to adapters
//! (`--disable-adapter-routing`, the `-blind` configurations), as `direct` is: the baseline
//! routing by adapter must beat.

use std::fmt::Write;
use std::path::Path;

use serde::Serialize;

use super::routing::{cold_point, RoutingPoint};
use super::sweep::{attainment, search_capacity, Memo};
use super::{quiet_sluice, FleetShape, ScenarioError, ScenarioPlan};
use crate::overhead::Template;
use crate::run::AdapterMix;

/// The loads measured, as multiples of C.
pub const LOADS: [f64; 2] = [0.8, 1.5];
/// Adapters the requests name.
pub const ADAPTERS: usize = 32;
/// Distinct adapters in one running batch (the GPU slots).
pub const MAX_LORAS: u32 = 4;
/// Adapters each engine keeps in host memory.
pub const MAX_CPU_LORAS: u32 = 16;
/// The adapters' popularity: the k-th asked for 1/k as often as the first.
const ZIPF_EXPONENT: f64 = 1.0;

/// sluice's policies, by their `--policy` names, routing by adapter.
const POLICIES: [&str; 4] = ["round_robin", "least_load", "power_of_two", "cache_aware"];
/// The policies also run blind to adapters: the best two of the baseline (docs/benchmarks.md,
/// "LoRA adapters"), all four within each other's spread there.
const BLIND: [&str; 2] = ["least_load", "power_of_two"];

/// How long moving an adapter takes, from `sluice_sim::lora`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LoadSetting {
    Fast,
    Slow,
}

impl LoadSetting {
    pub const BOTH: [LoadSetting; 2] = [LoadSetting::Fast, LoadSetting::Slow];

    fn times(self) -> sluice_sim::lora::LoadTimes {
        match self {
            LoadSetting::Fast => sluice_sim::lora::FAST_LOAD,
            LoadSetting::Slow => sluice_sim::lora::SLOW_LOAD,
        }
    }

    fn name(self) -> &'static str {
        match self {
            LoadSetting::Fast => "fast",
            LoadSetting::Slow => "slow",
        }
    }
}

/// What the engines serve under `setting`: the adapters, their caps and load times.
pub fn shape(setting: LoadSetting) -> FleetShape {
    let times = setting.times();
    let mut extra: Vec<String> = [
        "--enable-lora",
        "--max-loras",
        &MAX_LORAS.to_string(),
        "--max-cpu-loras",
        &MAX_CPU_LORAS.to_string(),
        "--lora-load-from-cpu-ms",
        &times.from_cpu_ms.to_string(),
        "--lora-load-from-disk-ms",
        &times.from_disk_ms.to_string(),
        "--lora-modules",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    extra.extend(
        adapters()
            .names
            .iter()
            .map(|name| format!("{name}=/adapters/{name}")),
    );
    FleetShape {
        extra,
        ..FleetShape::default()
    }
}

/// The adapters the requests name.
pub fn adapters() -> AdapterMix {
    AdapterMix::numbered(ADAPTERS, ZIPF_EXPONENT)
}

/// `direct` first (it sets C), sluice's policies, two of them blind to adapters, SMG's round
/// robin and cache-aware when SMG is installed.
pub fn configs(exe: &Path, time_scale: f64) -> Vec<Template> {
    let poll = super::load_poll(time_scale);
    let mut configs = vec![quiet_sluice("direct", exe, &super::naive_flags(false))];
    for policy in POLICIES {
        let name = format!("sluice-{}", policy.replace('_', "-"));
        configs.push(quiet_sluice(
            &name,
            exe,
            &["--load-monitor-interval", &poll, "--policy", policy],
        ));
    }
    for policy in BLIND {
        let name = format!("sluice-{}-blind", policy.replace('_', "-"));
        configs.push(quiet_sluice(
            &name,
            exe,
            &[
                "--load-monitor-interval",
                &poll,
                "--policy",
                policy,
                "--disable-adapter-routing",
            ],
        ));
    }
    if crate::overhead::on_path("smg") {
        for policy in ["round_robin", "cache_aware"] {
            let mut smg = super::smg_config(time_scale);
            smg.name = format!("smg-{}", policy.replace('_', "-"));
            smg.argv.extend(["--policy".into(), policy.into()]);
            configs.push(smg);
        }
    }
    configs
}

/// One configuration at one load under one setting.
#[derive(Debug, Clone, Serialize)]
pub struct LoraPoint {
    pub setting: LoadSetting,
    pub capacity: f64,
    #[serde(flatten)]
    pub measured: RoutingPoint,
}

#[derive(Debug, Clone, Serialize)]
pub struct LoraReport {
    pub engines: usize,
    pub time_scale: f64,
    pub window_engine_secs: f64,
    pub points: Vec<LoraPoint>,
}

/// The plan for `setting`: its fleet, the adapters, its own directory (so each setting's C is
/// remembered apart).
fn setting_plan(plan: &ScenarioPlan, setting: LoadSetting) -> Result<ScenarioPlan, ScenarioError> {
    let out_dir = plan.out_dir.join(setting.name());
    std::fs::create_dir_all(&out_dir).map_err(|source| ScenarioError::Write {
        path: out_dir.clone(),
        source,
    })?;
    Ok(ScenarioPlan {
        fleet: shape(setting),
        adapters: Some(adapters()),
        out_dir,
        ..plan.clone()
    })
}

pub async fn lora(plan: &ScenarioPlan) -> Result<LoraReport, ScenarioError> {
    let mut points = Vec::new();
    for setting in LoadSetting::BOTH {
        let plan = &setting_plan(plan, setting)?;
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
        for config in &plan.configs {
            for load in LOADS {
                let mut measured = cold_point(plan, config, load * capacity).await?;
                measured.point.offered = load * capacity;
                tracing::info!(setting = setting.name(), config = %config.name, load, goodput = measured.point.goodput, "lora point");
                points.push(LoraPoint {
                    setting,
                    capacity,
                    measured,
                });
            }
        }
    }
    Ok(LoraReport {
        engines: plan.engines,
        time_scale: plan.time_scale,
        window_engine_secs: plan.window.as_secs_f64(),
        points,
    })
}

impl LoraReport {
    /// Markdown: one row per setting, configuration and load.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{ADAPTERS} adapters (Zipf 1) over {} engines, --max-loras {MAX_LORAS}, \
             --max-cpu-loras {MAX_CPU_LORAS}; C measured on direct per load-time setting; time \
             scale {}, {} engine-s per point, every point from cold engines\n\n\
             | load times | config | load | goodput (req/s) | within SLO | TTFT p50 / p99 (s) | adapter copies / disk reads per engine | slot waits per engine | rejected |\n\
             | --- | --- | ---: | ---: | ---: | ---: | --- | --- | ---: |\n",
            self.engines, self.time_scale, self.window_engine_secs
        );
        for p in &self.points {
            let (point, r) = (&p.measured.point, &p.measured.point.report);
            let per = |f: fn(&super::EngineTotals) -> String| {
                p.measured
                    .per_engine
                    .iter()
                    .map(f)
                    .collect::<Vec<_>>()
                    .join(" / ")
            };
            let _ = writeln!(
                out,
                "| {} | {} | {:.1}x | {:.2} | {:.0}% | {:.2} / {:.2} | {} | {} | {:.0}% |",
                p.setting.name(),
                point.config,
                point.offered / p.capacity,
                point.goodput,
                100.0 * attainment(point),
                r.ttft_p50 * self.time_scale,
                r.ttft_p99 * self.time_scale,
                per(|e| format!("{}/{}", e.adapter_loads_from_cpu, e.adapter_loads_from_disk)),
                per(|e| e.adapter_slot_waits.to_string()),
                100.0 * r.rejection_rate,
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engines_serve_every_adapter_the_requests_name_with_the_settings_load_times() {
        let fast = shape(LoadSetting::Fast).extra;
        let at = fast.iter().position(|a| a == "--lora-modules").unwrap();
        assert_eq!(fast.len() - at - 1, ADAPTERS);
        for name in &adapters().names {
            assert!(fast.contains(&format!("{name}=/adapters/{name}")));
        }
        let slow = shape(LoadSetting::Slow).extra;
        let ms = |extra: &[String], flag: &str| {
            let at = extra.iter().position(|a| a == flag).unwrap();
            extra[at + 1].parse::<f64>().unwrap()
        };
        assert!(ms(&slow, "--lora-load-from-cpu-ms") > ms(&fast, "--lora-load-from-cpu-ms"));
        assert_eq!(
            ms(&fast, "--lora-load-from-disk-ms"),
            sluice_sim::lora::FAST_LOAD.from_disk_ms
        );
    }

    #[test]
    fn every_blind_policy_is_compared_after_direct() {
        let configs = configs(Path::new("/bin/sluice"), 4.0);
        assert_eq!(configs[0].name, "direct");
        for policy in POLICIES {
            let name = format!("sluice-{}", policy.replace('_', "-"));
            assert!(configs.iter().any(|c| c.name == name), "{name}");
        }
    }
}
