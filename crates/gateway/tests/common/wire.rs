//! A scripted engine on 127.0.0.1:0 that answers with the wire-conformance fixtures
//! (`fixtures/engines/`), each written from vLLM's or SGLang's source — not with the project's
//! own simulator, which the gateway must not be checked against alone.
//!
//! It serves `/health`, `/v1/models` (its flavor as `owned_by`), its flavor's load endpoint
//! (`/metrics`, `/v1/loads`, `/get_load`: a status and a body the test sets, or 404) and
//! `/v1/chat/completions`, which plays the next scripted answer (or the default one). An answer
//! can hold its body until the test releases it — the head goes out at once, as the engines'
//! streaming responses do — so nothing here sleeps.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::Notify;

/// A fixture's text, by its path under `fixtures/engines/`.
pub fn fixture(path: &str) -> String {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/engines/");
    std::fs::read_to_string(format!("{root}{path}"))
        .unwrap_or_else(|e| panic!("fixture {path}: {e}"))
}

/// One answer to a generation request.
#[derive(Clone)]
pub struct Scripted {
    pub status: u16,
    pub sse: bool,
    pub body: String,
    /// The body waits for this (the head does not).
    pub release: Option<Arc<Notify>>,
}

impl Scripted {
    /// A `200` event stream with `body`.
    pub fn stream(body: impl Into<String>) -> Self {
        Self {
            status: 200,
            sse: true,
            body: body.into(),
            release: None,
        }
    }

    /// A JSON answer with `status`.
    pub fn json(status: u16, body: impl Into<String>) -> Self {
        Self {
            status,
            sse: false,
            body: body.into(),
            release: None,
        }
    }

    /// A stream that finishes as a healthy one does.
    pub fn ok_stream() -> Self {
        Self::stream(
            "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
        )
    }

    /// The same, its body held until `release` is notified.
    pub fn held(mut self, release: &Arc<Notify>) -> Self {
        self.release = Some(release.clone());
        self
    }
}

struct Wire {
    flavor: &'static str,
    /// Load endpoint path -> (status, body).
    load: Mutex<HashMap<&'static str, (u16, String)>>,
    answers: Mutex<VecDeque<Scripted>>,
    default: Mutex<Scripted>,
    received: AtomicU64,
    /// A load request with a query string is answered 422 (an engine that checks `include`).
    refuse_queries: std::sync::atomic::AtomicBool,
    /// Load requests answered.
    polls: AtomicU64,
    polled: Notify,
}

/// A running scripted engine; stopped when dropped.
pub struct WireEngine {
    pub url: String,
    wire: Arc<Wire>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for WireEngine {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl WireEngine {
    /// An engine of `flavor` (`vllm`, `sglang`) answering `default` to every generation.
    pub async fn start(flavor: &'static str, default: Scripted) -> Self {
        let wire = Arc::new(Wire {
            flavor,
            load: Mutex::new(HashMap::new()),
            answers: Mutex::new(VecDeque::new()),
            default: Mutex::new(default),
            received: AtomicU64::new(0),
            refuse_queries: std::sync::atomic::AtomicBool::new(false),
            polls: AtomicU64::new(0),
            polled: Notify::new(),
        });
        let app = Router::new()
            .route("/health", get(|| async { StatusCode::OK }))
            .route("/v1/models", get(models))
            .route("/metrics", get(load))
            .route("/v1/loads", get(load))
            .route("/get_load", get(load))
            .route("/v1/chat/completions", post(generate))
            .with_state(wire.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self { url, wire, task }
    }

    /// What `path` answers from now on.
    pub fn set_load(&self, path: &'static str, status: u16, body: impl Into<String>) {
        self.wire.load.lock().insert(path, (status, body.into()));
    }

    /// Load requests with a query string are refused (422) from now on.
    pub fn refuse_queries(&self) {
        self.wire.refuse_queries.store(true, Ordering::SeqCst);
    }

    /// The next generation request gets `answer` (then the default again).
    pub fn then(&self, answer: Scripted) {
        self.wire.answers.lock().push_back(answer);
    }

    pub fn set_default(&self, answer: Scripted) {
        *self.wire.default.lock() = answer;
    }

    /// Generation requests received.
    pub fn received(&self) -> u64 {
        self.wire.received.load(Ordering::SeqCst)
    }

    /// Waits until `n` more load requests than `since` were answered.
    pub async fn polls_past(&self, since: u64, n: u64) {
        loop {
            let polled = self.wire.polled.notified();
            if self.wire.polls.load(Ordering::SeqCst) >= since + n {
                return;
            }
            polled.await;
        }
    }

    pub fn polls(&self) -> u64 {
        self.wire.polls.load(Ordering::SeqCst)
    }
}

async fn models(State(wire): State<Arc<Wire>>) -> impl IntoResponse {
    let body = serde_json::json!({
        "object": "list",
        "data": [{"id": "test-model", "object": "model", "owned_by": wire.flavor}],
    });
    axum::Json(body)
}

async fn load(State(wire): State<Arc<Wire>>, uri: Uri) -> Response {
    let path = match uri.path() {
        "/metrics" => "/metrics",
        "/v1/loads" => "/v1/loads",
        _ => "/get_load",
    };
    let answer = wire.load.lock().get(path).cloned();
    wire.polls.fetch_add(1, Ordering::SeqCst);
    wire.polled.notify_waiters();
    if uri.query().is_some() && wire.refuse_queries.load(Ordering::SeqCst) {
        return StatusCode::UNPROCESSABLE_ENTITY.into_response();
    }
    match answer {
        Some((status, body)) => (StatusCode::from_u16(status).unwrap(), body).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn generate(State(wire): State<Arc<Wire>>) -> Response {
    wire.received.fetch_add(1, Ordering::SeqCst);
    let next = wire.answers.lock().pop_front();
    let answer = next.unwrap_or_else(|| wire.default.lock().clone());
    let content_type = if answer.sse {
        "text/event-stream"
    } else {
        "application/json"
    };
    let bytes = Bytes::from(answer.body);
    let body = match answer.release {
        None => Body::from(bytes),
        Some(release) => Body::from_stream(futures_util::stream::once(async move {
            release.notified().await;
            Ok::<_, std::io::Error>(bytes)
        })),
    };
    Response::builder()
        .status(answer.status)
        .header(header::CONTENT_TYPE, content_type)
        .body(body)
        .unwrap()
}
