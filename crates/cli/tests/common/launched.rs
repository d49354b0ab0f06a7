//! `sluice serve` as a process: its stderr lines read on a thread of their own, awaited with a
//! bound, and the process stopped by its PID when dropped. `Lines` serves any child's output.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A child's output, line by line, read on a thread of its own.
pub struct Lines {
    lines: mpsc::Receiver<String>,
    /// Every line read so far.
    pub said: Vec<String>,
}

impl Lines {
    pub fn of(output: impl Read + Send + 'static) -> Self {
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(output).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self {
            lines,
            said: Vec::new(),
        }
    }

    /// The first line `pick` takes something from within `within`; failing with all it said.
    pub fn until<T>(
        &mut self,
        what: &str,
        within: Duration,
        pick: impl Fn(&str) -> Option<T>,
    ) -> T {
        let give_up = tokio::time::Instant::now() + within;
        loop {
            let left = give_up.saturating_duration_since(tokio::time::Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no {what}; it said:\n{}", self.said.join("\n")));
            self.said.push(line.clone());
            if let Some(found) = pick(&line) {
                return found;
            }
        }
    }
}

pub struct Launched {
    pub child: Child,
    /// What it said on stderr.
    pub lines: Lines,
}

impl Launched {
    /// `sluice serve` with `args`, and `env` set for it (never a cluster's in-pod credentials:
    /// a test's Kubernetes is the one its kubeconfig names).
    pub fn start(args: &[String], env: &[(&str, &OsStr)]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .arg("serve")
            .args(args)
            .envs(env.iter().copied())
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let lines = Lines::of(child.stderr.take().unwrap());
        Self { child, lines }
    }

    /// The first line `pick` takes something from; bounded, and failing with all it said.
    pub fn until<T>(&mut self, what: &str, pick: impl Fn(&str) -> Option<T>) -> T {
        self.lines.until(what, Duration::from_secs(30), pick)
    }
}

impl Drop for Launched {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
