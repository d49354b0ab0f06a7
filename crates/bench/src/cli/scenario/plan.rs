//! The plan a scenario runs from (`ScenarioPlan`): its fleet, its loads, the engines' flags and
//! the configurations it compares, from its arguments.

use std::path::Path;

use super::{envoy_for, seconds, BenchError, ScenarioArgs, ScenarioName};
use crate::overhead::Template;

/// The scenario's own fleet size.
fn default_engines(name: ScenarioName) -> usize {
    match name {
        ScenarioName::OverloadSweep
        | ScenarioName::TieredOverload
        | ScenarioName::NoisyTenant
        | ScenarioName::Degradation => 2,
        ScenarioName::Routing | ScenarioName::Lora => 4,
        _ => 3,
    }
}

pub(super) fn plan(args: &ScenarioArgs) -> Result<crate::scenario::ScenarioPlan, BenchError> {
    let exe = std::env::current_exe().map_err(BenchError::Exe)?;
    let configs = configs(args, &exe)?;
    if !(args.time_scale > 0.0 && args.time_scale.is_finite()) {
        return Err(BenchError::Positive("time-scale"));
    }
    if args.capacity.is_some_and(|c| !(c > 0.0 && c.is_finite())) {
        return Err(BenchError::Positive("capacity"));
    }
    let engines = args.engines.unwrap_or(default_engines(args.name));
    if engines == 0 {
        return Err(BenchError::Zero("engines"));
    }
    let window = args
        .window_secs
        .unwrap_or(if args.quick { 20.0 } else { 120.0 });
    Ok(crate::scenario::ScenarioPlan {
        configs,
        time_scale: args.time_scale,
        window: seconds("window-secs", window)?,
        engines,
        seed: args.seed,
        client: args.client,
        mix: args.mix.unwrap_or(match args.name {
            ScenarioName::Routing => crate::run::Mix::Shared,
            ScenarioName::LongContext => crate::run::Mix::LongContext,
            _ => crate::run::Mix::Chat,
        }),
        quick: args.quick,
        capacity: args.capacity.map(|per_engine| per_engine * engines as f64),
        sluice_exe: exe,
        out_dir: args.out.clone(),
        engine_args: engine_args(args),
        fleet: match args.name {
            ScenarioName::Degradation => crate::scenario::degradation_shape(engines),
            ScenarioName::Routing => crate::scenario::FleetShape {
                kv_events: true,
                ..Default::default()
            },
            _ => crate::scenario::FleetShape::default(),
        },
        api: match args.name {
            ScenarioName::Degradation => crate::scenario::degradation_api(),
            _ => crate::client::Api::Completions,
        },
        adapters: None,
        loads: loads(args)?,
        tiers: match args.name {
            ScenarioName::TieredOverload | ScenarioName::Degradation => {
                crate::scenario::three_tiers()
            }
            ScenarioName::NoisyTenant => crate::scenario::two_tenants(),
            _ => crate::run::default_tiers(),
        },
    })
}

/// `--load`, checked: positive multiples, for the scenarios that take them.
fn loads(args: &ScenarioArgs) -> Result<Option<Vec<f64>>, BenchError> {
    if args.load.is_empty() {
        return Ok(None);
    }
    if args.load.iter().any(|l| !(*l > 0.0 && l.is_finite())) {
        return Err(BenchError::Positive("load"));
    }
    match args.name {
        ScenarioName::Routing
        | ScenarioName::LongContext
        | ScenarioName::TieredOverload
        | ScenarioName::Spike => Ok(Some(args.load.clone())),
        _ => Err(BenchError::LoadNotTaken),
    }
}

/// The simulated engines' arguments: `--engine-args`, or the scenario's, and gRPC's.
fn engine_args(args: &ScenarioArgs) -> Vec<String> {
    args.engine_args
        .as_deref()
        .unwrap_or(match args.name {
            ScenarioName::LongContext => "--max-num-seqs 64",
            _ => "--max-num-seqs 64 --num-gpu-blocks 2048",
        })
        .split_whitespace()
        .map(String::from)
        .chain(
            args.grpc
                .then_some(["--grpc", "--flavor", "sglang"])
                .into_iter()
                .flatten()
                .map(String::from),
        )
        .collect()
}

