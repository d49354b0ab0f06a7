//! Continuous batching for one data-parallel rank, as a pure state machine.
//!
//! `Scheduler::step` plans one forward pass the way vLLM's scheduler does: running requests first
//! (decodes and prefill chunks, in admission order), then requests swapped out to host memory,
//! then the waiting queue, all within `max_num_batched_tokens` and `max_num_seqs`. A request is
//! admitted when the free KV blocks cover its first chunk plus a watermark; each later chunk, and
//! each decoded token past a block's end, takes more, and when none is free a victim chosen by the
//! eviction policy is preempted (recompute, swap or truncate). With prefix caching, an admitted prompt's
//! leading blocks already in the cache are shared instead of prefilled (`prefix`). The step's cost
//! comes from the step-time model (`cost`) `b0 + b1 * prefill + b2 * decode + b3 * KV tokens read + b4 *
//! attention pairs prefilled (+ PCIe transfers)`, so a cached block costs no prefill and a long
//! prompt's later chunks cost more than its first.
//!
//! KV blocks are taken per scheduled chunk, as vLLM's `allocate_slots(request, num_new_tokens)`
//! does (vllm/v1/core/sched/scheduler.py, read at 00024d3): a long prompt is admitted when its
//! first chunk fits and grows chunk by chunk, preempting others if it must. A prompt's tokens are
//! counted (`prompt_tokens_counted`) when its prefill ends and its first token comes, as vLLM's
//! `IterationStats.update_from_output` counts them (vllm/v1/metrics/stats.py, read at 28ed1fb).
//!
//! Nothing here knows about time passing or HTTP: the engine loop calls `step`, waits the returned
//! duration, and delivers the returned events. That keeps every scheduling decision testable on a
//! plain `for` loop.

mod admission;
mod blocks;
mod cost;
pub mod lora;
pub mod prefix;
mod seq;
#[cfg(test)]
mod tests;
pub mod usage;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use blocks::{blocks_for, BlockPool};
use blocks::{cache_computed, return_blocks, take_blocks};
pub use cost::StepCost;
use cost::{attention_pairs_of, StepWork};
pub use lora::{Adapter, AdapterCounters, AdapterId, LoraConfig, Residency};
use prefix::PrefixCache;
pub use seq::{FinishReason, NewSeq, Phase, Seq, SeqId};

/// What happens to a running request evicted to free KV blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Preemption {
    /// Free its blocks and prefill it again later (prompt + generated tokens). vLLM's default.
    #[default]
    Recompute,
    /// Move its blocks to host memory; bringing them back costs a PCIe transfer.
    Swap,
    /// End it at once with `finish_reason: "length"`.
    Truncate,
}

/// Which running request is evicted when the KV cache is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Eviction {
    /// The most recently admitted request (vLLM's behaviour).
    #[default]
    Fcfs,
    /// Least attained service: the request that has consumed the fewest tokens.
    Las,
    /// Shortest remaining processing time first: evict the request furthest from completion.
    Srpt,
}

/// Limits and policies of one rank's scheduler.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// At most this many requests in the running batch.
    pub max_num_seqs: u32,
    /// At most this many tokens (prefill chunks + decodes) in one step.
    pub max_num_batched_tokens: u32,
    /// KV blocks on this rank.
    pub num_gpu_blocks: u32,
    /// Tokens per KV block.
    pub block_size: u32,
    /// Blocks that must stay free after admitting a new request, so running ones can keep decoding.
    pub watermark_blocks: u32,
    pub preemption: Preemption,
    pub eviction: Eviction,
    pub cost: StepCost,
    /// LoRA adapters' cap and residency; `None`: the engine serves no adapters.
    pub lora: Option<LoraConfig>,
}

/// Something a step did to a sequence, for the engine to deliver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqEvent {
    /// The sequence produced one more token.
    Token(SeqId),
    /// The sequence ended; its blocks are already free.
    Finished(SeqId, FinishReason),
    /// The sequence was preempted (recompute or swap) and will resume later.
    Preempted(SeqId),
}

/// One planned forward pass and what it produced.
#[derive(Debug, Clone)]
pub struct Step {
    /// How long the pass takes on the modelled GPU.
    pub duration: Duration,
    pub prefill_tokens: u32,
    pub decode_tokens: u32,
    /// Prompt tokens of the requests whose prefill ended in this step (vLLM's iteration stats).
    pub prompt_tokens_counted: u32,
    pub events: Vec<SeqEvent>,
}

