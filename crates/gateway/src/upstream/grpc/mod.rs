//! `grpc://` workers: engines behind SMG's servicer, spoken to in SGLang's scheduler service
//! (`sluice_proto`). For the forward stage a gRPC worker answers like an HTTP one: `send` turns
//! the OpenAI request into `Generate` (the prompt tokenized here) and the replies into the OpenAI
//! answer (`render`), as an `UpstreamResponse`; so retries, read-ahead, the relay and its
//! metering treat both alike.
//!
//! How the call's outcomes map:
//! - a status the engine sent before any reply is the HTTP answer an engine would have given:
//!   `INVALID_ARGUMENT` 400, `NOT_FOUND` 404, `RESOURCE_EXHAUSTED` 429, `UNAVAILABLE` 503 with
//!   the engine's message (SGLang's full queue reads as at capacity), `DEADLINE_EXCEEDED` 504,
//!   anything else 500;
//! - a transport failure (tonic's status with a transport error under it) is a `SendError`, a
//!   connect failure when the connection was refused or never made;
//! - a status after the stream began is an error event and `[DONE]`; a transport failure then is
//!   the body's break;
//! - a client that leaves drops the body: the call is cancelled and `Abort` sent, so the engine
//!   frees the request at once; an answer ended by a stop sequence aborts the rest the same way.
//!
//! ## Layout
//! - `request` — the OpenAI body as a `GenerateRequest`; what is refused on this path.
//! - `render` — replies as OpenAI's event stream or completion.
//! - `tokenizer` — the model's tokenizer fetched from a worker (`GetTokenizer`) when the command
//!   line names no model directory.

mod render;
mod request;
mod tokenizer;

use std::collections::HashMap;
use std::time::Duration;

use axum::http::{header, HeaderValue, Response, StatusCode};
use bytes::Bytes;
use parking_lot::Mutex;
use sluice_proto::sglang_scheduler::sglang_scheduler_client::SglangSchedulerClient;
use sluice_proto::sglang_scheduler::{
    AbortRequest, GenerateResponse, GetLoadsRequest, GetLoadsResponse, GetModelInfoRequest,
    GetModelInfoResponse, HealthCheckRequest, HealthCheckResponse,
};
use tokio::sync::mpsc;
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};

pub(crate) use render::Renderer;
pub(crate) use request::Route;

use super::exchange::{ExchangeError, SendError, UpstreamRequest};
use super::pool::{UpstreamBody, UpstreamResponse};
use super::Endpoint;
use crate::tokens::SharedTokens;

/// The scheme of a gRPC worker's URL (SMG's form).
pub(crate) const SCHEME: &str = "grpc";

/// Rendered pieces a stream may get ahead of its client.
const AHEAD: usize = 32;

/// HTTP/2 keep-alive pings on gRPC connections: a peer gone silent is noticed within about
/// twice this, even while no request is in flight (the KV-event stream is long-lived).
const KEEPALIVE: Duration = Duration::from_secs(10);

pub(super) type Client = SglangSchedulerClient<Channel>;

/// Connections to every gRPC worker, made on first use, and the model's tokens.
#[derive(Debug)]
pub(crate) struct GrpcUpstream {
    channels: Mutex<HashMap<String, Channel>>,
    connect_timeout: Duration,
    /// The model's tokens: from the command line's files, else fetched from the first worker
    /// that serves them (`fetch_tokenizer`).
    tokens: SharedTokens,
    /// Held while a worker's tokenizer is fetched (an async lock: the fetch awaits the worker).
    fetching: tokio::sync::Mutex<()>,
}

/// A control call's request, bounded by `timeout` (sent to the worker as `grpc-timeout` too).
fn timed<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    request
}

/// A gRPC failure that is the transport's (no status the engine sent).
fn is_transport(status: &Status) -> bool {
    std::error::Error::source(status).is_some()
}

/// A transport failure before anything reached the worker: the connection refused or not made.
fn is_connect(status: &Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::TimedOut
            ) {
                return true;
            }
        }
        if e.to_string().contains("connect") {
            return true;
        }
        source = e.source();
    }
    false
}

/// The HTTP status an engine's gRPC status stands for.
pub(crate) fn http_status(code: Code) -> u16 {
    match code {
        Code::InvalidArgument => 400,
        Code::NotFound => 404,
        Code::ResourceExhausted => 429,
        Code::Unavailable => 503,
        Code::DeadlineExceeded => 504,
        _ => 500,
    }
}

