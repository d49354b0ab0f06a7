//! One benchmark request, sent when due and read to the end, as a client would: either one that
//! never retries, or one that retries like the OpenAI Python SDK; patient, or giving up as
//! clients do (`Patience`).
//!
//! The SDK's rules (see the engines reference): 2 retries; connection errors, timeouts, 408,
//! 409, 429 and every status >= 500 are retried unless `x-should-retry: false` says otherwise;
//! the wait is `retry-after-ms`, else `retry-after` in seconds, when in (0, 60] s, else
//! `min(0.5 x 2^n, 8) x (1 - 0.25 x rand)` s; nothing is retried once the answer has started.
//! Its timeout is httpx's read timeout (openai-python's `timeout`, 600 s by default): the
//! longest wait for the answer's head, then for each piece of its body. A timeout before the
//! head is retried like a connection error; one inside a stream is raised to the caller, who
//! has the head already (`Stream` is returned once the head is in), so it is not retried.

use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use serde::Serialize;
use tokio::time::Instant;

use crate::goodput::Outcome;

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// How a client reacts to a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ClientKind {
    /// Never retries.
    None,
    /// Retries as the OpenAI Python SDK does.
    Sdk,
}

/// How long a client waits, and when it leaves of its own accord. The default waits forever
/// and reads every answer to its end.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Patience {
    /// The SDK's timeout (httpx's read timeout): the longest wait for the answer's head, then
    /// for each piece of its body. A retrying client retries it while no head has come.
    pub idle: Option<Duration>,
    /// The longest the request may take from when it is sent, retries included: the caller's
    /// own timeout around the call.
    pub total: Option<Duration>,
    /// Sent as `X-Request-Deadline-Ms` (the budget from arrival); the client gives up then too.
    pub deadline: Option<Duration>,
    /// Leaves a stream once this many tokens came (a reader who had enough, a stop button).
    pub leave_after: Option<u32>,
}

impl Patience {
    /// How long after sending the client gives up on the whole request, if ever.
    fn gives_up_after(&self) -> Option<Duration> {
        self.total.into_iter().chain(self.deadline).min()
    }
}

/// Everything about how one client behaves, the same for each of its requests.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Behaviour {
    pub retries: ClientKind,
    pub patience: Patience,
    /// Asks for a stream (SSE) or a whole answer.
    pub stream: bool,
}

impl Default for Behaviour {
    fn default() -> Self {
        Self {
            retries: ClientKind::None,
            patience: Patience::default(),
            stream: true,
        }
    }
}

/// What an outcome's `code` says when the client, not the server, ended the request: no byte
/// for the idle timeout, the whole request over its time, or a reader who left on purpose.
pub const IDLE_TIMEOUT: &str = "idle_timeout";
pub const CLIENT_TIMEOUT: &str = "client_timeout";
pub const LEFT: &str = "left";

/// The SDK's retries per request.
const SDK_RETRIES: u32 = 2;
/// The longest server-requested wait the SDK honors.
const SDK_MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// What a run's requests are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Api {
    /// Completions of exactly the job's output length (`ignore_eos`): the engine's work is the
    /// workload's, whatever the gateway does.
    #[default]
    Completions,
    /// Chat requests answered at the model's own length (a reasoning model thinks first), up to
    /// `max_tokens`: what a gateway that shortens requests can shorten.
    Chat { max_tokens: u32 },
}

/// One request of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// When it is due, from the start of the run.
    pub due: Duration,
    pub tier: usize,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    /// What the prompt says (and shares with other requests).
    pub prompt: crate::prompts::Prompt,
    pub tenant: u32,
    /// Sent as the body's `priority` (lower is served first, as in vLLM).
    pub priority: i64,
    /// Request headers saying who asks and how urgently: the tenant's key, the tier (see
    /// `run::identity_headers`).
    pub headers: Vec<(String, String)>,
    /// The model it asks for when not the run's (a LoRA adapter's name).
    pub model: Option<std::sync::Arc<str>>,
}

