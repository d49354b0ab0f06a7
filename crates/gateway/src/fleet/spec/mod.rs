//! A worker spec: what an operator says about a worker when registering it.
//!
//! Validated completely when it arrives (`POST /workers`, `PUT`, `--worker-urls`), so a bad spec is
//! a 400 that names its field, never an accepted registration that fails later. Fields are read
//! one by one from the JSON object rather than through a derived `Deserialize`, so that every
//! error can say which field it is about.

use std::collections::BTreeMap;

use axum::http::uri::{Authority, Scheme};
use axum::http::Uri;
use serde::Serialize;
use serde_json::{Map, Value};

use super::pd::Role;

/// What is wrong with a spec, and where.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SpecError {
    pub(crate) field: String,
    pub(crate) message: String,
}

fn spec_error(field: &str, message: impl Into<String>) -> SpecError {
    SpecError {
        field: field.to_string(),
        message: message.into(),
    }
}

/// A worker as registered.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkerSpec {
    /// Base URL, normalized to `http://host:port`.
    pub url: String,
    /// Sent to the worker as a bearer token; never shown back.
    #[serde(skip)]
    pub api_key: Option<String>,
    /// The model the worker serves, when known before it answers; otherwise learned from its
    /// `/v1/models`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) model_id: Option<String>,
    /// Speak HTTP/2 (prior knowledge) to this worker; unset follows `--upstream-http2`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) http2: Option<bool>,
    /// Free-form labels for operators.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) labels: BTreeMap<String, String>,
    /// Health-check settings of this worker; unset fields follow the gateway's flags.
    #[serde(skip_serializing_if = "HealthOverrides::is_empty")]
    pub(crate) health: HealthOverrides,
    /// Overload ceilings of this worker; unset fields follow the gateway's flags. Applies even
    /// under `--disable-worker-overload-protection`. Changed only by PUT.
    #[serde(skip_serializing_if = "OverloadOverrides::is_empty")]
    pub(crate) overload: OverloadOverrides,
    /// Its adaptive concurrency settings; unset fields follow the gateway's flags. Changed only
    /// by PUT.
    #[serde(skip_serializing_if = "AdaptiveOverrides::is_empty")]
    pub(crate) adaptive: AdaptiveOverrides,
    /// How often its load is polled; its pool polls at the smallest of its workers' values.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) load_monitor_interval_secs: Option<f64>,
    /// Its engine's tokens per batch (vLLM `--max-num-batched-tokens`), for the fractional
    /// prefill busy check; SGLang workers report theirs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_num_batched_tokens: Option<u64>,
    /// `regular`, or one half of prefill/decode disaggregation: `prefill` (with its
    /// `bootstrap_port`, SGLang's bootstrap server, when it has one) or `decode`.
    #[serde(skip_serializing_if = "is_regular")]
    pub worker_type: WorkerType,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bootstrap_port: Option<u16>,
    /// Its engine's running window (`--max-running-requests`, vLLM's `--max-num-seqs`), for the
    /// decode admission window; SGLang workers report theirs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_running_requests: Option<u64>,
    /// Its engine's KV-event publisher (`tcp://host:port`, rank r at port + r), overriding
    /// `--kv-events-port`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_events_endpoint: Option<ZmqEndpoint>,
    /// Its engine's data-parallel ranks, each publishing; unset follows `--kv-events-ranks`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) kv_events_ranks: Option<u32>,
    /// LoRA adapters the gateway may load onto its engine, and how many it may hold.
    #[serde(skip_serializing_if = "LoraSpec::is_empty")]
    pub(crate) lora: LoraSpec,
}

/// A ZMQ TCP endpoint a publisher binds, as a spec names it: `tcp://host:port`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct ZmqEndpoint(String);

impl ZmqEndpoint {
    pub fn parse(text: &str) -> Option<Self> {
        let endpoint = Self(text.to_string());
        endpoint.host_port()?;
        Some(endpoint)
    }

