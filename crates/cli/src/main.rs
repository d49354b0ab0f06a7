//! `sluice`: the one binary. `sluice sim` runs simulated engines; `sluice bench` measures them.

mod sim;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "An LLM inference gateway that keeps fleets out of overload collapse"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run simulated vLLM / SGLang engines, each on its own port.
    Sim(Box<sim::SimArgs>),
    /// Benchmarks: engine capacity.
    #[command(subcommand)]
    Bench(Box<sluice_bench::cli::BenchCommand>),
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_tracing();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match cli.command {
        Command::Sim(args) => runtime.block_on(sim::run(*args)),
        Command::Bench(command) => Ok(runtime.block_on(sluice_bench::cli::run(*command))?),
    }
}
