//! Which workers are likely to hold a prompt's prefix in their KV cache.
//!
//! Engines cache KV blocks by a chained hash of the prompt's leading blocks (vLLM's prefix
//! caching, SGLang's radix cache). The gateway cannot see those caches, but it knows where it sent
//! every prompt: a worker that was sent a prompt holds (until evicted) every leading block of it.
//! So the prompt's raw bytes are cut into fixed blocks, each block's hash chains the ones before
//! it, and the index remembers the last few workers each block hash was sent to.
//!
//! Hashing the request body's bytes rather than tokens keeps the gateway tokenizer-free; the same
//! client sends the same conversation prefix as the same bytes, which is what matters.
//!
//! Memory is bounded: past `capacity` block hashes, the least recently used tenth is dropped.

use std::collections::HashMap;

use crate::policy::Candidate;

/// Workers remembered per block: enough for a hot prefix spread over a few workers.
const OWNERS: usize = 4;

/// The chained hashes of the leading full blocks of `bytes` (a partial last block is ignored,
/// as engines only cache full blocks), at most `max_blocks` of them.
pub fn block_hashes(bytes: &[u8], block_size: usize, max_blocks: usize) -> Vec<u64> {
    if block_size == 0 {
        return Vec::new();
    }
    let mut previous = 0u64;
    bytes
        .chunks_exact(block_size)
        .take(max_blocks)
        .map(|chunk| {
            previous = crate::hash::chain_hash(previous, chunk);
            previous
        })
        .collect()
}

#[derive(Debug, Clone)]
struct Owners {
    workers: [u64; OWNERS],
    len: u8,
    /// When this block was last routed (the index's own counter), for eviction.
    stamp: u64,
}

impl Owners {
    fn holds(&self, worker: u64) -> bool {
        self.workers[..self.len as usize].contains(&worker)
    }

    /// Makes `worker` the most recent owner, dropping the oldest when full.
    fn add(&mut self, worker: u64) {
        let len = self.len as usize;
        if let Some(at) = self.workers[..len].iter().position(|&w| w == worker) {
            self.workers[..=at].rotate_right(1);
            return;
        }
        let keep = len.min(OWNERS - 1);
        self.workers.copy_within(0..keep, 1);
        self.workers[0] = worker;
        self.len = (keep + 1) as u8;
    }
}

/// Block hash -> the workers it was last sent to.
#[derive(Debug, Clone)]
pub struct PrefixIndex {
    blocks: HashMap<u64, Owners>,
    capacity: usize,
    clock: u64,
}

impl PrefixIndex {
    pub fn new(capacity: usize) -> Self {
        Self {
            blocks: HashMap::new(),
            capacity: capacity.max(16),
            clock: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Records that a prompt with these blocks was sent to `worker`.
    pub fn insert(&mut self, blocks: &[u64], worker: u64) {
        self.clock += 1;
        let stamp = self.clock;
        for &block in blocks {
            let owners = self.blocks.entry(block).or_insert(Owners {
                workers: [0; OWNERS],
                len: 0,
                stamp,
            });
            owners.add(worker);
            owners.stamp = stamp;
        }
        if self.blocks.len() > self.capacity {
            self.evict();
        }
    }

    /// Sets each candidate's `prefix_match`: the number of leading blocks it is believed to hold.
    /// A worker sent block `i` was sent every block before it, so its match is one past the
    /// deepest block it owns; the walk stops at the first block nobody holds.
    pub fn annotate(&self, blocks: &[u64], candidates: &mut [Candidate]) {
        for c in candidates.iter_mut() {
            c.prefix_match = 0;
        }
        for (depth, block) in blocks.iter().enumerate() {
            let Some(owners) = self.blocks.get(block) else {
                break;
            };
            for c in candidates.iter_mut() {
                if owners.holds(c.key) {
                    c.prefix_match = depth as u32 + 1;
                }
            }
        }
    }

    /// Drops the least recently used tenth of the index (at least enough to get under capacity).
    fn evict(&mut self) {
        let target = self.capacity - self.capacity / 10;
        let excess = self.blocks.len().saturating_sub(target);
        if excess == 0 {
            return;
        }
        let mut stamps: Vec<u64> = self.blocks.values().map(|o| o.stamp).collect();
        let (_, cutoff, _) = stamps.select_nth_unstable(excess - 1);
        let cutoff = *cutoff;
        self.blocks.retain(|_, o| o.stamp > cutoff);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidates(keys: &[u64]) -> Vec<Candidate> {
        keys.iter()
            .map(|&key| Candidate {
                key,
                load: 0,
                prefix_match: 0,
            })
            .collect()
    }

    #[test]
    fn blocks_chain_so_a_shared_prefix_shares_hashes() {
        let a = block_hashes(b"aaaabbbbccccdd", 4, 100);
        let b = block_hashes(b"aaaabbbbxxxx", 4, 100);
        assert_eq!(a.len(), 3, "the partial last block is ignored");
        assert_eq!(a[..2], b[..2]);
        assert_ne!(a[2], b[2]);
        let moved = block_hashes(b"xxxxbbbb", 4, 100);
        assert_ne!(a[1], moved[1], "a block's hash depends on what precedes it");
        assert_eq!(block_hashes(b"aaaabbbbcccc", 4, 2).len(), 2);
    }

    #[test]
    fn a_worker_matches_up_to_the_deepest_block_it_was_sent() {
        let mut index = PrefixIndex::new(1000);
        let long = block_hashes(b"system prompt...user: hello....more", 4, 100);
        index.insert(&long[..6], 1);
        index.insert(&long[..3], 2);
        let mut c = candidates(&[1, 2, 3]);
        index.annotate(&long, &mut c);
        assert_eq!(
            c.iter().map(|c| c.prefix_match).collect::<Vec<_>>(),
            vec![6, 3, 0]
        );
    }

    #[test]
    fn owners_keep_the_most_recent_few() {
        let mut index = PrefixIndex::new(1000);
        let blocks = block_hashes(b"abcd", 4, 1);
        for w in 1..=6 {
            index.insert(&blocks, w);
        }
        let mut c = candidates(&[1, 2, 3, 4, 5, 6]);
        index.annotate(&blocks, &mut c);
        let held: Vec<_> = c
            .iter()
            .filter(|c| c.prefix_match > 0)
            .map(|c| c.key)
            .collect();
        assert_eq!(held, vec![3, 4, 5, 6]);
        index.insert(&blocks, 4);
        index.insert(&blocks, 7);
        let mut c = candidates(&[3, 4]);
        index.annotate(&blocks, &mut c);
        assert_eq!(
            c[0].prefix_match, 0,
            "3 was the oldest after 4 was refreshed"
        );
        assert_eq!(c[1].prefix_match, 1);
    }

    #[test]
    fn memory_stays_bounded_and_recent_prefixes_survive() {
        let mut index = PrefixIndex::new(100);
        for i in 0u32..1000 {
            let blocks = block_hashes(&i.to_le_bytes(), 4, 1);
            index.insert(&blocks, 1);
            assert!(index.len() <= 100);
        }
        let recent = block_hashes(&999u32.to_le_bytes(), 4, 1);
        let mut c = candidates(&[1]);
        index.annotate(&recent, &mut c);
        assert_eq!(c[0].prefix_match, 1);
        let old = block_hashes(&0u32.to_le_bytes(), 4, 1);
        index.annotate(&old, &mut c);
        assert_eq!(c[0].prefix_match, 0);
    }
}
