//! `Generate` and `Abort`.
//!
//! A request's checks come in the scheduler's order: an empty prompt, a prompt at or past the
//! context (`max_req_input_len`: 400, so `INVALID_ARGUMENT`), the injected errors and the
//! worker-side cap, then the queue (`--max-queued-requests`: SGLang's 503, so `UNAVAILABLE`).
//! `max_new_tokens` is not checked but clipped to the room the prompt leaves, as SGLang's
//! scheduler does (`sglang/srt/managers/scheduler.py`, `max_req_len - len(origin_input_ids) - 1`),
//! and an unset one means all of that room.
//!
//! A streaming generation sends, per engine step, a chunk of each choice's new tokens (running
//! counts), and after a choice's last chunk its `complete`; a whole one sends every choice's
//! `complete` with all its tokens. A choice that stops ends on the end-of-turn token, as a
//! model's does, and its `complete` names it (`matched_token_id`). The engine work lives in a
//! task that owns the `Submission`: when the caller drops the call, or `Abort` names it, the
//! task ends and the engine frees the request's blocks at its next step.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures_util::stream::{self, StreamExt};
use sluice_proto::sglang_scheduler::generate_complete::MatchedStop;
use sluice_proto::sglang_scheduler::generate_response::Response as Reply;
use sluice_proto::sglang_scheduler::{
    AbortResponse, GenerateComplete, GenerateRequest, GenerateResponse, GenerateStreamChunk,
    SamplingParams,
};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};
use tonic::Status;

use super::{pd, status_for, Service, Streamed};
use crate::api::intake::{count_refusal, submit};
use crate::api::{ApiError, ApiState};
use crate::engine::{ChoiceEvent, EventKind, GateTicket, LoadGuard, Submission};
use crate::pd::Disagg;
use crate::request::GenerationRequest;
use crate::scheduler::FinishReason;
use crate::vocab::Vocab;

/// Messages a generation may get ahead of its caller before the engine's events wait.
const AHEAD: usize = 64;

/// The generations running now, by request id, so `Abort` can end them.
#[derive(Default)]
pub(super) struct LiveRequests {
    by_id: Arc<parking_lot::Mutex<HashMap<String, oneshot::Sender<()>>>>,
}

impl LiveRequests {
    fn register(&self, id: &str) -> (oneshot::Receiver<()>, Registered) {
        let (tx, rx) = oneshot::channel();
        self.by_id.lock().insert(id.to_string(), tx);
        let registered = Registered {
            by_id: self.by_id.clone(),
            id: id.to_string(),
        };
        (rx, registered)
    }

    /// Ends the generation `id`, as the servicer's `Abort` does: `success` false, "not found",
    /// when no such generation runs.
    pub(super) fn abort(&self, id: &str) -> AbortResponse {
        let found = self.by_id.lock().remove(id);
        let success = found.is_some_and(|tx| tx.send(()).is_ok());
        let outcome = if success { "aborted" } else { "not found" };
        AbortResponse {
            success,
            message: format!("Request {id} {outcome}"),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.by_id.lock().len()
    }
}

/// A generation's entry in `LiveRequests`, removed when the generation ends.
struct Registered {
    by_id: Arc<parking_lot::Mutex<HashMap<String, oneshot::Sender<()>>>>,
    id: String,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut by_id = self.by_id.lock();
        // A later generation may have taken the id; only a closed entry is ours.
        if by_id.get(&self.id).is_some_and(oneshot::Sender::is_closed) {
            by_id.remove(&self.id);
        }
    }
}

/// The refusal as the call's status, counted as the engine's when it is.
fn refused(st: &ApiState, error: ApiError) -> Status {
    count_refusal(st, &error);
    status_for(&error)
}