    /// Its host and port.
    pub(crate) fn host_port(&self) -> Option<(String, u16)> {
        let rest = self.0.strip_prefix("tcp://")?;
        let (host, port) = rest.rsplit_once(':')?;
        let port = port.parse::<u16>().ok().filter(|p| *p > 0)?;
        let valid = !host.is_empty() && host != "*" && !host.contains('/');
        valid.then(|| (host.to_string(), port))
    }
}

/// The spec's `worker_type`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkerType {
    #[default]
    Regular,
    Prefill,
    Decode,
}

impl WorkerType {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            WorkerType::Regular => "regular",
            WorkerType::Prefill => "prefill",
            WorkerType::Decode => "decode",
        }
    }
}

fn is_regular(t: &WorkerType) -> bool {
    *t == WorkerType::Regular
}

/// A worker's own overload ceilings (the spec's `overload` block).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct OverloadOverrides {
    /// `--worker-overload-waiting-requests`: at least 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) waiting_requests: Option<u64>,
    /// `--worker-overload-token-usage`: in (0, 1].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) token_usage: Option<f64>,
}

impl OverloadOverrides {
    pub(crate) fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// A worker's own health-check settings (the spec's `health` block). Each unset field keeps the
/// gateway-wide value of the flag it overrides.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct HealthOverrides {
    /// `--health-check-interval-secs`
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) check_interval_secs: Option<f64>,
    /// `--health-check-timeout-secs`
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) timeout_secs: Option<f64>,
    /// `--health-failure-threshold`
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) failure_threshold: Option<u32>,
    /// `--health-success-threshold`
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) success_threshold: Option<u32>,
    /// `--disable-health-check`
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) disable_health_check: Option<bool>,
    /// `--drain-settle-secs`
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) drain_settle_secs: Option<f64>,
}

/// The fields `PATCH /workers/{id}` may change; the rest need `PUT`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkerPatch {
    pub(crate) api_key: Option<Option<String>>,
    pub(crate) labels: Option<BTreeMap<String, String>>,
    /// Merged field by field: a field given sets it, `null` returns it to the gateway value,
    /// a field left out stays as it was.
    pub(crate) health: Option<HealthPatch>,
}

/// A `health` block in a PATCH: `None` leaves a field alone, `Some(None)` clears it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct HealthPatch {
    pub(crate) check_interval_secs: Option<Option<f64>>,
    pub(crate) timeout_secs: Option<Option<f64>>,
    pub(crate) failure_threshold: Option<Option<u32>>,
    pub(crate) success_threshold: Option<Option<u32>>,
    pub(crate) disable_health_check: Option<Option<bool>>,
    pub(crate) drain_settle_secs: Option<Option<f64>>,
}

mod blocks;
mod lora;
mod url;

pub use blocks::AdaptiveOverrides;
use blocks::{adaptive_block, health_patch, overload_block};
pub use lora::LoraSpec;
use url::normalize_url;

const FIELDS: &[&str] = &[
    "url",
    "api_key",
    "model_id",
    "http2",
    "labels",
    "health",
    "overload",
    "adaptive",
    "load_monitor_interval_secs",
    "max_num_batched_tokens",
    "worker_type",
    "bootstrap_port",
    "max_running_requests",
    "kv_events_endpoint",
    "kv_events_ranks",
    "lora",
];
/// The shortest load-poll interval a spec may ask for (the gateway polls no more often anyway).
const MIN_POLL_SECS: f64 = 1.0;
/// The shortest probe interval a spec may ask for: more often than this is load, not health.
pub(crate) const MIN_PROBE_INTERVAL_SECS: f64 = 0.05;
/// The shortest probe timeout a spec may ask for.
pub(crate) const MIN_PROBE_TIMEOUT_SECS: f64 = 0.01;

const PATCHABLE: &[&str] = &["api_key", "labels", "health"];
const HEALTH_FIELDS: &[&str] = &[
    "check_interval_secs",
    "timeout_secs",
    "failure_threshold",
    "success_threshold",
    "disable_health_check",
    "drain_settle_secs",
];

