//! Which KV blocks one engine actually holds, learned from its KV events ("precise" prefix
//! routing), where `prefix::PrefixIndex` only remembers where prompts were sent.
//!
//! An engine announces blocks it stored (with their token ids and the block they follow) and
//! blocks it evicted, by its own block hashes. Those hashes depend on the engine's settings and
//! seed (vLLM seeds the first block of every prefix randomly unless `PYTHONHASHSEED` is set), so
//! the gateway does not reproduce them: it keys each block by its own chained hash of the token
//! ids (`token_block_hashes`, the hash that prompts are cut into too) and keeps a map from the
//! engine's hash to that key, so a removal, which names only the engine's hash, finds it.
//!
//! vLLM does not de-duplicate its cache (`vllm/v1/core/block_pool.py`, `cache_full_blocks`: two
//! requests that fill identical blocks cache both, under one hash, and each eviction is a
//! `BlockRemoved` of that hash), so a hash stored twice is held until it is removed twice.
//!
//! A stored block whose parent the index does not know (events missed, or a subscription that
//! began mid-stream) cannot be placed in a prefix chain and is skipped, counted as an orphan; a
//! cleared cache or a lost stream clears everything (`clear`). Memory is bounded: past
//! `capacity` blocks new ones are refused, counted, until removals make room.

use std::collections::HashMap;

use crate::hash::{chain_hash, stable_hash};
use crate::kv_events::AdapterTag;

/// The chained hashes of the leading full blocks of `tokens` (a partial last block is ignored,
/// as engines cache only full blocks), at most `max_blocks` of them: block `i`'s hash names the
/// whole prefix up to and including it. `start` is the chain's start (`chain_start`).
pub fn token_block_hashes(
    start: u64,
    tokens: &[u32],
    block_size: usize,
    max_blocks: usize,
) -> Vec<u64> {
    chained(start, tokens, block_size)
        .take(max_blocks)
        .collect()
}

/// Where the chain of a prompt's block keys starts: 0 for the base model, a hash of the name for
/// a LoRA adapter. vLLM puts the adapter's name in the first block's extra keys
/// (`vllm/v1/core/kv_cache_utils.py`, `_gen_lora_extra_hash_keys`), so the same tokens under two
/// adapters are two caches; keyed apart here, a hit under one never counts for another.
pub fn chain_start(adapter: Option<&str>) -> u64 {
    adapter.map_or(0, |name| stable_hash(format!("lora:{name}").as_bytes()))
}

/// The chain start of a stored event's blocks: a named adapter's as a request for it starts;
/// one known only by the engine's number apart from every request's (no name to match).
pub fn event_chain_start(adapter: Option<&AdapterTag>) -> u64 {
    match adapter {
        None => 0,
        Some(AdapterTag::Name(name)) => chain_start(Some(name)),
        Some(AdapterTag::Id(id)) => stable_hash(format!("lora-id:{id}").as_bytes()),
    }
}

/// The chained hashes of `tokens`' full blocks after the block whose hash is `previous`.
fn chained(previous: u64, tokens: &[u32], block_size: usize) -> impl Iterator<Item = u64> + '_ {
    let mut previous = previous;
    let mut bytes = Vec::with_capacity(block_size * 4);
    // No blocks of size 0 (`chunks_exact` would panic on it).
    let whole = if block_size == 0 {
        &tokens[..0]
    } else {
        tokens
    };
    whole.chunks_exact(block_size.max(1)).map(move |block| {
        bytes.clear();
        bytes.extend(block.iter().flat_map(|t| t.to_le_bytes()));
        previous = chain_hash(previous, &bytes);
        previous
    })
}

/// One `BlockStored` event, as the subscriber decoded it: blocks `engine_hashes` hold `tokens`
/// (`block_size` each, in order) and follow the block `parent` (none: they start a prompt, whose
/// chain begins at `start`, `event_chain_start`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored<'a> {
    pub parent: Option<u64>,
    pub engine_hashes: &'a [u64],
    pub tokens: &'a [u32],
    pub block_size: usize,
    pub start: u64,
}

/// What became of a stored event's blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreOutcome {
    /// Blocks now held that were not before.
    pub added: usize,
    /// Blocks skipped: their parent is unknown, so their prefix is.
    pub orphaned: usize,
    /// Blocks refused because the index is full.
    pub refused: usize,
}

/// Errors in an event that the index cannot apply at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    #[error("a block size of 0")]
    NoBlockSize,
    #[error("{tokens} token ids for {blocks} blocks of {block_size}")]
    TokensDoNotFill {
        tokens: usize,
        blocks: usize,
        block_size: usize,
    },
    #[error("block size {got} where the engine's blocks were {known}")]
    BlockSizeChanged { known: usize, got: usize },
}

