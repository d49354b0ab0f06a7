//! One request through the data plane: one ext_proc stream, in full-duplex streamed mode.
//!
//! Two halves run together. The pump reads what the data plane sends — the request's head, its
//! body in pieces, the worker's head, the worker's body in pieces, trailers — and hands each to
//! whoever waits for it. The drive answers, in the order the protocol requires (request head,
//! request body, request trailers; response head, response body, response trailers): it hands
//! the request to the gateway's front stage (`front::pick`: the same checks, admission, queue and
//! choice as `sluice serve`), names the chosen worker, sends the body back, then reads the
//! worker's answer as `sluice serve` reads one (`Picked::answered`: first event, error events,
//! TTFT, usage, the deadline) and passes the relayed body back piece by piece.
//!
//! When the data plane closes or resets the stream first — its client left, or the exchange
//! failed — the drive is dropped where it stands: a request waiting in the gateway queue leaves
//! it, and one being answered is counted as cancelled, as when a client of `sluice serve` leaves.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use bytes::Bytes;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    processing_request, HttpHeaders, ProcessingRequest, ProcessingResponse,
};
use http_body::Frame;
use http_body_util::BodyExt;
use sluice_gateway::front::{self, Answered, DataPlaneReply, Front, Picked};
use sluice_gateway::http::CLIENT_CREDENTIALS;
use sluice_gateway::upstream::UpstreamBody;
use tokio::sync::{mpsc, oneshot};
use tonic::{Status, Streaming};

use crate::objective::Objectives;
use crate::wire;

/// Pieces of a body in flight between the halves. Small: the pump waits when the drive is
/// behind, which is the data plane's flow control doing its work.
const BODY_PIECES: usize = 16;
/// Answers on their way back to the data plane.
pub(crate) const ANSWERS: usize = 16;

/// What every exchange needs.
pub(crate) struct Shared {
    pub front: Arc<Front>,
    pub objectives: Objectives,
}

/// Where the drive's answers go: the stream back to the data plane.
pub(crate) type Outbound = mpsc::Sender<Result<ProcessingResponse, Status>>;

/// What the pump hands the drive.
struct Inbox {
    request_body: mpsc::Receiver<Option<Frame<Bytes>>>,
    request_trailers: Arc<AtomicBool>,
    response_head: oneshot::Receiver<ResponseHead>,
    response_body: mpsc::Receiver<Option<Frame<Bytes>>>,
}

/// The answer's head as the data plane sent it, and whether it, not the worker, answered.
struct ResponseHead {
    headers: HttpHeaders,
    reply: Option<DataPlaneReply>,
}

struct Pump {
    inbound: Streaming<ProcessingRequest>,
    request_body: Option<mpsc::Sender<Option<Frame<Bytes>>>>,
    request_trailers: Arc<AtomicBool>,
    response_head: Option<oneshot::Sender<ResponseHead>>,
    response_body: Option<mpsc::Sender<Option<Frame<Bytes>>>>,
}

/// Runs one ext_proc stream to its end.
pub(crate) async fn run(
    shared: Arc<Shared>,
    mut inbound: Streaming<ProcessingRequest>,
    out: Outbound,
) {
    let first = match inbound.message().await {
        Ok(Some(first)) => first,
        _ => return,
    };
    let Some(processing_request::Request::RequestHeaders(head)) = first.request else {
        let _ = out
            .send(Err(Status::failed_precondition(
                "the endpoint picker expects a request's headers first",
            )))
            .await;
        return;
    };
    let subset = wire::subset(first.metadata_context.as_ref());
    let (request_tx, request_body) = mpsc::channel(BODY_PIECES);
    let (head_tx, response_head) = oneshot::channel();
    let (response_tx, response_body) = mpsc::channel(BODY_PIECES);
    let request_trailers = Arc::new(AtomicBool::new(false));
    let pump = Pump {
        inbound,
        request_body: Some(request_tx).filter(|_| !head.end_of_stream),
        request_trailers: request_trailers.clone(),
        response_head: Some(head_tx),
        response_body: Some(response_tx),
    };
    let inbox = Inbox {
        request_body,
        request_trailers,
        response_head,
        response_body,
    };
    let drive = Drive {
        shared: &shared,
        out: &out,
        subset,
    };
    tokio::select! {
        () = pump.run() => {}
        ended = drive.run(head, inbox) => {
            if let Err(status) = ended {
                let _ = out.send(Err(status)).await;
            }
        }
    }
}