/// Running totals since the scheduler started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    pub steps: u64,
    pub preemptions: u64,
    pub aborted: u64,
    pub finished: u64,
    pub prompt_tokens_computed: u64,
    /// Prompt tokens of requests whose prefill has ended (each request once, when its first
    /// token comes): what an engine's `prompt_tokens_total` counts.
    pub prompt_tokens_counted: u64,
    pub tokens_generated: u64,
    /// Prefill and decode work spent on requests later aborted, or recomputed after preemption.
    pub wasted_tokens: u64,
    /// Prompt tokens looked up in the prefix cache at a request's first admission (vLLM's
    /// `prefix_cache_queries`), and those found there (`prefix_cache_hits`).
    pub prefix_queries: u64,
    pub prefix_hits: u64,
    /// The same at a preempted request's admission again, to recompute it: vLLM counts these
    /// apart and leaves them out of its hit rate and its counters (vllm/v1/metrics/stats.py,
    /// `PrefixCacheStats.record` with `preempted`, since vllm-project/vllm#25787, merged
    /// 2025-09-26): its recomputed tokens are mostly still cached and would read as hits.
    pub preempted_queries: u64,
    pub preempted_hits: u64,
}

#[derive(Debug, Clone, Copy)]
enum Work {
    Prefill(u32),
    Decode,
}

impl Work {
    /// Tokens this work computes, out of the step's budget.
    fn tokens(self) -> u32 {
        match self {
            Work::Prefill(chunk) => chunk,
            Work::Decode => 1,
        }
    }
}