impl Job {
    /// The request body for `api`: a streaming completion with usage, exactly `output_tokens`
    /// long (`ignore_eos`), its prompt the parts' text one after the other; or a streaming chat
    /// answered at the model's length, a message per part; or the same as a whole answer.
    pub fn body(&self, api: Api, model: &str, stream: bool) -> String {
        let user = format!("tenant-{}", self.tenant);
        let mut body = match api {
            Api::Completions => serde_json::json!({
                "model": model,
                "prompt": self.prompt.text(),
                "max_tokens": self.output_tokens,
                "ignore_eos": true,
                "stream": stream,
                "priority": self.priority,
                "user": user,
            }),
            Api::Chat { max_tokens } => serde_json::json!({
                "model": model,
                "messages": self.prompt.messages(),
                "max_tokens": max_tokens,
                "stream": stream,
                "priority": self.priority,
                "user": user,
            }),
        };
        if stream {
            body["stream_options"] = serde_json::json!({"include_usage": true});
        }
        body.to_string()
    }
}

/// How an answer that began ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// `[DONE]`, or a whole body read.
    Done,
    /// The connection ended, or an error event came, before the end.
    Cut,
    /// No byte for the idle timeout inside the body.
    Idle,
    /// The client left once it had enough.
    Left,
}

/// What one attempt got.
enum Attempt {
    /// The answer started (200): read to its end, or until the client stopped reading.
    Answered {
        ttft: Option<Instant>,
        end: Instant,
        tokens: u32,
        ending: Ending,
    },
    /// Refused before any answer: status (0 without one), code, and what the server asked.
    Refused {
        status: u16,
        code: Option<String>,
        at: Instant,
        headers: HeaderMap,
    },
}

/// Sends `job` (due at `start + job.due`) and returns what the client saw.
pub async fn run(
    http: &HttpClient,
    url: &str,
    (api, model): (Api, &str),
    job: &Job,
    behaviour: Behaviour,
    start: Instant,
) -> Outcome {
    let due = start + job.due;
    tokio::time::sleep_until(due).await;
    let sent = Instant::now();
    let base = Outcome {
        due: job.due,
        tier: job.tier,
        status: 0,
        code: None,
        completed: false,
        ttft: None,
        e2e: Duration::ZERO,
        output_tokens: 0,
        attempts: 1,
        rejected_after: None,
        sent_late: due.elapsed(),
    };
    let sending = Sending {
        http,
        url,
        body: Bytes::from(job.body(api, model, behaviour.stream)),
        headers: request_headers(job, behaviour),
        behaviour,
        due,
    };
    let mut tally = Tally::default();
    let tries = sending.until_answered(&mut tally, base.clone());
    let finished = match behaviour.patience.gives_up_after() {
        Some(limit) => tokio::time::timeout_at(sent + limit, tries).await.ok(),
        None => Some(tries.await),
    };
    match finished {
        Some(outcome) => Outcome {
            attempts: tally.attempts,
            ..outcome
        },
        None => Outcome {
            attempts: tally.attempts,
            rejected_after: tally.rejected_after,
            code: Some(CLIENT_TIMEOUT.into()),
            e2e: due.elapsed(),
            ..base
        },
    }
}

/// The job's headers, and its deadline when the client sends one.
fn request_headers(job: &Job, behaviour: Behaviour) -> Vec<(String, String)> {
    let mut headers = job.headers.clone();
    if let Some(deadline) = behaviour.patience.deadline {
        headers.push((
            "x-request-deadline-ms".into(),
            deadline.as_millis().to_string(),
        ));
    }
    headers
}

/// What the client counted across its tries: read after them, even when it gave up mid-try.
#[derive(Default)]
struct Tally {
    attempts: u32,
    rejected_after: Option<Duration>,
}

/// One request as the client sends it, on each of its tries.
struct Sending<'a> {
    http: &'a HttpClient,
    url: &'a str,
    body: Bytes,
    headers: Vec<(String, String)>,
    behaviour: Behaviour,
    due: Instant,
}