impl WorkerSpec {
    /// A spec with only a URL (and the gateway-wide worker key), as `--worker-urls` gives.
    pub fn from_url(url: &str, api_key: Option<String>) -> Result<Self, SpecError> {
        Ok(Self {
            url: normalize_url(url)?,
            api_key,
            model_id: None,
            http2: None,
            labels: BTreeMap::new(),
            health: HealthOverrides::default(),
            overload: OverloadOverrides::default(),
            adaptive: AdaptiveOverrides::default(),
            load_monitor_interval_secs: None,
            max_num_batched_tokens: None,
            worker_type: WorkerType::Regular,
            bootstrap_port: None,
            max_running_requests: None,
            kv_events_endpoint: None,
            kv_events_ranks: None,
            lora: LoraSpec::default(),
        })
    }

    /// What the worker does in its pool.
    pub(crate) fn role(&self) -> Role {
        match self.worker_type {
            WorkerType::Regular => Role::Regular,
            WorkerType::Prefill => Role::Prefill {
                bootstrap_port: self.bootstrap_port,
            },
            WorkerType::Decode => Role::Decode,
        }
    }

    /// Parses and validates a JSON spec.
    pub fn parse(body: &[u8]) -> Result<Self, SpecError> {
        let object = parse_object(body)?;
        if let Some(unknown) = object.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(spec_error(
                unknown,
                format!("unknown field (known: {})", FIELDS.join(", ")),
            ));
        }
        Ok(Self {
            url: match object.get("url") {
                Some(Value::String(url)) => normalize_url(url)?,
                Some(_) => return Err(spec_error("url", "must be a string")),
                None => return Err(spec_error("url", "is required")),
            },
            api_key: optional_string(&object, "api_key")?,
            model_id: optional_string(&object, "model_id")?,
            http2: optional(&object, "http2", "must be a boolean", Value::as_bool)?,
            labels: labels(&object)?.unwrap_or_default(),
            health: health_patch(&object)?.map_or_else(HealthOverrides::default, |patch| {
                HealthOverrides::default().patched(patch)
            }),
            overload: overload_block(&object)?,
            adaptive: adaptive_block(&object)?,
            worker_type: worker_type(&object)?,
            bootstrap_port: optional(&object, "bootstrap_port", "must be a port number", |v| {
                v.as_u64()
                    .and_then(|p| u16::try_from(p).ok())
                    .filter(|p| *p > 0)
            })?,
            max_running_requests: optional(&object, "max_running_requests", AT_LEAST_1, |v| {
                v.as_u64().filter(|n| *n >= 1)
            })?,
            kv_events_endpoint: optional(
                &object,
                "kv_events_endpoint",
                "must be tcp://host:port",
                |v| v.as_str().and_then(ZmqEndpoint::parse),
            )?,
            kv_events_ranks: kv_events_ranks(&object)?,
            lora: lora::lora_block(&object)?,
            max_num_batched_tokens: optional(&object, "max_num_batched_tokens", AT_LEAST_1, |v| {
                v.as_u64().filter(|n| *n >= 1)
            })?,
            load_monitor_interval_secs: optional(
                &object,
                "load_monitor_interval_secs",
                format!("must be a number of seconds from {MIN_POLL_SECS} to 86400"),
                |v| {
                    v.as_f64()
                        .filter(|x| x.is_finite() && *x >= MIN_POLL_SECS && *x <= 86_400.0)
                },
            )?,
        })
    }

    /// The scheme and authority requests to this worker are sent to.
    pub(crate) fn endpoint(&self) -> (Scheme, Authority) {
        #[allow(clippy::expect_used)]
        let uri: Uri = self.url.parse().expect("normalized at validation");
        #[allow(clippy::expect_used)]
        let authority = uri.authority().cloned().expect("validated to have a host");
        (uri.scheme().cloned().unwrap_or(Scheme::HTTP), authority)
    }

    pub fn apply(&mut self, patch: WorkerPatch) {
        if let Some(key) = patch.api_key {
            self.api_key = key;
        }
        if let Some(labels) = patch.labels {
            self.labels = labels;
        }
        if let Some(health) = patch.health {
            self.health = self.health.clone().patched(health);
        }
    }
}

impl HealthOverrides {
    pub(crate) fn is_empty(&self) -> bool {
        self == &Self::default()
    }

