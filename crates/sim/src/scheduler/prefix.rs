//! vLLM's automatic prefix caching for one rank's KV blocks.
//!
//! A full block of prompt tokens, once computed, is registered under the chained hash of its
//! tokens and every token before it. A later request whose leading blocks hash the same takes a
//! reference on those blocks instead of prefilling them again. A block nobody references stays
//! cached but counts as free (as vLLM's free block queue holds it); taking free blocks evicts the
//! least recently released cached ones first, after the never-used ones.
//!
//! The pool (`BlockPool`) counts blocks; this index only says which free and used blocks carry a
//! hash. Its invariant, kept by `Scheduler::take_blocks`: the evictable blocks are never more than
//! the free ones.

use std::collections::{BTreeSet, HashMap};

/// One cached block.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Running requests holding it; 0 means evictable.
    refs: u32,
    /// When its last reference was dropped (the index's own clock), for LRU eviction.
    released: u64,
}

/// A change to the blocks the cache holds, as an engine publishes it in its KV events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheEvent {
    /// A block was computed and cached under this hash, after the block `parent` (none: it is
    /// a prompt's first); it holds `tokens`, computed under `adapter` (`None`: the base model).
    Stored {
        hash: u64,
        parent: Option<u64>,
        tokens: Vec<u32>,
        adapter: Option<super::Adapter>,
    },
    /// A cached block was evicted.
    Removed(u64),
}

/// Block hash -> cached block.
#[derive(Debug, Default)]
pub struct PrefixCache {
    entries: HashMap<u64, Entry>,
    /// Evictable blocks, oldest release first.
    evictable: BTreeSet<(u64, u64)>,
    clock: u64,
    /// What changed since the engine last took the events.
    events: Vec<CacheEvent>,
}

/// What taking a reference did to the pool's count of used blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquired {
    /// The block was already held by another request.
    Shared,
    /// The block was evictable: it moves from free to used.
    Revived,
}

impl PrefixCache {
    /// How many of `blocks` (leading hashes of a prompt) are cached, in order, and how many of
    /// those are evictable (free) now.
    pub fn lookup(&self, blocks: &[u64]) -> (u32, u32) {
        let mut hits = 0;
        let mut evictable = 0;
        for hash in blocks {
            let Some(entry) = self.entries.get(hash) else {
                break;
            };
            hits += 1;
            if entry.refs == 0 {
                evictable += 1;
            }
        }
        (hits, evictable)
    }

    /// Takes a reference on a cached block; `None` when it is not cached.
    pub fn acquire(&mut self, hash: u64) -> Option<Acquired> {
        let entry = self.entries.get_mut(&hash)?;
        entry.refs += 1;
        if entry.refs == 1 {
            self.evictable.remove(&(entry.released, hash));
            Some(Acquired::Revived)
        } else {
            Some(Acquired::Shared)
        }
    }

    /// Caches a block just computed by a request that holds it (one reference): `hash`, after
    /// the block `parent`, holding `tokens`. False when the hash is cached already: the caller
    /// keeps its copy private.
    pub fn register(
        &mut self,
        hash: u64,
        parent: Option<u64>,
        tokens: &[u32],
        adapter: Option<&super::Adapter>,
    ) -> bool {
        if self.entries.contains_key(&hash) {
            return false;
        }
        self.entries.insert(
            hash,
            Entry {
                refs: 1,
                released: 0,
            },
        );
        self.events.push(CacheEvent::Stored {
            hash,
            parent,
            tokens: tokens.to_vec(),
            adapter: adapter.cloned(),
        });
        true
    }

    /// Drops a reference; true when the block became evictable (it returns to the free blocks).
    pub fn release(&mut self, hash: u64) -> bool {
        let Some(entry) = self.entries.get_mut(&hash) else {
            return false;
        };
        entry.refs = entry.refs.saturating_sub(1);
        if entry.refs > 0 {
            return false;
        }
        self.clock += 1;
        entry.released = self.clock;
        self.evictable.insert((self.clock, hash));
        true
    }

    /// Evicts the least recently released blocks until at most `free` remain evictable.
    pub fn shrink_to(&mut self, free: u32) {
        while self.evictable.len() > free as usize {
            let Some((_, hash)) = self.evictable.pop_first() else {
                break;
            };
            self.entries.remove(&hash);
            self.events.push(CacheEvent::Removed(hash));
        }
    }

