//! Instructions per request and per SSE event, counted by callgrind over the gateway's whole
//! process tree: the figure that does not move with the machine's load as CPU time does, so it
//! compares across runs and machines of one architecture. (`perf stat -e instructions` counts
//! the same at full speed but needs hardware counters, which virtual machines often hide;
//! callgrind needs nothing but valgrind.)
//!
//! The target is started under `valgrind --tool=callgrind --trace-children=yes` (nginx's worker
//! and a launcher's children are counted too). After a warm-up its counters are zeroed, a fixed
//! number of requests is sent, and the counters are dumped; then zeroed again and the gateway
//! left idle for as long as the requests took (5 s at least), and dumped. What an idle gateway spends in that
//! time (health probes, load polls, a status page's sampler) is taken off: under callgrind a
//! window lasts some fifty times longer than at full speed, and that background work, which a
//! real load spreads over fifty times more requests, would otherwise be charged to these.
//!
//! Under callgrind every target is the slowest part of the machine, so each is measured
//! saturated: counts compare like for like where CPU time may not. Two caveats stay: callgrind
//! counts a `rep movsb` copy one instruction per byte (hardware retires it as one), and it runs
//! a process's threads one at a time.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use super::load::{counted_loop, Shot};
use super::{free_ports, loopback, wait_until_serving_within, OverheadError, OverheadPlan, Target};
use crate::procs::{Launch, Proc};

/// Connections the counted requests are spread over.
const CONNECTIONS: usize = 8;
/// Streamed answers counted for the per-event figure (each `plan.stream_tokens` events).
const STREAMS: u64 = 16;
/// How long one `callgrind_control` may take.
const CONTROL_LIMIT: Duration = Duration::from_secs(30);
/// The shortest idle stretch: idle work comes in ticks (the status page's sampler, probes,
/// polls), and a stretch of a tick or two would take off one tick too many or too few.
const IDLE_AT_LEAST: Duration = Duration::from_secs(5);
/// Starting under valgrind is slow (Envoy takes tens of seconds).
const STARTUP_LIMIT: Duration = Duration::from_secs(300);

/// What callgrind counted for one target.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Instructions {
    pub target: String,
    /// Small requests counted, and instructions per request, idle work taken off.
    pub requests: u64,
    pub per_request: f64,
    /// SSE events counted, and instructions per event, idle work taken off.
    pub events: u64,
    pub per_sse_event: Option<f64>,
    /// What the idle gateway spent per second under callgrind (taken off both figures).
    pub idle_per_sec: f64,
}

/// The three counts of a run, before they become figures.
#[derive(Clone, Copy, Debug)]
struct Counts {
    requests: u64,
    requests_took: Duration,
    small: u64,
    idle: u64,
    idle_took: Duration,
    events: u64,
    streams_took: Duration,
    stream: u64,
}

impl Counts {
    fn figures(&self, target: &str) -> Instructions {
        let idle_per_sec = self.idle as f64 / self.idle_took.as_secs_f64().max(1e-9);
        let less_idle =
            |counted: u64, took: Duration| counted as f64 - idle_per_sec * took.as_secs_f64();
        Instructions {
            target: target.into(),
            requests: self.requests,
            per_request: less_idle(self.small, self.requests_took) / self.requests.max(1) as f64,
            events: self.events,
            per_sse_event: (self.events > 0)
                .then(|| less_idle(self.stream, self.streams_took) / self.events as f64),
            idle_per_sec,
        }
    }
}