/// The request read from its token ids, refused (and counted) as the engine refuses it: a
/// malformed one, a prompt past the context length, or an injected failure.
fn checked(
    st: &ApiState,
    request: &GenerateRequest,
    params: &SamplingParams,
) -> Result<GenerationRequest, Status> {
    let cfg = st.engine.config();
    let ids = request
        .tokenized
        .as_ref()
        .map(|t| t.input_ids.as_slice())
        .unwrap_or_default();
    let parsed = GenerationRequest::from_token_ids(
        &cfg.model,
        ids,
        params.n,
        params.max_new_tokens,
        params.min_new_tokens,
        params.ignore_eos,
        request.stream,
    )
    .map_err(|e| refused(st, ApiError::BadRequest(e.to_string())))?;
    let mut parsed = parsed;
    // The adapter's name, as SGLang's servicer passes `lora_id` on as the request's LoRA.
    if !request.lora_id.is_empty() {
        let adapter = st.engine.adapter(&request.lora_id).ok_or_else(|| {
            let message = crate::lora::not_loaded(&request.lora_id, &st.engine.loaded_adapters());
            refused(st, ApiError::BadRequest(message))
        })?;
        parsed.adapter = Some(adapter);
    }
    let prompt = parsed.longest_prompt();
    if prompt >= cfg.max_model_len {
        let message = format!(
            "The input ({prompt} tokens) is longer than the model's context length ({} tokens).",
            cfg.max_model_len
        );
        return Err(refused(st, ApiError::ContextTooLong(message)));
    }
    if st.inject_error() {
        return Err(refused(st, ApiError::Internal));
    }
    Ok(parsed)
}

/// Through the engine's queue gate, when it has one: refused when its queue is full, else
/// waiting for a slot.
async fn queued(st: &ApiState) -> Result<Option<GateTicket>, Status> {
    let engine = &st.engine;
    let Some(gate) = engine.gate() else {
        return Ok(None);
    };
    let mut ticket = gate
        .try_enter()
        .ok_or_else(|| refused(st, ApiError::AtCapacity))?;
    engine.notify_changed();
    ticket.slot().await;
    engine.notify_changed();
    Ok(Some(ticket))
}

/// Reads the request, runs the checks and puts it into the engine.
pub(super) async fn generate(
    svc: &Service,
    request: GenerateRequest,
) -> Result<Streamed<GenerateResponse>, Status> {
    let st = &svc.st;
    let engine = &st.engine;
    let cfg = engine.config();
    let load = engine.track_request();
    engine
        .totals()
        .requests_received
        .fetch_add(1, Ordering::Relaxed);
    let params = request.sampling_params.clone().unwrap_or_default();
    let parsed = checked(st, &request, &params)?;
    let prompt = parsed.longest_prompt();
    let ticket = queued(st).await?;
    let (mut aborted, registered) = svc.live.register(&request.request_id);
    if let Some(Disagg::Prefill(rooms)) = engine.disagg() {
        return pd::prefill(svc, rooms, &request, &parsed, &mut aborted).await;
    }
    let (mut choices, _) = parsed.choices_thinking(
        cfg.seed,
        cfg.profile.output_median_tokens,
        None,
        cfg.max_model_len,
    );
    let window = match engine.disagg() {
        Some(Disagg::Decode(side)) => {
            match pd::decode(svc, side, &request, &mut choices, &mut aborted).await? {
                Ok(window) => Some(window),
                Err(aborted) => return Ok(aborted),
            }
        }
        _ => None,
    };
    let planned = planned(&mut choices, &params.stop);
    let submission = submit(st, &choices).map_err(|e| refused(st, e))?;
    let expected: u64 = choices.iter().map(|c| u64::from(c.output_tokens)).sum();
    let half_way = (expected / 2).max(1);
    let faults = engine.faults();
    let generation = Generation {
        request_id: request.request_id,
        stream: request.stream,
        prompt_tokens: prompt,
        vocab: svc.vocab.clone(),
        choices: planned,
        fail_after: st
            .inject_error_event()
            .map(|code| (half_way, ApiError::Failed(code))),
        cut_after: faults.cut_streams.then_some(half_way),
        faults: engine.fault_watch(),
        _held: Held {
            _load: load,
            _ticket: ticket,
            _window: window,
            _registered: registered,
        },
    };
    let (tx, rx) = mpsc::channel(AHEAD);
    tokio::spawn(generation.run(submission, aborted, tx));
    Ok(stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) }).boxed())
}

/// Each choice as the engine will generate it, ended at the first of `stops` its words reach.
fn planned(choices: &mut [crate::engine::SeqSpec], stops: &[String]) -> Vec<Choice> {
    choices
        .iter_mut()
        .enumerate()
        .map(|(index, c)| {
            let stop = stop_string(c, index as u32, stops);
            Choice::planned(c.output_tokens, c.finish, stop)
        })
        .collect()
}