/// The configurations the scenario compares: its own and the defaults, `--gateway`'s, narrowed
/// to `--configs` when given.
fn configs(args: &ScenarioArgs, exe: &Path) -> Result<Vec<Template>, BenchError> {
    let mut configs = crate::scenario::default_configs(exe, args.time_scale);
    match args.name {
        ScenarioName::TieredOverload => {
            configs.push(crate::scenario::tiered_config(exe, args.time_scale));
            configs.extend(crate::scenario::tiered_policy_configs(exe, args.time_scale));
            if crate::overhead::on_path("smg") {
                let engines = args.engines.unwrap_or(2);
                configs.push(crate::scenario::smg_priority_config(
                    engines,
                    args.time_scale,
                ));
            }
        }
        ScenarioName::NoisyTenant => {
            let sizes = if args.queue_size.is_empty() {
                crate::scenario::QUEUE_SIZES.to_vec()
            } else {
                args.queue_size.clone()
            };
            if sizes.contains(&0) {
                return Err(BenchError::Zero("queue-size"));
            }
            for size in sizes {
                configs.push(crate::scenario::tenants_config(exe, args.time_scale, size));
            }
        }
        ScenarioName::Routing => {
            configs = crate::scenario::routing_configs(exe, args.time_scale);
        }
        ScenarioName::Lora => {
            configs = crate::scenario::lora_configs(exe, args.time_scale);
        }
        ScenarioName::Degradation => {
            // Against the same gateway without the ladder, and against the plain defaults.
            configs.retain(|t| ["direct", "sluice", "smg"].contains(&t.name.as_str()));
            let own = crate::scenario::degradation_configs(exe, args.time_scale, &args.out)
                .map_err(|e| BenchError::OutDir(args.out.clone(), e))?;
            configs.extend(own);
        }
        name => {
            if let Some(incident) = name.incident() {
                configs.extend(incident_configs(name, incident, exe, args.time_scale));
            }
        }
    }
    configs.extend(envoy_configs(args, exe)?);
    for g in &args.gateways {
        configs.push(Template::parse(g)?);
    }
    narrowed(configs, &args.configs)
}

/// An incident scenario's own configurations: the naive fleet that leaves out a worker it
/// cannot reach, the incident's controls, and for long-context and spike the policies
/// `predicted` is measured against.
fn incident_configs(
    name: ScenarioName,
    incident: crate::scenario::Incident,
    exe: &Path,
    time_scale: f64,
) -> Vec<Template> {
    let mut configs = vec![crate::scenario::quiet_sluice(
        "direct-unreachable",
        exe,
        &crate::scenario::naive_flags(true),
    )];
    configs.extend(crate::scenario::incident_configs(incident, exe, time_scale));
    if matches!(name, ScenarioName::LongContext | ScenarioName::Spike) {
        configs.extend(crate::scenario::default_policy_configs(exe, time_scale));
    }
    configs
}

/// Envoy's configurations, for the scenarios that compare it, when an Envoy is at hand.
fn envoy_configs(args: &ScenarioArgs, exe: &Path) -> Result<Vec<Template>, BenchError> {
    if !matches!(
        args.name,
        ScenarioName::TieredOverload | ScenarioName::FrozenEngine
    ) {
        return Ok(Vec::new());
    }
    let named = args.configs.iter().any(|c| c.starts_with("envoy"));
    Ok(envoy_for(named)?
        .map(|envoy| crate::scenario::envoy_configs(exe, args.time_scale, envoy))
        .unwrap_or_default())
}

/// Only the configurations `wanted` names (and `direct`), when it names any; a name that is no
/// configuration is refused.
fn narrowed(mut configs: Vec<Template>, wanted: &[String]) -> Result<Vec<Template>, BenchError> {
    if wanted.is_empty() {
        return Ok(configs);
    }
    if let Some(unknown) = wanted
        .iter()
        .find(|c| !configs.iter().any(|t| &t.name == *c))
    {
        return Err(crate::overhead::TemplateError::Unknown(unknown.clone()).into());
    }
    configs.retain(|t| t.name == "direct" || wanted.contains(&t.name));
    Ok(configs)
}
