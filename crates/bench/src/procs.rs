//! The processes a benchmark starts, and what Linux says they cost.
//!
//! Every child runs in its own process group, so stopping it by PID also stops anything it
//! started (`smg launch` is a Python launcher in front of the router). CPU and memory are read
//! from `/proc` for the whole group's process tree, so a launcher that forks cannot hide cost.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use tokio::process::Child;

/// Why a child process could not be started or inspected.
#[derive(Debug, thiserror::Error)]
pub enum ProcError {
    #[error("could not start {name} ({program}): {source}")]
    Spawn {
        name: String,
        program: String,
        source: std::io::Error,
    },
    #[error("could not create the log file {path}: {source}")]
    Log {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("could not read /proc for pid {pid}: {source}")]
    Proc { pid: u32, source: std::io::Error },
    #[error("unexpected format in {0}")]
    Format(String),
}

/// A started child; stopped (SIGTERM to its group, SIGKILL after a grace) when dropped.
pub struct Proc {
    name: String,
    pid: u32,
    child: Child,
    log: PathBuf,
}

/// How to start one child.
pub struct Launch<'a> {
    pub name: &'a str,
    pub argv: &'a [String],
    /// The CPU core to pin it (and everything it starts) to, via `taskset`.
    pub core: Option<usize>,
    /// Where its stdout and stderr go.
    pub log_dir: &'a Path,
}

impl Proc {
    pub fn spawn(launch: Launch<'_>) -> Result<Self, ProcError> {
        let log = launch.log_dir.join(format!("{}.log", launch.name));
        let out = File::create(&log).map_err(|source| ProcError::Log {
            path: log.clone(),
            source,
        })?;
        let err = out.try_clone().map_err(|source| ProcError::Log {
            path: log.clone(),
            source,
        })?;
        let mut argv: Vec<String> = Vec::new();
        if let Some(core) = launch.core {
            argv.extend(["taskset".into(), "-c".into(), core.to_string()]);
        }
        argv.extend(launch.argv.iter().cloned());
        let (program, args) = argv.split_first().ok_or_else(|| ProcError::Spawn {
            name: launch.name.into(),
            program: String::new(),
            source: std::io::Error::other("empty command"),
        })?;
        let child = tokio::process::Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(|source| ProcError::Spawn {
                name: launch.name.into(),
                program: program.clone(),
                source,
            })?;
        let pid = child.id().ok_or_else(|| ProcError::Spawn {
            name: launch.name.into(),
            program: program.clone(),
            source: std::io::Error::other("exited at once"),
        })?;
        Ok(Self {
            name: launch.name.into(),
            pid,
            child,
            log,
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The process and everything under it, now.
    pub fn pids(&self) -> Vec<u32> {
        tree(self.pid)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Whether it has exited (and so will never become ready).
    pub fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// CPU time (user + system) of the process and everything under it.
    pub fn cpu(&self) -> Result<Duration, ProcError> {
        let ticks_per_sec = clock_ticks_per_sec();
        let mut ticks = 0u64;
        for pid in tree(self.pid()) {
            ticks += cpu_ticks(pid)?;
        }
        Ok(Duration::from_secs_f64(ticks as f64 / ticks_per_sec))
    }

    /// Resident memory of the process tree: (now, peak), in bytes.
    pub fn rss(&self) -> Result<(u64, u64), ProcError> {
        let (mut now, mut peak) = (0, 0);
        for pid in tree(self.pid()) {
            let (n, p) = rss(pid)?;
            now += n;
            peak += p;
        }
        Ok((now, peak))
    }

    /// SIGTERM to the group, then SIGKILL (on drop) if it has not exited within `grace`.
    pub async fn stop(mut self, grace: Duration) {
        self.signal("TERM");
        let _ = tokio::time::timeout(grace, self.child.wait()).await;
    }

    /// SIGKILL to the group, as a crash would, and waits for the exit.
    pub async fn kill(mut self) {
        self.signal("KILL");
        let _ = self.child.wait().await;
    }

    fn signal(&self, signal: &str) {
        // A negative PID names the group; the child is its group's leader.
        let _ = Command::new("kill")
            .args([&format!("-{signal}"), "--", &format!("-{}", self.pid())])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if !self.exited() {
            self.signal("KILL");
            let _ = self.child.start_kill();
        }
        // Reaps without blocking: tokio's orphan queue collects the exit status.
    }
}

/// The PID and all its descendants, read from `/proc/<pid>/task/<tid>/children`.
fn tree(root: u32) -> Vec<u32> {
    let mut pids = vec![root];
    let mut next = 0;
    while next < pids.len() {
        let pid = pids[next];
        next += 1;
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            pids.extend(
                children
                    .split_whitespace()
                    .filter_map(|c| c.parse::<u32>().ok()),
            );
        }
    }
    pids
}

/// utime + stime, in clock ticks, from `/proc/<pid>/stat` (dead threads included).
fn cpu_ticks(pid: u32) -> Result<u64, ProcError> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|source| ProcError::Proc { pid, source })?;
    parse_cpu_ticks(&stat).ok_or_else(|| ProcError::Format(format!("/proc/{pid}/stat")))
}

/// Fields 14 and 15 (utime, stime), counted after the `)` that ends the command name, which
/// may itself contain spaces and parentheses.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// (VmRSS, VmHWM) in bytes from `/proc/<pid>/status`.
fn rss(pid: u32) -> Result<(u64, u64), ProcError> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|source| ProcError::Proc { pid, source })?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kib| kib * 1024)
            .ok_or_else(|| ProcError::Format(format!("/proc/{pid}/status {name}")))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// `getconf CLK_TCK`; Linux has used 100 everywhere for decades.
