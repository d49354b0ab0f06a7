//! One gateway configuration of the demo with a fleet of its own: the simulated engines (one
//! process each, so one can be killed), the gateway process, and the story's load on it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sluice_sim::Fault;

use super::story::{Incident, Story};
use super::{DemoPlan, Model};
use crate::client::{Api, ClientKind};
use crate::goodput::{summarize, Outcome, Report, Slo, Tier};
use crate::overhead::{sluice_template, Template};
use crate::run::{execute, Mix};
use crate::scenario::{
    load_plan, naive_flags, EngineTotals, FleetShape, Gateway, ScenarioError, ScenarioPlan,
    SimFleet,
};
use sluice_core::admission::Tier as GatewayTier;

/// The engine that freezes, and the one that crashes (both serve the first model).
const FROZEN: usize = 1;
const CRASHED: usize = 2;

/// Which configuration a stack runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// sluice as a user runs it, with tiers and tenants: the gateway queue, shedding by tier,
    /// overload and liveness vetoes, health checks, the circuit breaker, retries.
    Protected,
    /// Round robin and nothing else: no vetoes, checks, breaker, retries or queue.
    Unprotected,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Protected => "sluice",
            Kind::Unprotected => "unprotected",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Kind::Protected => "sluice, protections on",
            Kind::Unprotected => "unprotected: round robin, nothing else",
        }
    }
}

/// The tenants the protected gateway knows, one per tier, named by the load in SMG's tenant
/// header (as behind an authenticating proxy).
const TENANTS: &str = "\
# The demo's tenants: one per tier.
[[tenants]]
name = \"chat\"
priority = 0

[[tenants]]
name = \"agents\"
priority = 1

[[tenants]]
name = \"batch\"
priority = 2
weight = 1
";

/// The requests: 30% interactive chat, 30% agents, 40% batch, judged by the gateway's own
/// objectives (in engine time; the load converts them).
pub fn tiers() -> Vec<Tier> {
    let tier = |name: &str, share: f64, tenant: &str, gateway: GatewayTier| Tier {
        name: name.into(),
        share,
        tenant: Some(tenant.into()),
        slo: Slo::gateways(gateway),
    };
    vec![
        tier("interactive", 0.3, "chat", GatewayTier::Interactive),
        tier("agent", 0.3, "agents", GatewayTier::Agent),
        tier("batch", 0.4, "batch", GatewayTier::Batch),
    ]
}