/// Counts `target`'s instructions (None when not asked to, or when it has no process of its
/// own: `direct`).
pub(super) async fn count(
    plan: &OverheadPlan,
    target: &Target,
    engines: &[std::net::SocketAddr],
    log_dir: &Path,
    small: &Shot,
    stream: &Shot,
) -> Result<Option<Instructions>, OverheadError> {
    let Some(requests) = plan.instruction_requests else {
        return Ok(None);
    };
    let dir = out_dir(log_dir)?;
    let port = free_ports(1)?;
    let command = target
        .counted_command(port, engines, log_dir)
        .map_err(|source| OverheadError::LogDir {
            path: log_dir.into(),
            source,
        })?;
    let Some(argv) = command else {
        return Ok(None);
    };
    let name = format!("{}-callgrind", target.name());
    let argv = under_callgrind(argv, &dir.join(format!("{}.%p", target.name())));
    let mut proc = Proc::spawn(Launch {
        name: &name,
        argv: &argv,
        core: plan.pin(plan.gateway_core),
        log_dir,
    })?;
    let addr = [loopback(port)];
    wait_until_serving_within(&mut proc, addr[0], super::MODEL, STARTUP_LIMIT).await?;
    counted_loop(&addr, CONNECTIONS, small, requests / 4).await?;
    let mut dumps = Dumps::new(dir, target.name());
    let (requests_took, small_count) = dumps
        .around(&proc, counted_loop(&addr, CONNECTIONS, small, requests))
        .await?;
    let (idle_took, idle) = dumps
        .around(&proc, async {
            tokio::time::sleep(requests_took.max(IDLE_AT_LEAST)).await;
            Ok(Default::default())
        })
        .await?;
    let (streams_took, stream_count) = dumps
        .around(&proc, counted_loop(&addr, CONNECTIONS, stream, STREAMS))
        .await?;
    proc.stop(super::STOP_GRACE).await;
    let failed = small_count.tally.failed + stream_count.tally.failed;
    if failed > 0 {
        return Err(OverheadError::CountedFailures {
            name: target.name().into(),
            failed,
        });
    }
    let counts = Counts {
        requests: small_count.tally.completed(),
        requests_took,
        small: small_count.instructions,
        idle: idle.instructions,
        idle_took,
        events: stream_count.tally.events,
        streams_took,
        stream: stream_count.instructions,
    };
    Ok(Some(counts.figures(target.name())))
}

/// Where callgrind writes: a directory anyone may write to, since a process started as another
/// user (or one that drops privileges) dumps there too.
pub(super) fn out_dir(log_dir: &Path) -> Result<PathBuf, OverheadError> {
    use std::os::unix::fs::PermissionsExt;
    let dir = log_dir.join("callgrind");
    let made = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)));
    made.map_err(|source| OverheadError::LogDir {
        path: dir.clone(),
        source,
    })?;
    Ok(dir)
}

/// `argv` run under callgrind, every process it starts traced, each writing `out` (`%p` is the
/// PID).
fn under_callgrind(argv: Vec<String>, out: &Path) -> Vec<String> {
    let mut wrapped = vec![
        "valgrind".to_string(),
        "--tool=callgrind".into(),
        "--trace-children=yes".into(),
        format!("--callgrind-out-file={}", out.display()),
    ];
    wrapped.extend(argv);
    wrapped
}

/// One counted stretch: what the load did, and the instructions spent meanwhile.
#[derive(Default)]
struct Counted {
    tally: super::load::Tally,
    instructions: u64,
}

/// The dumps callgrind has written for one target, so each stretch reads only its own.
struct Dumps {
    dir: PathBuf,
    prefix: String,
    read: HashSet<PathBuf>,
}

impl Dumps {
    fn new(dir: PathBuf, target: &str) -> Self {
        let mut dumps = Self {
            dir,
            prefix: format!("{target}."),
            read: HashSet::new(),
        };
        let _ = dumps.new_files();
        dumps
    }

