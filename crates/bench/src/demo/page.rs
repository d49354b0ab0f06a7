//! The demo's own page: the story's narration and acts, whether the engines keep their clock,
//! and each gateway's status page (`/ui`, its own origin) side by side.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use tokio::time::Instant;

use super::{Stack, Story};

const PAGE: &str = include_str!("page.html");

#[derive(Debug, Clone, Serialize)]
pub struct ActView {
    pub name: &'static str,
    pub narration: &'static str,
    pub start_secs: f64,
    pub end_secs: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct StackView {
    pub name: &'static str,
    pub label: &'static str,
    /// Its gateway's status page.
    pub ui: String,
    /// The engines' late steps since the story began, as a share of their steps.
    pub late_share: f64,
}

/// What the page shows, written by the story's driver.
#[derive(Debug, Clone, Serialize)]
pub struct DemoState {
    pub acts: Vec<ActView>,
    /// The act under way.
    pub act: Option<usize>,
    #[serde(skip)]
    pub started: Option<Instant>,
    pub stacks: Vec<StackView>,
    pub over: bool,
}

impl DemoState {
    pub fn new(story: &Story, stacks: &[Stack]) -> Self {
        Self {
            acts: story
                .acts
                .iter()
                .map(|a| ActView {
                    name: a.name,
                    narration: a.narration,
                    start_secs: a.start.as_secs_f64(),
                    end_secs: a.end.as_secs_f64(),
                })
                .collect(),
            act: None,
            started: None,
            stacks: stacks
                .iter()
                .map(|s| StackView {
                    name: s.kind.name(),
                    label: s.kind.label(),
                    ui: s.ui.clone(),
                    late_share: 0.0,
                })
                .collect(),
            over: false,
        }
    }
}

type Shared = Arc<parking_lot::Mutex<DemoState>>;

async fn story(axum::extract::State(state): axum::extract::State<Shared>) -> impl IntoResponse {
    let state = state.lock().clone();
    let elapsed = state.started.map(|s| s.elapsed().as_secs_f64());
    let mut json = serde_json::to_value(&state).unwrap_or_default();
    json["elapsed_secs"] = serde_json::json!(elapsed);
    Json(json)
}

/// Serves the page on loopback `port` (0: any) until the runtime ends; returns where.
pub async fn serve(port: u16, state: Shared) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    let router = Router::new()
        .route(
            "/",
            get(|| async { ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], PAGE) }),
        )
        .route("/story", get(story))
        .with_state(state);
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok(addr)
}
