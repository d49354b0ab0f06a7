//! `sluice demo`: the whole product on an embedded simulated fleet, one command. A gateway with
//! its protections, tiers and tenants on, in front of six simulated engines serving two models,
//! while a load generator plays a story (steady load, a surge to three times capacity, an engine
//! that freezes, one that crashes and restarts, calm). With `--compare` the same story plays at
//! the same time through an unprotected gateway on a fleet of its own. The demo's page shows
//! the narration and each gateway's status page (`/ui`) side by side.
//!
//! Every process it starts (engines, gateways) runs in its own process group and is stopped by
//! its PID when the demo ends or is interrupted.
//!
//! ## Layout
//!
//! - `story` — the acts, their load and incidents, laid out in time.
//! - `stack` — one gateway configuration with its own fleet and the load on it.
//! - `page` — the demo's page: the narration, the engines' clock, the gateways' pages.

mod page;
mod stack;
mod story;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sluice_sim::{EngineConfig, Flavor, Profile};
use tokio::time::Instant;

pub use page::{DemoState, StackView};
pub use stack::{Kind, Stack};
pub use story::{Act, Incident, Scenario, Story};

use crate::capacity::{run_virtual, CapacityPlan};
use crate::scenario::{EngineTotals, ScenarioError};

/// How the demo runs.
#[derive(Debug, Clone)]
pub struct DemoPlan {
    pub scenario: Scenario,
    /// The whole story, wall time.
    pub duration: Duration,
    /// The engines' clock runs this many times faster than the wall clock (and the load with
    /// it).
    pub speed: f64,
    pub compare: bool,
    /// Where the demo's page listens (0: any free port).
    pub port: u16,
    pub seed: u64,
    /// The `sluice` binary the engines and gateways run.
    pub exe: PathBuf,
    /// Logs of every process.
    pub out_dir: PathBuf,
    /// End when the story does, instead of keeping the page up until Ctrl-C.
    pub exit: bool,
}

/// One model of the fleet.
#[derive(Debug, Clone, Copy)]
pub struct Model {
    pub name: &'static str,
    pub profile: &'static str,
    pub engines: usize,
    /// Requests an engine runs at once: small, so the fleet's capacity is a load two cores carry.
    pub max_num_seqs: u32,
    /// Requests per engine second the model's engines serve together (`capacity_of`).
    pub capacity: f64,
}

/// The fleet: four engines of a 70B model, two of an 8B one.
pub fn models() -> [Model; 2] {
    let model = |name, profile, engines| {
        let mut m = Model {
            name,
            profile,
            engines,
            max_num_seqs: 8,
            capacity: 0.0,
        };
        m.capacity = capacity_of(&m) * engines as f64;
        m
    };
    [
        model("llama-3.3-70b", "llama3-70b-h100-tp4", 4),
        model("llama-3.1-8b", "llama3-8b-h100", 2),
    ]
}

/// Requests per engine second one engine of `model` completes with its running batch full of
/// chat requests, measured on its scheduler in virtual time (exact, and instant).
pub fn capacity_of(model: &Model) -> f64 {
    let Some(profile) = Profile::named(model.profile) else {
        return 0.0;
    };
    let mut engine = EngineConfig::new(Flavor::Vllm, model.name, profile);
    engine.max_num_seqs = model.max_num_seqs;
    let window = Duration::from_secs(300);
    let plan = CapacityPlan {
        levels: vec![model.max_num_seqs],
        warmup: Duration::from_secs(60),
        window,
        workload: crate::prompts::chat(),
        seed: 7,
    };
    let report = run_virtual(&engine, &plan);
    report
        .levels
        .first()
        .map_or(0.0, |l| l.completed as f64 / window.as_secs_f64())
}

/// Why the demo could not run.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
    #[error("the demo's page cannot listen on port {port}: {source} (choose another with --port)")]
    Listen { port: u16, source: std::io::Error },
}

/// Prints a line of the story, stamped with the time into it.
fn say(start: Instant, line: &str) {
    let t = start.elapsed().as_secs();
    println!("[{:02}:{:02}] {line}", t / 60, t % 60);
}

/// The engines' late steps since `before`, as a share of their steps.
fn late_since(now: EngineTotals, before: EngineTotals) -> f64 {
    now.since(before).late_share()
}

/// Runs the demo: starts everything, plays the story, reports, and (unless `exit`) keeps the
/// page up, until the story ends or `shutdown` resolves (Ctrl-C); then stops every process it
/// started and waits for each to exit.
pub async fn run(
    plan: DemoPlan,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), DemoError> {
    let models = models();
    let story = Story::of(plan.scenario, plan.duration);
    std::fs::create_dir_all(&plan.out_dir).map_err(|source| ScenarioError::Write {
        path: plan.out_dir.clone(),
        source,
    })?;
    let kinds: &[Kind] = if plan.compare {
        &[Kind::Protected, Kind::Unprotected]
    } else {
        &[Kind::Protected]
    };
    println!(
        "sluice demo: {} engines of {} and {} of {} per gateway, serving {:.1} and {:.1} requests a second at {}x speed; logs in {}",
        models[0].engines,
        models[0].name,
        models[1].engines,
        models[1].name,
        models[0].capacity * plan.speed,
        models[1].capacity * plan.speed,
        plan.speed,
        plan.out_dir.display()
    );
    let mut stacks = Vec::new();
    tokio::pin!(shutdown);
    let shown = tokio::select! {
        shown = show(&plan, kinds, &story, &models, &mut stacks) => shown,
        () = &mut shutdown => {
            println!("sluice demo: stopping every process it started");
            Ok(())
        }
    };
    // Every process stopped and waited for, whatever ended the demo.
    for stack in stacks {
        stack.stop().await;
    }
    shown
}