/// Ends a choice at the first of `stops` its words reach, as SGLang's detokenizer stops a
/// request on a stop string (the tokens up to the one that completes it are generated): the
/// stop string it matched, if any.
fn stop_string(
    choice: &mut crate::engine::SeqSpec,
    index: u32,
    stops: &[String],
) -> Option<String> {
    let stops: Vec<&String> = stops.iter().filter(|s| !s.is_empty()).collect();
    if stops.is_empty() {
        return None;
    }
    let mut text = String::new();
    for i in 0..choice.output_tokens {
        text.push_str(crate::vocab::token_text(index, i));
        if let Some(stop) = stops.iter().find(|s| text.contains(s.as_str())) {
            choice.output_tokens = i + 1;
            choice.finish = FinishReason::Stop;
            return Some((*stop).clone());
        }
    }
    None
}

/// What a generation keeps alive until it ends.
struct Held {
    _load: LoadGuard,
    _ticket: Option<GateTicket>,
    /// A decode engine's running slots.
    _window: Option<OwnedSemaphorePermit>,
    _registered: Registered,
}

/// One choice's progress.
struct Choice {
    /// Tokens the engine will generate for it.
    planned: u32,
    /// How it ends when it runs its course.
    finish: FinishReason,
    /// The stop string its text reaches, which ends it there (`matched_stop_str`).
    stop: Option<String>,
    /// Ids not yet sent (this step's, or all of them for a whole answer).
    sent: Vec<u32>,
    emitted: u32,
    /// Finished in the engine, its `complete` not yet sent.
    done: Option<FinishReason>,
    /// Its `complete` went out.
    completed: bool,
}

impl Choice {
    /// A choice the engine will generate `planned` tokens of, none sent yet.
    fn planned(planned: u32, finish: FinishReason, stop: Option<String>) -> Self {
        Choice {
            planned,
            finish,
            stop,
            sent: Vec::new(),
            emitted: 0,
            done: None,
            completed: false,
        }
    }
}

struct Generation {
    request_id: String,
    stream: bool,
    prompt_tokens: u32,
    vocab: Arc<Vocab>,
    choices: Vec<Choice>,
    /// With the `error-event` fault: after this many tokens, the call ends with the error.
    fail_after: Option<(u64, ApiError)>,
    /// With the `cut-streams` fault: after this many tokens the stream closes with no
    /// `complete`, as a stream cut short does.
    cut_after: Option<u64>,
    faults: tokio::sync::watch::Receiver<crate::faults::FaultSet>,
    _held: Held,
}

type Outbox = mpsc::Sender<Result<GenerateResponse, Status>>;

impl Generation {
    /// One of the engine's events: a token taken into its choice's ids to send (whether it was
    /// one), or the choice finished.
    fn take(&mut self, e: &ChoiceEvent) -> bool {
        let choice = &mut self.choices[e.choice as usize];
        match e.kind {
            EventKind::Token => {
                let id = self.vocab.answer_token(e.choice, choice.emitted);
                // A natural stop ends on the end-of-turn token; a stop string on a word.
                let last_of_stop = choice.emitted + 1 == choice.planned
                    && choice.finish == FinishReason::Stop
                    && choice.stop.is_none();
                choice
                    .sent
                    .push(if last_of_stop { self.vocab.eos() } else { id });
                choice.emitted += 1;
                true
            }
            EventKind::Finished(reason) => {
                choice.done = Some(reason);
                false
            }
        }
    }

    async fn run(
        mut self,
        mut submission: Submission,
        mut aborted: oneshot::Receiver<()>,
        tx: Outbox,
    ) {
        let mut tokens = 0u64;
        loop {
            let first = tokio::select! {
                biased;
                () = tx.closed() => return,
                _ = &mut aborted => {
                    let _ = self.send_aborted(&tx).await;
                    return;
                }
                event = submission.events.recv() => event,
            };
            let Some(first) = first else {
                // The engine went away (a crash resets the connection as well).
                let _ = tx.send(Err(Status::unavailable("engine stopped"))).await;
                return;
            };
            let mut event = Some(first);
            while let Some(e) = event {
                tokens += u64::from(self.take(&e));
                event = submission.events.try_recv().ok();
            }
            if !self.deliverable(&tx).await {
                return;
            }
            if self.cut_after.is_some_and(|cut| tokens >= cut) {
                let _ = self.send_chunks(&tx).await;
                return;
            }
            if let Some(status) = self
                .fail_after
                .as_ref()
                .filter(|(at, _)| tokens >= *at)
                .map(|(_, error)| status_for(error))
            {
                let _ = self.send_chunks(&tx).await;
                let _ = tx.send(Err(status)).await;
                return;
            }
            let sent = if self.stream {
                self.send_chunks(&tx).await
            } else {
                self.send_whole(&tx).await
            };
            if !sent || self.choices.iter().all(|c| c.completed) {
                return;
            }
        }
    }

