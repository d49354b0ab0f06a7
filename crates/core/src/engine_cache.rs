//! What one worker's engine holds in its KV cache, across its data-parallel ranks, as its event
//! streams tell it: the state precise prefix routing reads.
//!
//! A worker's events come over one or more streams: a ZMQ publisher per rank (vLLM and SGLang
//! put rank `r` on the configured port plus `r`), or one gRPC stream carrying every rank's
//! batches. Each stream numbers its batches; a number skipped means batches were lost, so what
//! the ranks that stream feeds were known to hold can no longer be trusted and is cleared
//! (blocks stored after the gap whose parents were lost become orphans until the prompt is
//! stored again). A stream that breaks is cleared the same way.
//!
//! Each rank keeps its own `HeldBlocks`: a request lands on one rank (the engine's own balancer
//! picks it), so a worker's match is its best rank's, not the union of theirs.
//!
//! Only the GPU's blocks count: an offload tier (vLLM's CPU offload, SGLang's host cache) holds
//! blocks the engine must load back before it can skip their prefill, and vLLM's lazy offload
//! announces them without token ids. Events of other KV cache groups than the first (hybrid
//! models' sliding-window groups) describe the same tokens again and are skipped too.

use std::collections::{BTreeMap, BTreeSet};

use crate::held_blocks::{event_chain_start, EventError, HeldBlocks, Stored};
use crate::kv_events::{EventBatch, KvEvent};

/// A batch's place on its stream: vLLM's and SGLang's ZMQ publishers count from 0 by one per
/// batch (a restarted engine from 0 again); smg-grpc-servicer repeats the last number on
/// heartbeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Numbered {
    pub stream: u32,
    pub sequence: u64,
}

/// What applying one batch did, for the subscriber's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Applied {
    /// Batches were missed before this one: its stream's ranks were cleared first.
    pub gap: bool,
    /// The last batch's number again (a servicer's heartbeat): nothing done.
    pub repeated: bool,
    pub added: usize,
    pub removed: usize,
    /// Stored blocks whose parent was unknown.
    pub orphaned: usize,
    /// Stored blocks refused because the rank's index is full.
    pub refused: usize,
    /// Events not about the GPU's first cache group, or of a kind not known: skipped.
    pub skipped: usize,
    /// Events the index cannot apply (block size 0, ids not filling the blocks, a changed
    /// block size): skipped, the first such error kept.
    pub malformed: usize,
    pub error: Option<EventError>,
    pub cleared: bool,
}

/// One engine's cache as its events describe it.
#[derive(Debug, Clone)]
pub struct EngineCache {
    ranks: BTreeMap<u32, HeldBlocks>,
    /// Each stream's last batch number, and the ranks it has fed.
    streams: BTreeMap<u32, (u64, BTreeSet<u32>)>,
    /// Blocks per rank at most.
    capacity: usize,
}

impl EngineCache {
    pub fn new(capacity_per_rank: usize) -> Self {
        Self {
            ranks: BTreeMap::new(),
            streams: BTreeMap::new(),
            capacity: capacity_per_rank,
        }
    }

    /// Applies a batch that came on a stream with this number, for `rank` when the batch does
    /// not name one (the rank a ZMQ port serves).
    pub fn apply(&mut self, numbered: Numbered, rank: u32, batch: &EventBatch) -> Applied {
        let mut applied = Applied::default();
        let rank = batch.dp_rank.unwrap_or(rank);
        if batch.events.is_empty() && !self.streams.contains_key(&numbered.stream) {
            // A stream that has carried no event yet (a servicer's heartbeats, an engine
            // without KV events behind it) says nothing of the cache: it is not live.
            return applied;
        }
        match self.streams.get(&numbered.stream) {
            Some((last, _)) if numbered.sequence == *last => {
                applied.repeated = true;
                return applied;
            }
            // Numbers skipped, or counting again from below (the publisher restarted, its
            // cache with it): either way what was known is not any more.
            Some((last, _)) if numbered.sequence != last + 1 => {
                applied.gap = true;
                self.lost(numbered.stream);
            }
            _ => {}
        }
        let entry = self
            .streams
            .entry(numbered.stream)
            .or_insert_with(|| (numbered.sequence, BTreeSet::new()));
        entry.0 = numbered.sequence;
        entry.1.insert(rank);
        let capacity = self.capacity;
        let held = self
            .ranks
            .entry(rank)
            .or_insert_with(|| HeldBlocks::new(capacity));
        for event in &batch.events {
            apply_event(held, event, &mut applied);
        }
        applied
    }