/// An answer in SGLang's flat error shape, which the read-ahead understands (a full queue's
/// 503 is at capacity).
fn error_answer(status: u16, message: &str) -> UpstreamResponse {
    let body = serde_json::json!({
        "object": "error", "message": message, "type": "error", "param": null, "code": status,
    });
    answer(
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        "application/json",
        Bytes::from(body.to_string()),
    )
}

fn answer(status: StatusCode, content_type: &'static str, body: Bytes) -> UpstreamResponse {
    let (tx, rx) = mpsc::channel(1);
    let _ = tx.try_send(Ok(body));
    let mut response = Response::new(UpstreamBody::rendered(rx));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

impl GrpcUpstream {
    pub(super) fn new(connect_timeout: Duration, tokens: SharedTokens) -> Self {
        Self {
            channels: Mutex::new(HashMap::new()),
            connect_timeout,
            tokens,
            fetching: tokio::sync::Mutex::new(()),
        }
    }

    /// The worker's client, on a connection made when first needed and shared after.
    pub(super) fn client(&self, endpoint: &Endpoint) -> Client {
        let key = endpoint.authority.as_str();
        let mut channels = self.channels.lock();
        let channel = channels.entry(key.to_string()).or_insert_with(|| {
            let uri = format!("http://{key}");
            tonic::transport::Endpoint::from_shared(uri)
                .unwrap_or_else(|_| tonic::transport::Endpoint::from_static("http://0.0.0.0:0"))
                .connect_timeout(self.connect_timeout)
                .tcp_nodelay(true)
                .http2_keep_alive_interval(KEEPALIVE)
                .keep_alive_while_idle(true)
                .connect_lazy()
        });
        SglangSchedulerClient::new(channel.clone()).max_decoding_message_size(usize::MAX)
    }

    /// Forgets the connection to `endpoint`, whose worker's registration ended: kept, it would
    /// hold a task and an idle connection (pinged every `KEEPALIVE`) to an engine no longer in
    /// the fleet, one more with every worker discovery replaces. Calls holding it finish on it.
    pub(crate) fn forget(&self, endpoint: &Endpoint) {
        self.channels.lock().remove(endpoint.authority.as_str());
    }

    /// `GetModelInfo`: what the worker serves, as the control loop registers it.
    pub(crate) async fn model_info(
        &self,
        endpoint: &Endpoint,
        timeout: Duration,
    ) -> Result<GetModelInfoResponse, Status> {
        let request = timed(GetModelInfoRequest {}, timeout);
        Ok(self
            .client(endpoint)
            .get_model_info(request)
            .await?
            .into_inner())
    }

    /// `HealthCheck`: the servicer's one-token probe.
    pub(crate) async fn health(
        &self,
        endpoint: &Endpoint,
        timeout: Duration,
    ) -> Result<HealthCheckResponse, Status> {
        let request = timed(HealthCheckRequest {}, timeout);
        Ok(self
            .client(endpoint)
            .health_check(request)
            .await?
            .into_inner())
    }

    /// `GetServerInfo`: the engine's settings (`server_args`).
    pub(crate) async fn server_info(
        &self,
        endpoint: &Endpoint,
        timeout: Duration,
    ) -> Result<sluice_proto::sglang_scheduler::GetServerInfoResponse, Status> {
        let request = timed(
            sluice_proto::sglang_scheduler::GetServerInfoRequest {},
            timeout,
        );
        Ok(self
            .client(endpoint)
            .get_server_info(request)
            .await?
            .into_inner())
    }

    /// `SubscribeKvEvents`: the engine's KV events, each batch with its load record.
    pub(crate) async fn subscribe_kv_events(
        &self,
        endpoint: &Endpoint,
        request: sluice_proto::common::SubscribeKvEventsRequest,
    ) -> Result<Streaming<sluice_proto::common::KvEventBatch>, Status> {
        Ok(self
            .client(endpoint)
            .subscribe_kv_events(request)
            .await?
            .into_inner())
    }

    /// `GetLoads` with every section: each rank's load, as `/v1/loads?include=all` gives it.
    pub(crate) async fn loads(
        &self,
        endpoint: &Endpoint,
        timeout: Duration,
    ) -> Result<GetLoadsResponse, Status> {
        let request = timed(
            GetLoadsRequest {
                dp_rank: None,
                include: vec!["all".into()],
            },
            timeout,
        );
        Ok(self.client(endpoint).get_loads(request).await?.into_inner())
    }

    /// One OpenAI request to a gRPC worker, answered as an HTTP engine would answer it.
    pub(super) async fn send(
        &self,
        endpoint: &Endpoint,
        request: UpstreamRequest,
    ) -> Result<UpstreamResponse, SendError> {
        let route = match request.uri().path() {
            "/v1/chat/completions" => Route::Chat,
            "/v1/completions" => Route::Completions,
            path => {
                return Ok(error_answer(
                    404,
                    &format!("{path} is not served by gRPC workers"),
                ))
            }
        };
        let Some(tokens) = self.tokens.get() else {
            return Err(SendError::NoTokenizer);
        };
        let request_id = request
            .headers()
            .get(crate::http::REQUEST_ID)
            .and_then(|v| v.to_str().ok())
            .map_or_else(|| format!("{:016x}", rand::random::<u64>()), str::to_string);
        let body = request.into_body();
        let model = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["model"].as_str().map(str::to_string))
            .unwrap_or_default();
        let converted = {
            let (tokens, id) = (tokens.clone(), request_id.clone());
            tokio::task::spawn_blocking(move || {
                request::generate_request(route, &body, &tokens, &id)
            })
            .await
        };
        let (generate, asked) = match converted {
            Ok(Ok(converted)) => converted,
            Ok(Err(refused)) => {
                return Err(SendError::NotOnGrpc {
                    param: refused.param(),
                    message: refused.to_string(),
                })
            }
            Err(_) => return Ok(error_answer(500, "tokenizing the prompt failed")),
        };
        let mut client = self.client(endpoint);
        let call = Call {
            client: client.clone(),
            request_id,
        };
        let mut replies = match client.generate(generate).await {
            Ok(replies) => replies.into_inner(),
            Err(status) => return call.refused(status),
        };
        let renderer = Renderer::new(asked.clone(), &tokens, &model, &call.request_id);
        if asked.stream {
            call.stream(replies, renderer).await
        } else {
            call.whole(&mut replies, renderer).await
        }
    }
}

