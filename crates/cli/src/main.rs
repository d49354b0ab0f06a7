//! `sluice`: the one binary. `sluice serve` runs the gateway; `sluice epp` runs it as a Gateway
//! API endpoint picker behind Envoy; `sluice sim` runs simulated engines; `sluice bench`
//! measures them; `sluice demo` runs them all together, on one page; `sluice flags` prints the
//! flag reference (docs/flags.md).

// Functions stay under 60 lines (clippy.toml), test code excepted: `cargo clippy` holds it.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

mod demo;
mod epp;
mod flags;
mod serve;
mod sim;

use std::path::Path;
use std::sync::Arc;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// mimalloc instead of glibc's malloc: a request makes some forty short-lived allocations, and
/// glibc's malloc and free were 12% of the gateway's instructions; with mimalloc a small request
/// takes about 6% fewer and an open stream 10% less memory, for 0.85 MB more anonymous memory
/// at idle (CHANGELOG.md, 2026-12-02). Built without transparent huge pages, which cost 12 MB at idle. A static because
/// Rust's allocator hook is one; it holds no state.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    /// Watch it survive: an embedded simulated fleet, the gateway with its protections, and a
    /// load that plays a story (a surge, a frozen engine, a crash), on one page.
    Demo(Box<demo::DemoArgs>),
    /// Run the gateway in front of OpenAI-compatible workers (vLLM, SGLang, ...).
    Serve(Box<serve::ServeArgs>),
    /// Run the gateway as a Gateway API endpoint picker behind Envoy (ext_proc on --grpc-port):
    /// the data plane sends each request where sluice decides.
    Epp(Box<epp::EppArgs>),
    /// Run simulated vLLM / SGLang engines, each on its own port.
    Sim(Box<sim::SimArgs>),
    /// Benchmarks: engine capacity, gateway overhead, open-loop goodput runs, whole scenarios
    /// (overload sweep, incidents).
    #[command(subcommand)]
    Bench(Box<sluice_bench::cli::BenchCommand>),
    /// Print the reference of every flag of `sluice serve` and `sluice epp` (meaning, default,
    /// config-file key, SMG's default where it differs) as Markdown: docs/flags.md.
    Flags,
}

/// Logs to stderr — text, coloured only on a terminal, or JSON lines — and, with a directory,
/// to `sluice.log` in it too (uncoloured).
fn init_tracing(default_filter: &str, json: bool, dir: Option<&Path>) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    use tracing_subscriber::fmt::writer::{BoxMakeWriter, MakeWriterExt};
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let (writer, ansi) = match dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .map_err(|e| anyhow::anyhow!("--log-dir {}: {e}", dir.display()))?;
            let path = dir.join("sluice.log");
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|e| anyhow::anyhow!("--log-dir: cannot open {}: {e}", path.display()))?;
            (
                // The file first: once a line is on stderr, it is in the file too.
                BoxMakeWriter::new(Arc::new(file).and(std::io::stderr)),
                false,
            )
        }
        None => (
            BoxMakeWriter::new(std::io::stderr),
            std::io::stderr().is_terminal(),
        ),
    };
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(ansi);
    if json {
        logs.json().init();
    } else {
        logs.init();
    }
    Ok(())
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}

/// The command line, parsed. When it names a flag clap does not know that is one of SMG's,
/// the error lists every such flag on the line with what to use instead (`config::smg`), so an
/// SMG launch line is mended in one pass rather than one flag per try.
fn parse() -> clap::ArgMatches {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    use sluice_gateway::config::smg;
    Cli::command().try_get_matches().unwrap_or_else(|e| {
        let unknown = match e.get(ContextKind::InvalidArg) {
            Some(ContextValue::String(arg)) if e.kind() == ErrorKind::UnknownArgument => arg,
            _ => e.exit(),
        };
        if smg::instead_of(unknown).is_none() {
            e.exit()
        }
        for arg in std::env::args_os().filter_map(|a| a.into_string().ok()) {
            if let Some(instead) = smg::instead_of(&arg) {
                let flag = arg.split_once('=').map_or(arg.as_str(), |(flag, _)| flag);
                eprintln!("error: {flag} is SMG's flag, and sluice does not take it: {instead}");
            }
        }
        std::process::exit(2)
    })
}

/// `command`'s own arguments.
fn subcommand<'a>(
    matches: &'a clap::ArgMatches,
    command: &str,
) -> anyhow::Result<&'a clap::ArgMatches> {
    matches
        .subcommand_matches(command)
        .ok_or_else(|| anyhow::anyhow!("{command}: no arguments"))
}

/// `sluice serve`'s settings, with logging started; `None` when `--print-config` printed them
/// instead.
fn serve_settings(matches: &clap::ArgMatches) -> anyhow::Result<Option<sluice_gateway::Settings>> {
    let settings = serve::settings(subcommand(matches, "serve")?)?;
    if settings.print_config {
        print!("{}", settings.to_toml()?);
        return Ok(None);
    }
    start_logging(&settings)?;
    Ok(Some(settings))
}

/// `sluice epp`'s settings (the gateway's and the picker's own, from the same flags and file),
/// with logging started; `None` when `--print-config` printed them instead.
fn epp_settings(
    matches: &clap::ArgMatches,
) -> anyhow::Result<Option<(sluice_gateway::Settings, sluice_epp::EppSettings)>> {
    let (settings, epp) = sluice_gateway::config::load_with(subcommand(matches, "epp")?)?;
    if settings.print_config {
        print!("{}", settings.to_toml_with(&epp)?);
        return Ok(None);
    }
    start_logging(&settings)?;
    Ok(Some((settings, epp)))
}

fn start_logging(settings: &sluice_gateway::Settings) -> anyhow::Result<()> {
    init_tracing(
        &settings.telemetry.log_filter()?,
        settings.telemetry.log_json,
        settings.telemetry.log_dir.as_deref(),
    )
}

fn main() -> anyhow::Result<()> {
    let matches = parse();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    match cli.command {
        Command::Serve(_) => match serve_settings(&matches)? {
            Some(settings) => runtime()?.block_on(serve::run(settings)),
            None => Ok(()),
        },
        Command::Epp(_) => match epp_settings(&matches)? {
            Some((settings, epp)) => runtime()?.block_on(epp::run(settings, epp)),
            None => Ok(()),
        },
        Command::Demo(args) => {
            init_tracing("warn", false, None)?;
            runtime()?.block_on(demo::run(*args))
        }
        Command::Sim(args) => {
            init_tracing("info", false, None)?;
            runtime()?.block_on(sim::run(*args))
        }
        Command::Bench(command) => {
            init_tracing("info", false, None)?;
            Ok(runtime()?.block_on(sluice_bench::cli::run(*command))?)
        }
        Command::Flags => {
            print!("{}", flags::reference(&Cli::command()));
            Ok(())
        }
    }
}
