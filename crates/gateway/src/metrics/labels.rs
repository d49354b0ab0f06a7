//! The label sets of the gateway's metric families, and the values a label may take (each
//! preset to zero, so a series exists before its first event).

use prometheus_client::encoding::EncodeLabelSet;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RequestLabels {
    pub(crate) route: &'static str,
    pub(crate) status: u16,
    /// The gateway's error code, or `none` when a worker's answer was relayed.
    pub(crate) code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RouteLabel {
    pub(crate) route: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct WorkerLabel {
    pub(crate) worker: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct SelectionLabels {
    pub(crate) policy: &'static str,
    pub(crate) worker: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReasonLabel {
    pub(crate) reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TransitionLabels {
    pub(crate) worker: String,
    pub(crate) from: &'static str,
    pub(crate) to: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CancelLabels {
    pub(crate) route: &'static str,
    /// `waiting` (before the response started) or `streaming`.
    pub(crate) stage: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StageLabel {
    /// `select` (every candidate full) or `dispatch` (the chosen one became full).
    pub(crate) stage: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ResultLabel {
    /// `success` or `failure`.
    pub(crate) result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct UpstreamErrorLabels {
    pub(crate) worker: String,
    /// One of `UPSTREAM_ERROR_KINDS`.
    pub(crate) kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReportIssueLabels {
    pub(crate) worker: String,
    /// One of `REPORT_ISSUES`.
    pub(crate) issue: &'static str,
}

/// How a load report came out less than whole: `fallback` (the worker's preferred endpoint
/// failed and the older one was asked), `dropped_field` (a field of the wrong type was left out,
/// the rest of the report kept).
pub(crate) const REPORT_ISSUES: [&str; 2] = ["fallback", "dropped_field"];

/// Why a request was retried.
pub(crate) const RETRY_REASONS: [&str; 6] = [
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
/// broken, before or during the body), `adapter_load` (a LoRA adapter the gateway asked it to
/// load was not).
pub(crate) const UPSTREAM_ERROR_KINDS: [&str; 10] = [
    "connect",
    "reset",
    "timeout",
    "stream",
    "status",
    "unresponsive",
    "error_event",
    "event_too_large",
    "bad_answer",
    "adapter_load",
];
