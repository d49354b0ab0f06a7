//! `SubscribeKvEvents`: the engine's KV events with its load on every batch, and heartbeats
//! through quiet spells, as smg-grpc-servicer 0.14.1 relays them (`kv_relay.py`, `relay`;
//! `load_record.py`, `LoadRecorder`).
//!
//! Each rank's batches keep the rank's own numbering. Without KV events (SGLang started without
//! `--kv-events-config`) the call is `UNIMPLEMENTED`; a cursor other than 0 is `OUT_OF_RANGE`
//! ("resubscribe with zero and rebuild"); a subscriber that falls behind the engine's backlog
//! loses events, and the stream ends with `DATA_LOSS`, as the relay ends one that skipped.
//! The `events-stop` and `one-way` faults drop every batch and heartbeat while they stand.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::stream::{self, StreamExt};
use sluice_proto::common::kv_cache_event::Data;
use sluice_proto::common::{
    EngineLoad, KvBlock, KvBlocksRemoved, KvBlocksStored, KvCacheEvent, KvEventBatch,
    SubscribeKvEventsRequest,
};
use tokio::sync::{broadcast, mpsc};
use tokio::time::{Instant, MissedTickBehavior};
use tonic::Status;

use super::{load, Streamed};
use crate::api::ApiState;
use crate::engine::KvBatch;
use crate::scheduler::prefix::CacheEvent;

/// How often the record is checked between batches (`LOAD_TICK`).
const LOAD_TICK: Duration = Duration::from_millis(100);
/// Silence after which a heartbeat goes out (`HEARTBEAT_INTERVAL`).
const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);
/// The interval once two heartbeats in a row carried an unchanged record (`HEARTBEAT_BACKOFF`).
const HEARTBEAT_BACKOFF: Duration = Duration::from_secs(5);

/// One subscriber's load records: numbered, trimmed to the core between heartbeats, paced.
/// Pure: the caller passes the time and the engine's current record.
#[derive(Debug)]
pub struct LoadRecorder {
    sample: u64,
    last_record: Option<EngineLoad>,
    last_sent_at: Instant,
    idle_heartbeats: u32,
    last_rank: Option<i32>,
    last_sequence: Option<u64>,
}

impl LoadRecorder {
    pub fn new(now: Instant) -> Self {
        Self {
            sample: 0,
            last_record: None,
            last_sent_at: now,
            idle_heartbeats: 0,
            last_rank: None,
            last_sequence: None,
        }
    }

    /// The rank whose record a heartbeat carries: that of the last batch sent.
    pub fn rank(&self) -> Option<i32> {
        self.last_rank
    }

    fn numbered(&mut self, current: EngineLoad, load_only: bool) -> EngineLoad {
        let mut record = current.clone();
        self.sample += 1;
        record.sample = self.sample;
        record.load_only = load_only;
        if !load_only && self.sample > 1 {
            // Telemetry rides the first record and the heartbeats only.
            record.cache_hit_rate = None;
            record.num_used_tokens = None;
            record.max_total_num_tokens = None;
            record.memory = None;
            record.queues = None;
            record.speculative = None;
            record.lora = None;
            record.disaggregation = None;
        }
        self.last_record = Some(current);
        record
    }

    /// Puts the record on a batch about to go out, and notes that it went.
    pub fn stamp(&mut self, batch: &mut KvEventBatch, now: Instant, current: Option<EngineLoad>) {
        self.last_rank = batch.dp_rank;
        self.last_sequence = Some(batch.sequence_number);
        self.last_sent_at = now;
        self.idle_heartbeats = 0;
        if let Some(current) = current {
            batch.load = Some(self.numbered(current, false));
        }
    }

    /// A `load_only` batch when the record moved since the last one, or after the heartbeat
    /// interval of silence (the backoff after two unchanged heartbeats); none before the first
    /// batch, which gives a heartbeat its sequence number to repeat.
    pub fn heartbeat(&mut self, now: Instant, current: Option<EngineLoad>) -> Option<KvEventBatch> {
        let sequence = self.last_sequence?;
        let current = current?;
        let changed = self
            .last_record
            .as_ref()
            .is_none_or(|last| load_changed(last, &current));
        let due_after = if self.idle_heartbeats >= 2 {
            HEARTBEAT_BACKOFF
        } else {
            HEARTBEAT_INTERVAL
        };
        if !changed && now.duration_since(self.last_sent_at) < due_after {
            return None;
        }
        let record = self.numbered(current, true);
        self.last_sent_at = now;
        self.idle_heartbeats = if changed { 0 } else { self.idle_heartbeats + 1 };
        Some(KvEventBatch {
            sequence_number: sequence,
            timestamp: unix_now(),
            dp_rank: self.last_rank,
            load: Some(record),
            ..Default::default()
        })
    }
}

