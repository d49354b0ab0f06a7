//! A real `redis-server` (Debian's package; `scripts/test` installs it) on a free loopback port,
//! started and stopped by the test that uses it.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    /// How it listens: plain TCP on `port`, or TLS there with these files.
    tls: Vec<String>,
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
            tls: Vec::new(),
        };
        server.restart();
        server
    }

    /// A fresh server speaking TLS only, with `certs`' server certificate; clients need not
    /// show one.
    pub fn start_tls(certs: &super::certs::Certs) -> Self {
        let path = |p: &std::path::Path| p.to_str().unwrap().to_string();
        let mut server = Self {
            child: None,
            port: free_port(),
            tls: vec![
                "--tls-cert-file".into(),
                path(&certs.server_cert),
                "--tls-key-file".into(),
                path(&certs.server_key),
                "--tls-ca-cert-file".into(),
                path(&certs.ca),
                "--tls-auth-clients".into(),
                "no".into(),
            ],
        };
        server.restart();
        server
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts the server (again) on its port, empty, and returns once it says it is ready.
    pub fn restart(&mut self) {
        let port = self.port.to_string();
        let listen: &[&str] = if self.tls.is_empty() {
            &["--port", &port]
        } else {
            &["--port", "0", "--tls-port", &port]
        };
        let mut child = Command::new("redis-server")
            .args(listen)
            .args(["--bind", "127.0.0.1"])
            .args(&self.tls)
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
