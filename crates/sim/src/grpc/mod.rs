//! The engine's gRPC service (`--grpc`): SGLang's scheduler service as SMG speaks to a
//! `grpc://` worker, following smg-grpc-servicer 0.14.1 (`smg_grpc_servicer/sglang/servicer.py`)
//! in front of SGLang.
//!
//! | RPC | what it does here |
//! | --- | --- |
//! | `Generate` | token ids in, token ids out: chunks per scheduler step when streaming, then one `complete` per choice (`generate`) |
//! | `Abort` | ends a live generation with `finish_reason: "abort"`; `success: false`, "not found", for an unknown id |
//! | `HealthCheck` | a one-token probe; healthy on any engine output after it started, unhealthy after 20 s without (`health`) |
//! | `GetModelInfo`, `GetServerInfo` | the simulated model and the engine's settings (`info`) |
//! | `GetLoads` | each rank's load, the figures of SGLang's `/v1/loads` (`load`) |
//! | `SubscribeKvEvents` | the prefix cache's events, a load record on each batch, heartbeats (`events`) |
//! | `GetTokenizer` | the simulated model's files (`vocab`) as a zip archive in 64 KiB pieces, the SHA-256 on the last |
//!
//! Errors are gRPC statuses mapped from the HTTP status SGLang's scheduler gives
//! (`engine_status.py`, `grpc_code_for_http_status`): a full queue is `UNAVAILABLE`, a bad
//! request `INVALID_ARGUMENT`, anything else `INTERNAL`. The `one-way` fault stalls every RPC
//! and stream; `events-stop` stalls the event stream only.
//!
//! ## Layout
//! - `generate` — `Generate` and `Abort`: the request's choices, the stream, the registry of
//!   live requests.
//! - `events` — `SubscribeKvEvents`, and `LoadRecorder`, the servicer's numbering and pacing
//!   of load records.
//! - `load` — `GetLoads` and the load record, from the same figures as `/v1/loads`.
//! - `info` — `HealthCheck`, `GetModelInfo`, `GetServerInfo`.
//! - `pd` — the halves of a disaggregated request (`--pd-role`), met in the bootstrap room the
//!   request's `disaggregated_params` name.

mod events;
mod generate;
mod info;
mod load;
mod pd;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures_util::stream::{BoxStream, StreamExt};
use sluice_proto::common::{GetTokenizerChunk, GetTokenizerRequest, KvEventBatch};
use sluice_proto::sglang_scheduler::sglang_scheduler_server::{
    SglangScheduler, SglangSchedulerServer,
};
use sluice_proto::sglang_scheduler::{
    AbortRequest, AbortResponse, GenerateRequest, GenerateResponse, GetLoadsRequest,
    GetLoadsResponse, GetModelInfoRequest, GetModelInfoResponse, GetServerInfoRequest,
    GetServerInfoResponse, HealthCheckRequest, HealthCheckResponse,
};
use tonic::{Request, Response, Status};

pub use events::LoadRecorder;

use crate::api::{ApiError, ApiState};
use crate::vocab::Vocab;

/// What every RPC of one engine incarnation shares.
struct Service {
    st: Arc<ApiState>,
    vocab: Arc<Vocab>,
    live: generate::LiveRequests,
}

/// The engine's gRPC routes, to serve on its listener in place of the HTTP ones.
pub fn router(st: Arc<ApiState>) -> axum::Router {
    let service = Service {
        st,
        vocab: Arc::new(Vocab::new()),
        live: generate::LiveRequests::default(),
    };
    tonic::service::Routes::new(SglangSchedulerServer::new(service)).into_axum_router()
}

impl Service {
    /// Never returns while the `one-way` fault stands: the request arrived, the answer will not.
    async fn unless_one_way(&self) {
        let mut faults = self.st.engine.fault_watch();
        let _ = faults.wait_for(|f| !f.one_way).await;
    }
}

