//! `sluice sim`: flags in, a running fleet (and its control listener) out.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use sluice_sim::args::EngineArgs;
use sluice_sim::{Fault, FleetConfig, SimFleet};

#[derive(Args)]
pub struct SimArgs {
    /// Number of engines; engine i listens on --port + i.
    #[arg(long, default_value_t = 1)]
    pub engines: usize,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Port of the first engine.
    #[arg(long, default_value_t = 8001)]
    pub port: u16,
    /// With --pd-role prefill: the first engine's bootstrap server port (the others take the
    /// next ports), SGLang's `--disaggregation-bootstrap-port`; 0 picks free ports.
    #[arg(long, default_value_t = 8998)]
    pub disaggregation_bootstrap_port: u16,
    /// Port of the control listener (`GET /engines`, `POST /engines/{i}/fault`,
    /// `GET /engines/{i}/state`); off when not given.
    #[arg(long)]
    pub control_port: Option<u16>,
    /// A fault to apply at startup, `[ENGINE=]JSON`, e.g. `1={"kind":"slow","factor":3}`
    /// (all engines when no index is given). Repeatable. Kinds: wedge (polls), pause, crash, restart,
    /// slow-start (secs), slow (factor), error-rate (rate), error-event (rate, code), hang,
    /// cut-streams, events-stop, one-way, no-tokenizer, load-endpoint (mode), report (waiting,
    /// running, kv_usage, rank), sleep (level), wake, clear; see docs/simulator.md.
    #[arg(long = "fault", value_name = "[ENGINE=]JSON")]
    pub faults: Vec<String>,
    /// More engines serving another model, `MODEL=PROFILE:ENGINES`, e.g.
    /// `llama-3.1-8b=llama3-8b-h100:2` beside a 70B fleet: they follow the --engines engines (on
    /// the next ports), with this command's other engine flags (not --reasoning). Repeatable.
    #[arg(long = "also-serve", value_name = "MODEL=PROFILE:ENGINES")]
    pub also_serve: Vec<String>,
    /// Write the simulated model's files (tokenizer.json, tokenizer_config.json with its chat
    /// template, config.json) into DIR at startup: what a gateway's --tokenizer-path or
    /// --model-path points at to talk to --grpc engines, whose answers are token ids.
    #[arg(long, value_name = "DIR")]
    pub write_model_dir: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// Parses `MODEL=PROFILE:ENGINES`.
fn parse_also(spec: &str) -> anyhow::Result<(String, String, usize)> {
    let bad = || anyhow::anyhow!("--also-serve {spec:?}: expected MODEL=PROFILE:ENGINES");
    let (model, rest) = spec.split_once('=').ok_or_else(bad)?;
    let (profile, engines) = rest.rsplit_once(':').ok_or_else(bad)?;
    let engines: usize = engines.trim().parse().map_err(|_| bad())?;
    if model.trim().is_empty() || engines == 0 {
        return Err(bad());
    }
    Ok((
        model.trim().to_string(),
        profile.trim().to_string(),
        engines,
    ))
}

/// Parses `[ENGINE=]JSON`.
fn parse_fault(spec: &str) -> anyhow::Result<(Option<usize>, Fault)> {
    let (target, json) = match spec.split_once('=') {
        Some((index, json)) if index.trim().chars().all(|c| c.is_ascii_digit()) => {
            (Some(index.trim().parse()?), json)
        }
        _ => (None, spec),
    };
    let fault = serde_json::from_str(json).with_context(|| format!("invalid --fault {spec:?}"))?;
    Ok((target, fault))
}

pub async fn run(args: SimArgs) -> anyhow::Result<()> {
    let engine = args.engine.config()?;
    let faults = args
        .faults
        .iter()
        .map(|f| parse_fault(f))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if let Some(dir) = &args.write_model_dir {
        sluice_sim::vocab::Vocab::new()
            .write_model_dir(dir, &engine.model)
            .with_context(|| format!("cannot write the model's files into {}", dir.display()))?;
        tracing::info!(dir = %dir.display(), "model files written");
    }
    let mut also = Vec::new();
    for spec in &args.also_serve {
        let (model, profile, engines) = parse_also(spec)?;
        also.push((engines, args.engine.config_for(&model, &profile)?));
    }
    let fleet = SimFleet::start(FleetConfig {
        engines: args.engines,
        host: args.host,
        port: args.port,
        bootstrap_port: args.disaggregation_bootstrap_port,
        engine: engine.clone(),
        also,
        faults,
    })
    .await?;
    let fleet = Arc::new(fleet);
    announce(&fleet);
    if let Some(port) = args.control_port {
        serve_control(&fleet, SocketAddr::new(args.host, port)).await?;
    }
    shutdown_signal().await;
    tracing::info!("shutting down");
    Ok(())
}

/// Each engine's address and what it simulates, in the log.
fn announce(fleet: &SimFleet) {
    for slot in fleet.engines() {
        let engine = slot.config();
        tracing::info!(
            engine = slot.index(),
            url = %slot.url(),
            flavor = engine.flavor.owner(),
            model = %engine.model,
            profile = engine.profile.name,
            time_scale = engine.time_scale,
            reasoning = engine.reasoning.is_some(),
            grpc = engine.grpc.is_some(),
            "engine listening"
        );
        if let Some(addr) = slot.bootstrap_addr() {
            tracing::info!(
                engine = slot.index(),
                bootstrap_port = addr.port(),
                "bootstrap server listening"
            );
        }
    }
}

/// `--control-port`: the fault-injection API, on a task of its own.
async fn serve_control(fleet: &Arc<SimFleet>, addr: SocketAddr) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} for the control API"))?;
    tracing::info!(url = %format!("http://{addr}"), "control listener");
    let router = sluice_sim::control::router(fleet.clone());
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            tracing::error!(error = %e, "control listener stopped");
        }
    });
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_target_one_engine_or_all() {
        let (target, fault) = parse_fault(r#"1={"kind":"slow","factor":3}"#).unwrap();
        assert_eq!(target, Some(1));
        assert_eq!(fault, Fault::Slow { factor: 3.0 });
        let (target, fault) = parse_fault(r#"{"kind":"pause"}"#).unwrap();
        assert_eq!((target, fault), (None, Fault::Pause));
        assert!(parse_fault("melt").is_err());
    }

    #[test]
    fn another_model_is_model_profile_and_engines() {
        assert_eq!(
            parse_also("llama-3.1-8b=llama3-8b-h100:2").unwrap(),
            ("llama-3.1-8b".into(), "llama3-8b-h100".into(), 2)
        );
        for bad in ["llama", "m=p", "m=p:0", "=p:1", "m=p:x"] {
            assert!(parse_also(bad).is_err(), "{bad}");
        }
    }
}
