//! What a worker's engine holds in its KV cache, as its KV events tell: the state precise prefix
//! routing reads (`sluice_core::engine_cache` decides; this is where it lives).
//!
//! One writer: the task that subscribes to the worker's events (`control::kv_events`, or the
//! load monitor for a gRPC worker's stream, which carries both). The route stage reads it under a
//! read lock held for one lookup, never across an `.await`; the writer holds the write lock for
//! one batch.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;
use serde::Serialize;
use sluice_core::engine_cache::{Applied, EngineCache, Numbered};
use sluice_core::kv_events::EventBatch;

/// A worker's held blocks and what its event streams have done.
#[derive(Debug)]
pub(crate) struct HeldIndex {
    cache: RwLock<EngineCache>,
    counts: Counts,
}

#[derive(Debug, Default)]
struct Counts {
    batches: AtomicU64,
    gaps: AtomicU64,
    lost: AtomicU64,
    orphaned: AtomicU64,
    refused: AtomicU64,
    malformed: AtomicU64,
    undecodable: AtomicU64,
}

impl Default for HeldIndex {
    fn default() -> Self {
        Self {
            cache: RwLock::new(EngineCache::new(0)),
            counts: Counts::default(),
        }
    }
}

/// What `/workers` shows of it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct PrefixCacheView {
    /// `events`: scored by the blocks its engine says it holds; `approximate`: by where this
    /// gateway sent prompts (no events flow from it).
    pub(crate) scored_by: &'static str,
    pub(crate) blocks: usize,
    /// The block size its events name (`null` before the first stored block).
    pub(crate) block_size: Option<usize>,
    pub(crate) batches: u64,
    /// Batches found missing by their numbers: what it held was forgotten each time.
    pub(crate) gaps: u64,
    /// Streams lost (disconnected, ended): forgotten the same way.
    pub(crate) lost: u64,
    /// Stored blocks whose parent was unknown (stored before the gateway listened, or lost).
    pub(crate) orphaned: u64,
    /// Stored blocks refused because the index was full (`--kv-events-max-blocks`).
    pub(crate) refused: u64,
    /// Events that could not be applied, and payloads that could not be decoded.
    pub(crate) malformed: u64,
    pub(crate) undecodable: u64,
    /// Each live stream (a ZMQ publisher's rank; a gRPC worker's one stream) and the number
    /// of the last batch applied from it.
    pub(crate) streams: Vec<StreamView>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct StreamView {
    pub(crate) stream: u32,
    pub(crate) last_batch: u64,
}

impl HeldIndex {
    /// Starts afresh with room for `capacity_per_rank` blocks on each rank (the writer, once,
    /// before its first batch).
    pub(crate) fn begin(&self, capacity_per_rank: usize) {
        *self.cache.write() = EngineCache::new(capacity_per_rank);
    }

    /// Applies one batch of the worker's events.
    pub fn apply(&self, numbered: Numbered, rank: u32, batch: &EventBatch) -> Applied {
        let applied = self.cache.write().apply(numbered, rank, batch);
        let c = &self.counts;
        c.batches.fetch_add(1, Ordering::Relaxed);
        for (count, n) in [
            (&c.gaps, usize::from(applied.gap)),
            (&c.orphaned, applied.orphaned),
            (&c.refused, applied.refused),
            (&c.malformed, applied.malformed),
        ] {
            count.fetch_add(n as u64, Ordering::Relaxed);
        }
        applied
    }

    /// A stream broke: what its ranks held is forgotten (counted when it was live).
    pub(crate) fn lost(&self, stream: u32) {
        let was_live = self.cache.write().lost(stream);
        self.counts
            .lost
            .fetch_add(u64::from(was_live), Ordering::Relaxed);
    }

    /// Every stream broke at once (a gRPC worker's one stream).
    pub(crate) fn lost_all(&self) {
        let was_live = self.cache.write().lost_all();
        self.counts
            .lost
            .fetch_add(u64::from(was_live), Ordering::Relaxed);
    }

    /// A payload that was not a batch.
    pub(crate) fn undecodable(&self) {
        self.counts.undecodable.fetch_add(1, Ordering::Relaxed);
    }

    /// The block sizes its ranks cut prompts into, while events flow.
    pub(crate) fn block_sizes(&self) -> Vec<usize> {
        let cache = self.cache.read();
        if !cache.is_live() {
            return Vec::new();
        }
        cache.block_sizes().into_iter().collect()
    }

    /// How many of a prompt's leading blocks of `block_size` its best rank holds.
    pub(crate) fn held_prefix(&self, block_size: usize, keys: &[u64]) -> usize {
        self.cache.read().held_prefix(block_size, keys)
    }

    pub(crate) fn view(&self) -> PrefixCacheView {
        let cache = self.cache.read();
        let c = &self.counts;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PrefixCacheView {
            scored_by: if cache.is_live() {
                "events"
            } else {
                "approximate"
            },
            blocks: cache.blocks(),
            block_size: cache.block_sizes().into_iter().next(),
            batches: get(&c.batches),
            gaps: get(&c.gaps),
            lost: get(&c.lost),
            orphaned: get(&c.orphaned),
            refused: get(&c.refused),
            malformed: get(&c.malformed),
            undecodable: get(&c.undecodable),
            streams: cache
                .last_numbers()
                .into_iter()
                .map(|n| StreamView {
                    stream: n.stream,
                    last_batch: n.sequence,
                })
                .collect(),
        }
    }
}
