//! The spec's nested blocks (`health`, `overload`, `adaptive`), validated field by field so an
//! error names the field (`health.timeout_secs`).

use serde::Serialize;
use serde_json::{Map, Value};

use super::{
    spec_error, HealthPatch, OverloadOverrides, SpecError, HEALTH_FIELDS, MIN_PROBE_INTERVAL_SECS,
    MIN_PROBE_TIMEOUT_SECS,
};

/// The `overload` block: `waiting_requests` >= 1, `token_usage` in (0, 1].
pub(super) fn overload_block(object: &Map<String, Value>) -> Result<OverloadOverrides, SpecError> {
    let block = match object.get("overload") {
        None | Some(Value::Null) => return Ok(OverloadOverrides::default()),
        Some(Value::Object(block)) => block,
        Some(_) => return Err(spec_error("overload", "must be an object")),
    };
    const KNOWN: &[&str] = &["waiting_requests", "token_usage"];
    if let Some(unknown) = block.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(spec_error(
            &format!("overload.{unknown}"),
            format!("unknown field (known: {})", KNOWN.join(", ")),
        ));
    }
    let waiting_requests = match block.get("waiting_requests") {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_u64().filter(|n| *n >= 1).ok_or_else(|| {
            spec_error(
                "overload.waiting_requests",
                "must be a whole number of at least 1 (the comparison is inclusive: 0 would veto always)",
            )
        })?),
    };
    let token_usage = match block.get("token_usage") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_f64()
                .filter(|x| *x > 0.0 && *x <= 1.0)
                .ok_or_else(|| {
                    spec_error(
                        "overload.token_usage",
                        "must be a fraction of the KV cache in (0, 1]",
                    )
                })?,
        ),
    };
    Ok(OverloadOverrides {
        waiting_requests,
        token_usage,
    })
}

/// A worker's own adaptive-concurrency settings (the spec's `adaptive` block); unset fields follow
/// the `--adaptive-*` flags. Each is a whole number of at least 1 but the window. Changed only
/// by PUT.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct AdaptiveOverrides {
    /// `--adaptive-window-secs` (from 0.1 to 3600, fractions allowed)
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) window_secs: Option<f64>,
    /// `--adaptive-initial-limit`
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) initial_limit: Option<u64>,
    /// `--adaptive-min-limit`
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) min_limit: Option<u64>,
    /// `--adaptive-max-limit`
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_limit: Option<u64>,
    /// `--adaptive-itl-breach-ms`
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) itl_breach_ms: Option<u64>,
    /// `--adaptive-itl-healthy-ms`
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) itl_healthy_ms: Option<u64>,
    /// `--adaptive-ttft-breach-ms`
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ttft_breach_ms: Option<u64>,
    /// `--adaptive-ttft-healthy-ms`
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ttft_healthy_ms: Option<u64>,
}

impl AdaptiveOverrides {
    pub(crate) fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

const ADAPTIVE_FIELDS: &[&str] = &[
    "window_secs",
    "initial_limit",
    "min_limit",
    "max_limit",
    "itl_breach_ms",
    "itl_healthy_ms",
    "ttft_breach_ms",
    "ttft_healthy_ms",
];

/// The `adaptive` block: whole numbers of at least 1; a floor over its ceiling, or a healthy
/// target not under its breach target, is refused when both are given here.
pub(super) fn adaptive_block(object: &Map<String, Value>) -> Result<AdaptiveOverrides, SpecError> {
    let block = match object.get("adaptive") {
        None | Some(Value::Null) => return Ok(AdaptiveOverrides::default()),
        Some(Value::Object(block)) => block,
        Some(_) => return Err(spec_error("adaptive", "must be an object")),
    };
    if let Some(unknown) = block
        .keys()
        .find(|k| !ADAPTIVE_FIELDS.contains(&k.as_str()))
    {
        return Err(spec_error(
            &format!("adaptive.{unknown}"),
            format!("unknown field (known: {})", ADAPTIVE_FIELDS.join(", ")),
        ));
    }
    let whole = |name: &str| -> Result<Option<u64>, SpecError> {
        match block.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_u64().filter(|n| *n >= 1).map(Some).ok_or_else(|| {
                spec_error(
                    &format!("adaptive.{name}"),
                    "must be a whole number of at least 1",
                )
            }),
        }
    };
    let window_secs = match block.get("window_secs") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_f64()
                .filter(|x| (0.1..=3600.0).contains(x))
                .ok_or_else(|| {
                    spec_error(
                        "adaptive.window_secs",
                        "must be a number of seconds from 0.1 to 3600",
                    )
                })?,
        ),
    };
    let block = AdaptiveOverrides {
        window_secs,
        initial_limit: whole("initial_limit")?,
        min_limit: whole("min_limit")?,
        max_limit: whole("max_limit")?,
        itl_breach_ms: whole("itl_breach_ms")?,
        itl_healthy_ms: whole("itl_healthy_ms")?,
        ttft_breach_ms: whole("ttft_breach_ms")?,
        ttft_healthy_ms: whole("ttft_healthy_ms")?,
    };
    adaptive_ordered(&block)?;
    Ok(block)
}