    /// The stream broke or skipped batches: what the ranks it fed hold is no longer known. The
    /// next batch on it starts afresh, whatever its number. Whether it was live.
    pub fn lost(&mut self, stream: u32) -> bool {
        let Some((_, ranks)) = self.streams.remove(&stream) else {
            return false;
        };
        for rank in ranks {
            if let Some(held) = self.ranks.get_mut(&rank) {
                held.clear();
            }
        }
        true
    }

    /// Every stream lost at once (a gRPC worker's one stream carries every rank's). Whether
    /// any was live.
    pub fn lost_all(&mut self) -> bool {
        let streams: Vec<u32> = self.streams.keys().copied().collect();
        let mut any = false;
        for stream in streams {
            any |= self.lost(stream);
        }
        any
    }

    /// Each live stream's last batch number.
    pub fn last_numbers(&self) -> Vec<Numbered> {
        self.streams
            .iter()
            .map(|(&stream, &(sequence, _))| Numbered { stream, sequence })
            .collect()
    }

    /// A stream has delivered a batch and has not been lost since: events flow.
    pub fn is_live(&self) -> bool {
        !self.streams.is_empty()
    }

    #[cfg(test)]
    fn is_live_stream(&self, stream: u32) -> bool {
        self.streams.contains_key(&stream)
    }

    /// Blocks held, summed over the ranks (each rank's cache is its own).
    pub fn blocks(&self) -> usize {
        self.ranks.values().map(HeldBlocks::len).sum()
    }

    /// The block sizes the ranks cut prompts into (one, in practice).
    pub fn block_sizes(&self) -> BTreeSet<usize> {
        self.ranks
            .values()
            .filter_map(HeldBlocks::block_size)
            .collect()
    }

    /// How many of a prompt's leading blocks (`keys`, cut in `block_size`) the best rank holds.
    pub fn held_prefix(&self, block_size: usize, keys: &[u64]) -> usize {
        self.ranks
            .values()
            .filter(|held| held.block_size() == Some(block_size))
            .map(|held| held.held_prefix(keys))
            .max()
            .unwrap_or(0)
    }
}

/// Whether an event is about the blocks prefix routing reads: the GPU's, first group.
fn counted(medium: Option<&str>, group: Option<u32>) -> bool {
    medium.is_none_or(|m| m.eq_ignore_ascii_case("gpu")) && group.unwrap_or(0) == 0
}

