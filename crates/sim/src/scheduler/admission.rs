//! Taking requests into the running batch: swapped ones back first, then waiting ones in
//! order, each while the blocks of its next chunk (plus the watermark) are free and the batch
//! has room for its adapter.

use std::collections::BTreeSet;

use super::blocks::{blocks_for, take_blocks};
use super::prefix::Acquired;
use super::{AdapterId, Phase, Scheduler, SeqId, Work};

impl Scheduler {
    /// Brings swapped requests back while blocks (plus the watermark) allow, each decoding in the
    /// step that brings it back.
    pub(super) fn resume_swapped(
        &mut self,
        plan: &mut Vec<(SeqId, Work)>,
        budget: &mut u32,
        transferred_blocks: &mut u32,
    ) {
        let mut batch = self.batch_adapters(plan);
        let mut passed_over = Vec::new();
        while let Some(&id) = self.swapped.front() {
            if self.running.len() >= self.cfg.max_num_seqs as usize || *budget == 0 {
                break;
            }
            let Some(adapter) = self.seqs.get(&id).map(|s| s.adapter.as_ref().map(|a| a.id)) else {
                self.swapped.pop_front();
                continue;
            };
            // vLLM's V0 scheduler, which swapped, passed over a swapped request whose adapter
            // the batch had no room for, as the waiting queue does.
            if !self.adapter_fits(&batch, id, adapter) {
                passed_over.push(self.swapped.pop_front().unwrap_or(id));
                continue;
            }
            let Some((work, moved)) = self.resume(id, *budget) else {
                break;
            };
            batch.insert(adapter);
            *transferred_blocks += moved;
            *budget -= work.tokens();
            plan.push((id, work));
        }
        for id in passed_over.into_iter().rev() {
            self.swapped.push_front(id);
        }
    }

    /// Brings the swapped request at the front back into the running batch; returns its work
    /// and the blocks moved back, or `None` when its blocks are not free.
    fn resume(&mut self, id: SeqId, budget: u32) -> Option<(Work, u32)> {
        let seq = self.seqs.get_mut(&id)?;
        let work = if seq.is_prefilling() {
            Work::Prefill((seq.prefill_target - seq.computed).min(budget))
        } else {
            Work::Decode
        };
        let extra = blocks_for(seq.computed + work.tokens(), self.cfg.block_size)
            .saturating_sub(seq.blocks);
        let need = seq.blocks + extra;
        if self.pool.free() < need + self.cfg.watermark_blocks
            || !take_blocks(&mut self.pool, &mut self.cache, need)
        {
            return None;
        }
        let moved = seq.blocks;
        seq.blocks = need;
        self.admissions += 1;
        seq.admitted_at = self.admissions;
        seq.phase = Phase::Running;
        self.swapped.pop_front();
        self.running.push(id);
        Some((work, moved))
    }

    /// Admits waiting requests in order while the blocks of their first chunk (plus the
    /// watermark) are free; the rest of a long prompt takes its blocks chunk by chunk. A request
    /// whose adapter would be one too many for the batch is passed over, keeping its place.
    pub(super) fn admit_waiting(&mut self, plan: &mut Vec<(SeqId, Work)>, budget: &mut u32) {
        let mut batch = self.batch_adapters(plan);
        let mut passed_over = Vec::new();
        while self.running.len() < self.cfg.max_num_seqs as usize && *budget > 0 {
            let Some(&id) = self.waiting.front() else {
                break;
            };
            let Some(adapter) = self.seqs.get(&id).map(|s| s.adapter.as_ref().map(|a| a.id)) else {
                self.waiting.pop_front();
                continue;
            };
            if !self.adapter_fits(&batch, id, adapter) {
                passed_over.push(self.waiting.pop_front().unwrap_or(id));
                continue;
            }
            let Some(chunk) = self.admit(id, *budget) else {
                break;
            };
            batch.insert(adapter);
            *budget -= chunk;
            plan.push((id, Work::Prefill(chunk)));
        }
        for id in passed_over.into_iter().rev() {
            self.waiting.push_front(id);
        }
    }

    /// Whether the batch has room for `adapter`; a request refused for it is counted once.
    fn adapter_fits(
        &mut self,
        batch: &BTreeSet<Option<AdapterId>>,
        id: SeqId,
        adapter: Option<AdapterId>,
    ) -> bool {
        let Some(adapters) = self.adapters.as_mut() else {
            return true;
        };
        if adapters.fits(batch, adapter) {
            return true;
        }
        if let Some(seq) = self.seqs.get_mut(&id) {
            if !seq.slot_waited {
                seq.slot_waited = true;
                adapters.note_slot_wait();
            }
        }
        false
    }

    /// Moves the waiting request at the front into the running batch with its cached blocks and
    /// the blocks of its first chunk; returns the chunk, or `None` when the blocks are not free.
    fn admit(&mut self, id: SeqId, budget: u32) -> Option<u32> {
        let seq = self.seqs.get_mut(&id)?;
        // At least the last prompt token is computed, as in vLLM, even on a full hit.
        let hashed = (seq.prefill_target.saturating_sub(1) / self.cfg.block_size.max(1))
            .min(seq.prefix.len() as u32);
        let (hits, revived) = self.cache.lookup(&seq.prefix[..hashed as usize]);
        // Transferred KV lands in the blocks taken now; the last prompt token is still
        // computed here, as on a full prefix hit.
        let preloaded = seq.preloaded.min(seq.prefill_target.saturating_sub(1));
        let computed = (hits * self.cfg.block_size).max(preloaded);
        let chunk = (seq.prefill_target - computed).min(budget);
        let need = blocks_for(computed + chunk, self.cfg.block_size).max(hits);
        let fresh = need - hits;
        if self.pool.free() < fresh + revived + self.cfg.watermark_blocks {
            return None;
        }
        for hash in &seq.prefix[..hits as usize] {
            if self.cache.acquire(*hash) == Some(Acquired::Revived) {
                self.pool.try_take(1);
            }
        }
        let taken = take_blocks(&mut self.pool, &mut self.cache, fresh);
        debug_assert!(taken, "the free blocks were counted above");
        let (queries, found) = match seq.preempted {
            false => (
                &mut self.counters.prefix_queries,
                &mut self.counters.prefix_hits,
            ),
            true => (
                &mut self.counters.preempted_queries,
                &mut self.counters.preempted_hits,
            ),
        };
        *queries += u64::from(seq.prefill_target);
        *found += u64::from(hits * self.cfg.block_size);
        seq.shared = hits;
        seq.computed = computed;
        self.waiting.pop_front();
        self.admissions += 1;
        seq.admitted_at = self.admissions;
        seq.blocks = need;
        seq.phase = Phase::Running;
        self.running.push(id);
        Some(chunk)
    }
}
