//! Forwarding a request of a disaggregated model: a prefill and a decode worker, SGLang's way,
//! or vLLM's when the prefill worker is a vLLM engine (`Exchange`: the prefill leg first, asking
//! one token with `kv_transfer_params`, then the decode leg with what it answered).
//!
//! The decode worker is chosen first, and must have room in its running window (seed 000):
//! among the decode workers the policy would take, one with room is taken; when every one is
//! full the request waits where the fewest wait, up to `--pd-admission-wait-secs`, and a room
//! that frees goes to the most urgent tier's longest waiter; no room in time, or a request wider
//! than the window, is shed with the overload answer. Then a prefill worker; both get the request
//! with the same `bootstrap_host`, `bootstrap_port` (the prefill's bootstrap server) and a fresh
//! `bootstrap_room`, at once. gRPC workers get them in `Generate`'s `disaggregated_params`
//! (`upstream::grpc`), whose room is an `int32`: theirs are drawn below 2^31.
//!
//! The decode worker's answer is the client's, relayed once the prefill leg has ended well — the
//! KV is across by then — so until then nothing has reached the client and a failed pair can be
//! retried: a prefill leg that fails, or stays silent past the wedge bound
//! (`sluice_core::liveness::leg_silence_bound`), sends the request to a new pair with a new room,
//! under the same retry rules as any request. Dropping the attempt (the client left, or a retry)
//! closes both legs' connections, which aborts both on the engines. The decode worker's rooms are
//! held by its lease until the answer's body ends.

use std::time::Duration;

use bytes::Bytes;
use sluice_core::breaker::Outcome;
use sluice_core::liveness::{leg_silence_bound, prefill_allowance};
use sluice_core::retry::AttemptFailure;
use tokio::time::Instant;

use super::failed::{transport_failure, Failed};
use super::ForwardError;
use super::{build_request, Ahead, Answer, Attempt, Forwarder, Job, Tried};
use crate::admit::Terms;
use crate::context::RequestContext;
use crate::fleet::{DecodeRooms, Lease, NoRoom, Role};
use crate::http::RequestError;
use crate::request::Asked;
use crate::route::Chooser;
use crate::upstream::UpstreamResponse;

/// A disaggregated request's two choosers, each remembering the workers of its side tried.
pub(super) struct Choosers {
    pub(crate) prefill: Chooser,
    pub(crate) decode: Chooser,
}

/// The decode admission window's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PdConfig {
    /// `--pd-admission-wait-secs`: 0 sheds as soon as the window is full.
    pub admission_wait: Duration,
    /// `--worker-wedge-secs`: how long a prefill leg may be silent (0: no bound).
    pub wedge: Duration,
    /// Gate decode workers by their running window (`--disable-pd-admission-window` turns it
    /// off).
    pub(crate) window: bool,
}

impl Default for PdConfig {
    fn default() -> Self {
        Self {
            admission_wait: Duration::from_secs(30),
            wedge: Duration::from_secs(3),
            window: true,
        }
    }
}

/// How a prefill leg ended.
enum LegEnd {
    /// The prompt is computed and its KV handed over (or, with vLLM, waits to be pulled as the
    /// answer says).
    Done(Bytes),
    /// The prefill worker refused the request itself (a 4xx but 429): the client's answer, as
    /// the decode worker would give it too. Boxed: rare, and larger than the others.
    Refused(Box<UpstreamResponse>, Instant),
    Failed(AttemptFailure),
    /// Silent past its bound.
    Silent,
}

impl Forwarder {
    /// Forwards a request of a disaggregated model to a prefill/decode pair, the first decode
    /// worker the route stage leased.
    pub(super) async fn forward_pd(
        &self,
        ctx: &mut RequestContext,
        asked: &Asked<'_>,
        terms: Terms,
        body: Bytes,
        first: Lease,
        mut choosers: Choosers,
    ) -> Result<Answer, ForwardError> {
        let (terms, body) = (&terms, &body);
        let mut first = Some(first);
        loop {
            let (decode_lease, rooms) = self
                .decode_with_room(terms, &choosers.decode, first.take())
                .await?;
            let prefill_lease = choosers.prefill.next()?;
            ctx.attempt(&decode_lease.worker().id);
            let exchange = Exchange::of(&prefill_lease);
            let prefill_body = exchange.prefill_body(body, &prefill_lease)?;
            // SGLang's legs carry the same body; vLLM's decode leg gets the client's, and what
            // the prefill answered.
            let decode_body = match exchange {
                Exchange::Sglang => &prefill_body,
                Exchange::Vllm => body,
            };
            let decode_job = Job {
                parts: asked.parts,
                body: decode_body,
                chooser: &choosers.decode,
            };
            let prefill_job = Job {
                parts: asked.parts,
                body: &prefill_body,
                chooser: &choosers.prefill,
            };
            let pair = Pair {
                prefill: Attempt::of(ctx, asked, terms, &prefill_job),
                decode: Attempt::of(ctx, asked, terms, &decode_job),
            };
            let attempts = pair.decode.attempts;
            let paired = match exchange {
                Exchange::Sglang => self.pair(pair, prefill_lease, decode_lease).await,
                Exchange::Vllm => self.pair_vllm(pair, prefill_lease, decode_lease).await,
            };
            let retry = match paired.settle(rooms, &mut choosers) {
                Ok(ended) => return ended,
                Err(failure) => failure,
            };
            self.back_off(asked, terms, attempts, retry).await?;
        }
    }

