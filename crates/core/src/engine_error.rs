//! What an engine's error answer means for the worker that gave it: its failure, the client's
//! mistake, or backpressure.
//!
//! Engines end a stream that failed after it started with an error event and then `[DONE]`
//! (vLLM's serving_chat / serving_completion: `{"error": {"message", "type", "param", "code"}}`
//! with the HTTP status as the integer code; SGLang: the same with its flat error object,
//! `"object": "error"`, inside; older vLLM sent the flat object alone). A gateway that reads only
//! the `[DONE]` takes such a stream for a success. SGLang's `--max-queued-requests` refuses an
//! arrival with 503 "The request queue is full." — as a status with a body, or as a stream's first
//! event: backpressure like a 429, which must never open a circuit. The fixtures under
//! `fixtures/engines/` hold each shape, with the source file it was written from.

use serde_json::Value;

/// SGLang's words for a full queue (`_abort_on_queued_limit`).
const QUEUE_FULL: &str = "The request queue is full";

/// Whose the failure is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The engine failed: a failure of the worker (breaker, failure rate).
    Engine,
    /// The engine refused the request as the client's mistake (a bad grammar, a tool call it
    /// could not parse): the request failed, the worker did not.
    Client,
    /// The engine is full and said so: at capacity, never a failure.
    AtCapacity,
}

/// An error event's class and the status it names, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorEvent {
    pub class: ErrorClass,
    pub status: Option<u16>,
}

impl ErrorEvent {
    /// The status an engine's failure names, as a retry rule judges it (500 when it names
    /// none); `None` for the client's mistake and for backpressure, which are not failures.
    pub fn failure_status(&self) -> Option<u16> {
        (self.class == ErrorClass::Engine).then(|| self.status.unwrap_or(500))
    }
}

/// Whether an event's data is an engine's error event, and of which class. Cheap for every other
/// event (it runs on each one relayed): only data whose first key is `"error"`, or `"object"`
/// with the value `"error"`, as engines write them, is parsed.
pub fn error_event(data: &[u8]) -> Option<ErrorEvent> {
    if !first_key_says_error(data) {
        return None;
    }
    let value: Value = serde_json::from_slice(data).ok()?;
    let error = match value.get("error") {
        Some(inner @ (Value::Object(_) | Value::String(_))) => inner,
        _ if value.get("object").and_then(Value::as_str) == Some("error") => &value,
        _ => return None,
    };
    let status = status_of(error);
    let message = message_of(error);
    let kind = error.get("type").and_then(Value::as_str).unwrap_or("");
    Some(ErrorEvent {
        class: classify(status, kind, message),
        status,
    })
}

/// Whether an error status's body is the engine saying it is full: 429 and 529 always; SGLang's
/// 503 when its message says the queue is full (in its flat error object, in a nested one, or as
/// FastAPI's `detail`).
pub fn at_capacity(status: u16, body: &[u8]) -> bool {
    if matches!(status, 429 | 529) {
        return true;
    }
    if status != 503 {
        return false;
    }
    let Ok(value) = serde_json::from_slice::<Value>(body) else {
        return false;
    };
    let inner = value.get("error").unwrap_or(&value);
    let message = inner
        .get("message")
        .or_else(|| value.get("detail"))
        .and_then(Value::as_str)
        .unwrap_or("");
    message.contains(QUEUE_FULL)
}

/// `{"error": ...` or `{"object": "error", ...`, whitespace allowed where JSON allows it.
fn first_key_says_error(data: &[u8]) -> bool {
    let Some(object) = trimmed(data).strip_prefix(b"{") else {
        return false;
    };
    let object = trimmed(object);
    if object.starts_with(b"\"error\"") {
        return true;
    }
    let Some(rest) = object.strip_prefix(b"\"object\"") else {
        return false;
    };
    trimmed(rest)
        .strip_prefix(b":")
        .is_some_and(|value| trimmed(value).starts_with(b"\"error\""))
}

fn trimmed(bytes: &[u8]) -> &[u8] {
    bytes.trim_ascii_start()
}

fn classify(status: Option<u16>, kind: &str, message: &str) -> ErrorClass {
    if message.contains(QUEUE_FULL) || matches!(status, Some(429 | 529)) {
        return ErrorClass::AtCapacity;
    }
    let client_status = status.is_some_and(|s| (400..500).contains(&s) && s != 408);
    let client_type = matches!(
        kind,
        "BadRequestError"
            | "NotFoundError"
            | "UnprocessableEntityError"
            | "invalid_request_error"
            | "not_found_error"
    );
    if client_status || (status.is_none() && client_type) {
        ErrorClass::Client
    } else {
        ErrorClass::Engine
    }
}

