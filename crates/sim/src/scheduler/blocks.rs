//! The KV block pool of one data-parallel rank.
//!
//! Only counts are kept: the simulator needs to know how many blocks are free, not which ones.
//! Every block in use belongs to exactly one running request, and the scheduler's property tests
//! check that the pool's count always equals the sum of the blocks its running requests hold.

use super::prefix::{Acquired, PrefixCache};
use super::Seq;

/// A fixed pool of KV cache blocks.
#[derive(Debug, Clone)]
pub struct BlockPool {
    /// Blocks the GPU has for the KV cache (`--num-gpu-blocks`).
    total: u32,
    /// Blocks currently held by running requests.
    used: u32,
}

impl BlockPool {
    pub fn new(total: u32) -> Self {
        Self { total, used: 0 }
    }

    pub fn total(&self) -> u32 {
        self.total
    }

    pub fn used(&self) -> u32 {
        self.used
    }

    pub fn free(&self) -> u32 {
        self.total - self.used
    }

    /// Takes `n` blocks if that many are free; otherwise takes none.
    pub fn try_take(&mut self, n: u32) -> bool {
        if n <= self.free() {
            self.used += n;
            true
        } else {
            false
        }
    }

    /// Returns `n` blocks to the pool.
    pub fn give_back(&mut self, n: u32) {
        debug_assert!(n <= self.used, "returning more blocks than are in use");
        self.used -= n.min(self.used);
    }

    /// The fraction of blocks in use, as `vllm:kv_cache_usage_perc` reports it.
    pub fn usage(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            f64::from(self.used) / f64::from(self.total)
        }
    }
}

/// Blocks needed to hold `tokens` tokens of KV cache.
pub fn blocks_for(tokens: u32, block_size: u32) -> u32 {
    tokens.div_ceil(block_size.max(1))
}

/// Takes `n` free blocks, evicting the least recently released cached ones as needed, so the
/// evictable blocks never outnumber the free ones.
pub(super) fn take_blocks(pool: &mut BlockPool, cache: &mut PrefixCache, n: u32) -> bool {
    if !pool.try_take(n) {
        return false;
    }
    cache.shrink_to(pool.free());
    true
}

/// Returns a sequence's blocks: its own to the pool, its shared ones to the cache (which frees
/// them once nobody holds them, keeping them cached until evicted). The last block is released
/// first, as vLLM frees a request's blocks, so eviction eats a prefix from its tail and what is
/// left of it can still be hit.
pub(super) fn return_blocks(pool: &mut BlockPool, cache: &mut PrefixCache, seq: &mut Seq) {
    pool.give_back(seq.blocks - seq.shared);
    for hash in seq.prefix[..seq.shared as usize].iter().rev() {
        if cache.release(*hash) {
            pool.give_back(1);
        }
    }
    seq.blocks = 0;
    seq.shared = 0;
}

/// Caches the prompt blocks a prefill step completed. A block computed by two requests at once
/// is cached once: the later one drops its copy and shares the cached block.
pub(super) fn cache_computed(
    pool: &mut BlockPool,
    cache: &mut PrefixCache,
    seq: &mut Seq,
    block_size: u32,
) {
    let full =
        (seq.computed.min(seq.prompt_tokens) / block_size.max(1)).min(seq.prefix.len() as u32);
    let size = block_size.max(1) as usize;
    while seq.shared < full {
        let at = seq.shared as usize;
        let hash = seq.prefix[at];
        let parent = at.checked_sub(1).map(|p| seq.prefix[p]);
        let tokens = seq
            .prompt
            .get(at * size..(at + 1) * size)
            .unwrap_or_default();
        if !cache.register(hash, parent, tokens, seq.adapter.as_ref()) {
            if cache.acquire(hash) == Some(Acquired::Revived) {
                pool.try_take(1);
            }
            pool.give_back(1);
        }
        seq.shared += 1;
    }
}
