//! The two halves of a disaggregated request over gRPC (`--grpc --pd-role`): the same halves as
//! over HTTP (`crate::api::pd`), where they meet read from the request's `disaggregated_params`
//! (`bootstrap_host`, `bootstrap_port`, `bootstrap_room`), as the servicer hands them to SGLang
//! (smg-grpc-servicer 0.14.1, `sglang/servicer.py`, `_convert_generate_request`; a room of 0 is
//! a room). The protocol's room is an `int32`, so a gateway picks rooms below 2^31.
//!
//! The prefill half answers once its KV is across, with each choice's first token and
//! `finish_reason: "length"` (SGLang's `disaggregation/prefill.py` finishes a transferred
//! request with `FINISH_LENGTH`); the decode half is admitted into the running window, claims
//! the room, and is then generated as any request without computing its prompt.

use std::sync::Arc;

use futures_util::stream::{self, StreamExt};
use sluice_proto::sglang_scheduler::generate_response::Response as Reply;
use sluice_proto::sglang_scheduler::{
    DisaggregatedParams, GenerateComplete, GenerateRequest, GenerateResponse, GenerateStreamChunk,
};
use tokio::sync::{oneshot, OwnedSemaphorePermit};
use tonic::Status;

use super::{status_for, Service, Streamed};
use crate::api::pd::{decode_half, prefill_half};
use crate::api::ApiError;
use crate::engine::SeqSpec;
use crate::pd::{Bootstrap, DecodeSide, Rooms};
use crate::request::GenerationRequest;

/// Where the request's halves meet, if the request says.
fn bootstrap(params: Option<&DisaggregatedParams>) -> Option<Bootstrap> {
    let params = params?;
    Some(Bootstrap {
        host: Some(params.bootstrap_host.clone()).filter(|h| !h.is_empty())?,
        port: u16::try_from(params.bootstrap_port)
            .ok()
            .filter(|p| *p > 0)?,
        room: u64::try_from(params.bootstrap_room).ok()?,
    })
}

/// Waits for `work` unless `Abort` names the request first: then the call ends with each
/// choice completed as aborted, as the servicer reports a caller's cancel.
async fn unless_aborted<T>(
    work: impl std::future::Future<Output = Result<T, ApiError>>,
    aborted: &mut oneshot::Receiver<()>,
    request: &GenerateRequest,
    choices: usize,
) -> Result<Result<T, Streamed<GenerateResponse>>, Status> {
    tokio::select! {
        done = work => done.map(Ok).map_err(|e| status_for(&e)),
        _ = aborted => Ok(Err(replies(request, choices, 0, |_| Vec::new(), "abort"))),
    }
}

/// The decode half up to the moment its KV is in place: the running slots it holds until it
/// ends, or the call's end when aborted meanwhile.
pub(super) async fn decode(
    svc: &Service,
    side: &DecodeSide,
    request: &GenerateRequest,
    choices: &mut [SeqSpec],
    aborted: &mut oneshot::Receiver<()>,
) -> Result<Result<OwnedSemaphorePermit, Streamed<GenerateResponse>>, Status> {
    let Some(at) = bootstrap(request.disaggregated_params.as_ref()) else {
        return Err(Status::invalid_argument(
            "a decode server needs disaggregated_params with bootstrap_host, bootstrap_port and \
             bootstrap_room",
        ));
    };
    let count = choices.len();
    unless_aborted(
        decode_half(&svc.st, side, &at, choices),
        aborted,
        request,
        count,
    )
    .await
}

/// The prefill half, whole: wait for the decode engine's claim, compute, answer with each
/// choice's first token.
pub(super) async fn prefill(
    svc: &Service,
    rooms: &Arc<Rooms>,
    request: &GenerateRequest,
    parsed: &GenerationRequest,
    aborted: &mut oneshot::Receiver<()>,
) -> Result<Streamed<GenerateResponse>, Status> {
    let Some(room) = request
        .disaggregated_params
        .as_ref()
        .and_then(|p| u64::try_from(p.bootstrap_room).ok())
    else {
        return Err(Status::invalid_argument(
            "a prefill server needs disaggregated_params with bootstrap_room",
        ));
    };
    let choices = parsed.choice_count();
    let work = prefill_half(&svc.st, rooms, room, false, parsed);
    if let Err(aborted) = unless_aborted(work, aborted, request, choices).await? {
        return Ok(aborted);
    }
    let vocab = svc.vocab.clone();
    let first = move |index: usize| vec![vocab.answer_token(index as u32, 0)];
    Ok(replies(
        request,
        choices,
        parsed.longest_prompt(),
        first,
        "length",
    ))
}

/// Every choice's last messages: a chunk of its `ids` when streaming, then its `complete`
/// ending for `finish_reason`.
fn replies(
    request: &GenerateRequest,
    choices: usize,
    prompt_tokens: u32,
    ids: impl Fn(usize) -> Vec<u32>,
    finish_reason: &str,
) -> Streamed<GenerateResponse> {
    let reply = |response| {
        Ok(GenerateResponse {
            request_id: request.request_id.clone(),
            response: Some(response),
        })
    };
    let mut out = Vec::new();
    for index in 0..choices {
        let ids = ids(index);
        let completion_tokens = ids.len() as u32;
        if request.stream && !ids.is_empty() {
            out.push(reply(Reply::Chunk(GenerateStreamChunk {
                token_ids: ids.clone(),
                prompt_tokens,
                completion_tokens,
                index: index as u32,
                ..Default::default()
            })));
        }
        out.push(reply(Reply::Complete(GenerateComplete {
            output_ids: ids,
            finish_reason: finish_reason.into(),
            prompt_tokens,
            completion_tokens,
            index: index as u32,
            ..Default::default()
        })));
    }
    stream::iter(out).boxed()
}