/// Starts each stack into `stacks` (so that whoever stops the demo stops them), serves the page,
/// plays the story and reports; then, unless `--exit`, keeps the page up for good.
async fn show(
    plan: &DemoPlan,
    kinds: &[Kind],
    story: &Story,
    models: &[Model; 2],
    stacks: &mut Vec<Stack>,
) -> Result<(), DemoError> {
    for &kind in kinds {
        stacks.push(Stack::start(kind, plan, models).await?);
    }
    write_pids(plan, stacks)?;
    let state = Arc::new(parking_lot::Mutex::new(DemoState::new(story, stacks)));
    let addr = page::serve(plan.port, state.clone())
        .await
        .map_err(|source| DemoError::Listen {
            port: plan.port,
            source,
        })?;
    println!("sluice demo: open http://{addr}/ to watch");
    for stack in stacks.iter() {
        println!("  {}: {}", stack.kind.label(), stack.ui);
    }
    play(story, models, stacks, &state).await?;
    report(stacks).await?;
    state.lock().over = true;
    if !plan.exit {
        println!("sluice demo: the story is over; the page stays up until Ctrl-C");
        std::future::pending::<()>().await;
    }
    Ok(())
}

/// `pids` in the log directory: every process the demo started (a crashed engine's restart
/// aside), should the demo itself be killed with SIGKILL and leave them behind.
fn write_pids(plan: &DemoPlan, stacks: &[Stack]) -> Result<(), ScenarioError> {
    let lines: String = stacks
        .iter()
        .flat_map(Stack::pids)
        .map(|(name, pid)| format!("{name} {pid}\n"))
        .collect();
    let path = plan.out_dir.join("pids");
    std::fs::write(&path, lines).map_err(|source| ScenarioError::Write { path, source })
}

/// Plays the story: the load on every stack, each act's narration and incident on time, and the
/// engines' clock read every second.
async fn play(
    story: &Story,
    models: &[Model; 2],
    stacks: &mut [Stack],
    state: &parking_lot::Mutex<DemoState>,
) -> Result<(), DemoError> {
    let mut before = Vec::new();
    for stack in stacks.iter_mut() {
        before.push(stack.engine_totals().await);
        stack.start_load(story, models);
    }
    let start = Instant::now();
    state.lock().started = Some(start);
    for (i, act) in story.acts.iter().enumerate() {
        tokio::time::sleep_until(start + act.start).await;
        say(
            start,
            &format!("act {}/{}: {}", i + 1, story.acts.len(), act.narration),
        );
        state.lock().act = Some(i);
        for stack in stacks.iter_mut() {
            stack.begin(act.incident).await?;
        }
        let midway = start + act.start + (act.end - act.start) / 2;
        let mut midway_done = false;
        while Instant::now() < start + act.end {
            tokio::time::sleep(Duration::from_secs(1).min((start + act.end) - Instant::now()))
                .await;
            if !midway_done && Instant::now() >= midway {
                midway_done = true;
                for stack in stacks.iter_mut() {
                    stack.midway(act.incident).await?;
                }
                if act.incident == Incident::Crash {
                    say(start, "the crashed engine is starting again");
                }
            }
            for (j, stack) in stacks.iter().enumerate() {
                let now = stack.engine_totals().await;
                state.lock().stacks[j].late_share = late_since(now, before[j]);
            }
        }
        for stack in stacks.iter_mut() {
            stack.end(act.incident).await?;
        }
    }
    say(start, "the story is over: waiting for the last answers");
    Ok(())
}

/// What each gateway's clients got, and whether the engines kept their clock.
async fn report(stacks: &mut [Stack]) -> Result<(), DemoError> {
    for stack in stacks.iter_mut() {
        let report = stack.outcome().await?;
        let late = stack.engine_totals().await.late_share();
        let tiers: Vec<String> = report
            .tiers
            .iter()
            .map(|t| format!("{} {:.0}%", t.name, t.attainment * 100.0))
            .collect();
        println!(
            "{}: {} requests, {:.0}% within their objectives ({}); {} refused; engines' late steps {:.2}%",
            stack.kind.label(),
            report.requests,
            report.tiers.iter().map(|t| t.met_slo).sum::<u64>() as f64 * 100.0
                / report.requests.max(1) as f64,
            tiers.join(", "),
            report.rejections.values().sum::<u64>(),
            late * 100.0,
        );
        if late > 0.01 {
            println!(
                "  this machine could not keep the engines' clock (logs in {}): a lower --speed, or no --compare, shows the gateway rather than the machine",
                stack.log_dir().display()
            );
        }
    }
    Ok(())
}
