//! The spec's nested blocks (`health`, `overload`), validated field by field so an error names
//! the field (`health.timeout_secs`).

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