    /// A decode worker with rooms for the request, starting from `first` (the route stage's
    /// pick, on the first attempt): one with room now if the policy has one, else, once a room
    /// frees there, the full one where the fewest wait. No rooms when the window is off.
    async fn decode_with_room(
        &self,
        terms: &Terms,
        decode: &Chooser,
        mut first: Option<Lease>,
    ) -> Result<(Lease, Option<DecodeRooms>), ForwardError> {
        if !self.pd.window {
            let lease = match first {
                Some(lease) => lease,
                None => decode.next()?,
            };
            return Ok((lease, None));
        }
        let tier = terms.tier;
        let rooms = decode.request().weight;
        let mut skipped: Vec<u64> = Vec::new();
        let mut full: Vec<Lease> = Vec::new();
        loop {
            let picked = match first.take() {
                Some(lease) => Ok(lease),
                None => decode.next_except(&skipped),
            };
            let lease = match picked {
                Ok(lease) => lease,
                Err(_) if !full.is_empty() => break,
                Err(e) => return Err(e.into()),
            };
            let worker = lease.worker().clone();
            let size = worker.running_window();
            match worker.decode_window.enter(size, tier, rooms, None).await {
                Ok((held, _)) => return Ok((lease, Some(held))),
                Err(NoRoom::TooWide { .. }) => return Err(self.pd_shed(decode)),
                Err(NoRoom::Full) => {
                    skipped.push(worker.key);
                    full.push(lease);
                }
            }
        }
        // Every window is full: wait where the fewest wait, so waiters spread over the workers
        // (the policy's own order would send them all to the one it tries first).
        let Some(lease) = full
            .into_iter()
            .min_by_key(|l| l.worker().decode_window.counts().1)
        else {
            return Err(self.pd_shed(decode));
        };
        if self.pd.admission_wait.is_zero() {
            return Err(self.pd_shed(decode));
        }
        let worker = lease.worker().clone();
        let until = (Instant::now() + self.pd.admission_wait).min(terms.deadline);
        let size = worker.running_window();
        match worker
            .decode_window
            .enter(size, tier, rooms, Some(until))
            .await
        {
            Ok((held, waited)) => {
                if waited {
                    self.metrics.pd_admission_waits.inc();
                }
                Ok((lease, Some(held)))
            }
            Err(_) => Err(self.pd_shed(decode)),
        }
    }

    fn pd_shed(&self, decode: &Chooser) -> ForwardError {
        self.metrics.pd_admission_sheds.inc();
        decode.shed().into()
    }

    /// Both legs at once; the decode leg's answer once the prefill leg ended well.
    async fn pair(&self, pair: Pair<'_>, prefill: Lease, decode: Lease) -> Paired {
        let decode_key = decode.worker().key;
        let decoding = self.attempt(pair.decode.clone(), decode);
        tokio::pin!(decoding);
        let prefilling = self.prefill_leg(&pair.prefill, prefill);
        tokio::pin!(prefilling);
        let mut decoded: Option<Answer> = None;
        let mut prefilled = false;
        loop {
            tokio::select! {
                tried = &mut decoding, if decoded.is_none() => match tried {
                    Tried::Answered(answer) if answer.response.status().is_success() && !prefilled => {
                        decoded = Some(answer);
                    }
                    Tried::Answered(answer) => return Paired::Answered(answer),
                    Tried::Final(error) => return Paired::Final(error),
                    Tried::Retry(_, failure) => return Paired::RetryDecode(decode_key, failure),
                },
                (end, lease) = &mut prefilling, if !prefilled => match end {
                    LegEnd::Done(_) => {
                        prefilled = true;
                        if let Some(answer) = decoded.take() {
                            return Paired::Answered(answer);
                        }
                    }
                    end => return self.prefill_ended(&pair.prefill, lease, end),
                },
            }
        }
    }

