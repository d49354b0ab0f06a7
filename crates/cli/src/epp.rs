//! `sluice epp`: the gateway as a Gateway API endpoint picker, behind Envoy's ext_proc filter.

use clap::Args;
use sluice_epp::{EppSettings, Picker};
use sluice_gateway::{Settings, Stopped};
use tracing::warn;

/// `sluice epp` flags: every gateway setting of `sluice serve`, and the picker's own.
#[derive(Debug, Args)]
pub struct EppArgs {
    #[command(flatten)]
    pub settings: Settings,
    #[command(flatten)]
    pub epp: EppSettings,
}

/// Picks until SIGTERM or Ctrl-C, then drains.
pub async fn run(settings: Settings, epp: EppSettings) -> anyhow::Result<()> {
    let config = epp.config(&settings)?;
    let picker = Picker::start(config, &epp).await?;
    crate::serve::signal().await?;
    if let Stopped::GraceExpired { in_flight } = picker.shutdown().await {
        warn!(in_flight, "stopped with requests still in flight");
    }
    Ok(())
}
