//! `GetLoads` and the load record the event stream carries, from the figures SGLang's
//! `/v1/loads` reports (`api::load::SglangLoad`), so the HTTP and the gRPC engine never
//! disagree about their load.

use std::time::SystemTime;

use sluice_proto::common::{EngineLoad, EngineLora, EngineQueues};
use sluice_proto::sglang_scheduler::{
    AggregateMetrics, GetLoadsRequest, GetLoadsResponse, SchedulerLoad,
};
use tonic::Status;

use crate::api::load::{reported, SglangLoad, SGLANG_VERSION};
use crate::api::ApiState;

/// One rank's `SchedulerLoad`, with the queues section when asked for.
fn scheduler_load(rank: usize, l: &SglangLoad, queues: bool) -> SchedulerLoad {
    let clamp = |v: u64| i32::try_from(v).unwrap_or(i32::MAX);
    SchedulerLoad {
        dp_rank: rank as i32,
        num_running_reqs: clamp(l.running),
        num_waiting_reqs: clamp(l.waiting),
        num_total_reqs: clamp(l.running + l.waiting),
        num_used_tokens: clamp(l.used_tokens),
        max_total_num_tokens: clamp(l.total_tokens),
        token_usage: l.token_usage,
        gen_throughput: l.gen_throughput,
        cache_hit_rate: l.cache_hit_rate,
        utilization: l.token_usage,
        max_running_requests: l.max_running as i32,
        queues: queues.then(|| EngineQueues {
            waiting: clamp(l.queued),
            grammar: 0,
            paused: 0,
            retracted: clamp(l.retracted),
        }),
        num_waiting_uncached_tokens: clamp(l.waiting_uncached_tokens),
        ..Default::default()
    }
}

/// Each rank's figures now, as the engine reports them (pinned by the `report` fault).
fn ranks(st: &ApiState) -> Vec<SglangLoad> {
    let cfg = st.engine.config();
    reported(st)
        .iter()
        .map(|(view, pin)| SglangLoad::of(cfg, view, pin))
        .collect()
}

/// `GetLoads`: every rank, or the one asked for (`INVALID_ARGUMENT` for a rank it lacks).
pub(super) fn get_loads(
    st: &ApiState,
    request: &GetLoadsRequest,
) -> Result<GetLoadsResponse, Status> {
    let queues = request.include.iter().any(|s| s == "queues" || s == "all");
    let all = ranks(st);
    let chosen: Vec<(usize, &SglangLoad)> = match request.dp_rank {
        Some(rank) => {
            let index = usize::try_from(rank).ok().filter(|r| *r < all.len());
            let index = index.ok_or_else(|| {
                Status::invalid_argument(format!(
                    "dp_rank {rank} out of range: the engine has {} ranks",
                    all.len()
                ))
            })?;
            vec![(index, &all[index])]
        }
        None => all.iter().enumerate().collect(),
    };
    let lora = request.include.iter().any(|s| s == "lora" || s == "all");
    let loads: Vec<SchedulerLoad> = chosen
        .iter()
        .map(|(rank, l)| SchedulerLoad {
            lora: lora.then(|| slots(st, *rank)).flatten(),
            ..scheduler_load(*rank, l, queues)
        })
        .collect();
    let count = loads.len().max(1) as f64;
    let running: i32 = loads.iter().map(|l| l.num_running_reqs).sum();
    let waiting: i32 = loads.iter().map(|l| l.num_waiting_reqs).sum();
    let usage = loads.iter().map(|l| l.token_usage).sum::<f64>() / count;
    let aggregate = AggregateMetrics {
        total_running_reqs: running,
        total_waiting_reqs: waiting,
        total_reqs: running + waiting,
        avg_token_usage: usage,
        avg_throughput: loads.iter().map(|l| l.gen_throughput).sum::<f64>() / count,
        avg_utilization: usage,
    };
    Ok(GetLoadsResponse {
        timestamp: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
        version: SGLANG_VERSION.into(),
        dp_rank_count: all.len() as i32,
        loads,
        aggregate: Some(aggregate),
    })
}

/// The record for `rank` as smg-grpc-servicer builds it from `GetLoads`
/// (`load_record.py`, `engine_load_from`, with the queued token work its SGLang servicer
/// reports): the core, the cache hit rate, the token counts and the sections. It sets none of
/// the silence, step or pending-prefill fields (0.14.1 has no writer for them); `silence` adds
/// them as a newer servicer would (`--report-engine-silence`).
pub(super) fn record(st: &ApiState, rank: u32, silence: Option<Silence>) -> Option<EngineLoad> {
    let all = ranks(st);
    let l = all.get(rank as usize)?;
    let load = scheduler_load(rank as usize, l, true);
    Some(EngineLoad {
        running_requests: load.num_running_reqs.max(0) as u32,
        waiting_requests: load.num_waiting_reqs.max(0) as u32,
        waiting_uncached_tokens: Some(load.num_waiting_uncached_tokens.max(0) as u32),
        token_usage: load.token_usage,
        gen_throughput: load.gen_throughput,
        max_running_requests: load.max_running_requests.max(0) as u32,
        cache_hit_rate: Some(load.cache_hit_rate),
        num_used_tokens: Some(load.num_used_tokens),
        max_total_num_tokens: Some(load.max_total_num_tokens),
        queues: load.queues,
        lora: slots(st, rank as usize),
        engine_silence_ms: silence.and_then(|s| s.ms),
        engine_reports_steps: silence.map(|_| false),
        prefill_pending_tokens: silence.map(|_| load.num_waiting_uncached_tokens.max(0) as u32),
        ..Default::default()
    })
}

/// A rank's adapter slots, as `GetLoads`' `lora` section carries them (`--enable-lora`).
fn slots(st: &ApiState, rank: usize) -> Option<EngineLora> {
    let s = st.engine.adapter_stats()?.slots(rank)?;
    Some(EngineLora {
        slots_used: s.used as i32,
        slots_total: s.total as i32,
        utilization: s.utilization(),
    })
}

/// What a newer servicer says of its engine's silence: how long it has produced nothing while
/// holding work (`None` when it holds none).
#[derive(Debug, Clone, Copy)]
pub(super) struct Silence {
    pub ms: Option<u32>,
}

/// Tracks since when the engine has held work, to tell its silence: from the later of that and
/// its last output (so the first request after an idle spell is not read as a long silence).
#[derive(Debug, Default)]
pub(super) struct SilenceClock {
    busy_since: Option<tokio::time::Instant>,
}

impl SilenceClock {
    pub(super) fn read(&mut self, st: &ApiState) -> Silence {
        let now = tokio::time::Instant::now();
        let held: u64 = st
            .engine
            .ranks()
            .iter()
            .map(|r| r.running + r.queued())
            .sum();
        if held == 0 {
            self.busy_since = None;
            return Silence { ms: None };
        }
        let since = *self.busy_since.get_or_insert(now);
        let quiet_from = since.max(st.engine.last_progress());
        let ms = now.saturating_duration_since(quiet_from).as_millis();
        Silence {
            ms: Some(u32::try_from(ms).unwrap_or(u32::MAX)),
        }
    }
}