/// Whether the record moved enough to be worth a heartbeat (`load_changed`): any queue,
/// running or window change, KV usage by half a percent, the rate by 5% or 50 tokens/s.
fn load_changed(last: &EngineLoad, current: &EngineLoad) -> bool {
    let active = |r: &EngineLoad| r.active_token_usage.unwrap_or(r.token_usage);
    if last.running_requests != current.running_requests
        || last.waiting_requests != current.waiting_requests
        || last.waiting_uncached_tokens != current.waiting_uncached_tokens
        || last.max_running_requests != current.max_running_requests
        || (last.token_usage - current.token_usage).abs() > 0.005
        || (active(last) - active(current)).abs() > 0.005
    {
        return true;
    }
    let delta = (last.gen_throughput - current.gen_throughput).abs();
    delta > 50.0 || delta > 0.05 * last.gen_throughput.max(current.gen_throughput)
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// A step's cache changes as the protocol's events: each stored block with its tokens and the
/// block it follows, and each run of evictions as one removal.
fn events_of(batch: &KvBatch, block_size: u32, next_id: &mut u64) -> Vec<KvCacheEvent> {
    let mut out: Vec<KvCacheEvent> = Vec::with_capacity(batch.events.len());
    for event in &batch.events {
        let data = match event {
            // SGLang's events carry no adapter (`lora_id=None`), so the servicer's blocks do not.
            CacheEvent::Stored {
                hash,
                parent,
                tokens,
                adapter: _,
            } => Data::Stored(KvBlocksStored {
                blocks: vec![KvBlock {
                    block_hash: *hash as i64,
                    token_ids: tokens.clone(),
                    block_size: block_size as i32,
                    ..Default::default()
                }],
                parent_block_hash: parent.map(|p| p as i64),
                ..Default::default()
            }),
            &CacheEvent::Removed(hash) => {
                if let Some(Data::Removed(removed)) = out.last_mut().and_then(|e| e.data.as_mut()) {
                    removed.block_hashes.push(hash as i64);
                    continue;
                }
                Data::Removed(KvBlocksRemoved {
                    block_hashes: vec![hash as i64],
                    ..Default::default()
                })
            }
        };
        *next_id += 1;
        out.push(KvCacheEvent {
            event_id: *next_id,
            data: Some(data),
        });
    }
    out
}

/// Opens the stream, or says why not.
pub(super) fn subscribe(
    st: &Arc<ApiState>,
    request: &SubscribeKvEventsRequest,
) -> Result<Streamed<KvEventBatch>, Status> {
    let grpc = st.engine.config().grpc.unwrap_or_default();
    if !grpc.kv_events {
        return Err(Status::unimplemented(
            "KV cache events not enabled. Start SGLang with --kv-events-config '{\"publisher\": \"zmq\"}'",
        ));
    }
    if request.start_sequence_number != 0 {
        return Err(Status::out_of_range(
            "KV event replay cursors are per subscription; resubscribe with zero and rebuild",
        ));
    }
    let relay = Relay {
        st: st.clone(),
        batches: st.engine.subscribe_kv_events(),
        recorder: grpc.load_records.then(|| LoadRecorder::new(Instant::now())),
        next_event_id: 0,
        silence: grpc.report_silence.then(load::SilenceClock::default),
    };
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(relay.run(tx));
    Ok(stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) }).boxed())
}

/// One subscriber's relay from the engine's batches to its stream.
struct Relay {
    st: Arc<ApiState>,
    batches: broadcast::Receiver<Arc<KvBatch>>,
    recorder: Option<LoadRecorder>,
    next_event_id: u64,
    /// A newer servicer's silence figure (`--report-engine-silence`).
    silence: Option<load::SilenceClock>,
}

impl Relay {
    /// The engine's record for `rank` now, as the servicer builds it.
    fn record(&mut self, rank: u32) -> Option<EngineLoad> {
        let silence = self.silence.as_mut().map(|clock| clock.read(&self.st));
        load::record(&self.st, rank, silence)
    }

    async fn run(mut self, tx: mpsc::Sender<Result<KvEventBatch, Status>>) {
        let mut tick = tokio::time::interval(LOAD_TICK);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            let out = tokio::select! {
                () = tx.closed() => return,
                batch = self.batches.recv() => match batch {
                    Ok(batch) => self.forward(&batch),
                    Err(broadcast::error::RecvError::Lagged(skipped)) => Some(Err(Status::data_loss(
                        format!("the subscriber fell {skipped} batches behind; clear and resubscribe"),
                    ))),
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = tick.tick() => self.heartbeat().map(Ok),
            };
            let Some(out) = out else { continue };
            let last = out.is_err();
            if tx.send(out).await.is_err() || last {
                return;
            }
        }
    }

    /// Whether the faults keep everything from the subscriber now.
    fn silenced(&self) -> bool {
        let faults = self.st.engine.faults();
        faults.events_stopped || faults.one_way
    }

