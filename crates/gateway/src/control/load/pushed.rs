//! A gRPC worker's KV-event stream as a source of load reports (its block events are applied
//! by `pushed_events`): smg-grpc-servicer puts the
//! engine's load record on every batch and sends heartbeats through quiet spells, so while the
//! stream flows the worker's load is known at every scheduler step instead of every poll, and
//! every batch is contact. The monitor ingests each record as it ingests a poll's answer (the
//! overload check runs once per report, seed 000) and skips the poll while records arrive.
//!
//! The stream is asked for records before its first batch (`load_records_before_first_batch`),
//! so a quiet engine's load is known at once where the servicer honours it. A servicer without
//! KV events answers `UNIMPLEMENTED`: the worker is then only polled. A stream that breaks at the
//! transport is a liveness signal and is opened again after a second; one the servicer ends
//! (`OUT_OF_RANGE`, `DATA_LOSS`: it lost events) is opened again at once.

use std::collections::BTreeMap;
use std::time::Duration;

use sluice_core::load::{LoadReport, RankLoad};
use sluice_core::lora::AdapterSlots;
use sluice_proto::common::{EngineLoad, EngineLora, KvEventBatch, SubscribeKvEventsRequest};
use tonic::{Code, Streaming};

use crate::fleet::Worker;
use crate::upstream::Upstream;

/// How long a stream broken at the transport waits before it is opened again.
const RESUBSCRIBE_AFTER: Duration = Duration::from_secs(1);

/// What a record says of the engine's own silence (smg-grpc-proto 0.4.28's `engine_silence_ms`
/// and `engine_reports_steps`; servicers that predate them send neither).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Silence {
    /// How long the engine has produced nothing while holding streaming work; `None`: the
    /// servicer does not say (or holds none).
    pub(crate) ms: Option<u32>,
    /// The wire reports every scheduler step, so a silence is never a prefill in progress.
    pub(crate) reports_steps: bool,
}

/// What the stream gave.
#[derive(Debug)]
pub(super) enum Push {
    /// A batch with a load record: every rank's latest, as a report, and the engine's silence.
    Report(LoadReport, Silence),
    /// A batch without one (events only, an older servicer): contact, no report.
    Contact,
    /// The stream broke at the transport.
    Lost,
}

/// One worker's subscription, opened and reopened as needed.
pub(super) struct Pushed {
    stream: Option<Streaming<KvEventBatch>>,
    /// The servicer serves no KV events: nothing will come.
    unsupported: bool,
    /// Not opened again before then, after a transport failure (kept across a cancelled wait).
    retry_at: Option<tokio::time::Instant>,
    /// Each rank's latest record, telemetry kept from the record that last carried it.
    ranks: BTreeMap<u32, RankLoad>,
    /// When each rank's last record came.
    heard: BTreeMap<u32, tokio::time::Instant>,
    /// Each rank's adapter slots, from the last record that carried them (telemetry rides
    /// heartbeats).
    slots: BTreeMap<u32, EngineLora>,
}

impl Pushed {
    pub(super) fn new() -> Self {
        Self {
            stream: None,
            unsupported: false,
            retry_at: None,
            ranks: BTreeMap::new(),
            heard: BTreeMap::new(),
            slots: BTreeMap::new(),
        }
    }

    /// Every rank that pushes has delivered a record within `interval`: the poll may skip this
    /// tick (seed 000); once one falls silent, the poll takes over.
    pub(super) fn fresh(&self, interval: Duration) -> bool {
        !self.heard.is_empty() && self.heard.values().all(|at| at.elapsed() < interval)
    }

    /// The next thing the stream gives; never resolves for a worker without KV events.
    pub(super) async fn next(&mut self, upstream: &Upstream, worker: &Worker) -> Push {
        loop {
            if self.unsupported {
                return std::future::pending().await;
            }
            if let Some(at) = self.retry_at {
                tokio::time::sleep_until(at).await;
                self.retry_at = None;
            }
            let stream = match self.stream.as_mut() {
                Some(stream) => stream,
                None => match subscribe(upstream, worker).await {
                    Ok(stream) => self.stream.insert(stream),
                    Err(status) => {
                        if let Some(push) = self.failed(&status) {
                            return push;
                        }
                        continue;
                    }
                },
            };
            match stream.message().await {
                Ok(Some(batch)) => {
                    super::pushed_events::apply(worker, &batch);
                    return self.batch(&batch);
                }
                Ok(None) => {
                    // The servicer closed the stream: open it again.
                    self.stream = None;
                    worker.held.lost_all();
                }
                Err(status) => {
                    self.stream = None;
                    worker.held.lost_all();
                    if let Some(push) = self.failed(&status) {
                        return push;
                    }
                }
            }
        }
    }

