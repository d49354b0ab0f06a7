//! The label sets of the gateway's metric families, and the values a label may take (each
//! preset to zero, so a series exists before its first event).

use prometheus_client::encoding::EncodeLabelSet;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub route: &'static str,
    pub status: u16,
    /// The gateway's error code, or `none` when a worker's answer was relayed.
    pub code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabel {
    pub route: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkerLabel {
    pub worker: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SelectionLabels {
    pub policy: &'static str,
    pub worker: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransitionLabels {
    pub worker: String,
    pub from: &'static str,
    pub to: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CancelLabels {
    pub route: &'static str,
    /// `waiting` (before the response started) or `streaming`.
    pub stage: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabel {
    /// `select` (every candidate full) or `dispatch` (the chosen one became full).
    pub stage: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `success` or `failure`.
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamErrorLabels {
    pub worker: String,
    /// One of `UPSTREAM_ERROR_KINDS`.
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReportIssueLabels {
    pub worker: String,
    /// One of `REPORT_ISSUES`.
    pub issue: &'static str,
}

/// How a load report came out less than whole: `fallback` (the worker's preferred endpoint
/// failed and the older one was asked), `dropped_field` (a field of the wrong type was left out,
/// the rest of the report kept).
pub const REPORT_ISSUES: [&str; 2] = ["fallback", "dropped_field"];

/// Why a request was retried.
pub const RETRY_REASONS: [&str; 6] = [
    "connect",
    "dropped",
    "at_capacity",
    "status",
    "unresponsive",
    "bad_answer",
];

/// The moves a circuit makes.
pub(super) const BREAKER_TRANSITIONS: [(&str, &str); 4] = [
    ("closed", "open"),
    ("open", "half_open"),
    ("half_open", "closed"),
    ("half_open", "open"),
];

/// `connect`, `reset` (before headers), `timeout`, `stream` (mid-body), `status` (a retryable
/// error status before any byte), `unresponsive`, `error_event` (a stream the engine ended with
/// an error event of its own failure), `event_too_large` (an event-stream line or event past
/// the parser's cap), `bad_answer` (malformed HTTP/1.1 framing or a bound of the worker client
/// broken, before or during the body).
pub const UPSTREAM_ERROR_KINDS: [&str; 9] = [
    "connect",
    "reset",
    "timeout",
    "stream",
    "status",
    "unresponsive",
    "error_event",
    "event_too_large",
    "bad_answer",
];