/// The blocks one engine holds, by the gateway's key, and the engine's hash for each.
#[derive(Debug, Clone)]
pub struct HeldBlocks {
    /// The engine's block hash -> the gateway's key of that block, and how many of the
    /// engine's blocks carry that hash.
    by_engine: HashMap<u64, (u64, u32)>,
    /// The gateway's key -> how many of the engine's blocks hold it (the same tokens may be
    /// stored under two hashes, e.g. with different extra keys).
    held: HashMap<u64, u32>,
    /// The engine's block size, once an event has named it.
    block_size: Option<usize>,
    capacity: usize,
}

impl HeldBlocks {
    pub fn new(capacity: usize) -> Self {
        Self {
            by_engine: HashMap::new(),
            held: HashMap::new(),
            block_size: None,
            capacity: capacity.max(1),
        }
    }

    /// The engine's distinct block hashes held.
    pub fn len(&self) -> usize {
        self.by_engine.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_engine.is_empty()
    }

    /// The engine's block size, once known: prompts are cut into blocks of it to be matched.
    pub fn block_size(&self) -> Option<usize> {
        self.block_size
    }

    /// Applies a `BlockStored` event.
    pub fn store(&mut self, event: &Stored<'_>) -> Result<StoreOutcome, EventError> {
        let size = event.block_size;
        if size == 0 {
            return Err(EventError::NoBlockSize);
        }
        if let Some(known) = self.block_size.filter(|&known| known != size) {
            return Err(EventError::BlockSizeChanged { known, got: size });
        }
        let blocks = event.engine_hashes.len();
        if event.tokens.len() != blocks * size {
            return Err(EventError::TokensDoNotFill {
                tokens: event.tokens.len(),
                blocks,
                block_size: size,
            });
        }
        self.block_size = Some(size);
        let previous = match event.parent {
            None => event.start,
            Some(parent) => match self.by_engine.get(&parent) {
                Some(&(key, _)) => key,
                None => {
                    return Ok(StoreOutcome {
                        orphaned: blocks,
                        ..StoreOutcome::default()
                    })
                }
            },
        };
        let mut outcome = StoreOutcome::default();
        let keys = chained(previous, event.tokens, size);
        for (&engine_hash, key) in event.engine_hashes.iter().zip(keys) {
            if let Some((_, copies)) = self.by_engine.get_mut(&engine_hash) {
                *copies += 1;
                continue;
            }
            if self.by_engine.len() >= self.capacity {
                outcome.refused += 1;
                continue;
            }
            self.by_engine.insert(engine_hash, (key, 1));
            *self.held.entry(key).or_insert(0) += 1;
            outcome.added += 1;
        }
        Ok(outcome)
    }

    /// Applies a `BlockRemoved` event: the blocks it names are no longer held. Hashes the index
    /// never learned (orphans, refused blocks) are ignored. Returns how many it knew.
    pub fn remove(&mut self, engine_hashes: &[u64]) -> usize {
        let mut known = 0;
        for engine_hash in engine_hashes {
            let Some((key, copies)) = self.by_engine.get_mut(engine_hash) else {
                continue;
            };
            known += 1;
            *copies -= 1;
            if *copies > 0 {
                continue;
            }
            let key = *key;
            self.by_engine.remove(engine_hash);
            if let Some(count) = self.held.get_mut(&key) {
                *count -= 1;
                if *count == 0 {
                    self.held.remove(&key);
                }
            }
        }
        known
    }

    /// `AllBlocksCleared`, or the stream lost: nothing is known to be held any more.
    pub fn clear(&mut self) {
        self.by_engine.clear();
        self.held.clear();
    }

