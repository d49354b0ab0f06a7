//! The request headers admission reads, and the `x-ratelimit-*` headers it answers with.

use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use sluice_core::admission::{reset_text, Level, Tier};
use tokio::time::Instant;

use super::tenants::Tenant;
use super::AdmitError;

/// sluice's priority header: `0`, `1`, `2`, or `interactive`, `agent`, `batch`.
const PRIORITY_NAME: &str = "x-sluice-priority";
pub(crate) const PRIORITY: HeaderName = HeaderName::from_static(PRIORITY_NAME);
/// SMG's: `system`, `interactive`, `default`, `bulk`.
pub(crate) const SMG_PRIORITY: HeaderName = HeaderName::from_static("x-smg-priority");
const DEADLINE_NAME: &str = "x-request-deadline-ms";
use crate::context::DEADLINE;

/// The tier a request asks for, if any. sluice's header is strict (a typo is an error, not a
/// silent default); SMG's reads as SMG reads it.
pub(crate) fn asked_tier(headers: &HeaderMap) -> Result<Option<Tier>, AdmitError> {
    if let Some(value) = headers.get(&PRIORITY) {
        let text = value.to_str().unwrap_or("");
        return Tier::parse(text)
            .map(Some)
            .map_err(|e| AdmitError::InvalidHeader {
                header: PRIORITY_NAME,
                detail: e.to_string(),
            });
    }
    Ok(headers
        .get(&SMG_PRIORITY)
        .map(|v| Tier::from_smg_class(v.to_str().unwrap_or(""))))
}

/// `X-Request-Deadline-Ms`, when given: a whole number of milliseconds.
pub(crate) fn client_budget(headers: &HeaderMap) -> Result<Option<Duration>, AdmitError> {
    let Some(value) = headers.get(&DEADLINE) else {
        return Ok(None);
    };
    value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|ms| Some(Duration::from_millis(ms)))
        .ok_or_else(|| AdmitError::InvalidHeader {
            header: DEADLINE_NAME,
            detail: "must be a whole number of milliseconds".into(),
        })
}

/// OpenAI's rate-limit headers for the tenant's budgets as they stand.
pub(crate) fn rate_limits(tenant: &Tenant, now: Instant) -> HeaderMap {
    let mut out = HeaderMap::new();
    let mut put = |kind: &str, level: Option<Level>| {
        let Some(level) = level else { return };
        for (name, value) in [
            (format!("x-ratelimit-limit-{kind}"), level.limit.to_string()),
            (
                format!("x-ratelimit-remaining-{kind}"),
                level.remaining.to_string(),
            ),
            (format!("x-ratelimit-reset-{kind}"), reset_text(level.reset)),
        ] {
            if let (Ok(name), Ok(value)) =
                (HeaderName::try_from(name), HeaderValue::try_from(value))
            {
                out.insert(name, value);
            }
        }
    };
    put("requests", Tenant::level(&tenant.requests, now));
    put("tokens", Tenant::level(&tenant.tokens, now));
    out
}
