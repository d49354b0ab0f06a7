//! `POST /v1/chat/completions` and `POST /v1/completions`.
//!
//! Checks come in the order a real engine makes them (auth, body, model, context length), then
//! the injected faults and the worker-side cap, then the request enters the engine. Whatever holds
//! a count (`/load`, the N+Q gate) lives in the response until it ends, and dropping the response
//! (the client left) drops the `Submission`, which aborts the request inside the engine.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};

use tokio::sync::OwnedSemaphorePermit;

use super::errors::ApiError;
use super::intake::{checked, refuse, submit};
use super::sse::{event_stream, Renderer, Usage};
use super::{pd, ApiState};
use crate::config::Flavor;
use crate::engine::{ChoiceEvent, EventKind, GateTicket, LoadGuard, Submission};
use crate::pd::Disagg;
use crate::request::{GenerationRequest, Route};
use crate::scheduler::FinishReason;

pub(super) async fn chat(
    State(st): State<Arc<ApiState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    generate(Route::Chat, &st, &headers, &body).await
}

pub(super) async fn completions(
    State(st): State<Arc<ApiState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    generate(Route::Completions, &st, &headers, &body).await
}

/// What a response keeps alive until it ends.
struct Held {
    _load: LoadGuard,
    _ticket: Option<GateTicket>,
    /// A decode engine's running slots.
    _window: Option<OwnedSemaphorePermit>,
}

async fn generate(route: Route, st: &ApiState, headers: &HeaderMap, body: &[u8]) -> Response {
    let engine = &st.engine;
    let flavor = engine.config().flavor;
    let load = engine.track_request();
    engine.totals().arrival(headers);
    // An arrival is news even when the scheduler cannot say so (wedged, it publishes nothing).
    engine.notify_changed();
    if let Some(Disagg::Prefill(rooms)) = engine.disagg() {
        return pd::prefill(route, st, rooms, headers, body, load).await;
    }
    let admitted = admit(route, st, headers, body).await;
    let Admitted {
        request,
        submission,
        ticket,
        window,
        thinking,
        expected_tokens,
    } = match admitted {
        Ok(admitted) => admitted,
        Err(refused) => return refused.answer(st, flavor),
    };
    let failure = st.inject_error_event();
    if let (Some(code), false) = (failure, request.stream) {
        return refuse(st, ApiError::Failed(code));
    }
    let renderer = st.renderer(route, &request.model).thinking(thinking);
    let held = Held {
        _load: load,
        _ticket: ticket,
        _window: window,
    };
    let usage = Usage {
        prompt_tokens: request.prompt_tokens(),
        completion_tokens: 0,
    };
    let choices = request.choice_count();
    if request.stream {
        let half_way = (expected_tokens / 2).max(1);
        let cut_after = engine.faults().cut_streams.then_some(half_way);
        let state = StreamState {
            fail_after: failure.map(|code| (half_way, ApiError::Failed(code))),
            renderer,
            submission,
            _held: held,
            tokens: vec![0; choices],
            open: choices,
            usage,
            include_usage: request.include_usage,
            cut_after,
            phase: StreamPhase::Starting,
            faults: engine.fault_watch(),
        };
        stream(state)
    } else {
        complete(renderer, submission, held, choices, usage, flavor).await
    }
}

impl Refused {
    /// The answer the engine gives: the error, or the stream it opens with it.
    fn answer(self, st: &ApiState, flavor: Flavor) -> Response {
        match self {
            Refused::Answer(error) => refuse(st, error),
            Refused::InStream(error) => {
                st.engine.totals().rejected.fetch_add(1, Ordering::Relaxed);
                failed_stream(&error, flavor)
            }
        }
    }
}

/// Why a request did not get into the engine, and how the engine says so.
enum Refused {
    /// An error answer with its status.
    Answer(ApiError),
    /// A stream that opens with the error event: SGLang's scheduler refuses a queued-limit
    /// arrival after its stream has started, so the refusal is an error frame, then `[DONE]`.
    InStream(ApiError),
}

impl From<ApiError> for Refused {
    fn from(error: ApiError) -> Self {
        Refused::Answer(error)
    }
}

/// A stream that ends with `error`'s event at once (200, as the stream had already begun).
fn failed_stream(error: &ApiError, flavor: crate::config::Flavor) -> Response {
    let mut out = String::new();
    Renderer::error(&mut out, &error.event(flavor));
    Renderer::done(&mut out);
    event_stream(Body::from(out))
}

/// A request inside the engine.
struct Admitted {
    request: GenerationRequest,
    submission: Submission,
    ticket: Option<GateTicket>,
    window: Option<OwnedSemaphorePermit>,
    /// Each choice's first tokens that are thinking (`--reasoning`).
    thinking: Vec<u32>,
    /// Output tokens the engine will generate, over every choice.
    expected_tokens: u64,
}