/// The integer `code` (vLLM, SGLang), or one written as digits.
fn status_of(error: &Value) -> Option<u16> {
    let code = error.get("code")?;
    code.as_u64()
        .or_else(|| code.as_str()?.parse().ok())
        .and_then(|c| u16::try_from(c).ok())
        .filter(|c| (100..600).contains(c))
}

fn message_of(error: &Value) -> &str {
    match error {
        Value::String(message) => message,
        _ => error.get("message").and_then(Value::as_str).unwrap_or(""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each event of a fixture under `fixtures/engines/`, as the stream carried it.
    fn events(path: &str) -> Vec<String> {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/engines/");
        let text = std::fs::read_to_string(format!("{root}{path}")).unwrap();
        let mut parser = crate::sse::SseParser::new();
        let mut out = Vec::new();
        parser
            .feed(text.as_bytes(), |e| {
                out.push(String::from_utf8_lossy(e.data).into_owned())
            })
            .unwrap();
        out
    }

    fn classes(path: &str) -> Vec<Option<ErrorClass>> {
        events(path)
            .iter()
            .map(|e| error_event(e.as_bytes()).map(|e| e.class))
            .collect()
    }

    #[test]
    fn a_failed_stream_ends_with_an_engine_error_then_done() {
        use ErrorClass::*;
        assert_eq!(
            classes("vllm/stream-error-midway.sse"),
            [None, None, Some(Engine), None]
        );
        assert_eq!(
            classes("sglang/stream-error-midway.sse"),
            [None, Some(Engine), None]
        );
        let vllm = error_event(events("vllm/stream-error-midway.sse")[2].as_bytes()).unwrap();
        assert_eq!(vllm.status, Some(500));
        let unnamed = error_event(br#"{"error":"the engine died"}"#).unwrap();
        assert_eq!(
            unnamed.failure_status(),
            Some(500),
            "no status named: a 500"
        );
        let client = error_event(events("vllm/stream-error-client.sse")[1].as_bytes()).unwrap();
        assert_eq!(client.failure_status(), None, "not the worker's failure");
    }

    #[test]
    fn the_clients_mistake_is_not_the_workers() {
        assert_eq!(
            classes("vllm/stream-error-client.sse"),
            [None, Some(ErrorClass::Client), None]
        );
        let flat_old = br#"{"object":"error","message":"bad grammar","type":"BadRequestError","param":null,"code":400}"#;
        assert_eq!(error_event(flat_old).unwrap().class, ErrorClass::Client);
        let typed_only = br#"{"error":{"message":"x","type":"invalid_request_error"}}"#;
        assert_eq!(error_event(typed_only).unwrap().class, ErrorClass::Client);
        let timeout = br#"{"error":{"message":"x","code":408}}"#;
        assert_eq!(error_event(timeout).unwrap().class, ErrorClass::Engine);
    }

    #[test]
    fn a_full_queue_is_backpressure_in_either_shape() {
        assert_eq!(
            classes("sglang/stream-queue-full.sse"),
            [Some(ErrorClass::AtCapacity), None]
        );
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/engines/");
        for body in ["sglang/queue-full.json", "sglang/queue-full-detail.json"] {
            let body = std::fs::read(format!("{root}{body}")).unwrap();
            assert!(at_capacity(503, &body));
            assert!(!at_capacity(500, &body), "only a 503 says it so");
        }
        assert!(!at_capacity(
            503,
            br#"{"object":"error","message":"engine dead","code":503}"#
        ));
        assert!(!at_capacity(503, b"not json"));
        assert!(at_capacity(429, b""));
    }

    #[test]
    fn ordinary_events_are_not_errors() {
        let chunk =
            br#"{"choices":[{"delta":{"content":"say \"error\" here"},"finish_reason":null}]}"#;
        assert_eq!(error_event(chunk), None, "escaped quotes in a token");
        let reason = br#"{"choices":[{"delta":{},"finish_reason":"error"}]}"#;
        assert_eq!(
            error_event(reason),
            None,
            "a finish reason is not an error event"
        );
        assert_eq!(error_event(b"[DONE]"), None);
        let later_key = br#"{"id":"x","error":{"message":"m","code":500}}"#;
        assert_eq!(
            error_event(later_key),
            None,
            "engines write the error key first"
        );
        let spaced = b" {  \"object\" :  \"error\", \"message\": \"m\", \"code\": 500}";
        assert_eq!(error_event(spaced).unwrap().class, ErrorClass::Engine);
        assert_eq!(error_event(br#"{"error": 3}"#), None);
    }
}
