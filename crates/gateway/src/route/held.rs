//! Precise prefix scoring: where a worker's KV events flow, the cache-aware policy scores it by
//! the blocks its engine says it holds (`fleet::HeldIndex`) instead of by where this gateway
//! sent prompts (`sluice_core::prefix::PrefixIndex`), which never learns of an eviction.
//!
//! The prompt must then be in the engine's own ids, cut into its block size: the request's
//! prompt is tokenized (off the runtime's threads) only when its pool has a worker whose events
//! flow and the model's tokenizer is loaded; otherwise every worker is scored the approximate
//! way, as before. In a pool where some workers' events flow and others' do not, each is scored
//! its own way and the two compared as shares of the prompt (`policy::prefix_share`). A request
//! for a LoRA adapter is keyed under its adapter (`held_blocks::chain_start`), as vLLM caches it.

use std::sync::Arc;

use sluice_core::held_blocks::{chain_start, token_block_hashes};
use sluice_core::policy::{by_shares, prefix_share, Candidate, RouteInput};

use super::{RouteRequest, RouteStage, Wants};
use crate::fleet::{Pool, Worker};
use crate::tokens::PromptJson;

/// Prompt tokens matched at most: enough to tell conversations apart (and a long document's
/// cached prefix) without hashing whole books.
pub(super) const MAX_MATCHED_TOKENS: usize = 32_768;

/// A prompt's block keys in each block size its pool's engines cache in (one, in practice).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct HeldKeys {
    by_size: Vec<(usize, Vec<u64>)>,
}

impl HeldKeys {
    /// `ids` cut in each of `sizes`, keyed from `start` (`chain_start`: the request's adapter's
    /// blocks are its own).
    fn cut(start: u64, ids: &[u32], sizes: &[usize]) -> Self {
        Self {
            by_size: sizes
                .iter()
                .map(|&size| {
                    let max = MAX_MATCHED_TOKENS / size.max(1);
                    (size, token_block_hashes(start, ids, size, max))
                })
                .collect(),
        }
    }

    fn keys(&self, size: usize) -> Option<&[u64]> {
        self.by_size
            .iter()
            .find(|(s, _)| *s == size)
            .map(|(_, keys)| keys.as_slice())
    }

    /// The share of the prompt `worker`'s best rank holds; `None` when no events flow from it
    /// (or its block size is not among those cut).
    fn share_held_by(&self, worker: &Worker) -> Option<u32> {
        let sizes = worker.held.block_sizes();
        sizes
            .iter()
            .filter_map(|&size| {
                let keys = self.keys(size)?;
                Some(prefix_share(
                    worker.held.held_prefix(size, keys),
                    keys.len(),
                ))
            })
            .max()
    }
}

/// The block sizes the pool's workers whose events flow cut prompts into.
fn block_sizes(pool: &Pool) -> Vec<usize> {
    let mut sizes: Vec<usize> = pool
        .workers
        .iter()
        .flat_map(|w| w.held.block_sizes())
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

impl RouteStage {
    /// The request's prompt cut into the block keys of the pool's engines whose events flow;
    /// `None` when none does, when the policy does not route by prefix, or when the prompt's
    /// ids cannot be known here.
    pub(crate) async fn held_keys(&self, pool: &Pool, wants: &Wants<'_>) -> Option<HeldKeys> {
        if !self.wants_prefix() {
            return None;
        }
        let prompt = wants.prompt_json?;
        let sizes = block_sizes(pool);
        if sizes.is_empty() {
            return None;
        }
        let tokens = self.tokens.get()?;
        let start = chain_start(pool.adapter.as_deref());
        let (chat, raw) = match prompt {
            PromptJson::Messages(raw) => (true, raw.to_vec()),
            PromptJson::Completion(raw) => (false, raw.to_vec()),
        };
        tokio::task::spawn_blocking(move || {
            let prompt = if chat {
                PromptJson::Messages(&raw)
            } else {
                PromptJson::Completion(&raw)
            };
            let ids = tokens.routing_ids(prompt)?;
            Some(HeldKeys::cut(start, &ids, &sizes))
        })
        .await
        .ok()
        .flatten()
    }
}

/// Scores `candidates` (of `workers`, in order) by what their engines hold, where events flow
/// (`policy::by_shares` decides how the two kinds of match meet). `None`: no candidate's events
/// flow, the approximate scores stand.
pub(super) fn score(
    workers: &[&Arc<Worker>],
    request: &RouteRequest,
    candidates: &mut [Candidate],
) -> Option<RouteInput> {
    let keys = request.held.as_ref()?;
    let held: Vec<Option<u32>> = workers.iter().map(|w| keys.share_held_by(w)).collect();
    by_shares(candidates, &held, request.blocks.len(), &request.input)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompt_is_cut_in_each_block_size_and_bounded() {
        let ids: Vec<u32> = (0..100).collect();
        let keys = HeldKeys::cut(0, &ids, &[16, 1]);
        assert_eq!(keys.keys(16).map(<[u64]>::len), Some(6));
        assert_eq!(keys.keys(1).map(<[u64]>::len), Some(100));
        assert_eq!(keys.keys(8), None);
        let long: Vec<u32> = (0..40_000).collect();
        let bounded = HeldKeys::cut(0, &long, &[16]);
        assert_eq!(
            bounded.keys(16).map(<[u64]>::len),
            Some(MAX_MATCHED_TOKENS / 16)
        );
    }
}
