//! A worker on 127.0.0.1:0 that writes its generation answers byte for byte as the test gives
//! them — framings no HTTP library would produce — and answers the gateway's own requests
//! (`/health`, `/v1/models`, the load endpoint) as a vLLM engine does, on kept-alive
//! connections.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the worker does with a generation request.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Generation {
    /// Writes these bytes, and keeps the connection.
    Writes(&'static [u8]),
    /// On a connection that already carried an answer, reads the request and closes with
    /// nothing answered (the close crossing the request: a keep-alive race); on a fresh one,
    /// writes these bytes.
    RacesWith(&'static [u8]),
}

/// A running raw worker; stopped when dropped.
pub struct RawWorker {
    pub url: String,
    generations: Arc<AtomicU64>,
    dropped: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RawWorker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RawWorker {
    pub async fn start(generation: Generation) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let generations = Arc::new(AtomicU64::new(0));
        let dropped = Arc::new(AtomicU64::new(0));
        let counts = (generations.clone(), dropped.clone());
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((socket, _)) = listener.accept().await {
                let counts = (counts.0.clone(), counts.1.clone());
                connections.spawn(serve(socket, generation, counts));
            }
        });
        Self {
            url,
            generations,
            dropped,
            task,
        }
    }

    /// Generation requests that reached it.
    pub fn generations(&self) -> u64 {
        self.generations.load(Ordering::SeqCst)
    }

    /// Generation requests it read and closed the connection on, unanswered.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::SeqCst)
    }
}

const MODELS: &str =
    r#"{"object":"list","data":[{"id":"test-model","object":"model","owned_by":"vllm"}]}"#;

async fn serve(
    mut socket: TcpStream,
    generation: Generation,
    (generations, dropped): (Arc<AtomicU64>, Arc<AtomicU64>),
) {
    let mut read = Vec::new();
    let mut answered = false;
    while let Some(target) = request(&mut socket, &mut read).await {
        let answer: Vec<u8> = if target.starts_with("POST /v1/chat/completions") {
            generations.fetch_add(1, Ordering::SeqCst);
            match generation {
                Generation::RacesWith(_) if answered => {
                    dropped.fetch_add(1, Ordering::SeqCst);
                    return;
                }
                Generation::Writes(bytes) | Generation::RacesWith(bytes) => bytes.to_vec(),
            }
        } else if target.starts_with("GET /v1/models") {
            framed("200 OK", MODELS)
        } else if target.starts_with("GET /health") {
            framed("200 OK", "")
        } else {
            framed("404 Not Found", "")
        };
        if socket.write_all(&answer).await.is_err() {
            return;
        }
        answered = true;
    }
}

fn framed(status: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The next request's first line (its head and body read off the socket); `None` at the end.
async fn request(socket: &mut TcpStream, read: &mut Vec<u8>) -> Option<String> {
    loop {
        if let Some(end) = read.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&read[..end]).into_owned();
            let length: usize = head
                .to_ascii_lowercase()
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if read.len() >= end + 4 + length {
                read.drain(..end + 4 + length);
                return head.lines().next().map(str::to_string);
            }
        }
        let mut buf = [0u8; 4096];
        match socket.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => read.extend_from_slice(&buf[..n]),
        }
    }
}
