//! One benchmark request, sent when due and read to the end, as a client would: either one that
//! never retries, or one that retries like the OpenAI Python SDK.
//!
//! The SDK's rules (see the engines reference): 2 retries; connection errors, timeouts, 408,
//! 409, 429 and every status >= 500 are retried unless `x-should-retry: false` says otherwise;
//! the wait is `retry-after-ms`, else `retry-after` in seconds, when in (0, 60] s, else
//! `min(0.5 x 2^n, 8) x (1 - 0.25 x rand)` s; nothing is retried once the answer has started.

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
}

impl Job {
    /// The request body for `api`: a streaming completion with usage, exactly `output_tokens`
    /// long (`ignore_eos`), its prompt the parts' text one after the other; or a streaming chat
    /// answered at the model's length, a message per part.
    pub fn body(&self, api: Api, model: &str) -> String {
        let user = format!("tenant-{}", self.tenant);
        match api {
            Api::Completions => serde_json::json!({
                "model": model,
                "prompt": self.prompt.text(),
                "max_tokens": self.output_tokens,
                "ignore_eos": true,
                "stream": true,
                "stream_options": {"include_usage": true},
                "priority": self.priority,
                "user": user,
            }),
            Api::Chat { max_tokens } => serde_json::json!({
                "model": model,
                "messages": self.prompt.messages(),
                "max_tokens": max_tokens,
                "stream": true,
                "stream_options": {"include_usage": true},
                "priority": self.priority,
                "user": user,
            }),
        }
        .to_string()
    }
}