/// Everything between the request and the engine; an error is the answer.
async fn admit(
    route: Route,
    st: &ApiState,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Admitted, Refused> {
    let engine = &st.engine;
    let cfg = engine.config();
    let (request, ticket) = checked(route, st, headers, body).await?;
    let (mut choices, thinking) = request.choices_thinking(
        cfg.seed,
        cfg.profile.output_median_tokens,
        cfg.reasoning,
        cfg.max_model_len,
    );
    let window = match engine.disagg() {
        Some(Disagg::Decode(side)) => {
            Some(pd::decode_half_http(st, side, &request, &mut choices).await?)
        }
        _ => None,
    };
    let submission = match submit(st, &choices) {
        Ok(submission) => submission,
        Err(ApiError::QueueFull) if request.stream && cfg.flavor == Flavor::Sglang => {
            return Err(Refused::InStream(ApiError::QueueFull))
        }
        Err(error) => return Err(error.into()),
    };
    Ok(Admitted {
        request,
        submission,
        ticket,
        window,
        thinking,
        expected_tokens: choices.iter().map(|c| u64::from(c.output_tokens)).sum(),
    })
}

async fn complete(
    renderer: Renderer,
    mut submission: Submission,
    held: Held,
    choices: usize,
    mut usage: Usage,
    flavor: crate::config::Flavor,
) -> Response {
    let mut results = vec![(0u32, FinishReason::Stop); choices];
    let mut open = choices;
    while open > 0 {
        let Some(event) = submission.events.recv().await else {
            return ApiError::Internal.respond(flavor);
        };
        let slot = &mut results[event.choice as usize];
        match event.kind {
            EventKind::Token => slot.0 += 1,
            EventKind::Finished(reason) => {
                slot.1 = reason;
                open -= 1;
            }
        }
    }
    drop(held);
    usage.completion_tokens = results.iter().map(|r| u64::from(r.0)).sum();
    axum::Json(renderer.complete(&results, usage)).into_response()
}

struct StreamState {
    renderer: Renderer,
    submission: Submission,
    _held: Held,
    tokens: Vec<u32>,
    open: usize,
    usage: Usage,
    include_usage: bool,
    /// With the `cut-streams` fault: end the stream abruptly after this many tokens.
    cut_after: Option<u64>,
    /// With the `error-event` fault: after this many tokens, the error event and `[DONE]`.
    fail_after: Option<(u64, ApiError)>,
    phase: StreamPhase,
    /// The `hang` fault holds the stream's chunks while it lasts.
    faults: tokio::sync::watch::Receiver<crate::faults::FaultSet>,
}

#[derive(PartialEq)]
enum StreamPhase {
    Starting,
    Streaming,
    Cut,
    Done,
}

fn stream(state: StreamState) -> Response {
    event_stream(Body::from_stream(futures_util::stream::unfold(
        state, next_chunk,
    )))
}

impl StreamState {
    /// Renders one of the engine's events into `out`; whether the stream stops after it (cut, or
    /// failed, as the faults ask).
    fn render(&mut self, out: &mut String, e: &ChoiceEvent) -> bool {
        match e.kind {
            EventKind::Token => {
                let index = &mut self.tokens[e.choice as usize];
                self.renderer.token(out, e.choice, *index);
                *index += 1;
                self.usage.completion_tokens += 1;
            }
            EventKind::Finished(reason) => {
                self.renderer.finish(out, e.choice, reason);
                self.open -= 1;
            }
        }
        let emitted = self.usage.completion_tokens;
        if self.cut_after.is_some_and(|cut| emitted >= cut) {
            self.phase = StreamPhase::Cut;
            return true;
        }
        if let Some((_, error)) = self
            .fail_after
            .as_ref()
            .filter(|(after, _)| emitted >= *after)
        {
            Renderer::error(out, &error.event(self.renderer.flavor()));
            Renderer::done(out);
            self.phase = StreamPhase::Done;
            return true;
        }
        false
    }
}

/// The next piece of the stream: every event the engine has ready, as SSE.
async fn next_chunk(mut s: StreamState) -> Option<(Result<Bytes, io::Error>, StreamState)> {
    match s.phase {
        StreamPhase::Done => return None,
        StreamPhase::Cut => {
            // Let the server flush what was already sent before the connection breaks.
            tokio::task::yield_now().await;
            s.phase = StreamPhase::Done;
            let cut = io::Error::new(io::ErrorKind::ConnectionAborted, "stream cut by fault");
            return Some((Err(cut), s));
        }
        StreamPhase::Starting | StreamPhase::Streaming => {}
    }
    let Some(first) = s.submission.events.recv().await else {
        // The engine went away mid-request (a crash): the connection ends without [DONE].
        s.phase = StreamPhase::Done;
        let gone = io::Error::new(io::ErrorKind::ConnectionReset, "engine stopped");
        return Some((Err(gone), s));
    };
    // A hung API process relays nothing; the engine behind it runs on.
    let _ = s.faults.wait_for(|f| !f.hang).await;
    let mut out = String::new();
    if s.phase == StreamPhase::Starting {
        s.phase = StreamPhase::Streaming;
        for choice in 0..s.tokens.len() as u32 {
            s.renderer.role(&mut out, choice);
        }
    }
    let mut event = Some(first);
    while let Some(e) = event {
        if s.render(&mut out, &e) {
            return Some((Ok(Bytes::from(out)), s));
        }
        event = s.submission.events.try_recv().ok();
    }
    if s.open == 0 {
        if s.include_usage {
            s.renderer.usage(&mut out, s.usage);
        }
        Renderer::done(&mut out);
        s.phase = StreamPhase::Done;
    }
    Some((Ok(Bytes::from(out)), s))
}
