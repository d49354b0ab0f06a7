//! The functions `sluice serve` runs — starting, idle, answering requests and streams — as a
//! symbol ordering for the linker (`scripts/release`), so that they sit together at the start of
//! the binary's code.
//!
//! Why: an idle gateway's resident memory is mostly pages of its own binary, and which pages
//! depends on where the code it ran lies. Spread over 20 MB of code, the few thousand functions
//! it runs touch pages all over it, and a kernel that maps a whole cached folio around each fault
//! makes every touch cost far more than its page. Laid out together they cost a few hundred
//! pages. The names are the binary's own (mangled, as callgrind reads them with `--demangle=no`);
//! their hashes change with the code, so the ordering is made from the very build it orders.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::load::counted_loop;
use super::{free_ports, loopback, spawn_engines, wait_until_serving_within, OverheadError};
use crate::procs::{Launch, Proc};

/// Connections the requests are spread over.
const CONNECTIONS: usize = 8;
/// Streamed answers sent after the small requests, of `STREAM_TOKENS` events each.
const STREAMS: u64 = 8;
const STREAM_TOKENS: u32 = 50;
/// Starting under callgrind is slow, and so is stopping (the dump is written at exit).
const LIMIT: Duration = Duration::from_secs(300);

/// What to profile and where the ordering goes.
#[derive(Debug, Clone)]
pub struct LayoutPlan {
    /// The `sluice` binary to profile (the one the ordering is for).
    pub exe: PathBuf,
    pub out: PathBuf,
    /// Small requests sent.
    pub requests: u64,
    /// How long the gateway is left idle before them (its probes, polls and sampler run).
    pub idle: Duration,
}

/// Profiles `plan.exe` serving two instant engines and writes the ordering; the number of
/// functions in it.
pub async fn symbol_order(plan: &LayoutPlan) -> Result<usize, OverheadError> {
    let log_dir = std::env::temp_dir().join(format!("sluice-symbol-order-{}", std::process::id()));
    let dir = super::instructions::out_dir(&log_dir)?;
    let (engines, addrs) = spawn_engines(&plan.exe, "instant", 2, None, &log_dir).await?;
    let profiled = profile(plan, &addrs, &dir, &log_dir).await;
    engines.stop(super::STOP_GRACE).await;
    profiled?;
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).map_err(|source| OverheadError::LogDir {
        path: dir.clone(),
        source,
    })? {
        let path = entry
            .map_err(|source| OverheadError::LogDir {
                path: dir.clone(),
                source,
            })?
            .path();
        let text = std::fs::read_to_string(&path)
            .map_err(|source| OverheadError::LogDir { path, source })?;
        names.extend(functions(&text).map(str::to_string));
    }
    let mut seen = std::collections::HashSet::new();
    names.retain(|name| seen.insert(name.clone()));
    if names.is_empty() {
        return Err(OverheadError::CallgrindOutput { path: dir });
    }
    let text = names.join("\n") + "\n";
    std::fs::write(&plan.out, text).map_err(|source| OverheadError::LogDir {
        path: plan.out.clone(),
        source,
    })?;
    Ok(names.len())
}

/// The gateway under callgrind from its start to its exit: idle, then the requests, then the
/// streams.
async fn profile(
    plan: &LayoutPlan,
    engines: &[SocketAddr],
    dir: &Path,
    log_dir: &Path,
) -> Result<(), OverheadError> {
    let port = free_ports(1)?;
    let mut argv: Vec<String> = [
        "valgrind",
        "--tool=callgrind",
        "--demangle=no",
        &format!("--callgrind-out-file={}", dir.join("serve.%p").display()),
        &plan.exe.display().to_string(),
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "--worker-urls",
    ]
    .map(str::to_string)
    .into();
    argv.extend(engines.iter().map(|a| format!("http://{a}")));
    let mut gateway = Proc::spawn(Launch {
        name: "serve-callgrind",
        argv: &argv,
        core: None,
        log_dir,
    })?;
    let addr = [loopback(port)];
    wait_until_serving_within(&mut gateway, addr[0], super::MODEL, LIMIT).await?;
    tokio::time::sleep(plan.idle).await;
    let small = counted_loop(&addr, CONNECTIONS, &super::small_shot(), plan.requests).await?;
    let streams = super::stream_shot(STREAM_TOKENS);
    let streamed = counted_loop(&addr, CONNECTIONS, &streams, STREAMS).await?;
    gateway.stop(LIMIT).await;
    let failed = small.failed + streamed.failed;
    if failed > 0 {
        return Err(OverheadError::CountedFailures {
            name: "sluice serve".into(),
            failed,
        });
    }
    Ok(())
}

/// The functions a callgrind dump names, in the order it first names them: `fn=(id) name` and
/// `cfn=(id) name` give a name once, later lines the id alone. Callgrind's own pseudo-functions
/// (`(below main)`) are no symbols.
fn functions(dump: &str) -> impl Iterator<Item = &str> {
    dump.lines().filter_map(|line| {
        let named = line
            .strip_prefix("fn=(")
            .or_else(|| line.strip_prefix("cfn=("))?;
        let (_, name) = named.split_once(") ")?;
        let name = name.trim();
        (!name.is_empty() && !name.contains(char::is_whitespace)).then_some(name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_function_is_read_where_the_dump_first_names_it() {
        let dump = "events: Ir\nob=(1) /usr/bin/sluice\nfl=(1) ???\nfn=(1) _ZN4main17h0E\n\
                    0 5\ncfn=(2) _ZN5serve17h1E\ncalls=1 0\n0 9\nfn=(2)\n0 3\ncfn=(1)\n\
                    fn=(3) memcpy\nfn=(4) (below main)\n";
        let names: Vec<_> = functions(dump).collect();
        assert_eq!(names, ["_ZN4main17h0E", "_ZN5serve17h1E", "memcpy"]);
    }
}