impl Sending<'_> {
    /// Tries until answered, or refused with no retry left (an SDK client retries what the
    /// OpenAI SDK retries, after the wait it would take).
    async fn until_answered(&self, tally: &mut Tally, base: Outcome) -> Outcome {
        let due = self.due;
        loop {
            tally.attempts += 1;
            let attempt = attempt(
                self.http,
                self.url,
                self.body.clone(),
                &self.headers,
                self.behaviour,
            );
            match attempt.await {
                Attempt::Answered {
                    ttft,
                    end,
                    tokens,
                    ending,
                } => {
                    return Outcome {
                        status: 200,
                        code: ending.code(),
                        completed: matches!(ending, Ending::Done | Ending::Left),
                        ttft: ttft.map(|t| t - due),
                        e2e: end - due,
                        output_tokens: tokens,
                        rejected_after: tally.rejected_after,
                        ..base
                    };
                }
                Attempt::Refused {
                    status,
                    code,
                    at,
                    headers,
                } => {
                    let rejected_after = *tally.rejected_after.get_or_insert(at - due);
                    let wait = match self.behaviour.retries {
                        ClientKind::Sdk if tally.attempts <= SDK_RETRIES => {
                            sdk_wait(status, &headers, tally.attempts)
                        }
                        _ => None,
                    };
                    let Some(wait) = wait else {
                        return Outcome {
                            status,
                            code,
                            e2e: at - due,
                            rejected_after: Some(rejected_after),
                            ..base
                        };
                    };
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }
}

impl Ending {
    /// The code the outcome gives an answer that ended so: none for a whole or cut one.
    fn code(self) -> Option<String> {
        match self {
            Ending::Done | Ending::Cut => None,
            Ending::Idle => Some(IDLE_TIMEOUT.to_string()),
            Ending::Left => Some(LEFT.to_string()),
        }
    }
}

async fn attempt(
    http: &HttpClient,
    url: &str,
    body: Bytes,
    headers: &[(String, String)],
    behaviour: Behaviour,
) -> Attempt {
    let refused = |status: u16, code: Option<String>, headers: HeaderMap| Attempt::Refused {
        status,
        code,
        at: Instant::now(),
        headers,
    };
    let mut request = Request::post(url).header(CONTENT_TYPE, "application/json");
    for (name, value) in headers {
        request = request.header(name.as_str(), value.as_str());
    }
    let Ok(request) = request.body(Full::new(body)) else {
        return refused(0, Some("invalid_request".into()), HeaderMap::new());
    };
    let idle = behaviour.patience.idle;
    let response = match within(idle, http.request(request)).await {
        Some(Ok(r)) => r,
        Some(Err(_)) => return refused(0, None, HeaderMap::new()),
        None => return refused(0, Some(IDLE_TIMEOUT.into()), HeaderMap::new()),
    };
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    if status != 200 {
        let body = within(idle, response.into_body().collect())
            .await
            .and_then(Result::ok)
            .map(|b| b.to_bytes());
        let code = headers
            .get("x-sluice-error-code")
            .and_then(|v| v.to_str().ok())
            .map(String::from)
            .or_else(|| body.and_then(|b| error_code(&b)));
        return refused(status, code, headers);
    }
    let head = Instant::now();
    if behaviour.stream {
        read_stream(response.into_body(), behaviour.patience).await
    } else {
        read_whole(response.into_body(), idle, head).await
    }
}

/// `future`'s output, or `None` when `limit` passes first (no limit: wait for it).
async fn within<F: std::future::Future>(limit: Option<Duration>, future: F) -> Option<F::Output> {
    match limit {
        Some(limit) => tokio::time::timeout(limit, future).await.ok(),
        None => Some(future.await),
    }
}

/// Reads a whole (non-streaming) answer: its tokens from the usage; its head is its first byte.
async fn read_whole(
    mut body: hyper::body::Incoming,
    idle: Option<Duration>,
    head: Instant,
) -> Attempt {
    let mut bytes = Vec::new();
    let ending = loop {
        match within(idle, body.frame()).await {
            None => break Ending::Idle,
            Some(None) => break Ending::Done,
            Some(Some(Err(_))) => break Ending::Cut,
            Some(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    bytes.extend_from_slice(&data);
                }
            }
        }
    };
    let json = serde_json::from_slice::<serde_json::Value>(&bytes).ok();
    let tokens = json
        .as_ref()
        .and_then(|j| j["usage"]["completion_tokens"].as_u64())
        .unwrap_or(0) as u32;
    let ending = match (ending, json.is_some()) {
        (Ending::Done, false) => Ending::Cut,
        (ending, _) => ending,
    };
    Attempt::Answered {
        ttft: Some(head),
        end: Instant::now(),
        tokens,
        ending,
    }
}

/// Reads an SSE answer: the first token's arrival, tokens (from the usage chunk, else counted),
/// and how it ended: `[DONE]`, cut, silent past the idle timeout, or left once the client had
/// the tokens it wanted.
async fn read_stream(mut body: hyper::body::Incoming, patience: Patience) -> Attempt {
    let mut ttft = None;
    let mut counted = 0u32;
    let mut usage = None;
    let mut done = false;
    let mut pending = String::new();
    let ending = 'read: loop {
        let frame = match within(patience.idle, body.frame()).await {
            None => break Ending::Idle,
            Some(None) => break if done { Ending::Done } else { Ending::Cut },
            Some(Some(Err(_))) => break Ending::Cut,
            Some(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        pending.push_str(&String::from_utf8_lossy(&data));
        while let Some(end) = pending.find("\n\n") {
            let event: String = pending.drain(..end + 2).collect();
            let Some(payload) = event.trim().strip_prefix("data: ") else {
                continue;
            };
            if payload == "[DONE]" {
                done = true;
                continue;
            }
            let Ok(json) = serde_json::from_str::<serde_json::Value>(payload) else {
                continue;
            };
            if json.get("error").is_some() {
                break 'read Ending::Cut;
            }
            if let Some(n) = json["usage"]["completion_tokens"].as_u64() {
                usage = Some(n as u32);
            }
            if has_text(&json) {
                counted += 1;
                ttft.get_or_insert_with(Instant::now);
                if patience.leave_after.is_some_and(|n| counted >= n) {
                    // Dropping the body closes the connection: the client is gone.
                    break 'read Ending::Left;
                }
            }
        }
    };
    Attempt::Answered {
        ttft,
        end: Instant::now(),
        tokens: usage.unwrap_or(counted),
        ending,
    }
}

/// A completion's text, or a chat delta's content or thinking (a reasoning model's first token
/// is its first thought).
fn has_text(json: &serde_json::Value) -> bool {
    json["choices"].as_array().is_some_and(|c| {
        c.iter().any(|c| {
            c["text"].as_str().is_some()
                || c["delta"]["content"]
                    .as_str()
                    .is_some_and(|t| !t.is_empty())
                || c["delta"]["reasoning_content"].as_str().is_some()
        })
    })
}

fn error_code(body: &[u8]) -> Option<String> {
    let json: serde_json::Value = serde_json::from_slice(body).ok()?;
    match &json["error"]["code"] {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(format!("status_{n}")),
        _ => None,
    }
}

/// The SDK's decision after its `attempt`-th try was refused: how long to wait, or no retry.
pub fn sdk_wait(status: u16, headers: &HeaderMap, attempt: u32) -> Option<Duration> {
    let should = match headers.get("x-should-retry").and_then(|v| v.to_str().ok()) {
        Some("true") => true,
        Some("false") => false,
        _ => status == 0 || matches!(status, 408 | 409 | 429) || status >= 500,
    };
    if !should {
        return None;
    }
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let asked = header("retry-after-ms")
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|ms| ms / 1000.0)
        .or_else(|| header("retry-after").and_then(|v| v.trim().parse::<f64>().ok()));
    if let Some(secs) = asked.filter(|s| *s > 0.0 && *s <= SDK_MAX_RETRY_AFTER.as_secs_f64()) {
        return Duration::try_from_secs_f64(secs).ok();
    }
    let base = (0.5 * 2f64.powi(attempt.saturating_sub(1) as i32)).min(8.0);
    let jitter = 1.0 - 0.25 * rand::random::<f64>();
    Duration::try_from_secs_f64(base * jitter).ok()
}

#[cfg(test)]
mod tests;
