//! `sluice serve` as a process: its stderr lines read on a thread of their own, awaited with a
//! bound, and the process stopped by its PID when dropped.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub struct Launched {
    pub child: Child,
    lines: mpsc::Receiver<String>,
    /// Every line read so far.
    pub said: Vec<String>,
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
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self {
            child,
            lines,
            said: Vec::new(),
        }
    }

    /// The first line `pick` takes something from; bounded, and failing with all it said.
    pub fn until<T>(&mut self, what: &str, pick: impl Fn(&str) -> Option<T>) -> T {
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("no {what}; it said:\n{}", self.said.join("\n")));
            self.said.push(line.clone());
            if let Some(found) = pick(&line) {
                return found;
            }
        }
    }
}

impl Drop for Launched {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