/// The gateway's objectives in wall time: engine time divided by the speed.
fn slo_flags(speed: f64) -> Vec<String> {
    let ms =
        |d: Option<Duration>| d.map_or(0, |d| (d.as_secs_f64() * 1000.0 / speed).round() as u64);
    let by_tier = |field: fn(&Slo) -> Option<Duration>| {
        GatewayTier::ALL
            .iter()
            .map(|&t| ms(field(&Slo::gateways(t))).to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    vec![
        "--slo-ttft-ms-by-tier".into(),
        by_tier(|s| s.ttft),
        "--slo-tpot-ms-by-tier".into(),
        by_tier(|s| s.tpot),
    ]
}

/// The gateway command of `kind`.
fn template(kind: Kind, plan: &DemoPlan, dir: &Path) -> Result<Template, ScenarioError> {
    let speed = plan.speed;
    // Polled every second of engine time: the cards show load reports that fresh.
    let poll = format!("{}", (1.0 / speed).max(0.1));
    let mut flags: Vec<String> = vec!["--log-level".into(), "warn".into()];
    flags.extend(["--load-monitor-interval".into(), poll]);
    match kind {
        Kind::Protected => {
            let tenants = dir.join("tenants.toml");
            std::fs::write(&tenants, TENANTS).map_err(|source| ScenarioError::Write {
                path: tenants.clone(),
                source,
            })?;
            // Each tier waits in the queue at most its objective less the engine's own half
            // second to a first token (batch: two minutes). The engines run 8 requests at a
            // time, each for seconds: one waiting is already a second's delay, so the ceiling
            // is sized to them, as an operator sizes it to theirs.
            let wait = |objective: f64| (objective - 0.5) / speed;
            flags.extend([
                "--config".into(),
                tenants.display().to_string(),
                "--trust-tenant-header".into(),
                "--worker-overload-shed".into(),
                "--worker-overload-waiting-requests".into(),
                "1".into(),
                "--queue-size".into(),
                "1024".into(),
                "--queue-timeout-by-tier".into(),
                format!("{},{},{}", wait(2.0), wait(5.0), 120.0 / speed),
            ]);
        }
        Kind::Unprotected => flags.extend(naive_flags(false).iter().map(|s| s.to_string())),
    }
    flags.extend(slo_flags(speed));
    let argv: Vec<&str> = flags.iter().map(String::as_str).collect();
    Ok(sluice_template(kind.name(), &plan.exe, &argv))
}

/// What the engines run: both models' engines with `--max-num-seqs`, so the fleet's capacity is
/// a load two cores carry with their clocks kept.
fn scenario_plan(plan: &DemoPlan, models: &[Model; 2], dir: &Path) -> ScenarioPlan {
    ScenarioPlan {
        adapters: None,
        loads: None,
        configs: Vec::new(),
        time_scale: plan.speed,
        window: plan.duration,
        engines: models[0].engines,
        seed: plan.seed,
        client: ClientKind::None,
        mix: Mix::Chat,
        quick: false,
        capacity: None,
        sluice_exe: plan.exe.clone(),
        out_dir: dir.to_path_buf(),
        engine_args: vec!["--max-num-seqs".into(), models[0].max_num_seqs.to_string()],
        tiers: tiers(),
        fleet: FleetShape {
            model: models[0].name.into(),
            profile: models[0].profile.into(),
            extra: Vec::new(),
            also: Some((
                models[1].engines,
                models[1].name.into(),
                models[1].profile.into(),
            )),
            kv_events: false,
        },
        api: Api::Chat { max_tokens: 512 },
    }
}

type Load = tokio::task::JoinHandle<Result<Vec<Outcome>, crate::arrivals::ArrivalError>>;

/// One configuration, running.
pub struct Stack {
    pub kind: Kind,
    pub ui: String,
    fleet: SimFleet,
    gateway: Gateway,
    plan: ScenarioPlan,
    loads: Vec<Load>,
    dir: PathBuf,
}

impl Stack {
    pub async fn start(
        kind: Kind,
        plan: &DemoPlan,
        models: &[Model; 2],
    ) -> Result<Self, ScenarioError> {
        let dir = plan.out_dir.join(kind.name());
        std::fs::create_dir_all(&dir).map_err(|source| ScenarioError::Write {
            path: dir.clone(),
            source,
        })?;
        let scenario = scenario_plan(plan, models, &dir);
        let fleet = SimFleet::start(&scenario).await?;
        let gateway = Gateway::start(&template(kind, plan, &dir)?, &fleet.workers, &dir).await?;
        Ok(Self {
            kind,
            ui: format!("{}/ui", gateway.url),
            fleet,
            gateway,
            plan: scenario,
            loads: Vec::new(),
            dir,
        })
    }

    /// The story's load, each model at its share of its own capacity (requests per engine
    /// second).
    pub fn start_load(&mut self, story: &Story, models: &[Model; 2]) {
        for (i, model) in models.iter().enumerate() {
            let schedule = story.schedule(model.capacity * self.plan.time_scale);
            let mut run = load_plan(&self.plan, &self.gateway.url, schedule, story.duration());
            run.model = model.name.into();
            run.seed = self.plan.seed.wrapping_add(i as u64);
            self.loads.push(tokio::spawn(
                async move { execute(&run).await.map(|(o, _)| o) },
            ));
        }
    }

    /// Starts what `incident` does to the fleet: a freeze is an engine core stuck in a step.
    pub async fn begin(&mut self, incident: Incident) -> Result<(), ScenarioError> {
        match incident {
            Incident::None => Ok(()),
            Incident::Freeze => self.fleet.fault(FROZEN, &wedge()).await,
            Incident::Crash => {
                self.fleet.kill(CRASHED).await;
                Ok(())
            }
        }
    }

    /// Halfway through the act: a crashed engine starts again.
    pub async fn midway(&mut self, incident: Incident) -> Result<(), ScenarioError> {
        match incident {
            Incident::Crash => self.fleet.restart(CRASHED).await,
            _ => Ok(()),
        }
    }

    /// The act is over: a frozen engine resumes.
    pub async fn end(&mut self, incident: Incident) -> Result<(), ScenarioError> {
        match incident {
            Incident::Freeze => self.fleet.fault(FROZEN, &Fault::Clear).await,
            _ => Ok(()),
        }
    }

    pub async fn engine_totals(&self) -> EngineTotals {
        self.fleet.totals().await
    }

    /// Waits for the load to finish and sums it up.
    pub async fn outcome(&mut self) -> Result<Report, ScenarioError> {
        let mut outcomes = Vec::new();
        for load in self.loads.drain(..) {
            outcomes.extend(load.await.map_err(ScenarioError::Join)??);
        }
        let tiers = crate::scenario::wall_tiers(&self.plan);
        Ok(summarize(&outcomes, &tiers, self.plan.window))
    }

    /// Every process of the stack running now, `name pid`: the engines and the gateway.
    pub fn pids(&self) -> Vec<(String, u32)> {
        let mut pids = self.fleet.pids();
        pids.push(("gateway".into(), self.gateway.pid()));
        pids.into_iter()
            .map(|(name, pid)| (format!("{}/{name}", self.kind.name()), pid))
            .collect()
    }

    pub fn log_dir(&self) -> &Path {
        &self.dir
    }

    pub async fn stop(self) {
        for load in self.loads {
            load.abort();
        }
        self.gateway.stop().await;
        self.fleet.stop().await;
    }
}

/// An engine core stuck inside a step, as vLLM's wedges (its gauges stand at the last step).
fn wedge() -> Fault {
    Fault::Wedge {
        polls: sluice_sim::WedgedPolls::Stale,
    }
}
