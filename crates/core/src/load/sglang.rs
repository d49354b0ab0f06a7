//! SGLang's load endpoints, read field by field.
//!
//! Read in SGLang's source (the scheduler's `get_loads` behind `GET /v1/loads`):
//! `num_waiting_reqs` sums the waiting queue with the disaggregation queues (a prefill's
//! bootstrap queue; a decode's prealloc, transfer and retracted queues), so a healthy decode
//! worker always "waits"; `include=all` adds `queues.waiting` (the scheduler's own waiting queue)
//! and `disaggregation.*_queue_reqs`, from which the queue that means overload is told apart.
//! The request in chunked prefill is in neither count; `num_waiting_uncached_tokens` includes
//! its remaining tokens. `include=lora` adds each rank's adapter slots (`lora.slots_used`,
//! `slots_total`: `scheduler_metrics_mixin.py`, `get_loads`), counts without names. The older
//! `/get_load` (now a deprecated shim) sends `"dp_rank": null` when there is one rank and has
//! no KV usage.

use serde_json::{Map, Value};

use super::{count, fraction, non_empty, LoadError, LoadReport, RankLoad};
use crate::lora::AdapterSlots;

/// The path and query polled for SGLang's load: every section (an engine that does not know
/// `include` ignores it; `all` reads the same as a list or as one value).
pub const SGLANG_LOADS_QUERY: &str = "/v1/loads?include=all";

/// One object's fields, each read on its own: a field of the wrong type is dropped and named,
/// and the rest stand.
struct Fields<'a> {
    object: &'a Map<String, Value>,
    dropped: &'a mut Vec<&'static str>,
}

impl<'a> Fields<'a> {
    fn number(&mut self, key: &'static str) -> Option<f64> {
        match self.object.get(key) {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) => n.as_f64(),
            Some(_) => {
                self.dropped.push(key);
                None
            }
        }
    }

    fn count(&mut self, key: &'static str) -> Option<u64> {
        self.number(key).map(count)
    }

    fn section(&mut self, key: &'static str) -> Option<&'a Map<String, Value>> {
        match self.object.get(key) {
            None | Some(Value::Null) => None,
            Some(Value::Object(section)) => Some(section),
            Some(_) => {
                self.dropped.push(key);
                None
            }
        }
    }
}

/// SGLang `GET /v1/loads`: one entry per rank under `loads` (an `aggregate` object, which some
/// releases add, is ignored: the ranks say the same).
pub fn parse_sglang_loads(body: &[u8]) -> Result<LoadReport, LoadError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| LoadError::Json(e.to_string()))?;
    let Some(Value::Array(loads)) = value.get("loads") else {
        return Err(LoadError::Json("no `loads` list".into()));
    };
    let mut dropped = Vec::new();
    let mut ranks = Vec::new();
    let mut adapters: Option<AdapterSlots> = None;
    for (i, entry) in loads.iter().enumerate() {
        let Value::Object(object) = entry else {
            dropped.push("loads[]");
            continue;
        };
        let mut f = Fields {
            object,
            dropped: &mut dropped,
        };
        if let Some(lora) = f.section("lora") {
            add_slots(adapters.get_or_insert_with(AdapterSlots::default), lora);
        }
        let all_waiting = f.count("num_waiting_reqs").unwrap_or(0);
        let deferred = deferred_of(&mut f, all_waiting);
        let (queue_waiting, retracted) = match f.section("queues") {
            Some(q) => (
                q.get("waiting").and_then(Value::as_f64).map(count),
                q.get("retracted").and_then(Value::as_f64).map(count),
            ),
            None => (None, None),
        };
        ranks.push(RankLoad {
            rank: rank_of(&mut f, i),
            waiting: queue_waiting.unwrap_or(all_waiting.saturating_sub(deferred)),
            deferred,
            running: f.count("num_running_reqs").unwrap_or(0),
            kv_usage: f.number("token_usage").map_or(0.0, fraction),
            kv_capacity: f.count("max_total_num_tokens"),
            max_running: f.count("max_running_requests"),
            gen_throughput: f.number("gen_throughput").filter(|t| t.is_finite()),
            retracted,
            pending_prefill_tokens: f.count("num_waiting_uncached_tokens"),
            used_tokens: f.count("num_used_tokens"),
            cache_hit_rate: f
                .number("cache_hit_rate")
                .filter(|r| r.is_finite())
                .map(fraction),
            ..RankLoad::default()
        });
    }
    let mut report = non_empty(ranks, dropped)?;
    report.adapters = adapters;
    Ok(report)
}