    /// The changes since the last call, oldest first.
    pub fn take_events(&mut self) -> Vec<CacheEvent> {
        std::mem::take(&mut self.events)
    }

    /// Cached blocks nobody holds.
    pub fn evictable(&self) -> u32 {
        self.evictable.len() as u32
    }

    /// Cached blocks some running request holds.
    pub fn referenced(&self) -> u32 {
        (self.entries.len() - self.evictable.len()) as u32
    }

    /// The references on a block (tests check them against the running requests).
    pub fn refs(&self, hash: u64) -> Option<u32> {
        self.entries.get(&hash).map(|e| e.refs)
    }
}

/// The chained hashes of a prompt's full blocks: each block's hash covers its tokens and every
/// token before it, so two prompts share block `i` only if they agree up to its end.
pub fn block_hashes(tokens: &[u32], block_size: u32) -> Vec<u64> {
    block_hashes_under(tokens, block_size, None)
}

/// `block_hashes` of a prompt run under a LoRA adapter: the adapter's name is part of every
/// block's hash, as vLLM puts `lora_name` first among a block's extra hash keys
/// (vllm/v1/core/kv_cache_utils.py, `_gen_lora_extra_hash_keys`), so the same tokens under two
/// adapters (or under one and the base model) never share a cached block.
pub fn block_hashes_under(tokens: &[u32], block_size: u32, adapter: Option<&str>) -> Vec<u64> {
    const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const FNV_PRIME: u64 = 0x0100_0000_01b3;
    let fold = |hash: u64, bytes: &[u8]| {
        bytes
            .iter()
            .fold(hash, |h, b| (h ^ u64::from(*b)).wrapping_mul(FNV_PRIME))
    };
    let mut previous = adapter.map_or(FNV_OFFSET, |name| {
        fold(fold(FNV_OFFSET, b"lora:"), name.as_bytes())
    });
    tokens
        .chunks_exact(block_size.max(1) as usize)
        .map(|block| {
            let bytes: Vec<u8> = block.iter().flat_map(|t| t.to_le_bytes()).collect();
            previous = fold(previous, &bytes);
            previous
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_hash_covers_everything_before_it() {
        let a = block_hashes(&[1, 2, 3, 4, 5, 6, 7], 2);
        let b = block_hashes(&[1, 2, 3, 4, 9, 9], 2);
        assert_eq!(a.len(), 3, "the partial last block is not hashed");
        assert_eq!(a[..2], b[..2]);
        assert_ne!(a[2], b[2]);
        let moved = block_hashes(&[9, 9, 3, 4], 2);
        assert_ne!(a[1], moved[1]);
    }

    #[test]
    fn released_blocks_are_evicted_oldest_first() {
        let mut cache = PrefixCache::default();
        for hash in 1..=3 {
            assert!(cache.register(
                hash,
                hash.checked_sub(1).filter(|&p| p > 0),
                &[hash as u32],
                None
            ));
        }
        assert!(
            !cache.register(2, Some(1), &[2], None),
            "a cached hash is not cached twice"
        );
        assert!(cache.release(2));
        assert!(cache.release(1));
        assert!(cache.release(3));
        assert_eq!(cache.evictable(), 3);
        cache.shrink_to(2);
        assert_eq!(cache.lookup(&[2]), (0, 0), "2 was released first");
        assert_eq!(cache.lookup(&[1, 3]), (2, 2));
        assert_eq!(cache.acquire(1), Some(Acquired::Revived));
        assert_eq!(cache.acquire(1), Some(Acquired::Shared));
        cache.shrink_to(0);
        assert_eq!(
            cache.take_events(),
            [1u64, 2, 3]
                .map(|hash| CacheEvent::Stored {
                    hash,
                    parent: hash.checked_sub(1).filter(|&p| p > 0),
                    tokens: vec![hash as u32],
                    adapter: None,
                })
                .into_iter()
                .chain([2, 3].map(CacheEvent::Removed))
                .collect::<Vec<_>>(),
            "what the engine publishes: each block stored once, each eviction"
        );
        assert!(cache.take_events().is_empty());
        assert_eq!(
            cache.lookup(&[1, 3]),
            (1, 0),
            "a held block is never evicted"
        );
        assert_eq!(cache.referenced(), 1);
    }
}