    /// vLLM's exchange: the prefill leg first (one token, `do_remote_decode`), then the decode
    /// leg with the `kv_transfer_params` the prefill answered, naming where the KV waits.
    async fn pair_vllm(&self, pair: Pair<'_>, prefill: Lease, decode: Lease) -> Paired {
        let decode_key = decode.worker().key;
        let (end, lease) = self.prefill_leg(&pair.prefill, prefill).await;
        let LegEnd::Done(answered) = end else {
            return self.prefill_ended(&pair.prefill, lease, end);
        };
        let handed = serde_json::from_slice::<serde_json::Value>(&answered)
            .ok()
            .map(|mut v| v["kv_transfer_params"].take())
            .filter(serde_json::Value::is_object);
        let original = pair.decode.job.body;
        let Some(body) =
            handed.and_then(|kv| with_fields(original, [("kv_transfer_params", Some(kv))]))
        else {
            // A prefill answer without its KV's whereabouts: this worker does not speak the
            // exchange.
            return Paired::Final(ForwardError::UpstreamFailed {
                worker: lease.worker().id.clone(),
            });
        };
        drop(lease);
        let job = Job {
            parts: pair.decode.job.parts,
            body: &body,
            chooser: pair.decode.job.chooser,
        };
        let at = Attempt {
            job: &job,
            ..pair.decode.clone()
        };
        match self.attempt(at, decode).await {
            Tried::Answered(answer) => Paired::Answered(answer),
            Tried::Final(error) => Paired::Final(error),
            Tried::Retry(_, failure) => Paired::RetryDecode(decode_key, failure),
        }
    }

    /// A prefill leg that did not end well: its refusal is the client's answer; a failure or a
    /// silence goes to a new pair when the retry rules allow.
    fn prefill_ended(&self, at: &Attempt<'_>, lease: Lease, end: LegEnd) -> Paired {
        let failure = match end {
            LegEnd::Refused(response, sent_at) => {
                return Paired::Answered(Answer {
                    response: *response,
                    lease,
                    sent_at,
                    ahead: Ahead::default(),
                    terms: *at.terms,
                })
            }
            LegEnd::Failed(failure) => failure,
            LegEnd::Done(_) | LegEnd::Silent => AttemptFailure::Unresponsive,
        };
        let failed = Failed {
            worker: lease.worker().key,
            kind: failure,
            left: ForwardError::UpstreamFailed {
                worker: lease.worker().id.clone(),
            },
        };
        match self.judge(failed, at) {
            Ok((worker, failure)) => Paired::RetryPrefill(worker, failure),
            Err(error) => Paired::Final(error),
        }
    }

    /// The prefill leg: sent, its answer read to the end (its KV is across then). Silent past
    /// its bound, or past the deadline, it ends as silent.
    async fn prefill_leg(&self, at: &Attempt<'_>, mut lease: Lease) -> (LegEnd, Lease) {
        let end = self.run_prefill_leg(at, &mut lease).await;
        (end, lease)
    }

    async fn run_prefill_leg(&self, at: &Attempt<'_>, lease: &mut Lease) -> LegEnd {
        let worker = lease.worker().clone();
        lease.for_request(at.request_id);
        lease.prefilling(at.job.chooser.request().prompt_tokens);
        let allowance = prefill_allowance(
            worker.traffic.pending_prefill_tokens(),
            worker.latency.prefill_rate().unwrap_or(0.0),
        );
        let sent_at = Instant::now();
        let bound = leg_silence_bound(self.pd.wedge, allowance)
            .map_or(at.terms.deadline, |b| (sent_at + b).min(at.terms.deadline));
        let request = build_request(at, lease);
        let leg = async {
            let response: UpstreamResponse = self
                .upstream
                .send(&worker.endpoint, request)
                .await
                .map_err(|e| transport_failure(&worker, &e).0)?;
            worker.signals.contact(Instant::now());
            let status = response.status();
            if status.is_client_error() && status.as_u16() != 429 {
                return Ok(Err(response));
            }
            if !status.is_success() {
                return Err(AttemptFailure::ServerError);
            }
            let body = http_body_util::BodyExt::collect(response.into_body())
                .await
                .map_err(|_| AttemptFailure::Dropped)?;
            Ok(Ok(body.to_bytes()))
        };
        match tokio::time::timeout_at(bound, leg).await {
            Ok(Ok(Err(refused))) => {
                lease.answered();
                lease.settle(Outcome::Success);
                LegEnd::Refused(Box::new(refused), sent_at)
            }
            Ok(Ok(Ok(body))) => {
                lease.first_byte_after(sent_at.elapsed());
                lease.settle(Outcome::Success);
                LegEnd::Done(body)
            }
            Ok(Err(failure)) => {
                lease.settle(Outcome::Failure);
                self.count_upstream_error(lease, "prefill");
                LegEnd::Failed(failure)
            }
            Err(_) => {
                lease.settle(Outcome::Failure);
                self.count_upstream_error(lease, "prefill_silent");
                LegEnd::Silent
            }
        }
    }
}