impl Pump {
    /// Hands on what the data plane sends until it resets the stream, or closes its side
    /// before the worker's answer has all come: then the exchange is over. A data plane that
    /// closes its side once it has sent everything is still answered to the end.
    async fn run(mut self) {
        loop {
            let message = match self.inbound.message().await {
                Ok(Some(message)) => message,
                Ok(None) if self.sent_everything() => return std::future::pending().await,
                Ok(None) | Err(_) => return,
            };
            let Some(request) = message.request else {
                continue;
            };
            match request {
                processing_request::Request::RequestBody(body) => {
                    let eos = body.end_of_stream;
                    piece(&mut self.request_body, body.body, eos).await;
                }
                processing_request::Request::RequestTrailers(_) => {
                    self.request_trailers.store(true, Ordering::Release);
                    end(&mut self.request_body).await;
                }
                processing_request::Request::ResponseHeaders(head) => {
                    let eos = head.end_of_stream;
                    if let Some(tx) = self.response_head.take() {
                        let reply = wire::data_plane_reply(&message.attributes);
                        let _ = tx.send(ResponseHead {
                            headers: head,
                            reply,
                        });
                    }
                    if eos {
                        end(&mut self.response_body).await;
                    }
                }
                processing_request::Request::ResponseBody(body) => {
                    let eos = body.end_of_stream;
                    piece(&mut self.response_body, body.body, eos).await;
                }
                processing_request::Request::ResponseTrailers(trailers) => {
                    if let Some(tx) = &self.response_body {
                        let map = wire::headers(trailers.trailers.as_ref());
                        let _ = tx.send(Some(Frame::trailers(map))).await;
                    }
                    end(&mut self.response_body).await;
                }
                processing_request::Request::RequestHeaders(_) => {}
            }
        }
    }

    /// The worker's answer has all come (its head, and its body's end).
    fn sent_everything(&self) -> bool {
        self.response_head.is_none() && self.response_body.is_none()
    }
}

/// Hands a piece of a body on, and its end when `eos`.
async fn piece(to: &mut Option<mpsc::Sender<Option<Frame<Bytes>>>>, data: Vec<u8>, eos: bool) {
    if let (Some(tx), false) = (to.as_ref(), data.is_empty()) {
        let _ = tx.send(Some(Frame::data(Bytes::from(data)))).await;
    }
    if eos {
        end(to).await;
    }
}

async fn end(to: &mut Option<mpsc::Sender<Option<Frame<Bytes>>>>) {
    if let Some(tx) = to.take() {
        let _ = tx.send(None).await;
    }
}

/// The answering half.
struct Drive<'a> {
    shared: &'a Shared,
    out: &'a Outbound,
    /// The data plane's subset hint: `None` allows every worker.
    subset: Option<Vec<SocketAddr>>,
}

/// The data plane went away: nothing more to answer.
struct Gone;

impl From<Gone> for Status {
    fn from(_: Gone) -> Self {
        Status::cancelled("the data plane closed the stream")
    }
}

