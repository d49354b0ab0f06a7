//! The forward stage when a data plane sends the request itself (`sluice epp` behind Envoy): the
//! placed request's worker is leased here as `Forwarder::forward` leases it, and handed over
//! with what the data plane must add on the way (the worker's key, the request id, what is left
//! of the client's deadline); the data plane's answer comes back as a head and a stream of
//! frames, and is judged and relayed as a worker's answer is.
//!
//! There is one attempt: retries are the data plane's (its retry policy, on the endpoints it is
//! given), so `--retry-*` do not apply. What a failed exchange looks like differs too: a
//! connection the data plane could not make comes back as its own reply (Envoy's 503 "upstream
//! connect error"), which the worker never sent. Where the data plane says so (Envoy's
//! `response.code_details` attribute), it is judged as `sluice serve` judges a connection it
//! could not make — a transport failure of the worker, never a sign of life — and the client
//! gets the gateway's own error instead. Where it does not, it is judged as a worker's 503.

use axum::http::HeaderMap;
use bytes::Bytes;
use tokio::time::Instant;

use super::ForwardError;
use super::{read_ahead, Answer, Dispatch};
use crate::admit::Terms;
use crate::context::RequestContext;
use crate::fleet::{Lease, Pool, Worker, AT_CAPACITY_VETO};
use crate::request::Asked;
use crate::route::{Placement, RouteError};
use crate::upstream::{UpstreamBody, UpstreamResponse};

/// Why the data plane answered a request itself instead of relaying the worker's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataPlaneReply {
    /// It could not reach the worker: the connection failed, or was reset before a head came.
    Unreachable,
    /// Anything else it answers itself (its own timeout, a route or cluster it lacks): nothing
    /// the worker said, and nothing about the worker.
    Other,
}

/// A request placed and leased, for a data plane to send.
#[derive(Debug)]
pub struct Handover {
    /// The worker's hold, until the answer ends (or the handover is dropped).
    pub(crate) lease: Lease,
    /// What to send: the client's body, or the one the ladder or the model's name rewrote.
    pub(crate) body: Bytes,
    /// Headers to set on the way to the worker; `http::CLIENT_CREDENTIALS` are to be removed
    /// first.
    pub(crate) set_headers: HeaderMap,
    /// When the worker was handed over (time to first byte counts from here).
    pub(crate) sent_at: Instant,
    /// Admission's terms, which the answer is relayed under.
    pub(crate) terms: Terms,
}

/// Hands a placed request to a data plane: leased on a worker that `allowed` accepts (the data
/// plane's subset, the workers it can reach), never on one it does not.
pub(crate) struct ToDataPlane<'a> {
    pub(crate) allowed: &'a (dyn Fn(&Worker) -> bool + Sync),
    /// Loads a LoRA adapter onto the worker first, where its spec allows and it must.
    pub(crate) adapter_loads: Option<&'a crate::control::AdapterLoads>,
}

impl Dispatch for ToDataPlane<'_> {
    type Sent = Handover;

    /// The workers the data plane cannot reach; a disaggregated model not at all: its prefill
    /// and decode legs are two exchanges sluice makes itself.
    fn excluded(&self, pool: &Pool) -> Result<Vec<u64>, RouteError> {
        if pool.pd.is_some() {
            return Err(RouteError::NoAvailableWorkers {
                model: pool.model.clone(),
                detail: ": its prefill and decode workers are paired by `sluice serve`, \
                         not behind a data plane"
                    .to_string(),
            });
        }
        Ok(pool
            .workers
            .iter()
            .filter(|w| !(self.allowed)(w))
            .map(|w| w.key)
            .collect())
    }

    async fn dispatch<'a>(
        &'a self,
        ctx: &'a mut RequestContext,
        asked: &'a Asked<'a>,
        placement: Placement,
    ) -> Result<Handover, ForwardError> {
        ctx.forwarding();
        let Placement {
            terms,
            body,
            mut lease,
            chooser,
            prefill,
        } = placement;
        if prefill.is_some() {
            // `excluded` refused the pool before it was placed.
            return Err(RouteError::NoAvailableWorkers {
                model: chooser.model().clone(),
                detail: String::new(),
            }
            .into());
        }
        ctx.attempt(&lease.worker().id);
        let id = &asked.arrival.id;
        lease.for_request(id);
        lease.prefilling(chooser.request().prompt_tokens);
        if chooser.request().stream {
            lease.streaming();
        }
        if let Some(loads) = self.adapter_loads {
            match super::adapter::load_for(loads, &lease, terms.deadline).await {
                Ok(()) => {}
                Err(Some(_)) => {
                    lease.settle(sluice_core::breaker::Outcome::Failure);
                    return Err(super::adapter::load_failed(&lease));
                }
                Err(None) => {
                    let timeout = terms.allowed(asked.arrival.started);
                    return Err(crate::error::Expired::RequestTimeout { timeout }.into());
                }
            }
        }
        let mut set_headers = HeaderMap::new();
        super::add_worker_headers(
            &mut set_headers,
            id,
            terms.client_deadline,
            lease.worker(),
            ctx.trace(),
        );
        Ok(Handover {
            lease,
            body,
            set_headers,
            sent_at: Instant::now(),
            terms,
        })
    }
}

impl Handover {
    /// The worker's answer as the data plane streams it through: `status` and `headers` from its
    /// head, the body's frames from `frames` (`None` ends it). Read ahead and judged as
    /// `Forwarder` judges an answer — an engine that says it is full is kept off for a moment —
    /// then relayed: the returned answer's body yields what the data plane passes on.
    pub async fn answered(
        self,
        status: axum::http::StatusCode,
        headers: HeaderMap,
        frames: tokio::sync::mpsc::Receiver<Option<http_body::Frame<Bytes>>>,
    ) -> Answer {
        let mut response = UpstreamResponse::new(UpstreamBody::handed_over(frames));
        *response.status_mut() = status;
        *response.headers_mut() = headers;
        let worker = self.lease.worker().clone();
        worker.signals.contact(Instant::now());
        // Handed-over frames never fail: a data plane that goes away leaves the body unfinished,
        // and the exchange is dropped with it.
        let ahead = read_ahead(&mut response, self.terms.deadline)
            .await
            .unwrap_or_default();
        if ahead.at_capacity {
            worker.vetoes.at_capacity_for(AT_CAPACITY_VETO);
        }
        Answer {
            response,
            lease: self.lease,
            sent_at: self.sent_at,
            ahead,
            terms: self.terms,
        }
    }

    /// The data plane answered in the worker's place (`reply`): no contact with the worker, and
    /// nothing of it relayed. A connection it could not make is the worker's transport failure,
    /// as when the forward stage cannot connect. Returns the error the client gets instead.
    pub fn unanswered(mut self, ctx: &RequestContext, reply: DataPlaneReply) -> ForwardError {
        let worker = self.lease.worker().clone();
        if reply == DataPlaneReply::Unreachable {
            worker.signals.transport_failure(Instant::now());
            self.lease.settle(sluice_core::breaker::Outcome::Failure);
            ctx.metrics().upstream_error(worker.id.as_str(), "connect");
        }
        ForwardError::UpstreamFailed {
            worker: worker.id.clone(),
        }
    }
}