/// The scheduler of one data-parallel rank.
#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    pool: BlockPool,
    cache: PrefixCache,
    seqs: HashMap<SeqId, Seq>,
    /// The running batch, in admission order.
    running: Vec<SeqId>,
    /// Requests waiting for admission; preempted (recompute) requests go back to the front.
    waiting: VecDeque<SeqId>,
    /// Requests swapped out to host memory, resumed in the order they left.
    swapped: VecDeque<SeqId>,
    admissions: u64,
    counters: Counters,
    /// Where the adapters are (`SchedulerConfig::lora`).
    adapters: Option<Residency>,
    /// Time the loop spent between steps on adapters loaded through the API, which the next
    /// step waits out (vLLM runs `add_lora` as a utility call between steps).
    stall: Duration,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig) -> Self {
        let pool = BlockPool::new(cfg.num_gpu_blocks);
        let adapters = cfg.lora.clone().map(Residency::new);
        Self {
            cfg,
            pool,
            cache: PrefixCache::default(),
            seqs: HashMap::new(),
            running: Vec::new(),
            waiting: VecDeque::new(),
            swapped: VecDeque::new(),
            admissions: 0,
            counters: Counters::default(),
            adapters,
            stall: Duration::ZERO,
        }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// Queues a new sequence at the back of the waiting queue.
    pub fn add(&mut self, new: NewSeq) {
        let id = new.id;
        self.seqs.insert(id, Seq::new(new));
        self.waiting.push_back(id);
    }

    /// Removes a sequence wherever it is and frees its blocks; its work so far is wasted.
    /// Returns false when the sequence is unknown (already finished).
    pub fn abort(&mut self, id: SeqId) -> bool {
        let Some(mut seq) = self.seqs.remove(&id) else {
            return false;
        };
        match seq.phase {
            Phase::Running => {
                return_blocks(&mut self.pool, &mut self.cache, &mut seq);
                self.running.retain(|r| *r != id);
            }
            Phase::Waiting => self.waiting.retain(|r| *r != id),
            Phase::Swapped => self.swapped.retain(|r| *r != id),
        }
        self.counters.wasted_tokens += seq.work;
        self.counters.aborted += 1;
        true
    }

    pub fn running_len(&self) -> usize {
        self.running.len()
    }

    pub fn waiting_len(&self) -> usize {
        self.waiting.len()
    }

    pub fn swapped_len(&self) -> usize {
        self.swapped.len()
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    pub fn prefix_cache(&self) -> &PrefixCache {
        &self.cache
    }

    /// The prefix cache's changes since the last call (its KV events).
    pub fn take_cache_events(&mut self) -> Vec<prefix::CacheEvent> {
        self.cache.take_events()
    }

    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Where the adapters are, and their moves; `None` when the engine serves no adapters.
    pub fn adapters(&self) -> Option<&Residency> {
        self.adapters.as_ref()
    }

    /// An adapter loaded through the API, read into host memory; the next step waits for the
    /// read, as vLLM's `add_lora` utility call holds the engine loop. Returns the read's time.
    pub fn preload_adapter(&mut self, id: AdapterId) -> Duration {
        let read = self
            .adapters
            .as_mut()
            .map_or(Duration::ZERO, |a| a.preload(id));
        self.stall += read;
        read
    }

    /// An adapter unloaded through the API.
    pub fn forget_adapter(&mut self, id: AdapterId) {
        if let Some(a) = self.adapters.as_mut() {
            a.forget(id);
        }
    }

    pub fn seq(&self, id: SeqId) -> Option<&Seq> {
        self.seqs.get(&id)
    }

    /// Every live sequence: running, then waiting, then swapped out.
    pub fn live_ids(&self) -> Vec<SeqId> {
        self.running
            .iter()
            .chain(self.waiting.iter())
            .chain(self.swapped.iter())
            .copied()
            .collect()
    }

    /// Sequences in the running batch, in admission order.
    pub fn running(&self) -> impl Iterator<Item = &Seq> {
        self.running.iter().filter_map(|id| self.seqs.get(id))
    }

    /// Compute (tokens) spent on the live sequences: what a crash now would waste.
    pub fn work_in_flight(&self) -> u64 {
        self.seqs.values().map(|s| s.work).sum()
    }

    /// Running requests part-way through a chunked prefill: SGLang's `chunked_req`, which
    /// neither its running nor its waiting count includes.
    pub fn chunked_len(&self) -> usize {
        self.running()
            .filter(|s| s.is_prefilling() && s.computed > 0)
            .count()
    }

    /// Prompt tokens not yet prefilled, waiting or running (Dynamo's `active_prefill_tokens`).
    pub fn pending_prefill_tokens(&self) -> u64 {
        self.seqs
            .values()
            .filter(|s| s.phase != Phase::Swapped)
            .map(|s| u64::from(s.prefill_target.saturating_sub(s.computed)))
            .sum()
    }

    /// Plans and applies one forward pass. `None` when there is nothing to do.
    pub fn step(&mut self) -> Option<Step> {
        let mut events = Vec::new();
        let mut plan: Vec<(SeqId, Work)> = Vec::new();
        let mut budget = self.cfg.max_num_batched_tokens;
        let mut transferred_blocks = 0u32;

        let preempted =
            self.schedule_running(&mut plan, &mut budget, &mut events, &mut transferred_blocks);
        if !preempted {
            self.resume_swapped(&mut plan, &mut budget, &mut transferred_blocks);
            if self.swapped.is_empty() {
                self.admit_waiting(&mut plan, &mut budget);
            }
        }
        if plan.is_empty() && transferred_blocks == 0 && events.is_empty() {
            return None;
        }
        let adapter_moves = self.activate_adapters(&plan);
        let mut step = self.apply(plan, transferred_blocks, events);
        step.duration += adapter_moves + std::mem::take(&mut self.stall);
        self.counters.steps += 1;
        Some(step)
    }

    /// The adapters (`None`: the base model) of the planned requests.
    fn batch_adapters(&self, plan: &[(SeqId, Work)]) -> BTreeSet<Option<AdapterId>> {
        plan.iter()
            .filter_map(|(id, _)| self.seqs.get(id))
            .map(|s| s.adapter.as_ref().map(|a| a.id))
            .collect()
    }

    /// Brings the planned requests' adapters into GPU slots before the pass; what that takes.
    fn activate_adapters(&mut self, plan: &[(SeqId, Work)]) -> Duration {
        if self.adapters.is_none() {
            return Duration::ZERO;
        }
        let batch: BTreeSet<AdapterId> = self.batch_adapters(plan).into_iter().flatten().collect();
        self.adapters
            .as_mut()
            .map_or(Duration::ZERO, |a| a.activate(&batch))
    }

    /// Schedules the running batch; returns whether anything was preempted.
    fn schedule_running(
        &mut self,
        plan: &mut Vec<(SeqId, Work)>,
        budget: &mut u32,
        events: &mut Vec<SeqEvent>,
        transferred_blocks: &mut u32,
    ) -> bool {
        let mut preempted = false;
        let mut i = 0;
        while i < self.running.len() && *budget > 0 {
            let id = self.running[i];
            let Some(seq) = self.seqs.get_mut(&id) else {
                self.running.remove(i);
                continue;
            };
            let work = if seq.is_prefilling() {
                Work::Prefill((seq.prefill_target - seq.computed).min(*budget))
            } else {
                Work::Decode
            };
            let need = blocks_for(seq.computed + work.tokens(), self.cfg.block_size)
                .saturating_sub(seq.blocks);
            if need == 0 || take_blocks(&mut self.pool, &mut self.cache, need) {
                seq.blocks += need;
                *budget -= work.tokens();
                plan.push((id, work));
                i += 1;
                continue;
            }
            // Out of blocks: evict someone (maybe this very request) and try again.
            let Some(victim) = self.pick_victim() else {
                break;
            };
            preempted = true;
            let victim_index = self.running.iter().position(|r| *r == victim);
            if let Some(pos) = plan.iter().position(|(pid, _)| *pid == victim) {
                let (_, work) = plan.remove(pos);
                *budget += work.tokens();
            }
            self.preempt(victim, events, transferred_blocks);
            if matches!(victim_index, Some(v) if v < i) {
                i -= 1;
            }
        }
        preempted
    }

    /// The running request the eviction policy gives up first; ties go to the newest admission.
    fn pick_victim(&self) -> Option<SeqId> {
        let running = self.running.iter().filter_map(|id| self.seqs.get(id));
        let newest = |s: &Seq| s.admitted_at;
        let victim = match self.cfg.eviction {
            Eviction::Fcfs => running.max_by_key(|s| newest(s)),
            Eviction::Las => running.min_by_key(|s| (s.attained(), std::cmp::Reverse(newest(s)))),
            Eviction::Srpt => running.max_by_key(|s| (s.remaining(), newest(s))),
        };
        victim.map(|s| s.id)
    }

    fn preempt(&mut self, id: SeqId, events: &mut Vec<SeqEvent>, transferred_blocks: &mut u32) {
        self.running.retain(|r| *r != id);
        self.counters.preemptions += 1;
        let Some(seq) = self.seqs.get_mut(&id) else {
            return;
        };
        let held = seq.blocks;
        return_blocks(&mut self.pool, &mut self.cache, seq);
        match self.cfg.preemption {
            Preemption::Recompute => {
                self.counters.wasted_tokens += seq.work;
                seq.work = 0;
                seq.blocks = 0;
                seq.computed = 0;
                seq.prefill_target = seq.prompt_tokens + seq.generated;
                seq.preempted = true;
                seq.phase = Phase::Waiting;
                self.waiting.push_front(id);
                events.push(SeqEvent::Preempted(id));
            }
            Preemption::Swap => {
                // Its copy in host memory is its own; the cached blocks stay behind, evictable.
                seq.blocks = held;
                *transferred_blocks += seq.blocks;
                seq.phase = Phase::Swapped;
                self.swapped.push_back(id);
                events.push(SeqEvent::Preempted(id));
            }
            Preemption::Truncate => {
                self.seqs.remove(&id);
                self.counters.finished += 1;
                events.push(SeqEvent::Finished(id, FinishReason::Length));
            }
        }
    }

    /// Prices the planned pass and advances every planned sequence by it.
    fn apply(
        &mut self,
        plan: Vec<(SeqId, Work)>,
        transferred_blocks: u32,
        mut events: Vec<SeqEvent>,
    ) -> Step {
        let mut work_done = StepWork {
            transferred_blocks,
            ..StepWork::default()
        };
        let mut prompt_tokens_counted = 0u32;
        let mut finished = Vec::new();
        for (id, work) in plan {
            let Some(seq) = self.seqs.get_mut(&id) else {
                continue;
            };
            let computed_now = match work {
                Work::Prefill(chunk) => {
                    work_done.prefill_tokens += chunk;
                    self.counters.prompt_tokens_computed += u64::from(chunk);
                    work_done.attention_pairs += attention_pairs_of(seq.computed, chunk);
                    chunk
                }
                Work::Decode => {
                    work_done.decode_tokens += 1;
                    1
                }
            };
            seq.computed += computed_now;
            seq.work += u64::from(computed_now);
            work_done.kv_read += u64::from(seq.computed);
            if matches!(work, Work::Prefill(_)) {
                cache_computed(&mut self.pool, &mut self.cache, seq, self.cfg.block_size);
            }
            if seq.is_prefilling() {
                continue;
            }
            if seq.generated == 0 {
                prompt_tokens_counted += seq.prompt_tokens;
            }
            seq.generated += 1;
            self.counters.tokens_generated += 1;
            events.push(SeqEvent::Token(id));
            if seq.generated >= seq.output_tokens {
                events.push(SeqEvent::Finished(id, seq.finish));
                finished.push(id);
            }
        }
        for id in finished {
            if let Some(mut seq) = self.seqs.remove(&id) {
                return_blocks(&mut self.pool, &mut self.cache, &mut seq);
                self.counters.finished += 1;
            }
            self.running.retain(|r| *r != id);
        }
        self.counters.prompt_tokens_counted += u64::from(prompt_tokens_counted);
        Step {
            duration: self.cfg.cost.of(&work_done),
            prefill_tokens: work_done.prefill_tokens,
            decode_tokens: work_done.decode_tokens,
            prompt_tokens_counted,
            events,
        }
    }
}

impl Scheduler {
    /// Sequences waiting or swapped out, in queue order.
    pub fn queued_ids(&self) -> Vec<SeqId> {
        self.waiting
            .iter()
            .chain(self.swapped.iter())
            .copied()
            .collect()
    }
}