/// A floor not over its ceiling, a healthy target under its breach target, where both are given.
fn adaptive_ordered(block: &AdaptiveOverrides) -> Result<(), SpecError> {
    let ordered = |low: Option<u64>, high: Option<u64>, strict: bool| match (low, high) {
        (Some(l), Some(h)) => l < h || (!strict && l == h),
        _ => true,
    };
    if !ordered(block.min_limit, block.max_limit, false) {
        return Err(spec_error(
            "adaptive.min_limit",
            "must not exceed max_limit",
        ));
    }
    if !ordered(block.itl_healthy_ms, block.itl_breach_ms, true) {
        return Err(spec_error(
            "adaptive.itl_healthy_ms",
            "must be under itl_breach_ms",
        ));
    }
    if !ordered(block.ttft_healthy_ms, block.ttft_breach_ms, true) {
        return Err(spec_error(
            "adaptive.ttft_healthy_ms",
            "must be under ttft_breach_ms",
        ));
    }
    Ok(())
}

/// The `health` block, each field validated and named (`health.timeout_secs`) when wrong.
pub(super) fn health_patch(object: &Map<String, Value>) -> Result<Option<HealthPatch>, SpecError> {
    let block = match object.get("health") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(block)) => block,
        Some(_) => return Err(spec_error("health", "must be an object")),
    };
    if let Some(unknown) = block.keys().find(|k| !HEALTH_FIELDS.contains(&k.as_str())) {
        return Err(spec_error(
            &format!("health.{unknown}"),
            format!("unknown field (known: {})", HEALTH_FIELDS.join(", ")),
        ));
    }
    // The least each may be: an interval or timeout under its floor is a mistake, not a
    // setting (zero: off, for the drain settle time).
    let seconds = |name: &str, least: f64| -> Result<Option<Option<f64>>, SpecError> {
        let field = format!("health.{name}");
        match block.get(name) {
            None => Ok(None),
            Some(Value::Null) => Ok(Some(None)),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() && x >= least && x <= 86_400.0 => Ok(Some(Some(x))),
                _ => Err(spec_error(
                    &field,
                    format!("must be a number of seconds from {least} to 86400"),
                )),
            },
        }
    };
    let count = |name: &str| -> Result<Option<Option<u32>>, SpecError> {
        match block.get(name) {
            None => Ok(None),
            Some(Value::Null) => Ok(Some(None)),
            Some(v) => match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
                Some(n) if n >= 1 => Ok(Some(Some(n))),
                _ => Err(spec_error(
                    &format!("health.{name}"),
                    "must be a whole number of at least 1",
                )),
            },
        }
    };
    Ok(Some(HealthPatch {
        check_interval_secs: seconds("check_interval_secs", MIN_PROBE_INTERVAL_SECS)?,
        timeout_secs: seconds("timeout_secs", MIN_PROBE_TIMEOUT_SECS)?,
        failure_threshold: count("failure_threshold")?,
        success_threshold: count("success_threshold")?,
        disable_health_check: match block.get("disable_health_check") {
            None => None,
            Some(Value::Null) => Some(None),
            Some(Value::Bool(b)) => Some(Some(*b)),
            Some(_) => {
                return Err(spec_error(
                    "health.disable_health_check",
                    "must be a boolean",
                ))
            }
        },
        drain_settle_secs: seconds("drain_settle_secs", 0.0)?,
    }))
}

#[cfg(test)]
mod tests {
    use super::super::WorkerSpec;

    #[test]
    fn an_adaptive_block_sets_a_workers_own_limits_and_targets() {
        let spec = WorkerSpec::parse(
            br#"{"url":"http://x:1","adaptive":{"window_secs":2.5,"initial_limit":16,"max_limit":48,"itl_breach_ms":40,"itl_healthy_ms":20}}"#,
        )
        .unwrap();
        assert_eq!(spec.adaptive.initial_limit, Some(16));
        assert_eq!(spec.adaptive.window_secs, Some(2.5));
        assert_eq!(spec.adaptive.max_limit, Some(48));
        assert_eq!(spec.adaptive.itl_breach_ms, Some(40));
        assert_eq!(spec.adaptive.ttft_breach_ms, None);
        let shown = serde_json::to_value(&spec).unwrap();
        assert_eq!(shown["adaptive"]["itl_healthy_ms"], 20);
        for (block, field) in [
            (r#"{"initial_limit":0}"#, "adaptive.initial_limit"),
            (r#"{"window_secs":0}"#, "adaptive.window_secs"),
            (r#"{"itl_breach_ms":2.5}"#, "adaptive.itl_breach_ms"),
            (r#"{"min_limit":9,"max_limit":8}"#, "adaptive.min_limit"),
            (
                r#"{"itl_breach_ms":20,"itl_healthy_ms":20}"#,
                "adaptive.itl_healthy_ms",
            ),
            (
                r#"{"ttft_breach_ms":900,"ttft_healthy_ms":1000}"#,
                "adaptive.ttft_healthy_ms",
            ),
            (r#"{"limit":3}"#, "adaptive.limit"),
            ("[]", "adaptive"),
        ] {
            let body = format!(r#"{{"url":"http://x:1","adaptive":{block}}}"#);
            let e = WorkerSpec::parse(body.as_bytes()).unwrap_err();
            assert_eq!(e.field, field, "{block}: {e}");
        }
    }
}