    /// Waits while the `one-way` fault holds what the engine produced; false when the caller
    /// left meanwhile.
    async fn deliverable(&mut self, tx: &Outbox) -> bool {
        tokio::select! {
            held = self.faults.wait_for(|f| !f.one_way) => held.is_ok(),
            () = tx.closed() => false,
        }
    }

    /// This step's chunks, and the `complete` of each choice that finished; false when the
    /// caller is gone.
    async fn send_chunks(&mut self, tx: &Outbox) -> bool {
        for index in 0..self.choices.len() {
            let choice = &mut self.choices[index];
            if choice.sent.is_empty() && choice.done.is_none() {
                continue;
            }
            let ids = std::mem::take(&mut choice.sent);
            let chunk = GenerateStreamChunk {
                token_ids: ids.clone(),
                prompt_tokens: self.prompt_tokens,
                completion_tokens: choice.emitted,
                index: index as u32,
                ..Default::default()
            };
            let done = choice.done.take();
            if !ids.is_empty() && !self.reply(tx, Reply::Chunk(chunk)).await {
                return false;
            }
            if let Some(reason) = done {
                self.choices[index].completed = true;
                let complete = self.complete(index, ids, reason);
                if !self.reply(tx, Reply::Complete(complete)).await {
                    return false;
                }
            }
        }
        true
    }

    /// Every choice's `complete` once all have finished; false when the caller is gone.
    async fn send_whole(&mut self, tx: &Outbox) -> bool {
        if self.choices.iter().any(|c| c.done.is_none()) {
            return true;
        }
        for index in 0..self.choices.len() {
            let ids = std::mem::take(&mut self.choices[index].sent);
            let reason = self.choices[index]
                .done
                .take()
                .unwrap_or(FinishReason::Stop);
            self.choices[index].completed = true;
            let complete = self.complete(index, ids, reason);
            if !self.reply(tx, Reply::Complete(complete)).await {
                return false;
            }
        }
        true
    }

    /// The caller's `Abort`: each open choice completes with `finish_reason: "abort"`, as the
    /// servicer reports a caller's cancel (a completion, not a status).
    async fn send_aborted(&mut self, tx: &Outbox) -> bool {
        for index in 0..self.choices.len() {
            if self.choices[index].done.is_some() {
                continue;
            }
            let ids = std::mem::take(&mut self.choices[index].sent);
            let mut complete = self.complete(index, ids, FinishReason::Stop);
            complete.finish_reason = "abort".into();
            complete.matched_stop = None;
            if !self.reply(tx, Reply::Complete(complete)).await {
                return false;
            }
        }
        true
    }

    fn complete(
        &self,
        index: usize,
        output_ids: Vec<u32>,
        reason: FinishReason,
    ) -> GenerateComplete {
        let choice = &self.choices[index];
        let (finish_reason, matched_stop) = match (reason, &choice.stop) {
            (FinishReason::Length, _) => ("length", None),
            (FinishReason::Stop, Some(stop)) => {
                ("stop", Some(MatchedStop::MatchedStopStr(stop.clone())))
            }
            (FinishReason::Stop, None) => {
                ("stop", Some(MatchedStop::MatchedTokenId(self.vocab.eos())))
            }
        };
        GenerateComplete {
            output_ids,
            finish_reason: finish_reason.into(),
            prompt_tokens: self.prompt_tokens,
            completion_tokens: choice.emitted,
            matched_stop,
            index: index as u32,
            ..Default::default()
        }
    }

    async fn reply(&self, tx: &Outbox, response: Reply) -> bool {
        let message = GenerateResponse {
            request_id: self.request_id.clone(),
            response: Some(response),
        };
        tx.send(Ok(message)).await.is_ok()
    }
}