impl Drive<'_> {
    async fn send(&self, response: ProcessingResponse) -> Result<(), Gone> {
        self.out.send(Ok(response)).await.map_err(|_| Gone)
    }

    async fn run(self, head: HttpHeaders, inbox: Inbox) -> Result<(), Status> {
        let Inbox {
            request_body,
            request_trailers,
            response_head,
            response_body,
        } = inbox;
        let has_body = !head.end_of_stream;
        let mut parts = match wire::request_parts(head.headers.as_ref()) {
            Ok(parts) => parts,
            Err(e) => {
                tracing::warn!(error = %e, "a request the data plane sent cannot be read");
                let answered = Answered {
                    response: axum::response::IntoResponse::into_response(
                        sluice_gateway::http::RequestError::MalformedRequest,
                    ),
                    shed: false,
                };
                return Ok(self.answer_here(answered).await?);
            }
        };
        self.shared.objectives.apply(&mut parts.headers);
        let body = if has_body {
            Body::new(UpstreamBody::handed_over(request_body))
        } else {
            Body::empty()
        };
        let subset = self.subset.as_deref();
        let allowed = move |worker: &sluice_gateway::fleet::Worker| {
            worker
                .endpoint
                .socket_addr()
                .is_some_and(|at| subset.is_none_or(|s| s.contains(&at)))
        };
        let picked = match front::pick(&self.shared.front, parts, body, &allowed).await {
            Ok(picked) => picked,
            Err(answered) => return Ok(self.answer_here(answered).await?),
        };
        let trailers = request_trailers.load(Ordering::Acquire);
        self.send_request(&picked, has_body, trailers).await?;
        self.relay(picked, response_head, response_body).await
    }

    /// The gateway answered itself: its answer goes to the client instead of a worker's.
    async fn answer_here(&self, answered: Answered) -> Result<(), Gone> {
        let Answered { response, shed } = answered;
        let (parts, body) = response.into_parts();
        let body = body
            .collect()
            .await
            .map(|b| b.to_bytes().to_vec())
            .unwrap_or_default();
        // The Inference Extension asks for 429 when a request is dropped for load.
        let status = if shed {
            StatusCode::TOO_MANY_REQUESTS
        } else {
            parts.status
        };
        self.send(wire::immediate(status, &parts.headers, body))
            .await
    }

    /// Names the chosen worker, then sends the request's body (as the gateway leaves it) back.
    async fn send_request(
        &self,
        picked: &Picked,
        has_body: bool,
        trailers: bool,
    ) -> Result<(), Status> {
        let Some(at) = picked.worker().endpoint.socket_addr() else {
            return Err(Status::internal("the chosen worker has no IP address"));
        };
        let mut set = picked.upstream_headers().clone();
        let endpoint = HeaderValue::from_str(&at.to_string())
            .map_err(|_| Status::internal("unwritable endpoint"))?;
        set.insert(wire::DESTINATION, endpoint);
        if has_body {
            set.insert(
                axum::http::header::CONTENT_LENGTH,
                HeaderValue::from(picked.body().len()),
            );
        }
        let remove: Vec<String> = CLIENT_CREDENTIALS
            .iter()
            .filter(|name| !set.contains_key(*name))
            .map(|name| name.as_str().to_string())
            .collect();
        self.send(wire::route_to(at, wire::mutation(&set, remove)))
            .await?;
        if has_body {
            self.send(wire::body_chunk(true, picked.body().to_vec(), !trailers))
                .await?;
        }
        if trailers {
            self.send(wire::trailers(true)).await?;
        }
        Ok(())
    }

    /// Waits for the worker's answer and relays it back, judged as `sluice serve` judges one.
    async fn relay(
        &self,
        picked: Picked,
        head: oneshot::Receiver<ResponseHead>,
        frames: mpsc::Receiver<Option<Frame<Bytes>>>,
    ) -> Result<(), Status> {
        let ResponseHead {
            headers: head,
            reply,
        } = head.await.map_err(|_| Gone)?;
        let has_body = !head.end_of_stream;
        let (status, upstream) = wire::response_head(head.headers.as_ref())
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let answer = match reply {
            // The data plane's own reply: the gateway's error replaces it, body and all.
            Some(reply) => picked.unanswered(reply),
            None => picked.answered(status, upstream.clone(), frames).await,
        };
        let (parts, mut body) = answer.into_parts();
        let mut headers = changed(&upstream, &parts.headers);
        if parts.status != status {
            headers = wire::with_status(headers, parts.status);
        }
        self.send(wire::response_headers(headers)).await?;
        if !has_body {
            // Nothing to pass on; reading it still ends the request's accounting.
            while let Some(Ok(_)) = body.frame().await {}
            return Ok(());
        }
        let mut trailers = false;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| Status::aborted(e.to_string()))?;
            match frame.into_data() {
                Ok(data) => {
                    self.send(wire::body_chunk(false, data.to_vec(), false))
                        .await?
                }
                Err(_) => trailers = true,
            }
        }
        if trailers {
            self.send(wire::body_chunk(false, Vec::new(), false))
                .await?;
            self.send(wire::trailers(false)).await?;
        } else {
            self.send(wire::body_chunk(false, Vec::new(), true)).await?;
        }
        Ok(())
    }
}

/// What turns the worker's headers into the answer's: every header whose values differ is set,
/// every header the answer dropped is removed.
fn changed(
    from: &HeaderMap,
    to: &HeaderMap,
) -> envoy_types::pb::envoy::service::ext_proc::v3::HeaderMutation {
    let set = to
        .keys()
        .filter(|name| !from.get_all(*name).iter().eq(to.get_all(*name).iter()))
        .flat_map(|name| to.get_all(name).iter().map(move |value| (name, value)));
    let remove = from
        .keys()
        .filter(|name| !to.contains_key(*name))
        .map(|name| name.as_str().to_string());
    wire::mutation(set, remove)
}
