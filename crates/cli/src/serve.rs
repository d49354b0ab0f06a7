//! `sluice serve`: the gateway.

use clap::{ArgMatches, Args};
use sluice_gateway::{Gateway, Settings, Stopped};
use tracing::warn;

/// `sluice serve` flags: every gateway setting (see `sluice serve --help`).
#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub settings: Settings,
}

/// Resolves the settings (flags over `--config` file over defaults).
pub fn settings(matches: &ArgMatches) -> anyhow::Result<Settings> {
    Ok(sluice_gateway::config::load(matches)?)
}

/// Serves until SIGTERM or Ctrl-C, then drains.
pub async fn run(settings: Settings) -> anyhow::Result<()> {
    let config = settings.validate()?;
    let gateway = Gateway::start(config).await?;
    signal().await?;
    if let Stopped::GraceExpired { in_flight } = gateway.shutdown().await {
        warn!(in_flight, "stopped with requests still in flight");
    }
    Ok(())
}

#[cfg(unix)]
pub async fn signal() -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        r = tokio::signal::ctrl_c() => r?,
    }
    Ok(())
}

#[cfg(not(unix))]
pub async fn signal() -> std::io::Result<()> {
    tokio::signal::ctrl_c().await
}
