//! A gRPC worker's KV-event stream as a source of held blocks: the same stream that carries its
//! load records carries its engine's block events (smg-grpc-proto 0.4.28's `KvCacheEvent`), each
//! block with its token ids and the block it follows. They are read as the ZMQ publishers'
//! batches are (`sluice_core::engine_cache`): every rank's batches on one stream, each rank's
//! numbered on its own (smg-grpc-servicer 0.14.1 relays each rank's numbering and repeats the
//! last number on heartbeats), so each rank is a stream of its own in the index, and losing
//! the gRPC stream loses them all.

use sluice_core::engine_cache::Numbered;
use sluice_core::kv_events::{AdapterTag, EventBatch, KvEvent};
use sluice_proto::common::kv_cache_event::Data;
use sluice_proto::common::{KvBlocksStored, KvCacheTier, KvEventBatch};

use crate::fleet::Worker;

/// Applies a batch's block events to what the worker's engine is known to hold.
pub(super) fn apply(worker: &Worker, batch: &KvEventBatch) {
    let events = batch_of(batch);
    let rank = events.dp_rank.unwrap_or(0);
    let numbered = Numbered {
        stream: rank,
        sequence: batch.sequence_number,
    };
    worker.held.apply(numbered, rank, &events);
}

fn batch_of(batch: &KvEventBatch) -> EventBatch {
    EventBatch {
        ts: batch.timestamp,
        events: batch
            .events
            .iter()
            .filter_map(|e| e.data.as_ref())
            .map(event_of)
            .collect(),
        dp_rank: batch.dp_rank.and_then(|r| u32::try_from(r).ok()),
    }
}

fn event_of(data: &Data) -> KvEvent {
    match data {
        Data::Stored(stored) => stored_of(stored),
        Data::Removed(removed) => KvEvent::Removed {
            hashes: removed.block_hashes.iter().map(|&h| h as u64).collect(),
            medium: medium(removed.medium.as_deref(), removed.tier),
            group: removed.group_idx,
        },
        Data::Cleared(_) => KvEvent::AllCleared,
    }
}

fn stored_of(stored: &KvBlocksStored) -> KvEvent {
    KvEvent::Stored {
        hashes: stored.blocks.iter().map(|b| b.block_hash as u64).collect(),
        parent: stored.parent_block_hash.map(|h| h as u64),
        tokens: stored
            .blocks
            .iter()
            .flat_map(|b| b.token_ids.iter().copied())
            .collect(),
        block_size: stored
            .blocks
            .first()
            .map_or(0, |b| usize::try_from(b.block_size).unwrap_or(0)),
        medium: medium(stored.medium.as_deref(), stored.tier),
        group: stored.group_idx,
        adapter: adapter_of(stored),
    }
}

/// The adapter the blocks are in: the batch's `lora_name`, else the blocks' `lora_id` (each
/// block carries its own; one event's blocks are one request's, so the first's stands).
fn adapter_of(stored: &KvBlocksStored) -> Option<AdapterTag> {
    stored
        .lora_name
        .clone()
        .map(AdapterTag::Name)
        .or_else(|| stored.blocks.first()?.lora_id.map(AdapterTag::Id))
}

/// Where the blocks live, as the core reads it (`None`: the GPU): the event's medium when it
/// names one, else its tier's.
fn medium(named: Option<&str>, tier: Option<i32>) -> Option<String> {
    if let Some(named) = named {
        return Some(named.to_string());
    }
    match tier.and_then(|t| KvCacheTier::try_from(t).ok()) {
        Some(KvCacheTier::Host) => Some("CPU".into()),
        Some(KvCacheTier::Disk) => Some("DISK".into()),
        Some(KvCacheTier::External) => Some("EXTERNAL".into()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_proto::common::{KvBlock, KvBlocksRemoved, KvCacheEvent};

    #[test]
    fn blocks_read_as_one_stored_event_and_tiers_as_media() {
        let block = |hash: i64, ids: &[u32]| KvBlock {
            block_hash: hash,
            token_ids: ids.to_vec(),
            block_size: 2,
            ..Default::default()
        };
        let stored = KvBlocksStored {
            blocks: vec![block(-1, &[1, 2]), block(7, &[3, 4])],
            parent_block_hash: Some(5),
            lora_name: Some("sql".into()),
            ..Default::default()
        };
        let removed = KvBlocksRemoved {
            block_hashes: vec![7],
            tier: Some(KvCacheTier::Host as i32),
            ..Default::default()
        };
        let batch = KvEventBatch {
            sequence_number: 3,
            dp_rank: Some(1),
            events: vec![
                KvCacheEvent {
                    data: Some(Data::Stored(stored)),
                    ..Default::default()
                },
                KvCacheEvent {
                    data: Some(Data::Removed(removed)),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let read = batch_of(&batch);
        assert_eq!(read.dp_rank, Some(1));
        assert_eq!(
            read.events[0],
            KvEvent::Stored {
                hashes: vec![u64::MAX, 7],
                parent: Some(5),
                tokens: vec![1, 2, 3, 4],
                block_size: 2,
                medium: None,
                group: None,
                adapter: Some(AdapterTag::Name("sql".into())),
            }
        );
        assert_eq!(
            read.events[1],
            KvEvent::Removed {
                hashes: vec![7],
                medium: Some("CPU".into()),
                group: None,
            }
        );
    }
}