    fn forward(&mut self, batch: &KvBatch) -> Option<Result<KvEventBatch, Status>> {
        if self.silenced() {
            return None;
        }
        let block_size = self.st.engine.config().block_size;
        let mut out = KvEventBatch {
            sequence_number: batch.sequence,
            timestamp: unix_now(),
            events: events_of(batch, block_size, &mut self.next_event_id),
            dp_rank: Some(batch.rank as i32),
            ..Default::default()
        };
        if self.recorder.is_some() {
            let current = self.record(batch.rank);
            if let Some(recorder) = self.recorder.as_mut() {
                recorder.stamp(&mut out, Instant::now(), current);
            }
        }
        Some(Ok(out))
    }

    fn heartbeat(&mut self) -> Option<KvEventBatch> {
        if self.silenced() {
            return None;
        }
        let rank = self.recorder.as_ref()?.rank().unwrap_or(0).max(0) as u32;
        let current = self.record(rank);
        self.recorder.as_mut()?.heartbeat(Instant::now(), current)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(running: u32) -> EngineLoad {
        EngineLoad {
            running_requests: running,
            cache_hit_rate: Some(0.5),
            ..Default::default()
        }
    }

    fn batch(sequence: u64) -> KvEventBatch {
        KvEventBatch {
            sequence_number: sequence,
            dp_rank: Some(0),
            ..Default::default()
        }
    }

    #[test]
    fn records_are_numbered_and_telemetry_rides_the_first_and_the_heartbeats() {
        let t0 = Instant::now();
        let mut recorder = LoadRecorder::new(t0);
        assert!(
            recorder
                .heartbeat(t0 + Duration::from_secs(9), Some(load(1)))
                .is_none(),
            "no heartbeat before the first batch"
        );
        let mut first = batch(1);
        recorder.stamp(&mut first, t0, Some(load(1)));
        let record = first.load.unwrap();
        assert_eq!((record.sample, record.load_only), (1, false));
        assert_eq!(record.cache_hit_rate, Some(0.5));
        let mut second = batch(2);
        recorder.stamp(&mut second, t0, Some(load(1)));
        let record = second.load.unwrap();
        assert_eq!((record.sample, record.cache_hit_rate), (2, None));

        let beat = recorder.heartbeat(t0 + Duration::from_secs(1), Some(load(1)));
        let beat = beat.expect("a heartbeat after a second of silence");
        assert_eq!(
            beat.sequence_number, 2,
            "a heartbeat repeats the last sequence"
        );
        let record = beat.load.unwrap();
        assert_eq!((record.sample, record.load_only), (3, true));
        assert_eq!(record.cache_hit_rate, Some(0.5));
    }

    #[test]
    fn heartbeats_back_off_while_nothing_changes_and_go_at_once_when_it_does() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut recorder = LoadRecorder::new(t0);
        recorder.stamp(&mut batch(1), t0, Some(load(1)));
        assert!(recorder.heartbeat(at(900), Some(load(1))).is_none());
        assert!(recorder.heartbeat(at(1000), Some(load(1))).is_some());
        assert!(recorder.heartbeat(at(2000), Some(load(1))).is_some());
        // Two unchanged heartbeats: the next waits five seconds.
        assert!(recorder.heartbeat(at(3000), Some(load(1))).is_none());
        assert!(recorder.heartbeat(at(6900), Some(load(1))).is_none());
        assert!(recorder.heartbeat(at(7000), Some(load(1))).is_some());
        // A change goes out at the next tick, and resets the pace.
        let moved = recorder.heartbeat(at(7100), Some(load(2)));
        assert_eq!(
            moved.and_then(|b| b.load).map(|l| l.running_requests),
            Some(2)
        );
        assert!(recorder.heartbeat(at(8100), Some(load(2))).is_some());
        assert!(
            recorder.heartbeat(at(9100), None).is_none(),
            "no record to read, no heartbeat"
        );
    }

    #[test]
    fn a_step_becomes_stored_blocks_and_one_removal_per_run_of_evictions() {
        let batch = KvBatch {
            rank: 0,
            sequence: 7,
            events: vec![
                CacheEvent::Removed(1),
                CacheEvent::Removed(2),
                CacheEvent::Stored {
                    hash: 3,
                    parent: Some(9),
                    tokens: vec![5, 6],
                    adapter: None,
                },
                CacheEvent::Removed(4),
            ],
        };
        let mut next = 10;
        let events = events_of(&batch, 16, &mut next);
        let ids: Vec<u64> = events.iter().map(|e| e.event_id).collect();
        assert_eq!(ids, [11, 12, 13]);
        match &events[0].data {
            Some(Data::Removed(r)) => assert_eq!(r.block_hashes, [1, 2]),
            other => panic!("expected a removal, got {other:?}"),
        }
        match &events[1].data {
            Some(Data::Stored(s)) => {
                assert_eq!((s.blocks[0].block_hash, s.blocks[0].block_size), (3, 16));
                assert_eq!(s.blocks[0].token_ids, [5, 6]);
                assert_eq!(s.parent_block_hash, Some(9));
            }
            other => panic!("expected a store, got {other:?}"),
        }
    }
}
