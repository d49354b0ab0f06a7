//! `--smg-defaults`: the defaults of SMG 1.13, for an operator who wants SMG's behaviour first and
//! sluice's protections one flag at a time.
//!
//! sluice keeps SMG's defaults except where a measurement or a safety argument says otherwise
//! (docs/migrating-from-smg.md lists each difference and why). The switch puts back SMG's value
//! for every one of those settings that was not given — on the command line, in the environment
//! or in the config file — so a given flag keeps the meaning the migration page gives it.
//! `crates/cli/tests/smg_defaults.rs` holds the table to SMG's own parser
//! (`fixtures/smg/launch-defaults-1.13.0.tsv`, written by `scripts/smg-flags`).

use toml::Value;

/// SMG's value of every setting whose sluice default differs, by config-file key (and the one
/// bound of sluice's own that SMG's values need raised). `queue_size` is
/// not here: SMG's queue only holds requests past `--max-concurrent-requests`, so its 100 applies
/// only with a cap (`smg_queue_size`). Nor are the queue timeouts by tier: SMG has one,
/// `--queue-timeout-secs`, for every class, whatever it is set to (`fill`).
pub fn values() -> [(&'static str, Value); 13] {
    [
        (
            "routing_key_headers",
            Value::Array(vec![Value::from("x-smg-routing-key")]),
        ),
        ("host", Value::from("0.0.0.0")),
        ("prometheus_host", Value::from("0.0.0.0")),
        ("prometheus_port", Value::from(29000)),
        ("max_payload_size", Value::from(512 * 1024 * 1024)),
        // sluice's bound on every body held at once, which SMG does not have, must hold one of
        // SMG's largest: two of them.
        ("max_buffered_body_bytes", Value::from(1024 * 1024 * 1024)),
        ("max_tree_size", Value::from(1 << 26)),
        ("header_read_timeout_secs", Value::from(30.0)),
        ("retry_max_retries", Value::from(5)),
        ("retry_max_backoff_ms", Value::from(30_000)),
        ("retry_backoff_multiplier", Value::from(1.5)),
        ("retry_jitter_factor", Value::from(0.2)),
        ("load_monitor_interval", Value::from(10.0)),
    ]
}

/// SMG's queue as `smg_queue_size` gives it, in words (the flag reference's SMG column).
pub const SMG_QUEUE: &str = "100, only past `--max-concurrent-requests`; none without it";

/// SMG's queue: 100 requests past `--max-concurrent-requests`, none without a cap.
pub(crate) fn smg_queue_size(max_concurrent_requests: i64) -> usize {
    if max_concurrent_requests == -1 {
        0
    } else {
        100
    }
}

/// Puts SMG's value into `merged` (the settings as flags and file give them) for every setting
/// that differs and is not `given`.
pub(crate) fn fill(merged: &mut toml::Table, given: impl Fn(&str) -> bool) {
    for (key, value) in values() {
        if !given(key) {
            merged.insert(key.to_string(), value);
        }
    }
    if !given("queue_size") {
        let cap = merged
            .get("max_concurrent_requests")
            .and_then(Value::as_integer)
            .unwrap_or(-1);
        let size = i64::try_from(smg_queue_size(cap)).unwrap_or(0);
        merged.insert("queue_size".to_string(), Value::Integer(size));
    }
    if !given("queue_timeout_by_tier") {
        if let Some(longest) = merged.get("queue_timeout_secs").cloned() {
            let every_class = Value::Array(vec![longest; 3]);
            merged.insert("queue_timeout_by_tier".to_string(), every_class);
        }
    }
}
