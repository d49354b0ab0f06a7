//! The step-time model: what one forward pass costs on the modelled GPU, `b0 + b1 * prefill +
//! b2 * decode + b3 * KV tokens read + b4 * attention pairs prefilled (+ PCIe transfers)`.

use std::time::Duration;

/// The step-time model's coefficients.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepCost {
    /// Fixed cost of any forward pass (b0).
    pub base: Duration,
    /// Cost of each prompt token prefilled (b1).
    pub per_prefill_token: Duration,
    /// Cost of each token decoded (b2).
    pub per_decode_token: Duration,
    /// Cost of each token of context whose KV is read by attention (b3): long contexts decode slower.
    pub per_kv_token_read: Duration,
    /// Cost of every thousand (query, key) token pairs a prefill's attention computes (b4): a
    /// chunk of c tokens after p already computed attends to c * p + c * (c + 1) / 2 pairs, so
    /// a prompt's prefill grows with the square of its length.
    pub per_attention_kpair: Duration,
    /// Cost of moving one KV block across PCIe, either way.
    pub per_block_transfer: Duration,
}

impl StepCost {
    /// Every step free: the `instant` profile's.
    pub const ZERO: StepCost = StepCost {
        base: Duration::ZERO,
        per_prefill_token: Duration::ZERO,
        per_decode_token: Duration::ZERO,
        per_kv_token_read: Duration::ZERO,
        per_attention_kpair: Duration::ZERO,
        per_block_transfer: Duration::ZERO,
    };
}

/// What one step computed, as the step-time model counts it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct StepWork {
    pub prefill_tokens: u32,
    pub decode_tokens: u32,
    /// Context tokens whose KV attention read, over every request in the step.
    pub kv_read: u64,
    /// (query, key) pairs the step's prefill chunks computed (`attention_pairs_of`).
    pub attention_pairs: u64,
    /// KV blocks moved across PCIe (swaps out and in).
    pub transferred_blocks: u32,
}

impl StepCost {
    /// How long a step that did `work` takes: nothing for an empty step, the fixed cost of a
    /// forward pass plus each term otherwise.
    pub(super) fn of(&self, work: &StepWork) -> Duration {
        let forward_pass = if work.prefill_tokens + work.decode_tokens > 0 {
            self.base
        } else {
            Duration::ZERO
        };
        forward_pass
            + self.per_prefill_token * work.prefill_tokens
            + self.per_decode_token * work.decode_tokens
            + self
                .per_kv_token_read
                .saturating_mul(u32::try_from(work.kv_read).unwrap_or(u32::MAX))
            + self.per_block_transfer * work.transferred_blocks
            + self
                .per_attention_kpair
                .mul_f64(work.attention_pairs as f64 / 1000.0)
    }
}

/// The (query, key) pairs causal attention computes for a chunk of `chunk` tokens after `before`
/// already in the cache.
pub(super) fn attention_pairs_of(before: u32, chunk: u32) -> u64 {
    let (before, chunk) = (u64::from(before), u64::from(chunk));
    chunk * before + chunk * (chunk + 1) / 2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_step_costs_nothing_and_attention_grows_with_the_square_of_the_prompt() {
        let cost = StepCost {
            base: Duration::from_millis(5),
            per_attention_kpair: Duration::from_millis(1),
            ..StepCost::ZERO
        };
        assert_eq!(cost.of(&StepWork::default()), Duration::ZERO);
        // A 100-token chunk after 100 cached: 100 * 100 + 100 * 101 / 2 pairs.
        assert_eq!(attention_pairs_of(100, 100), 15_050);
        let work = StepWork {
            prefill_tokens: 100,
            attention_pairs: attention_pairs_of(100, 100),
            ..StepWork::default()
        };
        assert_eq!(
            cost.of(&work),
            Duration::from_millis(5) + Duration::from_micros(15_050)
        );
    }
}
