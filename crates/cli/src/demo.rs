//! `sluice demo`: the whole product on an embedded simulated fleet (see `sluice_bench::demo`).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use sluice_bench::demo::{self, DemoPlan, Scenario};

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// What the fleet goes through: the whole story (steady load, a surge to three times
    /// capacity, a frozen engine, a crash and restart, calm), or one incident between steady
    /// load and calm.
    #[arg(long, value_enum, default_value = "story")]
    pub scenario: Scenario,

    /// Seconds the story lasts (its acts share them equally).
    #[arg(long, default_value_t = 150.0, value_name = "SECS")]
    pub duration: f64,

    /// How many times faster than the wall clock the engines run (and the load with them); more
    /// than the machine can carry shows in the engines' late steps, on the page.
    #[arg(long, default_value_t = 1.0)]
    pub speed: f64,

    /// Play the same story at the same time through an unprotected gateway (round robin and
    /// nothing else) on a fleet of its own, shown beside sluice.
    #[arg(long)]
    pub compare: bool,

    /// The loopback port of the demo's page (0: any free port).
    #[arg(long, default_value_t = 8800)]
    pub port: u16,

    /// Where every process's log goes [default: a new directory under the system's temp dir].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,

    /// The seed of the load (arrivals, prompts, tiers).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,

    /// End when the story ends, instead of keeping the page up until Ctrl-C.
    #[arg(long)]
    pub exit: bool,
}

impl DemoArgs {
    fn plan(self) -> anyhow::Result<DemoPlan> {
        let duration = Duration::try_from_secs_f64(self.duration)
            .ok()
            .filter(|d| d.as_secs() >= 5)
            .ok_or_else(|| {
                anyhow::anyhow!("--duration: {} is not at least 5 seconds", self.duration)
            })?;
        if !(self.speed > 0.0 && self.speed <= 50.0) {
            anyhow::bail!("--speed: {} is not above 0 and at most 50", self.speed);
        }
        let out_dir = self.out.unwrap_or_else(|| {
            std::env::temp_dir().join(format!("sluice-demo-{}", std::process::id()))
        });
        Ok(DemoPlan {
            scenario: self.scenario,
            duration,
            speed: self.speed,
            compare: self.compare,
            port: self.port,
            seed: self.seed,
            exe: std::env::current_exe()?,
            out_dir,
            exit: self.exit,
        })
    }
}

/// Runs the demo until its story ends (with `--exit`) or Ctrl-C / SIGTERM; either way every
/// process it started is stopped and waited for before it returns.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let plan = args.plan()?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let shutdown = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
    };
    Ok(demo::run(plan, shutdown).await?)
}