    /// How many of `keys` (a prompt's `token_block_hashes` in the engine's block size), from
    /// the first, the engine holds: its cache can skip that much of the prompt's prefill.
    pub fn held_prefix(&self, keys: &[u64]) -> usize {
        keys.iter()
            .take_while(|key| self.held.contains_key(key))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BS: usize = 4;

    fn tokens(n: u32) -> Vec<u32> {
        (0..n).collect()
    }

    fn stored<'a>(parent: Option<u64>, hashes: &'a [u64], tokens: &'a [u32]) -> Stored<'a> {
        Stored {
            parent,
            engine_hashes: hashes,
            tokens,
            block_size: BS,
            start: 0,
        }
    }

    #[test]
    fn a_prompts_blocks_chain_so_a_shared_prefix_shares_keys() {
        let a = token_block_hashes(0, &[1, 2, 3, 4, 5, 6, 7, 8, 9], BS, 100);
        let b = token_block_hashes(0, &[1, 2, 3, 4, 9, 9, 9, 9], BS, 100);
        assert_eq!(a.len(), 2, "the partial last block is ignored");
        assert_eq!(a[0], b[0]);
        assert_ne!(a[1], b[1]);
        let moved = token_block_hashes(0, &[9, 9, 9, 9, 5, 6, 7, 8], BS, 100);
        assert_ne!(a[1], moved[1], "a block's key depends on what precedes it");
        assert_eq!(token_block_hashes(0, &tokens(16), BS, 3).len(), 3);
        assert!(token_block_hashes(0, &tokens(16), 0, 3).is_empty());
    }

    #[test]
    fn stored_blocks_are_matched_by_the_prompts_tokens_whatever_the_engines_hashes() {
        let mut held = HeldBlocks::new(100);
        let prompt = tokens(12);
        // The engine stores the first block, then the next two after it, by hashes of its own.
        let first = held.store(&stored(None, &[901], &prompt[..4])).unwrap();
        assert_eq!(first.added, 1);
        let rest = held
            .store(&stored(Some(901), &[77, 5], &prompt[4..]))
            .unwrap();
        assert_eq!(rest.added, 2);
        assert_eq!(held.block_size(), Some(BS));
        let keys = token_block_hashes(0, &prompt, BS, 100);
        assert_eq!(held.held_prefix(&keys), 3);
        let other = token_block_hashes(0, &[0, 1, 2, 3, 9, 9, 9, 9], BS, 100);
        assert_eq!(held.held_prefix(&other), 1, "only the shared first block");
    }

    #[test]
    fn an_eviction_named_by_the_engines_hash_ends_the_match_there() {
        let mut held = HeldBlocks::new(100);
        let prompt = tokens(12);
        held.store(&stored(None, &[1, 2, 3], &prompt)).unwrap();
        let keys = token_block_hashes(0, &prompt, BS, 100);
        assert_eq!(held.remove(&[2, 404]), 1, "an unknown hash is ignored");
        assert_eq!(
            held.held_prefix(&keys),
            1,
            "the prefix breaks at the evicted block"
        );
        assert_eq!(held.len(), 2);
        held.clear();
        assert!(held.is_empty());
        assert_eq!(held.held_prefix(&keys), 0);
    }

    #[test]
    fn a_block_whose_parent_is_unknown_is_an_orphan_not_a_guess() {
        let mut held = HeldBlocks::new(100);
        let prompt = tokens(8);
        let outcome = held.store(&stored(Some(999), &[2], &prompt[4..])).unwrap();
        assert_eq!(outcome.orphaned, 1);
        assert!(held.is_empty());
        let keys = token_block_hashes(0, &prompt, BS, 100);
        assert_eq!(held.held_prefix(&keys), 0);
    }

    #[test]
    fn the_same_tokens_under_two_hashes_stay_held_until_both_are_evicted() {
        let mut held = HeldBlocks::new(100);
        let prompt = tokens(4);
        held.store(&stored(None, &[1], &prompt)).unwrap();
        held.store(&stored(None, &[2], &prompt)).unwrap();
        let keys = token_block_hashes(0, &prompt, BS, 100);
        held.remove(&[1]);
        assert_eq!(held.held_prefix(&keys), 1);
        held.remove(&[2]);
        assert_eq!(held.held_prefix(&keys), 0);
    }

    #[test]
    fn a_hash_stored_twice_is_held_until_removed_twice() {
        // vLLM caches identical blocks of two requests under one hash, and evicts each.
        let mut held = HeldBlocks::new(100);
        let prompt = tokens(4);
        held.store(&stored(None, &[1], &prompt)).unwrap();
        let again = held.store(&stored(None, &[1], &prompt)).unwrap();
        assert_eq!(again.added, 0, "no new block");
        assert_eq!(held.len(), 1);
        let keys = token_block_hashes(0, &prompt, BS, 100);
        held.remove(&[1]);
        assert_eq!(held.held_prefix(&keys), 1, "one copy left");
        held.remove(&[1]);
        assert_eq!(held.held_prefix(&keys), 0);
    }

    #[test]
    fn memory_is_bounded_and_removals_make_room() {
        let mut held = HeldBlocks::new(2);
        let prompt = tokens(12);
        let outcome = held.store(&stored(None, &[1, 2, 3], &prompt)).unwrap();
        assert_eq!((outcome.added, outcome.refused), (2, 1));
        assert_eq!(held.len(), 2);
        held.remove(&[1]);
        let outcome = held.store(&stored(None, &[7], &prompt[..4])).unwrap();
        assert_eq!(outcome.added, 1);
    }

    #[test]
    fn malformed_events_are_refused_whole() {
        let mut held = HeldBlocks::new(100);
        let prompt = tokens(6);
        assert_eq!(
            held.store(&stored(None, &[1, 2], &prompt)),
            Err(EventError::TokensDoNotFill {
                tokens: 6,
                blocks: 2,
                block_size: BS
            })
        );
        let zero = Stored {
            block_size: 0,
            ..stored(None, &[1], &prompt[..4])
        };
        assert_eq!(held.store(&zero), Err(EventError::NoBlockSize));
        held.store(&stored(None, &[1], &prompt[..4])).unwrap();
        let other_size = Stored {
            block_size: 2,
            ..stored(None, &[3], &prompt[..2])
        };
        assert_eq!(
            held.store(&other_size),
            Err(EventError::BlockSizeChanged { known: 4, got: 2 })
        );
        assert_eq!(held.len(), 1);
    }

    /// Three prompts sharing their first block; the engine names block `b` of prompt `p` by
    /// `p * 100 + b` (its own hashing, unrelated to the gateway's).
    fn prompt(p: u64) -> Vec<u32> {
        let mut t = tokens(4);
        t.extend((0..16).map(|i| (p as u32 + 1) * 1000 + i));
        t
    }

    #[derive(Debug, Clone)]
    enum Op {
        Store { p: u64, from: usize, n: usize },
        Remove { p: u64, b: usize },
        Clear,
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0u64..3, 0usize..5, 1usize..5).prop_map(|(p, from, n)| Op::Store { p, from, n }),
            2 => (0u64..3, 0usize..5).prop_map(|(p, b)| Op::Remove { p, b }),
            1 => Just(Op::Clear),
        ]
    }

    proptest::proptest! {
        /// Whatever the engine stores, evicts and clears, a prompt matches exactly the leading
        /// blocks a plain record of the engine's held blocks (by hash, with their prefixes)
        /// says it holds.
        #[test]
        fn the_match_is_what_the_engine_holds(ops in proptest::collection::vec(op(), 1..40)) {
            let mut held = HeldBlocks::new(1000);
            // The engine's held blocks: its hash -> (prompt, block) and its copies.
            let mut engine: HashMap<u64, ((u64, usize), u32)> = HashMap::new();
            for op in ops {
                match op {
                    Op::Store { p, from, n } => {
                        let n = n.min(5 - from);
                        let all = prompt(p);
                        let hashes: Vec<u64> = (from..from + n).map(|b| p * 100 + b as u64).collect();
                        let parent = (from > 0).then(|| p * 100 + from as u64 - 1);
                        let event = stored(parent, &hashes, &all[from * BS..(from + n) * BS]);
                        let outcome = held.store(&event).unwrap();
                        if parent.is_none_or(|h| engine.contains_key(&h)) {
                            for (i, h) in hashes.iter().enumerate() {
                                engine.entry(*h).or_insert(((p, from + i), 0)).1 += 1;
                            }
                        } else {
                            proptest::prop_assert_eq!(outcome.orphaned, n);
                        }
                    }
                    Op::Remove { p, b } => {
                        let h = p * 100 + b as u64;
                        if let Some((_, copies)) = engine.get_mut(&h) {
                            *copies -= 1;
                            if *copies == 0 {
                                engine.remove(&h);
                            }
                        }
                        held.remove(&[h]);
                    }
                    Op::Clear => {
                        engine.clear();
                        held.clear();
                    }
                }
                for p in 0..3 {
                    let keys = token_block_hashes(0, &prompt(p), BS, 100);
                    // Block 0 is the same tokens in every prompt: any prompt's block 0 counts.
                    let holds = |b: usize| {
                        engine.values().any(|&((q, c), _)| c == b && (q == p || b == 0))
                    };
                    let expected = (0..5).take_while(|&b| holds(b)).count();
                    proptest::prop_assert_eq!(held.held_prefix(&keys), expected);
                }
            }
        }
    }

    #[test]
    fn blocks_under_an_adapter_match_only_that_adapters_prompts() {
        let prompt = tokens(8);
        let mut held = HeldBlocks::new(100);
        let under = |adapter: Option<&AdapterTag>| Stored {
            start: event_chain_start(adapter),
            ..stored(None, &[1, 2], &prompt)
        };
        let sql = AdapterTag::Name("sql".into());
        held.store(&under(Some(&sql))).unwrap();
        let keys = |adapter| token_block_hashes(chain_start(adapter), &prompt, BS, 100);
        assert_eq!(held.held_prefix(&keys(Some("sql"))), 2);
        assert_eq!(held.held_prefix(&keys(Some("med"))), 0);
        assert_eq!(held.held_prefix(&keys(None)), 0, "nor the base model's");
        let mut numbered = HeldBlocks::new(100);
        numbered.store(&under(Some(&AdapterTag::Id(1)))).unwrap();
        for adapter in [None, Some("sql"), Some("1")] {
            assert_eq!(numbered.held_prefix(&keys(adapter)), 0, "{adapter:?}");
        }
    }
}