/// A call the gateway is waiting on before it has an answer to give: dropped meanwhile (the
/// client left, or the request's deadline passed), it sends `Abort`, so the engine stops the
/// work at once rather than when it notices the call was cancelled.
struct Waiting<'a> {
    call: &'a Call,
    answered: bool,
}

impl<'a> Waiting<'a> {
    fn on(call: &'a Call) -> Self {
        Self {
            call,
            answered: false,
        }
    }

    /// The engine answered (or failed): nothing to abort.
    fn answered(mut self) {
        self.answered = true;
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.call.abort();
        }
    }
}

/// One `Generate` call in flight.
struct Call {
    client: Client,
    request_id: String,
}

impl Call {
    /// A status before any reply: the transport's failure, or the engine's answer.
    fn refused(&self, status: Status) -> Result<UpstreamResponse, SendError> {
        if is_transport(&status) {
            return Err(SendError::Grpc {
                connect: is_connect(&status),
                status,
            });
        }
        Ok(error_answer(http_status(status.code()), status.message()))
    }

    /// Tells the engine to stop, without waiting for its answer.
    fn abort(&self) {
        let mut client = self.client.clone();
        let request = AbortRequest {
            request_id: self.request_id.clone(),
            reason: "the client left".into(),
        };
        tokio::spawn(async move {
            let _ = client.abort(request).await;
        });
    }

    async fn whole(
        self,
        replies: &mut Streaming<GenerateResponse>,
        mut renderer: Renderer,
    ) -> Result<UpstreamResponse, SendError> {
        let waiting = Waiting::on(&self);
        let ended = loop {
            match replies.message().await {
                Ok(Some(reply)) => {
                    if reply.response.as_ref().is_some_and(|r| renderer.whole(r)) {
                        break Ok(());
                    }
                }
                Ok(None) => break Err(None),
                Err(status) => break Err(Some(status)),
            }
        };
        waiting.answered();
        match ended {
            Ok(()) => Ok(answer(
                StatusCode::OK,
                "application/json",
                renderer.completion(),
            )),
            Err(None) => Ok(error_answer(
                500,
                "the engine ended the answer without completing it",
            )),
            Err(Some(status)) => self.refused(status),
        }
    }

    /// Waits for the first reply (a refusal before it is the HTTP answer), then relays the rest
    /// from a task that owns the call.
    async fn stream(
        self,
        mut replies: Streaming<GenerateResponse>,
        renderer: Renderer,
    ) -> Result<UpstreamResponse, SendError> {
        let waiting = Waiting::on(&self);
        let first = replies.message().await;
        waiting.answered();
        let first = match first {
            Ok(first) => first,
            Err(status) => return self.refused(status),
        };
        let (tx, rx) = mpsc::channel(AHEAD);
        tokio::spawn(self.relay(first, replies, renderer, tx));
        let mut response = Response::new(UpstreamBody::rendered(rx));
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        Ok(response)
    }