/// The two legs' attempts.
struct Pair<'a> {
    prefill: Attempt<'a>,
    decode: Attempt<'a>,
}

/// How a pair ended (the answer inline, as in `Tried`).
#[allow(clippy::large_enum_variant)]
enum Paired {
    Answered(Answer),
    Final(ForwardError),
    RetryPrefill(u64, AttemptFailure),
    RetryDecode(u64, AttemptFailure),
}

impl Paired {
    /// The request's end (an answer holding the decode worker's `rooms` until its body ends,
    /// or an error), or the failure to retry after, its worker added to those tried.
    fn settle(
        self,
        rooms: Option<DecodeRooms>,
        choosers: &mut Choosers,
    ) -> Result<Result<Answer, ForwardError>, AttemptFailure> {
        match self {
            Paired::Answered(mut answer) => {
                if let Some(rooms) = rooms {
                    answer.lease.hold_rooms(rooms);
                }
                Ok(Ok(answer))
            }
            Paired::Final(error) => Ok(Err(error)),
            Paired::RetryPrefill(key, failure) => {
                choosers.prefill.tried(key);
                Err(failure)
            }
            Paired::RetryDecode(key, failure) => {
                choosers.decode.tried(key);
                Err(failure)
            }
        }
    }
}

/// How a disaggregated model's engines hand the KV over, chosen by its prefill worker's flavor
/// (`owned_by` of its models).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exchange {
    /// Both legs at once, meeting in a bootstrap room.
    Sglang,
    /// The prefill leg first, then the decode leg with what it answered.
    Vllm,
}

impl Exchange {
    fn of(prefill: &Lease) -> Self {
        match prefill.worker().info() {
            Some(info) if info.flavor == "vllm" => Exchange::Vllm,
            _ => Exchange::Sglang,
        }
    }

    /// The body the prefill leg carries (and the decode leg too, with SGLang).
    fn prefill_body(self, body: &Bytes, prefill: &Lease) -> Result<Bytes, ForwardError> {
        let fields: Vec<(&str, Option<serde_json::Value>)> = match self {
            Exchange::Sglang => {
                let worker = prefill.worker();
                let port = match worker.role() {
                    Role::Prefill { bootstrap_port } => bootstrap_port,
                    _ => None,
                };
                let host = worker.endpoint.authority.host().trim_matches(['[', ']']);
                // SGLang's rooms are non-negative 63-bit integers; SMG's gRPC protocol carries
                // them as an `int32`.
                let room = if worker.endpoint.grpc() {
                    u64::from(rand::random::<u32>() >> 1)
                } else {
                    rand::random::<u64>() >> 1
                };
                vec![
                    ("bootstrap_host", Some(host.into())),
                    ("bootstrap_port", Some(port.into())),
                    ("bootstrap_room", Some(room.into())),
                ]
            }
            // As vLLM's disaggregated proxy asks a prefill: one token, whole, its KV kept for
            // a decode engine to pull.
            Exchange::Vllm => vec![
                ("max_tokens", Some(1.into())),
                ("max_completion_tokens", Some(1.into())),
                ("stream", Some(false.into())),
                ("stream_options", None),
                (
                    "kv_transfer_params",
                    Some(
                        serde_json::json!({"do_remote_decode": true, "do_remote_prefill": false,
                        "remote_engine_id": null, "remote_block_ids": null,
                        "remote_host": null, "remote_port": null}),
                    ),
                ),
            ],
        };
        with_fields(body, fields).ok_or(RequestError::BodyUnreadable.into())
    }
}

/// `body` (a JSON object) with `fields` set (`None`: removed).
fn with_fields<'a>(
    body: &Bytes,
    fields: impl IntoIterator<Item = (&'a str, Option<serde_json::Value>)>,
) -> Option<Bytes> {
    let mut object: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(body).ok()?;
    for (name, value) in fields {
        match value {
            Some(value) => object.insert(name.into(), value),
            None => object.remove(name),
        };
    }
    serde_json::to_vec(&object).ok().map(Bytes::from)
}