    /// Zeroes the counters of every process of `proc`, runs `load`, dumps them, and returns
    /// how long the load took and what was counted meanwhile.
    async fn around(
        &mut self,
        proc: &Proc,
        load: impl std::future::Future<Output = Result<super::load::Tally, super::load::LoadError>>,
    ) -> Result<(Duration, Counted), OverheadError> {
        let pids = proc.pids();
        control(proc.name(), &pids, "--zero").await?;
        let start = Instant::now();
        let tally = load.await?;
        let took = start.elapsed();
        control(proc.name(), &pids, "--dump").await?;
        let mut instructions = 0;
        for file in self.new_files() {
            let text = std::fs::read_to_string(&file).map_err(|source| OverheadError::LogDir {
                path: file.clone(),
                source,
            })?;
            instructions += total(&text)
                .ok_or_else(|| OverheadError::CallgrindOutput { path: file.clone() })?;
        }
        Ok((
            took,
            Counted {
                tally,
                instructions,
            },
        ))
    }

    /// Dump files not read before: `TARGET.PID.PART` (`TARGET.PID` itself is written at exit).
    fn new_files(&mut self) -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut fresh = Vec::new();
        for path in entries.flatten().map(|e| e.path()) {
            let ours = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix(&self.prefix))
                .is_some_and(|pid_part| pid_part.contains('.'));
            if ours && self.read.insert(path.clone()) {
                fresh.push(path);
            }
        }
        fresh
    }
}

/// Runs `callgrind_control FLAG PID` for every PID; those not under callgrind (a launcher's
/// shell that has become its child, say) refuse, but at least one must accept. A process that
/// cannot be reached (its pipes not its user's) would leave the command waiting: it is given
/// `CONTROL_LIMIT`.
async fn control(name: &str, pids: &[u32], flag: &str) -> Result<(), OverheadError> {
    let mut accepted = 0;
    for pid in pids {
        let status = tokio::process::Command::new("callgrind_control")
            .args([flag, &pid.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .status();
        let status = tokio::time::timeout(CONTROL_LIMIT, status).await;
        if status.is_ok_and(|s| s.is_ok_and(|s| s.success())) {
            accepted += 1;
        }
    }
    if accepted == 0 {
        return Err(OverheadError::CallgrindControl {
            name: name.into(),
            flag: flag.into(),
        });
    }
    Ok(())
}

/// The instructions a dump counted: its `totals:` line (older valgrinds write only `summary:`).
fn total(dump: &str) -> Option<u64> {
    let line = |key: &str| {
        dump.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
    };
    line("totals:").or_else(|| line("summary:"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dump_total_is_read_from_totals_or_summary() {
        let dump = "version: 1\ncreator: callgrind-3.19.0\nevents: Ir\nsummary: 200109693\n\nfn=(1)\n0 3\ntotals: 200109693\n";
        assert_eq!(total(dump), Some(200_109_693));
        assert_eq!(total("events: Ir\nsummary: 42\n"), Some(42));
        assert_eq!(total("events: Ir\n"), None);
    }

    #[test]
    fn idle_work_is_taken_off_for_the_time_each_stretch_took() {
        let secs = Duration::from_secs;
        let counts = Counts {
            requests: 3200,
            requests_took: secs(4),
            small: 200_000_000,
            idle: 16_000_000,
            idle_took: secs(10),
            events: 16_000,
            streams_took: secs(2),
            stream: 99_200_000,
        };
        let got = counts.figures("sluice");
        assert_eq!(got.idle_per_sec, 1_600_000.0);
        // (200M - 4 s x 1.6M) / 3200
        assert_eq!(got.per_request, 60_500.0);
        // (99.2M - 2 s x 1.6M) / 16,000
        assert_eq!(got.per_sse_event, Some(6_000.0));
    }

    #[test]
    fn the_command_runs_under_callgrind_with_its_children() {
        let argv = under_callgrind(
            vec!["nginx".into(), "-c".into(), "x.conf".into()],
            Path::new("/tmp/cg/nginx.%p"),
        );
        assert_eq!(
            argv,
            [
                "valgrind",
                "--tool=callgrind",
                "--trace-children=yes",
                "--callgrind-out-file=/tmp/cg/nginx.%p",
                "nginx",
                "-c",
                "x.conf"
            ]
        );
    }
}
