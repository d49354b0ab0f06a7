//! Named timing presets: the step-time coefficients and KV capacity of a model on a GPU.
//!
//! The coefficients are the published fits for vLLM (see `shared/reference/engines.md`): the
//! step time is `b0 + b1 * prefill tokens + b2 * decode tokens + b3 * KV tokens read`, where b3 is
//! the KV bytes per token over the GPU's memory bandwidth, so long contexts decode slower.

use std::time::Duration;

use crate::scheduler::StepCost;

/// PCIe Gen5 x16, the path KV blocks take when swapped to host memory.
const PCIE_BYTES_PER_SEC: f64 = 64e9;

/// A model on a GPU: how fast it steps and how much KV cache it has.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    pub name: &'static str,
    /// b0, b1, b2, b3 and the per-block PCIe transfer time.
    pub cost: StepCost,
    pub num_gpu_blocks: u32,
    pub block_size: u32,
    pub max_num_seqs: u32,
    pub max_num_batched_tokens: u32,
    pub max_model_len: u32,
    /// Median of the natural (EOS) answer length, in tokens.
    pub output_median_tokens: f64,
}

/// Every preset, for `--help` and error messages.
pub const PROFILE_NAMES: [&str; 4] = ["llama3-8b-h100", "llama3-70b-h100-tp4", "instant", "slow"];

impl Profile {
    /// Looks up a preset by name.
    pub fn named(name: &str) -> Option<Profile> {
        match name {
            "llama3-8b-h100" => Some(llama3_8b_h100()),
            "llama3-70b-h100-tp4" => Some(llama3_70b_h100_tp4()),
            "instant" => Some(instant()),
            "slow" => Some(slow()),
            _ => None,
        }
    }
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// Per-block PCIe time for a model whose KV takes `kv_bytes_per_token`.
fn block_transfer(kv_bytes_per_token: f64, block_size: u32) -> Duration {
    secs(kv_bytes_per_token * f64::from(block_size) / PCIE_BYTES_PER_SEC)
}

/// Llama-3.1-8B on one H100 (80 GB HBM3, 3.35 TB/s), vLLM defaults for that GPU class.
fn llama3_8b_h100() -> Profile {
    let kv_bytes_per_token = 128.0 * 1024.0;
    Profile {
        name: "llama3-8b-h100",
        cost: StepCost {
            base: secs(5.75e-3),
            per_prefill_token: secs(17e-6),
            per_decode_token: secs(6e-6),
            per_kv_token_read: secs(kv_bytes_per_token / 3.35e12),
            per_block_transfer: block_transfer(kv_bytes_per_token, 16),
        },
        num_gpu_blocks: 29_205,
        block_size: 16,
        max_num_seqs: 1024,
        max_num_batched_tokens: 8192,
        max_model_len: 8192,
        output_median_tokens: 200.0,
    }
}

/// Llama-3.3-70B with tensor parallelism over 4 H100s (KV read at 4 x 3.35 TB/s).
fn llama3_70b_h100_tp4() -> Profile {
    let kv_bytes_per_token = 320.0 * 1024.0;
    Profile {
        name: "llama3-70b-h100-tp4",
        cost: StepCost {
            base: secs(12.6e-3),
            per_prefill_token: secs(76e-6),
            per_decode_token: secs(67e-6),
            per_kv_token_read: secs(kv_bytes_per_token / (4.0 * 3.35e12)),
            per_block_transfer: block_transfer(kv_bytes_per_token, 16),
        },
        num_gpu_blocks: 28_000,
        block_size: 16,
        max_num_seqs: 1024,
        max_num_batched_tokens: 8192,
        max_model_len: 8192,
        output_median_tokens: 200.0,
    }
}

/// Answers at once: no step costs time, and the KV cache never runs out. For measuring a gateway's
/// own overhead, where the engine must never be the bottleneck.
fn instant() -> Profile {
    Profile {
        name: "instant",
        cost: StepCost {
            base: Duration::ZERO,
            per_prefill_token: Duration::ZERO,
            per_decode_token: Duration::ZERO,
            per_kv_token_read: Duration::ZERO,
            per_block_transfer: Duration::ZERO,
        },
        num_gpu_blocks: 4_000_000,
        block_size: 16,
        max_num_seqs: 4096,
        max_num_batched_tokens: 1 << 20,
        max_model_len: 32_768,
        output_median_tokens: 16.0,
    }
}

/// Every step takes one second whatever it holds, and the KV cache never runs out: each stream
/// gets a token a second. For holding many long streams open through a gateway (its memory per
/// stream), where the engine's speed must not depend on how many there are.
fn slow() -> Profile {
    Profile {
        name: "slow",
        cost: StepCost {
            base: Duration::from_secs(1),
            ..instant().cost
        },
        max_num_seqs: 1 << 16,
        ..instant()
    }
}
