//! A real `redis-server` (Debian's package; `scripts/test` installs it) on a free loopback port,
//! started and stopped by the test that uses it.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

impl RedisServer {
    /// A fresh server on a free port, once it accepts connections.
    pub fn start() -> Self {
        let mut server = Self {
            child: None,
            port: free_port(),
        };
        server.restart();
        server
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts the server (again) on its port, empty, and returns once it says it is ready.
    pub fn restart(&mut self) {
        let mut child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--logfile", ""])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (Debian's redis-server package; scripts/test installs it)");
        let stdout = child.stdout.take().unwrap();
        let (ready_tx, ready) = mpsc::channel();
        std::thread::spawn(move || {
            // Read to the end, so the server never blocks on a full pipe.
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.contains("Ready to accept connections") {
                    let _ = ready_tx.send(());
                }
            }
        });
        self.child = Some(child);
        ready
            .recv_timeout(Duration::from_secs(30))
            .expect("redis-server ready");
    }

    /// Stops the server by its PID (SIGKILL: as a crash, nothing flushed).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