fn apply_event(held: &mut HeldBlocks, event: &KvEvent, applied: &mut Applied) {
    match event {
        KvEvent::Stored {
            hashes,
            parent,
            tokens,
            block_size,
            medium,
            group,
            adapter,
        } if counted(medium.as_deref(), *group) => {
            let stored = Stored {
                parent: *parent,
                engine_hashes: hashes,
                tokens,
                block_size: *block_size,
                start: event_chain_start(adapter.as_ref()),
            };
            match held.store(&stored) {
                Ok(outcome) => {
                    applied.added += outcome.added;
                    applied.orphaned += outcome.orphaned;
                    applied.refused += outcome.refused;
                }
                Err(e) => {
                    applied.malformed += 1;
                    applied.error.get_or_insert(e);
                }
            }
        }
        KvEvent::Removed {
            hashes,
            medium,
            group,
        } if counted(medium.as_deref(), *group) => {
            applied.removed += held.remove(hashes);
        }
        KvEvent::AllCleared => {
            held.clear();
            applied.cleared = true;
        }
        _ => applied.skipped += 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::held_blocks::token_block_hashes;

    const BS: usize = 4;

    fn stored(hashes: &[u64], parent: Option<u64>, tokens: &[u32]) -> KvEvent {
        KvEvent::Stored {
            hashes: hashes.to_vec(),
            parent,
            tokens: tokens.to_vec(),
            block_size: BS,
            medium: None,
            group: None,
            adapter: None,
        }
    }

    fn batch(events: Vec<KvEvent>) -> EventBatch {
        EventBatch {
            ts: 0.0,
            events,
            dp_rank: None,
        }
    }

    fn at(stream: u32, sequence: u64) -> Numbered {
        Numbered { stream, sequence }
    }

    const PROMPT: [u32; 8] = [1, 2, 3, 4, 5, 6, 7, 8];

    fn keys() -> Vec<u64> {
        token_block_hashes(0, &PROMPT, BS, 100)
    }

    #[test]
    fn a_gap_in_the_numbers_clears_what_that_streams_ranks_held() {
        let mut cache = EngineCache::new(100);
        let first = cache.apply(at(0, 0), 0, &batch(vec![stored(&[10, 11], None, &PROMPT)]));
        assert_eq!((first.added, first.gap), (2, false));
        cache.apply(at(1, 0), 1, &batch(vec![stored(&[20, 21], None, &PROMPT)]));
        assert_eq!(cache.held_prefix(BS, &keys()), 2);
        assert!(
            !cache.apply(at(2, 0), 2, &batch(vec![])).gap && !cache.is_live_stream(2),
            "heartbeats alone do not make a stream live"
        );
        let next = cache.apply(at(0, 1), 0, &batch(vec![]));
        assert!(!next.gap, "the next number: no gap");
        let gapped = cache.apply(at(1, 3), 1, &batch(vec![]));
        assert!(gapped.gap, "2 was never seen");
        assert_eq!(cache.blocks(), 2, "rank 1 cleared, rank 0 kept");
        assert!(cache.apply(at(1, 3), 1, &batch(vec![])).repeated);
        cache.apply(at(1, 4), 1, &batch(vec![stored(&[20, 21], None, &PROMPT)]));
        let restarted = cache.apply(at(1, 0), 1, &batch(vec![]));
        assert!(
            restarted.gap,
            "counting from 0 again: the publisher restarted"
        );
        assert_eq!(cache.blocks(), 2, "rank 1 cleared again");
        assert!(cache.lost(0), "stream 0 was live");
        assert!(!cache.lost(0), "and is not any more");
        assert_eq!(cache.held_prefix(BS, &keys()), 0, "a lost stream clears");
        assert!(cache.is_live(), "stream 1 still flows");
        cache.lost(1);
        assert!(!cache.is_live());
        assert!(
            !cache.apply(at(0, 9), 0, &batch(vec![])).gap,
            "a stream opened again starts afresh"
        );
    }

    #[test]
    fn a_worker_matches_as_its_best_rank_does_and_counts_each_ranks_blocks() {
        let mut cache = EngineCache::new(100);
        let mut one = batch(vec![stored(&[10], None, &PROMPT[..4])]);
        one.dp_rank = Some(1);
        let mut two = batch(vec![stored(&[20, 21], None, &PROMPT)]);
        two.dp_rank = Some(2);
        // One stream carrying both ranks, as a gRPC worker's does.
        cache.apply(at(0, 1), 0, &one);
        cache.apply(at(0, 2), 0, &two);
        assert_eq!(cache.held_prefix(BS, &keys()), 2);
        assert_eq!(cache.held_prefix(8, &keys()), 0, "another block size");
        assert_eq!(cache.blocks(), 3);
        assert_eq!(cache.block_sizes().into_iter().collect::<Vec<_>>(), [BS]);
        cache.lost(0);
        assert_eq!(cache.blocks(), 0, "the stream fed both ranks");
        cache.apply(at(1, 1), 1, &one);
        cache.apply(at(2, 1), 2, &two);
        assert!(cache.lost_all());
        assert_eq!((cache.blocks(), cache.is_live()), (0, false));
        assert!(!cache.lost_all(), "nothing left live");
    }

    #[test]
    fn only_the_gpus_first_group_counts_and_bad_events_do_not_stop_a_batch() {
        let mut cache = EngineCache::new(100);
        let offloaded = KvEvent::Stored {
            hashes: vec![30],
            parent: None,
            tokens: Vec::new(),
            block_size: BS,
            medium: Some("CPU".into()),
            group: None,
            adapter: None,
        };
        let second_group = KvEvent::Stored {
            hashes: vec![31],
            parent: None,
            tokens: PROMPT[..4].to_vec(),
            block_size: BS,
            medium: Some("GPU".into()),
            group: Some(1),
            adapter: None,
        };
        let short = stored(&[40], None, &PROMPT[..3]);
        let applied = cache.apply(
            at(0, 0),
            0,
            &batch(vec![
                offloaded,
                second_group,
                short,
                KvEvent::Other("BlockTransferred".into()),
                stored(&[10, 11], None, &PROMPT),
                KvEvent::Removed {
                    hashes: vec![11],
                    medium: Some("CPU".into()),
                    group: None,
                },
            ]),
        );
        assert_eq!(
            (applied.skipped, applied.malformed, applied.added),
            (4, 1, 2)
        );
        assert!(matches!(
            applied.error,
            Some(EventError::TokensDoNotFill { .. })
        ));
        assert_eq!(
            cache.held_prefix(BS, &keys()),
            2,
            "a CPU removal leaves the GPU's"
        );
        let cleared = cache.apply(at(0, 1), 0, &batch(vec![KvEvent::AllCleared]));
        assert!(cleared.cleared);
        assert_eq!(cache.blocks(), 0);
    }
}
