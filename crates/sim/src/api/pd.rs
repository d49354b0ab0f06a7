//! The two halves of a disaggregated request (`--pd-role`, see `crate::pd`).
//!
//! The prefill half waits in its room for the decode engine's claim (failing at the bootstrap
//! deadline), computes the prompt and its first token, and answers with that one token; the
//! gateway relays the decode half's answer. The decode half waits for running slots, claims the
//! room, and is then generated as any request, its prompt's KV already in place.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use tokio::sync::OwnedSemaphorePermit;

use super::errors::ApiError;
use super::intake::{checked, refuse, submit};
use super::sse::{event_stream, Renderer, Usage};
use super::ApiState;
use crate::engine::{EventKind, LoadGuard, SeqSpec, Submission};
use crate::pd::{Bootstrap, DecodeSide, Failure, Rooms};
use crate::request::{GenerationRequest, Route};
use crate::scheduler::FinishReason;

/// Counts the request as aborted if its client leaves before it reaches the scheduler (which
/// counts its own aborts from then on).
struct AbortedIfDropped<'a> {
    aborted: &'a AtomicU64,
    armed: bool,
}

impl<'a> AbortedIfDropped<'a> {
    fn new(st: &'a ApiState) -> Self {
        Self {
            aborted: &st.engine.totals().aborted,
            armed: true,
        }
    }

    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for AbortedIfDropped<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.aborted.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The decode half of an HTTP request: where its KV waits is in the body.
pub(super) async fn decode_half_http(
    st: &ApiState,
    side: &DecodeSide,
    request: &GenerationRequest,
    choices: &mut [SeqSpec],
) -> Result<OwnedSemaphorePermit, ApiError> {
    let Some(at) = bootstrap_of(request) else {
        return Err(ApiError::BadRequest(
            "a decode server needs bootstrap_host, bootstrap_port and bootstrap_room (SGLang), \
             or kv_transfer_params with do_remote_prefill, remote_host, remote_port and \
             remote_request_id (vLLM)"
                .into(),
        ));
    };
    decode_half(st, side, &at, choices).await
}

/// The decode half up to the moment its KV is in place: the running slots it holds until it
/// ends. Its choices are marked preloaded.
pub(crate) async fn decode_half(
    st: &ApiState,
    side: &DecodeSide,
    at: &Bootstrap,
    choices: &mut [SeqSpec],
) -> Result<OwnedSemaphorePermit, ApiError> {
    let pending = AbortedIfDropped::new(st);
    let rooms = u32::try_from(choices.len()).unwrap_or(u32::MAX);
    st.engine.notify_changed();
    let permit = side.admit(rooms).await.ok_or_else(|| {
        ApiError::BadRequest(format!(
            "the request needs {rooms} running slots, more than the server's max_running_requests"
        ))
    })?;
    st.engine.notify_changed();
    if let Err(why) = side.claim(at).await {
        let totals = st.engine.totals();
        totals.transfer_failures.fetch_add(1, Ordering::Relaxed);
        pending.disarm();
        return Err(ApiError::Disaggregation(why));
    }
    pending.disarm();
    for choice in choices.iter_mut() {
        choice.preloaded = choice.prompt_tokens;
    }
    Ok(permit)
}

/// Where the decode half's KV waits: SGLang's bootstrap fields, or vLLM's `kv_transfer_params`.
fn bootstrap_of(request: &GenerationRequest) -> Option<Bootstrap> {
    if let Some(kv) = request
        .kv_transfer_params
        .as_ref()
        .filter(|p| p.do_remote_prefill)
    {
        return Some(Bootstrap {
            host: kv.remote_host.clone()?,
            port: kv.remote_port?,
            room: kv.remote_request_id.as_deref()?.parse().ok()?,
        });
    }
    Some(Bootstrap {
        host: request.bootstrap_host.clone()?,
        port: request.bootstrap_port?,
        room: request.bootstrap_room?,
    })
}

/// The prefill half, whole: wait for the claim, compute, answer with the first token.
pub(super) async fn prefill(
    route: Route,
    st: &ApiState,
    rooms: &Arc<Rooms>,
    headers: &HeaderMap,
    body: &[u8],
    _load: LoadGuard,
) -> Response {
    let (request, _ticket) = match checked(route, st, headers, body).await {
        Ok(checked) => checked,
        Err(error) => return refuse(st, error),
    };
    // vLLM's way: the KV is computed first and waits in a room of the engine's own naming for
    // the decode engine to pull it. SGLang's: the room is the gateway's, and the prefill starts
    // once the decode engine has claimed it.
    let vllm = request
        .kv_transfer_params
        .as_ref()
        .is_some_and(|p| p.do_remote_decode);
    let room =
        match (vllm, request.bootstrap_room) {
            (true, _) => rooms.fresh(),
            (false, Some(room)) => room,
            (false, None) => return refuse(
                st,
                ApiError::BadRequest(
                    "a prefill server needs bootstrap_room (SGLang) or kv_transfer_params with \
                     do_remote_decode (vLLM)"
                        .into(),
                ),
            ),
        };
    if let Err(error) = prefill_half(st, rooms, room, vllm, &request).await {
        return refuse(st, error);
    }
    let handed = vllm.then(|| kv_handed(st, room, &request));
    answer(st, route, &request, request.choice_count(), handed)
}

/// The prefill half's work once its request is read: it lands in `room`, waits for the decode
/// engine's claim (SGLang's way; vLLM's computes first), and computes each choice's first
/// token. When it returns `Ok` the KV is across (SGLang's prefill answers only then:
/// `disaggregation/prefill.py`, a request leaves the inflight queue on the transfer's success,
/// `FINISH_LENGTH(length=0)`).
pub(crate) async fn prefill_half(
    st: &ApiState,
    rooms: &Arc<Rooms>,
    room: u64,
    vllm: bool,
    request: &GenerationRequest,
) -> Result<(), ApiError> {
    let leg = rooms.land(room).map_err(ApiError::Disaggregation)?;
    let pending = AbortedIfDropped::new(st);
    if vllm {
        // Nothing to wait for before computing.
    } else if let Err(why) = leg.claimed().await {
        if why == Failure::BootstrapTimeout {
            let totals = st.engine.totals();
            totals.bootstrap_timeouts.fetch_add(1, Ordering::Relaxed);
        }
        pending.disarm();
        return Err(ApiError::Disaggregation(why));
    }
    let cfg = st.engine.config();
    let (mut choices, _) = request.choices_thinking(
        cfg.seed,
        cfg.profile.output_median_tokens,
        None,
        cfg.max_model_len,
    );
    for choice in &mut choices {
        choice.output_tokens = 1;
        choice.finish = FinishReason::Length;
    }
    let mut submission = submit(st, &choices)?;
    pending.disarm();
    let computed = tokio::select! {
        computed = first_tokens(&mut submission, choices.len()) => computed,
        // The decode engine left: its KV has nowhere to go (dropping the submission aborts).
        () = leg.decode_gone() => return Err(ApiError::Disaggregation(Failure::DecodeGone)),
    };
    if !computed {
        return Err(ApiError::Internal);
    }
    leg.done();
    Ok(())
}

/// vLLM's `kv_transfer_params` in a prefill's answer: where the decode engine pulls the KV.
fn kv_handed(st: &ApiState, room: u64, request: &GenerationRequest) -> serde_json::Value {
    let cfg = st.engine.config();
    let blocks = request.longest_prompt().div_ceil(cfg.block_size.max(1));
    serde_json::json!({
        "do_remote_prefill": true,
        "do_remote_decode": false,
        "remote_engine_id": format!("sim-{}", st.created),
        "remote_block_ids": (0..blocks).collect::<Vec<u32>>(),
        "remote_host": st.bootstrap.map(|a| a.ip().to_string()),
        "remote_port": st.bootstrap.map(|a| a.port()),
        "remote_request_id": room.to_string(),
        "tp_size": 1,
    })
}

/// Waits until every choice has its one token; false if the engine went away.
async fn first_tokens(submission: &mut Submission, choices: usize) -> bool {
    let mut open = choices;
    while open > 0 {
        match submission.events.recv().await {
            Some(event) if matches!(event.kind, EventKind::Finished(_)) => open -= 1,
            Some(_) => {}
            None => return false,
        }
    }
    true
}

/// The prefill's answer: each choice's first token, as JSON or as a whole SSE stream.
fn answer(
    st: &ApiState,
    route: Route,
    request: &GenerationRequest,
    choices: usize,
    kv: Option<serde_json::Value>,
) -> Response {
    let renderer = st.renderer(route, &request.model);
    let usage = Usage {
        prompt_tokens: request.prompt_tokens(),
        completion_tokens: choices as u64,
    };
    if !request.stream {
        let results = vec![(1, FinishReason::Length); choices];
        let mut body = renderer.complete(&results, usage);
        if let Some(kv) = kv {
            body["kv_transfer_params"] = kv;
        }
        return axum::Json(body).into_response();
    }
    let mut out = String::new();
    for choice in 0..choices as u32 {
        renderer.role(&mut out, choice);
        renderer.token(&mut out, choice, 0);
        renderer.finish(&mut out, choice, FinishReason::Length);
    }
    if request.include_usage {
        renderer.usage(&mut out, usage);
    }
    Renderer::done(&mut out);
    event_stream(Body::from(out))
}