/// One rank's `lora` section (`include=lora`: `slots_used`, `slots_total`), added to the
/// worker's: each rank batches its own adapters.
fn add_slots(slots: &mut AdapterSlots, lora: &Map<String, Value>) {
    let field = |key: &str| {
        lora.get(key)
            .and_then(Value::as_f64)
            .map(|x| count(x) as u32)
    };
    if let Some(total) = field("slots_total") {
        *slots.max.get_or_insert(0) += total;
    }
    if let Some(used) = field("slots_used") {
        *slots.used.get_or_insert(0) += used;
    }
}

/// Requests counted as waiting that wait for a KV transfer or a bootstrap, not for room: from
/// the `disaggregation` section, else what `num_waiting_reqs` has beyond `queues.waiting`.
fn deferred_of(f: &mut Fields<'_>, all_waiting: u64) -> u64 {
    if let Some(d) = f.section("disaggregation") {
        let queue = |key: &str| d.get(key).and_then(Value::as_f64).map_or(0, count);
        return queue("decode_prealloc_queue_reqs")
            + queue("decode_transfer_queue_reqs")
            + queue("prefill_bootstrap_queue_reqs");
    }
    match f.section("queues") {
        Some(q) => q
            .get("waiting")
            .and_then(Value::as_f64)
            .map_or(0, |own| all_waiting.saturating_sub(count(own))),
        None => 0,
    }
}

/// A rank's number: `dp_rank`, or its place in the list when the engine sends none or null
/// (an older SGLang with one rank).
fn rank_of(f: &mut Fields<'_>, place: usize) -> u32 {
    f.count("dp_rank")
        .and_then(|r| u32::try_from(r).ok())
        .unwrap_or(place as u32)
}

/// SGLang `GET /get_load`, the older endpoint: per rank `num_reqs` (running + waiting) and
/// `num_waiting_reqs`, or in its oldest form one `{"load": N}` of requests in flight. No KV usage.
pub fn parse_sglang_get_load(body: &[u8]) -> Result<LoadReport, LoadError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| LoadError::Json(e.to_string()))?;
    let mut dropped = Vec::new();
    let ranks = match &value {
        Value::Array(entries) => entries
            .iter()
            .enumerate()
            .filter_map(|(i, entry)| {
                let Value::Object(object) = entry else {
                    dropped.push("[]");
                    return None;
                };
                let mut f = Fields {
                    object,
                    dropped: &mut dropped,
                };
                let waiting = f.count("num_waiting_reqs").unwrap_or(0);
                Some(RankLoad {
                    rank: rank_of(&mut f, i),
                    waiting,
                    running: f.count("num_reqs").unwrap_or(0).saturating_sub(waiting),
                    ..RankLoad::default()
                })
            })
            .collect(),
        Value::Object(object) => {
            let mut f = Fields {
                object,
                dropped: &mut dropped,
            };
            match f.count("load") {
                Some(load) => vec![RankLoad {
                    running: load,
                    ..RankLoad::default()
                }],
                None => return Err(LoadError::Json("neither a list of ranks nor a load".into())),
            }
        }
        _ => return Err(LoadError::Json("neither a list of ranks nor a load".into())),
    };
    non_empty(ranks, dropped)
}
