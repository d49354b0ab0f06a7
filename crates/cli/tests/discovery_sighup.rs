//! `sluice serve --discovery-file` rereads its file on SIGHUP, even when nothing about the file
//! (size, modification time) says it changed — the way an operator forces a reread.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use sluice_sim::testkit::instant;
use sluice_sim::{Flavor, FleetConfig, SimFleet};

/// The gateway process, stopped by its PID when dropped.
struct Serving {
    child: Child,
    lines: mpsc::Receiver<String>,
    said: Vec<String>,
}

impl Serving {
    fn start(listing: &str) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["serve", "--host", "127.0.0.1", "--port", "0"])
            .args(["--discovery-file", listing])
            .args(["--discovery-check-interval-secs", "600"])
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

    /// Waits (bounded) for a line holding every one of `needles`.
    fn until(&mut self, needles: &[&str]) {
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| {
                    panic!(
                        "no line with {needles:?}; it said:\n{}",
                        self.said.join("\n")
                    )
                });
            self.said.push(line.clone());
            if needles.iter().all(|n| line.contains(n)) {
                return;
            }
        }
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A listing of `url`, padded to a fixed length so two listings are the same size.
fn listing(url: &str) -> String {
    format!("{:<64}", format!("[\"{url}\"]"))
}

#[test]
fn sighup_rereads_an_unchanged_looking_file() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let fleet = runtime
        .block_on(SimFleet::start(FleetConfig::local(
            2,
            instant(Flavor::Vllm),
        )))
        .unwrap();
    let urls = fleet.urls();
    let path = std::env::temp_dir().join(format!("sluice-sighup-{}.json", std::process::id()));
    std::fs::write(&path, listing(&urls[0])).unwrap();
    let mut gateway = Serving::start(path.to_str().unwrap());
    gateway.until(&["worker registered", &urls[0]]);
    gateway.until(&["worker health changed", "to=\"ready\""]);

    // The same size and modification time: only a SIGHUP makes it read again. Written aside
    // and dated before the rename, so the gateway never sees a newer time.
    let modified = std::fs::metadata(&path).unwrap().modified().unwrap();
    let aside = path.with_extension("next");
    std::fs::write(&aside, listing(&urls[1])).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&aside)
        .unwrap()
        .set_modified(modified)
        .unwrap();
    std::fs::rename(&aside, &path).unwrap();
    let pid = gateway.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap()
        .success());
    gateway.until(&["no longer listed: draining"]);
    gateway.until(&["worker registered", &urls[1]]);
    assert!(
        gateway.child.try_wait().unwrap().is_none(),
        "SIGHUP does not end the gateway"
    );
    let _ = std::fs::remove_file(&path);
}