/// What one attempt got.
enum Attempt {
    /// The answer started (200): read to the end.
    Answered {
        ttft: Option<Instant>,
        end: Instant,
        tokens: u32,
        completed: bool,
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
    kind: ClientKind,
    start: Instant,
) -> Outcome {
    let due = start + job.due;
    tokio::time::sleep_until(due).await;
    let sent_late = due.elapsed();
    let body = Bytes::from(job.body(api, model));
    let mut attempts = 0u32;
    let mut rejected_after = None;
    loop {
        attempts += 1;
        match attempt(http, url, body.clone(), &job.headers).await {
            Attempt::Answered {
                ttft,
                end,
                tokens,
                completed,
            } => {
                return Outcome {
                    due: job.due,
                    tier: job.tier,
                    status: 200,
                    code: None,
                    completed,
                    ttft: ttft.map(|t| t - due),
                    e2e: end - due,
                    output_tokens: tokens,
                    attempts,
                    rejected_after,
                    sent_late,
                }
            }
            Attempt::Refused {
                status,
                code,
                at,
                headers,
            } => {
                rejected_after.get_or_insert(at - due);
                let wait = match kind {
                    ClientKind::Sdk if attempts <= SDK_RETRIES => {
                        sdk_wait(status, &headers, attempts)
                    }
                    _ => None,
                };
                let Some(wait) = wait else {
                    return Outcome {
                        due: job.due,
                        tier: job.tier,
                        status,
                        code,
                        completed: false,
                        ttft: None,
                        e2e: at - due,
                        output_tokens: 0,
                        attempts,
                        rejected_after,
                        sent_late,
                    };
                };
                tokio::time::sleep(wait).await;
            }
        }
    }
}

async fn attempt(
    http: &HttpClient,
    url: &str,
    body: Bytes,
    headers: &[(String, String)],
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
    let response = match http.request(request).await {
        Ok(r) => r,
        Err(_) => return refused(0, None, HeaderMap::new()),
    };
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    if status != 200 {
        let body = response.into_body().collect().await.map(|b| b.to_bytes());
        let code = headers
            .get("x-sluice-error-code")
            .and_then(|v| v.to_str().ok())
            .map(String::from)
            .or_else(|| body.ok().and_then(|b| error_code(&b)));
        return refused(status, code, headers);
    }
    read_stream(response.into_body()).await
}

/// Reads an SSE answer: the first token's arrival, tokens (from the usage chunk, else counted),
/// and whether it ended with `[DONE]`.
async fn read_stream(mut body: hyper::body::Incoming) -> Attempt {
    let mut ttft = None;
    let mut counted = 0u32;
    let mut usage = None;
    let mut done = false;
    let mut pending = String::new();
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            break;
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
                break;
            }
            if let Some(n) = json["usage"]["completion_tokens"].as_u64() {
                usage = Some(n as u32);
            }
            // A completion's text, or a chat delta's content or thinking (a reasoning model's
            // first token is its first thought).
            let has_text = json["choices"].as_array().is_some_and(|c| {
                c.iter().any(|c| {
                    c["text"].as_str().is_some()
                        || c["delta"]["content"]
                            .as_str()
                            .is_some_and(|t| !t.is_empty())
                        || c["delta"]["reasoning_content"].as_str().is_some()
                })
            });
            if has_text {
                counted += 1;
                ttft.get_or_insert_with(Instant::now);
            }
        }
    }
    Attempt::Answered {
        ttft,
        end: Instant::now(),
        tokens: usage.unwrap_or(counted),
        completed: done,
    }
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
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn the_sdk_honors_what_the_server_asks_within_a_minute() {
        let h = headers(&[("retry-after", "10")]);
        assert_eq!(sdk_wait(503, &h, 1), Some(Duration::from_secs(10)));
        let ms = headers(&[("retry-after-ms", "250"), ("retry-after", "10")]);
        assert_eq!(
            sdk_wait(529, &ms, 1),
            Some(Duration::from_millis(250)),
            "ms first"
        );
        let long = headers(&[("retry-after", "120")]);
        let own = sdk_wait(503, &long, 1).unwrap();
        assert!(
            own <= Duration::from_millis(500) && own >= Duration::from_millis(375),
            "{own:?}"
        );
    }

    #[test]
    fn the_sdk_backs_off_on_its_own_and_retries_only_what_it_should() {
        let none = HeaderMap::new();
        let second = sdk_wait(500, &none, 2).unwrap();
        assert!(second <= Duration::from_secs(1) && second >= Duration::from_millis(750));
        assert_eq!(sdk_wait(400, &none, 1), None);
        assert_eq!(sdk_wait(404, &none, 1), None);
        assert!(
            sdk_wait(0, &none, 1).is_some(),
            "connection errors are retried"
        );
        assert!(sdk_wait(429, &none, 1).is_some());
        assert_eq!(
            sdk_wait(503, &headers(&[("x-should-retry", "false")]), 1),
            None
        );
        assert!(sdk_wait(400, &headers(&[("x-should-retry", "true")]), 1).is_some());
    }

    #[test]
    fn bodies_carry_the_shape() {
        let prompt = crate::prompts::Prompt {
            parts: vec![crate::prompts::Part {
                role: crate::prompts::Role::User,
                seed: 9,
                tokens: 256,
            }],
            conversation: 1,
        };
        let job = Job {
            due: Duration::ZERO,
            tier: 0,
            prompt_tokens: 256,
            output_tokens: 32,
            prompt: prompt.clone(),
            tenant: 3,
            priority: 1,
            headers: Vec::new(),
        };
        let body: serde_json::Value =
            serde_json::from_str(&job.body(Api::Completions, "m")).unwrap();
        assert_eq!(body["prompt"].as_str().unwrap().len(), 1024);
        assert_eq!(body["prompt"].as_str().unwrap(), prompt.text());
        assert_eq!(body["max_tokens"], 32);
        assert_eq!(body["stream"], true);
        assert_eq!(body["stream_options"]["include_usage"], true);
        assert_eq!(body["user"], "tenant-3");
        let chat: serde_json::Value =
            serde_json::from_str(&job.body(Api::Chat { max_tokens: 64 }, "m")).unwrap();
        assert_eq!(
            chat["messages"],
            serde_json::json!([{"role": "user", "content": prompt.text()}])
        );
        assert_eq!(chat["max_tokens"], 64);
    }
}