    fn patched(self, p: HealthPatch) -> Self {
        Self {
            check_interval_secs: p.check_interval_secs.unwrap_or(self.check_interval_secs),
            timeout_secs: p.timeout_secs.unwrap_or(self.timeout_secs),
            failure_threshold: p.failure_threshold.unwrap_or(self.failure_threshold),
            success_threshold: p.success_threshold.unwrap_or(self.success_threshold),
            disable_health_check: p.disable_health_check.unwrap_or(self.disable_health_check),
            drain_settle_secs: p.drain_settle_secs.unwrap_or(self.drain_settle_secs),
        }
    }
}

impl WorkerPatch {
    pub fn parse(body: &[u8]) -> Result<Self, SpecError> {
        let object = parse_object(body)?;
        if let Some(field) = object.keys().find(|k| !PATCHABLE.contains(&k.as_str())) {
            let message = if FIELDS.contains(&field.as_str()) {
                "cannot be changed by PATCH; send the whole spec with PUT".to_string()
            } else {
                format!("unknown field (patchable: {})", PATCHABLE.join(", "))
            };
            return Err(spec_error(field, message));
        }
        Ok(Self {
            api_key: match object.get("api_key") {
                None => None,
                Some(_) => Some(optional_string(&object, "api_key")?),
            },
            labels: labels(&object)?,
            health: health_patch(&object)?,
        })
    }
}

fn kv_events_ranks(object: &Map<String, Value>) -> Result<Option<u32>, SpecError> {
    optional(
        object,
        "kv_events_ranks",
        "must be a whole number from 1 to 1024",
        |v| {
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .filter(|n| (1..=1024).contains(n))
        },
    )
}

fn worker_type(object: &Map<String, Value>) -> Result<WorkerType, SpecError> {
    let kind = match object.get("worker_type") {
        None | Some(Value::Null) => WorkerType::Regular,
        Some(Value::String(s)) => match s.as_str() {
            "regular" => WorkerType::Regular,
            "prefill" => WorkerType::Prefill,
            "decode" => WorkerType::Decode,
            _ => {
                return Err(spec_error(
                    "worker_type",
                    "must be regular, prefill or decode",
                ))
            }
        },
        Some(_) => return Err(spec_error("worker_type", "must be a string")),
    };
    if kind != WorkerType::Prefill && object.get("bootstrap_port").is_some_and(|v| !v.is_null()) {
        return Err(spec_error(
            "bootstrap_port",
            "belongs to a prefill worker (worker_type prefill)",
        ));
    }
    Ok(kind)
}

fn parse_object(body: &[u8]) -> Result<Map<String, Value>, SpecError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(_) => Err(spec_error("body", "must be a JSON object")),
        Err(e) => Err(spec_error("body", format!("is not valid JSON: {e}"))),
    }
}

/// What a field's value must be when it has to be a whole number of at least 1.
const AT_LEAST_1: &str = "must be a whole number of at least 1";

/// An optional field: absent or null is `None`; a value `read` cannot take is refused, saying
/// what it `must` be.
fn optional<T>(
    object: &Map<String, Value>,
    field: &str,
    must: impl Into<String>,
    read: impl FnOnce(&Value) -> Option<T>,
) -> Result<Option<T>, SpecError> {
    match object.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => read(v).map(Some).ok_or_else(|| spec_error(field, must)),
    }
}

fn optional_string(object: &Map<String, Value>, field: &str) -> Result<Option<String>, SpecError> {
    match object.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.trim().is_empty() => Err(spec_error(field, "cannot be empty")),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(spec_error(field, "must be a string")),
    }
}

fn labels(object: &Map<String, Value>) -> Result<Option<BTreeMap<String, String>>, SpecError> {
    match object.get("labels") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(map)) => map
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                _ => Err(spec_error(
                    &format!("labels.{k}"),
                    "label values must be strings",
                )),
            })
            .collect::<Result<_, _>>()
            .map(Some),
        Some(_) => Err(spec_error("labels", "must be an object of strings")),
    }
}

#[cfg(test)]
mod tests;
