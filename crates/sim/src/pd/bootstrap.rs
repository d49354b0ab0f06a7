//! The prefill engine's bootstrap server and the decode engine's claim on it.
//!
//! `POST /bootstrap/{room}` claims a room and is answered when the KV is across (200) or the room
//! failed (409, `{"error": code}`). The claim's connection is the decode half's presence: when it
//! drops, the prefill stops computing for a decode engine that is gone.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{Method, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::json;

use super::{Bootstrap, Failure, Rooms};

/// The bootstrap server's routes over one incarnation's rooms.
pub fn router(rooms: Arc<Rooms>) -> Router {
    Router::new()
        .route("/bootstrap/{room}", post(claim))
        .with_state(rooms)
}

async fn claim(State(rooms): State<Arc<Rooms>>, Path(room): Path<u64>) -> Response {
    match rooms.claim(room).await {
        Ok(()) => axum::Json(json!({"ok": true})).into_response(),
        Err(why) => (
            StatusCode::CONFLICT,
            axum::Json(json!({"error": why.code()})),
        )
            .into_response(),
    }
}

/// The decode side's client for claims.
pub struct ClaimClient {
    client: Client<HttpConnector, Empty<Bytes>>,
}

impl ClaimClient {
    pub fn new() -> Self {
        Self {
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    pub async fn claim(&self, at: &Bootstrap) -> Result<(), Failure> {
        let host = if at.host.contains(':') && !at.host.starts_with('[') {
            format!("[{}]", at.host)
        } else {
            at.host.clone()
        };
        let request = Request::builder()
            .method(Method::POST)
            .uri(format!("http://{host}:{}/bootstrap/{}", at.port, at.room))
            .body(Empty::new())
            .map_err(|_| Failure::Unreachable)?;
        let response = self
            .client
            .request(request)
            .await
            .map_err(|_| Failure::Unreachable)?;
        if response.status().is_success() {
            return Ok(());
        }
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|_| Failure::Unreachable)?
            .to_bytes();
        let code = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_string))
            .unwrap_or_default();
        Err(Failure::from_code(&code))
    }
}

impl Default for ClaimClient {
    fn default() -> Self {
        Self::new()
    }
}
