//! The front stage for a data plane that sends requests itself (`sluice epp`, an endpoint picker
//! behind Envoy): the same checks, admission and choice as a request `sluice serve` receives,
//! ending in a worker handed to the data plane instead of a request sent to it; then the answer
//! the data plane streams back, judged and relayed as a worker's answer is.
//!
//! Whatever the gateway answers itself (a refusal, bad input, `GET /v1/models`) comes back as the
//! response `sluice serve` would have sent, for the data plane to send instead of the worker's.

use std::sync::Arc;

use axum::body::Body;
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, Request, Response, StatusCode};
use bytes::Bytes;
use http_body::Frame;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tower::ServiceExt;

use super::{degraded_header, routes, serve, ApiRoute, Front, DEGRADED};
use crate::context::RequestContext;
use crate::error::{respond, Answerable};
use crate::fleet::Worker;
use crate::forward::{DataPlaneReply, Handover, ToDataPlane};
use crate::http::{self, clean_response_headers, request_id, REQUEST_ID};
use crate::request::Arrival;
use crate::stream;

/// A request placed on a worker, for the data plane to send there.
#[derive(Debug)]
pub struct Picked {
    ctx: RequestContext,
    handover: Handover,
    /// What the client's answer carries whoever answers: its request id, its tenant's budgets,
    /// what the ladder did.
    answer_headers: HeaderMap,
}

impl Picked {
    /// The chosen worker.
    pub fn worker(&self) -> &Arc<Worker> {
        self.handover.lease.worker()
    }

    /// The body to send: the client's, or as the ladder or the model's name rewrote it.
    pub fn body(&self) -> &Bytes {
        &self.handover.body
    }

    /// Headers to set on the way to the worker (after removing `http::CLIENT_CREDENTIALS`).
    pub fn upstream_headers(&self) -> &HeaderMap {
        &self.handover.set_headers
    }

    /// The worker's answer as the data plane streams it: its head, then its body's frames from
    /// `frames` (`None` ends it). Returns the answer to pass on — the head cleaned and given the
    /// gateway's headers, the body relayed (an error event may be appended, as `sluice serve`
    /// appends one). The request is accounted for when that body ends, or when it is dropped
    /// (the data plane went away: the client left).
    pub async fn answered(
        self,
        status: StatusCode,
        mut headers: HeaderMap,
        frames: mpsc::Receiver<Option<Frame<Bytes>>>,
    ) -> Response<Body> {
        let Picked {
            ctx,
            handover,
            answer_headers,
        } = self;
        clean_response_headers(&mut headers);
        let answer = handover.answered(status, headers, frames).await;
        let mut response = stream::relay(answer, ctx);
        response.headers_mut().extend(answer_headers);
        response
    }
}

impl Picked {
    /// The data plane answered itself instead of the worker, for `reply`: the gateway's own
    /// error goes to the client in the OpenAI shape, and the data plane's reply is judged as
    /// what it says of the worker (`Handover::unanswered`), never as the worker's answer.
    pub fn unanswered(self, reply: DataPlaneReply) -> Response<Body> {
        let Picked {
            mut ctx,
            handover,
            answer_headers,
        } = self;
        let error = handover.unanswered(&ctx, reply);
        ctx.refuse(error.status(), &error);
        let mut response = respond(&error, error.status());
        response.headers_mut().extend(answer_headers);
        response
    }
}

/// The gateway's own answer to a data plane's request, to send instead of a worker's.
#[derive(Debug)]
pub struct Answered {
    pub response: Response<Body>,
    /// A refusal for load (`GatewayError::is_shed`).
    pub shed: bool,
}

/// The OpenAI route a request is for, when it is one the gateway places.
fn api_route(parts: &Parts) -> Option<ApiRoute> {
    if parts.method != Method::POST {
        return None;
    }
    ApiRoute::ALL
        .into_iter()
        .find(|route| route.path() == parts.uri.path())
}

/// Admits and places a request a data plane received, on a worker that `allowed` accepts (the
/// data plane's subset hint, the workers it can reach). `Err`: the gateway's own answer to send
/// instead — a refusal, bad input, or a route it answers itself (`GET /v1/models`) — with the
/// request already accounted for.
pub async fn pick(
    front: &Arc<Front>,
    parts: Parts,
    body: Body,
    allowed: &(dyn Fn(&Worker) -> bool + Sync),
) -> Result<Picked, Answered> {
    let Some(route) = api_route(&parts) else {
        return Err(Answered {
            response: answered_here(front, parts, body).await,
            shed: false,
        });
    };
    let started = Instant::now();
    let arrival = Arrival {
        id: request_id(&parts.headers, &front.request_id_headers),
        route,
        started,
    };
    let mut ctx = RequestContext::new(&front.accounts, arrival.id.clone(), route.path(), started);
    ctx.trace_from(&front.accounts, &parts.headers);
    let mut body = Some(body);
    let dispatch = ToDataPlane {
        allowed,
        adapter_loads: front.forward.adapter_loads(),
    };
    let picked = serve(front, &mut ctx, &arrival, &parts, &mut body, &dispatch).await;
    let mut answer_headers = HeaderMap::new();
    answer_headers.insert(REQUEST_ID, arrival.id);
    if let Some(limits) = ctx.admission.rate_headers.take() {
        answer_headers.extend(limits);
    }
    if let Some(degraded) = degraded_header(&ctx.degraded) {
        answer_headers.insert(DEGRADED, degraded);
    }
    match picked {
        Ok(handover) => Ok(Picked {
            ctx,
            handover,
            answer_headers,
        }),
        Err(error) => {
            // What is left of the body stays with the data plane, which holds the client's
            // connection: nothing to read away here.
            let status = front.answers.status(&error);
            ctx.refuse(status, &error);
            let shed = error.is_shed();
            let mut response = respond(&error, status);
            response.headers_mut().extend(answer_headers);
            Err(Answered { response, shed })
        }
    }
}

/// A request for a route the gateway answers itself, or does not serve: answered as `sluice
/// serve` answers it.
async fn answered_here(front: &Arc<Front>, parts: Parts, body: Body) -> Response<Body> {
    let router = routes(front.clone())
        .fallback(http::unknown_route)
        .method_not_allowed_fallback(http::method_not_allowed);
    let request = Request::from_parts(parts, body);
    match router.oneshot(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}
