//! Named timing presets: the step-time coefficients and KV capacity of a model on a GPU.
//!
//! The coefficients are the published fits for vLLM (see `shared/reference/engines.md`): the
//! step time is `b0 + b1 * prefill tokens + b2 * decode tokens + b3 * KV tokens read + b4 *
//! attention pairs`, where b3 is the KV bytes per token over the GPU's memory bandwidth, so long
//! contexts decode slower, and b4 is the attention FLOPs of one (query, key) pair over the
//! GPUs' attention throughput, so a long prompt's prefill grows with its square. The linear fits
//! were made on short prompts, whose attention is a rounding error; b4 is what they leave out.
//!
//! b4's figures: a pair costs 4 FLOPs per layer per model dimension (QK^T and PV, a multiply and
//! an add each); FlashAttention-3 computes causal attention at about 600 TFLOP/s on an H100
//! (Shah et al., "FlashAttention-3", 2024: 500-660 TFLOP/s in BF16, head dimension 128, 8k-16k
//! tokens). Cross-checked against published prefill times: an 8B model takes 30 minutes for a
//! 1M-token prompt on one A100 (Jiang et al., "MInference 1.0", 2024), where this model gives
//! about 7.5 minutes on an H100, whose attention runs about three times an A100's; Llama-3.1-70B
//! takes 472 ms for 32,768 tokens on 32 GH200s (NVIDIA technical blog, "Low Latency Inference
//! Chapter 2", 2024), where the 4-GPU profile takes 3.1 s, 0.39 s at 32 GPUs' worth.

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

/// Attention throughput of one H100 (FlashAttention-3, causal, BF16).
const H100_ATTENTION_FLOPS: f64 = 600e12;

/// Llama 3.1 and 3.3's context length, and vLLM's default `max_model_len` for them.
const LLAMA3_CONTEXT: u32 = 131_072;

/// b4: the time of a thousand attention pairs for a model of `layers` x `hidden` on `gpus` H100s.
fn attention_kpair(layers: f64, hidden: f64, gpus: f64) -> Duration {
    secs(1000.0 * 4.0 * layers * hidden / (gpus * H100_ATTENTION_FLOPS))
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
            per_attention_kpair: attention_kpair(32.0, 4096.0, 1.0),
            per_block_transfer: block_transfer(kv_bytes_per_token, 16),
        },
        num_gpu_blocks: 29_205,
        block_size: 16,
        max_num_seqs: 1024,
        max_num_batched_tokens: 8192,
        max_model_len: LLAMA3_CONTEXT,
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
            per_attention_kpair: attention_kpair(80.0, 8192.0, 4.0),
            per_block_transfer: block_transfer(kv_bytes_per_token, 16),
        },
        num_gpu_blocks: 28_000,
        block_size: 16,
        max_num_seqs: 1024,
        max_num_batched_tokens: 8192,
        max_model_len: LLAMA3_CONTEXT,
        output_median_tokens: 200.0,
    }
}

/// Answers at once: no step costs time, and the KV cache never runs out. For measuring a gateway's
/// own overhead, where the engine must never be the bottleneck.
fn instant() -> Profile {
    Profile {
        name: "instant",
        cost: StepCost::ZERO,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::{NewSeq, Scheduler, SchedulerConfig, SeqId};

    /// How long one prompt of `tokens` takes to its first token, alone on the profile.
    fn time_to_first_token(profile: &Profile, tokens: u32) -> f64 {
        let mut s = Scheduler::new(SchedulerConfig {
            max_num_seqs: profile.max_num_seqs,
            max_num_batched_tokens: profile.max_num_batched_tokens,
            num_gpu_blocks: profile.num_gpu_blocks,
            block_size: profile.block_size,
            watermark_blocks: 0,
            preemption: Default::default(),
            eviction: Default::default(),
            cost: profile.cost,
            lora: None,
        });
        s.add(NewSeq {
            id: SeqId(0),
            prompt_tokens: tokens,
            output_tokens: 2,
            finish: crate::scheduler::FinishReason::Stop,
            prefix: std::sync::Arc::from([]),
            prompt: std::sync::Arc::from([]),
            preloaded: 0,
            adapter: None,
        });
        let mut elapsed = 0.0;
        while let Some(step) = s.step() {
            elapsed += step.duration.as_secs_f64();
            if step.prompt_tokens_counted > 0 {
                return elapsed;
            }
        }
        panic!("the prompt never finished its prefill");
    }

    #[test]
    fn a_long_prompt_takes_the_published_prefill_time() {
        let small = Profile::named("llama3-8b-h100").unwrap();
        let large = Profile::named("llama3-70b-h100-tp4").unwrap();
        // 128k tokens: 2.2 s of linear work and 7.5 s of attention on the 8B.
        let ttft = time_to_first_token(&small, LLAMA3_CONTEXT);
        assert!((9.0..11.0).contains(&ttft), "8B, 128k tokens: {ttft} s");
        // 32k tokens on the 70B: 3.1 s on 4 GPUs, NVIDIA's 472 ms on 32 within a quarter.
        let ttft = time_to_first_token(&large, 32_768);
        let on_32_gpus = ttft * 4.0 / 32.0;
        assert!(
            (0.35..0.6).contains(&on_32_gpus),
            "70B, 32k tokens: {ttft} s"
        );
        // Short prompts keep the linear fit: attention is a rounding error there.
        let ttft = time_to_first_token(&small, 256);
        assert!((0.009..0.011).contains(&ttft), "8B, 256 tokens: {ttft} s");
    }
}