fn clock_ticks_per_sec() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|t| *t > 0.0)
        .unwrap_or(100.0)
}

/// Busy and total jiffies per CPU core, from `/proc/stat`.
#[derive(Clone, Debug, Default)]
pub struct CoreTimes(Vec<(u64, u64)>);

impl CoreTimes {
    pub fn read() -> Self {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        Self(parse_core_times(&stat))
    }

    /// The share of `core` that was busy between `earlier` and `self`, 0..=1.
    pub fn busy_since(&self, earlier: &CoreTimes, core: usize) -> Option<f64> {
        let (busy, total) = self.0.get(core)?;
        let (busy0, total0) = earlier.0.get(core)?;
        let total = total.checked_sub(*total0).filter(|t| *t > 0)?;
        Some(busy.saturating_sub(*busy0) as f64 / total as f64)
    }
}

/// `cpuN user nice system idle iowait irq softirq steal ...`: busy is all but idle and iowait.
fn parse_core_times(stat: &str) -> Vec<(u64, u64)> {
    stat.lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .map(|l| {
            let values: Vec<u64> = l
                .split_whitespace()
                .skip(1)
                .take(8)
                .filter_map(|v| v.parse().ok())
                .collect();
            let total: u64 = values.iter().sum();
            let idle = values.get(3).copied().unwrap_or(0) + values.get(4).copied().unwrap_or(0);
            (total - idle, total)
        })
        .collect()
}

/// Whether `taskset` can pin a process to `core` on this machine.
pub fn can_pin(core: usize) -> bool {
    Command::new("taskset")
        .args(["-c", &core.to_string(), "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Pins the calling process (all its threads) to `core`, so the load generator stays off the
/// gateway's core.
pub fn pin_self(core: usize) -> bool {
    Command::new("taskset")
        .args([
            "-a",
            "-p",
            "-c",
            &core.to_string(),
            &std::process::id().to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The processor as `/proc/cpuinfo` names it (model name, family, model, clock) and the
/// machine's logical cores (counted there, not as this process may use them: a benchmark pins
/// itself to one): written beside every figure, since machines sold as the same kind differ and
/// only figures from one run compare.
pub fn processor() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |key: &str| {
        info.lines().find_map(|line| {
            let (k, v) = line.split_once(':')?;
            (k.trim() == key).then(|| v.trim().to_string())
        })
    };
    let listed = info
        .lines()
        .filter(|line| {
            line.split_once(':')
                .is_some_and(|(k, _)| k.trim() == "processor")
        })
        .count();
    let cores = match listed {
        0 => std::thread::available_parallelism().map_or(0, |n| n.get()),
        n => n,
    };
    let Some(name) = field("model name") else {
        return format!("unknown processor, {cores} cores");
    };
    let mhz = field("cpu MHz")
        .and_then(|m| m.parse::<f64>().ok())
        .map(|m| format!(", {:.2} GHz", m / 1000.0))
        .unwrap_or_default();
    format!(
        "{name} (family {}, model {}{mhz}), {cores} cores",
        field("cpu family").unwrap_or_else(|| "?".into()),
        field("model").unwrap_or_else(|| "?".into()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_skip_a_command_name_with_spaces_and_parens() {
        let stat = "4242 (tokio (rt) w) S 1 4242 4242 0 -1 4194560 1234 0 0 0 250 75 0 0 20 0 5 0";
        assert_eq!(parse_cpu_ticks(stat), Some(325));
        assert_eq!(parse_cpu_ticks("4242 (short) S 1"), None);
    }

    #[test]
    fn core_times_count_iowait_as_idle() {
        let stat = "cpu  10 0 10 100 5 0 0 0 0 0\n\
                    cpu0 4 1 5 50 2 1 1 0 0 0\n\
                    cpu1 6 0 5 50 3 0 0 0 0 0\n\
                    intr 1 2 3\n";
        let cores = parse_core_times(stat);
        assert_eq!(cores, vec![(12, 64), (11, 64)]);
        let before = CoreTimes(vec![(0, 0), (0, 0)]);
        let after = CoreTimes(vec![(25, 100), (100, 100)]);
        assert_eq!(after.busy_since(&before, 0), Some(0.25));
        assert_eq!(after.busy_since(&before, 1), Some(1.0));
        assert_eq!(after.busy_since(&before, 2), None);
    }

    #[test]
    fn own_process_is_readable() {
        assert!(cpu_ticks(std::process::id()).is_ok());
        let (now, peak) = rss(std::process::id()).unwrap();
        assert!(now > 0 && peak >= now);
    }
}
