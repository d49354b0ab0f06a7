//! One sequence (one choice of one request) as the scheduler sees it.

use std::sync::Arc;

use serde::Serialize;

/// Identifies a sequence inside one engine; unique for the engine's lifetime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct SeqId(pub u64);

/// Why a sequence ended, as it appears in `finish_reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// The natural end of the answer (an EOS token).
    Stop,
    /// `max_tokens` reached, or the answer was truncated to free KV cache.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// What the scheduler needs to know about a new sequence.
#[derive(Debug, Clone)]
pub struct NewSeq {
    pub id: SeqId,
    /// Tokens in the prompt.
    pub prompt_tokens: u32,
    /// Tokens the sequence will generate before it ends (at least 1).
    pub output_tokens: u32,
    /// How the sequence ends once `output_tokens` are generated.
    pub finish: FinishReason,
    /// The chained hashes of the prompt's full KV blocks (`prefix::block_hashes`); empty when
    /// prefix caching is off.
    pub prefix: Arc<[u64]>,
    /// The prompt's token ids, which the KV event of each block it stores carries (empty when
    /// prefix caching is off).
    pub prompt: Arc<[u32]>,
    /// Prompt tokens whose KV another engine computed and sent (the decode half of a
    /// disaggregated request): admitted, they are in the cache without a prefill.
    pub preloaded: u32,
    /// The LoRA adapter the request names; `None`: the base model.
    pub adapter: Option<super::Adapter>,
}

/// Where a sequence is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// In the waiting queue, holding no blocks.
    Waiting,
    /// In the running batch, holding blocks.
    Running,
    /// Preempted by swap: its blocks are in host memory.
    Swapped,
}

/// A sequence inside the scheduler.
#[derive(Debug, Clone)]
pub struct Seq {
    pub id: SeqId,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    pub finish: FinishReason,
    pub phase: Phase,
    /// Tokens generated (and delivered) so far.
    pub generated: u32,
    /// Tokens whose KV is in the cache. Reset to 0 by a recompute preemption.
    pub computed: u32,
    /// Tokens that must be in the cache before decoding can go on: the prompt, plus, after a
    /// recompute preemption, every token generated before it.
    pub prefill_target: u32,
    /// KV blocks held on the GPU (Running) or in host memory (Swapped).
    pub blocks: u32,
    /// Order of (last) admission into the running batch; FCFS eviction takes the newest.
    pub admitted_at: u64,
    /// Compute (tokens) spent on this sequence that is not yet written off as wasted.
    pub work: u64,
    /// The prompt's block hashes, for the prefix cache.
    pub prefix: Arc<[u64]>,
    /// The prompt's token ids (`NewSeq::prompt`).
    pub prompt: Arc<[u32]>,
    /// Leading prompt blocks held as references on the prefix cache (counted among `blocks`);
    /// the rest of `blocks` are its own.
    pub shared: u32,
    /// Prompt tokens that arrive computed (`NewSeq::preloaded`).
    pub preloaded: u32,
    /// `NewSeq::adapter`.
    pub adapter: Option<super::Adapter>,
    /// Passed over at least once because the batch's adapter slots were taken.
    pub slot_waited: bool,
    /// Preempted to be recomputed at least once: its prefix lookups from then on are counted
    /// apart (`Counters::preempted_queries`).
    pub preempted: bool,
}

impl Seq {
    pub fn new(new: NewSeq) -> Self {
        Self {
            id: new.id,
            prompt_tokens: new.prompt_tokens,
            output_tokens: new.output_tokens.max(1),
            finish: new.finish,
            phase: Phase::Waiting,
            generated: 0,
            computed: 0,
            prefill_target: new.prompt_tokens,
            blocks: 0,
            admitted_at: 0,
            work: 0,
            prefix: new.prefix,
            prompt: new.prompt,
            shared: 0,
            preloaded: new.preloaded,
            adapter: new.adapter,
            slot_waited: false,
            preempted: false,
        }
    }

    /// True while the prompt (or the recomputed context) is still being prefilled.
    pub fn is_prefilling(&self) -> bool {
        self.computed < self.prefill_target
    }

    /// Tokens the sequence has attained: its cached context plus everything it generated.
    pub fn attained(&self) -> u32 {
        self.computed.max(self.prompt_tokens + self.generated)
    }

    /// Output tokens still to generate.
    pub fn remaining(&self) -> u32 {
        self.output_tokens - self.generated
    }
}