/// The status SGLang's servicer ends a call with for an HTTP status its scheduler gave.
pub(crate) fn status_for(error: &ApiError) -> Status {
    let message = error.to_string();
    match error.status().as_u16() {
        400 => Status::invalid_argument(message),
        404 => Status::not_found(message),
        408 | 504 => Status::deadline_exceeded(message),
        429 => Status::resource_exhausted(message),
        503 => Status::unavailable(message),
        _ => Status::internal(message),
    }
}

/// Bytes per `GetTokenizer` piece (the servicer's `CHUNK_SIZE`).
const TOKENIZER_CHUNK: usize = 64 * 1024;

type Streamed<T> = BoxStream<'static, Result<T, Status>>;

#[tonic::async_trait]
impl SglangScheduler for Service {
    type GenerateStream = Streamed<GenerateResponse>;
    type GetTokenizerStream = Streamed<GetTokenizerChunk>;
    type SubscribeKvEventsStream = Streamed<KvEventBatch>;

    async fn generate(
        &self,
        request: Request<GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        // The request reaches the engine and runs; only its answer is held.
        let answer = generate::generate(self, request.into_inner()).await;
        self.unless_one_way().await;
        answer.map(Response::new)
    }

    async fn health_check(
        &self,
        _: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        self.unless_one_way().await;
        Ok(Response::new(info::health(&self.st).await))
    }

    async fn abort(
        &self,
        request: Request<AbortRequest>,
    ) -> Result<Response<AbortResponse>, Status> {
        self.unless_one_way().await;
        Ok(Response::new(
            self.live.abort(&request.into_inner().request_id),
        ))
    }

    async fn get_model_info(
        &self,
        _: Request<GetModelInfoRequest>,
    ) -> Result<Response<GetModelInfoResponse>, Status> {
        self.unless_one_way().await;
        Ok(Response::new(info::model_info(&self.st, &self.vocab)))
    }

    async fn get_server_info(
        &self,
        _: Request<GetServerInfoRequest>,
    ) -> Result<Response<GetServerInfoResponse>, Status> {
        self.unless_one_way().await;
        Ok(Response::new(info::server_info(&self.st, self.live.len())))
    }

    async fn get_loads(
        &self,
        request: Request<GetLoadsRequest>,
    ) -> Result<Response<GetLoadsResponse>, Status> {
        self.unless_one_way().await;
        load::get_loads(&self.st, &request.into_inner()).map(Response::new)
    }

    async fn get_tokenizer(
        &self,
        _: Request<GetTokenizerRequest>,
    ) -> Result<Response<Self::GetTokenizerStream>, Status> {
        self.unless_one_way().await;
        if self.st.engine.faults().no_tokenizer {
            return Err(Status::failed_precondition(
                "Tokenizer path is not configured on this server.",
            ));
        }
        let totals = self.st.engine.totals();
        totals.tokenizer_fetches.fetch_add(1, Ordering::Relaxed);
        let model = &self.st.engine.config().model;
        let (archive, sha256) = self
            .vocab
            .bundle(model)
            .map_err(|e| Status::internal(e.to_string()))?;
        let count = archive.len().div_ceil(TOKENIZER_CHUNK);
        let chunks: Vec<Result<GetTokenizerChunk, Status>> = archive
            .chunks(TOKENIZER_CHUNK)
            .enumerate()
            .map(|(i, piece)| {
                Ok(GetTokenizerChunk {
                    data: piece.to_vec(),
                    sha256: if i + 1 == count {
                        sha256.clone()
                    } else {
                        String::new()
                    },
                })
            })
            .collect();
        Ok(Response::new(futures_util::stream::iter(chunks).boxed()))
    }

    async fn subscribe_kv_events(
        &self,
        request: Request<sluice_proto::common::SubscribeKvEventsRequest>,
    ) -> Result<Response<Self::SubscribeKvEventsStream>, Status> {
        self.unless_one_way().await;
        events::subscribe(&self.st, &request.into_inner()).map(Response::new)
    }
}