    async fn relay(
        self,
        mut next: Option<GenerateResponse>,
        mut replies: Streaming<GenerateResponse>,
        mut renderer: Renderer,
        tx: mpsc::Sender<Result<Bytes, ExchangeError>>,
    ) {
        loop {
            let Some(reply) = next.take() else {
                // The engine closed the call without completing every choice.
                let _ = tx
                    .send(Ok(render::error_event(
                        500,
                        "the engine ended the stream early",
                    )))
                    .await;
                return;
            };
            if let Some(reply) = reply.response {
                let rendered = renderer.stream(&reply);
                if !rendered.bytes.is_empty() && tx.send(Ok(rendered.bytes.into())).await.is_err() {
                    return self.abort();
                }
                if rendered.done {
                    if renderer.cut_short() {
                        // A stop sequence ended the answer before the engine did.
                        drop(replies);
                        self.abort();
                    }
                    let _ = tx.send(Ok(renderer.end())).await;
                    return;
                }
            }
            next = tokio::select! {
                () = tx.closed() => return self.abort(),
                reply = replies.message() => match reply {
                    Ok(reply) => reply,
                    Err(status) if is_transport(&status) => {
                        let _ = tx.send(Err(ExchangeError::Grpc(status))).await;
                        return;
                    }
                    Err(status) => {
                        let code = http_status(status.code());
                        let _ = tx.send(Ok(render::error_event(code, status.message()))).await;
                        return;
                    }
                },
            };
        }
    }
}

/// A `GetLoads` answer as the `/v1/loads` body it mirrors (the same names, field for field), so
/// the one SGLang parser reads both.
pub(crate) fn loads_json(loads: &GetLoadsResponse) -> String {
    let ranks: Vec<serde_json::Value> = loads
        .loads
        .iter()
        .map(|l| {
            let mut rank = serde_json::json!({
                "dp_rank": l.dp_rank,
                "num_running_reqs": l.num_running_reqs,
                "num_waiting_reqs": l.num_waiting_reqs,
                "num_waiting_uncached_tokens": l.num_waiting_uncached_tokens,
                "num_used_tokens": l.num_used_tokens,
                "max_total_num_tokens": l.max_total_num_tokens,
                "token_usage": l.token_usage,
                "gen_throughput": l.gen_throughput,
                "cache_hit_rate": l.cache_hit_rate,
                "max_running_requests": l.max_running_requests,
            });
            if let Some(q) = &l.queues {
                rank["queues"] = serde_json::json!({
                    "waiting": q.waiting, "grammar": q.grammar, "paused": q.paused,
                    "retracted": q.retracted,
                });
            }
            if let Some(lora) = &l.lora {
                rank["lora"] = serde_json::json!({
                    "slots_used": lora.slots_used, "slots_total": lora.slots_total,
                    "utilization": lora.utilization,
                });
            }
            if let Some(d) = &l.disaggregation {
                rank["disaggregation"] = serde_json::json!({
                    "mode": d.mode,
                    "prefill_inflight_queue_reqs": d.prefill_inflight_queue_reqs,
                    "decode_prealloc_queue_reqs": d.decode_prealloc_queue_reqs,
                    "decode_transfer_queue_reqs": d.decode_transfer_queue_reqs,
                });
            }
            rank
        })
        .collect();
    serde_json::json!({ "loads": ranks }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_proto::common::EngineLora;
    use sluice_proto::sglang_scheduler::SchedulerLoad;

    #[test]
    fn get_loads_lora_section_reads_as_the_v1_loads_one() {
        let rank = |used, total| SchedulerLoad {
            lora: Some(EngineLora {
                slots_used: used,
                slots_total: total,
                utilization: 0.0,
            }),
            ..SchedulerLoad::default()
        };
        let loads = GetLoadsResponse {
            loads: vec![rank(3, 8), rank(1, 8)],
            ..GetLoadsResponse::default()
        };
        let report = sluice_core::load::parse_sglang_loads(loads_json(&loads).as_bytes()).unwrap();
        let slots = report.adapters.expect("the lora section");
        assert_eq!((slots.used, slots.max), (Some(4), Some(16)));
    }
}