    /// A failed call or stream: `Lost` for the transport's failure (and a pause before the next
    /// try); nothing, to try again, for the servicer's own ending.
    fn failed(&mut self, status: &tonic::Status) -> Option<Push> {
        if status.code() == Code::Unimplemented {
            self.unsupported = true;
            return None;
        }
        if std::error::Error::source(status).is_some() || status.code() == Code::Unavailable {
            self.retry_at = Some(tokio::time::Instant::now() + RESUBSCRIBE_AFTER);
            return Some(Push::Lost);
        }
        None
    }

    fn batch(&mut self, batch: &KvEventBatch) -> Push {
        let Some(record) = &batch.load else {
            return Push::Contact;
        };
        let rank = batch
            .dp_rank
            .and_then(|r| u32::try_from(r).ok())
            .unwrap_or(0);
        self.heard.insert(rank, tokio::time::Instant::now());
        let previous = self.ranks.remove(&rank);
        let merged = rank_load(rank, record, previous.as_ref());
        self.ranks.insert(rank, merged);
        if let Some(lora) = record.lora {
            self.slots.insert(rank, lora);
        }
        let silence = Silence {
            ms: record.engine_silence_ms,
            reports_steps: record.engine_reports_steps == Some(true),
        };
        let report = LoadReport {
            ranks: self.ranks.values().cloned().collect(),
            dropped: Vec::new(),
            adapters: adapter_slots(self.slots.values()),
        };
        Push::Report(report, silence)
    }
}

/// The worker's adapter slots, each rank's added (each batches its own adapters), as SGLang's
/// `lora` section of `/v1/loads` reads; `None` when no record carried them.
fn adapter_slots<'a>(ranks: impl Iterator<Item = &'a EngineLora>) -> Option<AdapterSlots> {
    ranks.fold(None, |sum, rank| {
        let mut sum: AdapterSlots = sum.unwrap_or_default();
        let count = |n: i32| u32::try_from(n).unwrap_or(0);
        *sum.max.get_or_insert(0) += count(rank.slots_total);
        *sum.used.get_or_insert(0) += count(rank.slots_used);
        Some(sum)
    })
}

async fn subscribe(
    upstream: &Upstream,
    worker: &Worker,
) -> Result<Streaming<KvEventBatch>, tonic::Status> {
    let request = SubscribeKvEventsRequest {
        start_sequence_number: 0,
        load_records_before_first_batch: true,
    };
    upstream
        .grpc()
        .subscribe_kv_events(&worker.endpoint, request)
        .await
}

