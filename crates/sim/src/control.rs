//! The control listener of a sim process: list engines, inject faults, read ground truth.
//!
//! `GET /engines`, `POST /engines/{i}/fault` with `{"kind": ...}`, `GET /engines/{i}/state`.
//! It lives outside the engines so that a crashed engine can still be brought back.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use crate::faults::Fault;
use crate::fleet::{EngineSlot, FleetError, SimFleet};

type Fleet = Arc<SimFleet>;

fn error(status: StatusCode, message: String) -> Response {
    (status, Json(json!({"error": {"message": message}}))).into_response()
}

fn no_such_engine(e: FleetError) -> Response {
    error(StatusCode::NOT_FOUND, e.to_string())
}

async fn list(State(fleet): State<Fleet>) -> Response {
    let engines: Vec<_> = fleet
        .engines()
        .iter()
        .map(|s| {
            let state = s.state();
            json!({"index": state.index, "url": state.url, "up": state.up, "faults": state.faults})
        })
        .collect();
    Json(json!({"engines": engines})).into_response()
}

async fn state(State(fleet): State<Fleet>, Path(index): Path<usize>) -> Response {
    match fleet.engine(index) {
        Ok(slot) => Json(slot.state()).into_response(),
        Err(e) => no_such_engine(e),
    }
}

async fn fault(
    State(fleet): State<Fleet>,
    Path(index): Path<usize>,
    body: axum::body::Bytes,
) -> Response {
    let slot: &Arc<EngineSlot> = match fleet.engine(index) {
        Ok(slot) => slot,
        Err(e) => return no_such_engine(e),
    };
    let fault: Fault = match serde_json::from_slice(&body) {
        Ok(fault) => fault,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("invalid fault: {e}")),
    };
    match slot.fault(fault).await {
        Ok(()) => Json(slot.state()).into_response(),
        Err(e @ (FleetError::Fault(_) | FleetError::AlreadyRunning(_))) => {
            error(StatusCode::BAD_REQUEST, e.to_string())
        }
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// The control API over a fleet.
pub fn router(fleet: Fleet) -> Router {
    Router::new()
        .route("/engines", get(list))
        .route("/engines/{index}/state", get(state))
        .route("/engines/{index}/fault", post(fault))
        .with_state(fleet)
}