/// A pushed record as the rank's load, as `/v1/loads` would report it: the queue is the
/// `queues` section's when the record carries it (telemetry rides heartbeats), else every
/// waiting request; what a record between heartbeats leaves out is kept from the last that had it.
fn rank_load(rank: u32, record: &EngineLoad, previous: Option<&RankLoad>) -> RankLoad {
    let kept = |get: fn(&RankLoad) -> Option<u64>| previous.and_then(get);
    let waiting = u64::from(record.waiting_requests);
    let (queue_waiting, retracted) = match &record.queues {
        Some(q) => (
            Some(u64::try_from(q.waiting).unwrap_or(0)),
            Some(u64::try_from(q.retracted).unwrap_or(0)),
        ),
        None => (None, kept(|r| r.retracted)),
    };
    let queue = queue_waiting.unwrap_or(waiting);
    RankLoad {
        rank,
        waiting: queue,
        deferred: waiting.saturating_sub(queue),
        running: u64::from(record.running_requests),
        kv_usage: record.token_usage.clamp(0.0, 1.0),
        kv_capacity: record
            .max_total_num_tokens
            .and_then(|t| u64::try_from(t).ok())
            .or_else(|| kept(|r| r.kv_capacity)),
        max_running: Some(u64::from(record.max_running_requests))
            .filter(|m| *m > 0)
            .or_else(|| kept(|r| r.max_running)),
        gen_throughput: Some(record.gen_throughput).filter(|t| t.is_finite()),
        retracted,
        // The prompt tokens the servicer has handed the engine without output yet, when it says
        // (the newer field), else SGLang's queued token work.
        pending_prefill_tokens: record
            .prefill_pending_tokens
            .max(record.waiting_uncached_tokens)
            .map(u64::from),
        ..RankLoad::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_proto::common::EngineQueues;

    #[test]
    fn a_record_reads_as_sglangs_report_and_keeps_the_telemetry_heartbeats_carry() {
        let whole = EngineLoad {
            running_requests: 3,
            waiting_requests: 5,
            token_usage: 0.4,
            max_running_requests: 64,
            max_total_num_tokens: Some(1000),
            waiting_uncached_tokens: Some(700),
            queues: Some(EngineQueues {
                waiting: 4,
                retracted: 1,
                ..Default::default()
            }),
            ..Default::default()
        };
        let first = rank_load(0, &whole, None);
        assert_eq!((first.waiting, first.deferred, first.running), (4, 1, 3));
        assert_eq!(
            (first.kv_capacity, first.max_running, first.retracted),
            (Some(1000), Some(64), Some(1))
        );
        assert_eq!(first.pending_prefill_tokens, Some(700));
        let core = EngineLoad {
            running_requests: 2,
            waiting_requests: 2,
            token_usage: 0.5,
            ..Default::default()
        };
        let next = rank_load(0, &core, Some(&first));
        assert_eq!(
            (next.waiting, next.deferred),
            (2, 0),
            "no queues: every waiting request"
        );
        assert_eq!(
            next.kv_capacity,
            Some(1000),
            "kept from the record that carried it"
        );
        assert_eq!(next.max_running, Some(64));
        assert_eq!(next.pending_prefill_tokens, None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_poll_steps_aside_only_while_every_pushing_rank_is_fresh() {
        let mut pushed = Pushed::new();
        let interval = Duration::from_secs(10);
        assert!(!pushed.fresh(interval), "nothing pushed yet: polled");
        let batch = |rank: i32| KvEventBatch {
            dp_rank: Some(rank),
            load: Some(EngineLoad::default()),
            ..KvEventBatch::default()
        };
        let Push::Report(report, _) = pushed.batch(&batch(0)) else {
            panic!("a record is a report");
        };
        assert_eq!(report.ranks.len(), 1);
        pushed.batch(&batch(1));
        assert!(pushed.fresh(interval));
        tokio::time::advance(Duration::from_secs(6)).await;
        pushed.batch(&batch(0));
        tokio::time::advance(Duration::from_secs(6)).await;
        assert!(
            !pushed.fresh(interval),
            "rank 1 fell silent: the poll takes over"
        );
        assert!(matches!(
            pushed.batch(&KvEventBatch::default()),
            Push::Contact
        ));
    }

    #[test]
    fn adapter_slots_are_each_ranks_added_and_kept_through_records_without_them() {
        let mut pushed = Pushed::new();
        let batch = |rank: i32, lora: Option<EngineLora>| KvEventBatch {
            dp_rank: Some(rank),
            load: Some(EngineLoad {
                lora,
                ..EngineLoad::default()
            }),
            ..KvEventBatch::default()
        };
        let slots = |used, total| EngineLora {
            slots_used: used,
            slots_total: total,
            utilization: 0.0,
        };
        let Push::Report(none, _) = pushed.batch(&batch(0, None)) else {
            panic!("a record is a report");
        };
        assert_eq!(none.adapters, None, "no record said");
        pushed.batch(&batch(0, Some(slots(2, 8))));
        pushed.batch(&batch(1, Some(slots(8, 8))));
        let Push::Report(both, _) = pushed.batch(&batch(0, None)) else {
            panic!("a record is a report");
        };
        let adapters = both.adapters.expect("the ranks' slots");
        assert_eq!((adapters.used, adapters.max), (Some(10), Some(16)));
    }
}
