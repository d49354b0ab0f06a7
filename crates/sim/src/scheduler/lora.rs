//! LoRA adapters on one rank: how many distinct ones a running batch may hold, and where each
//! adapter's weights are (a GPU slot, host memory, or only on disk), which decides what bringing
//! it into a batch costs.
//!
//! The cap is the schedulers': vLLM admits a waiting request whose adapter is not among those of
//! the requests it scheduled this step only while fewer than `max_loras` are (otherwise it skips
//! the request, leaves it at its place in the queue and goes on with the next one;
//! vllm/v1/core/sched/scheduler.py `schedule`, read at 00024d3). SGLang does the same with
//! `max_loras_per_batch`, but counts the base model as one of the batch's adapters
//! (python/sglang/srt/lora/lora_manager.py `validate_lora_batch`, whose set holds `None` for
//! base requests; the scheduler's waiting loop `continue`s past a request that does not fit).
//!
//! The residency is vLLM's worker-side LRU caches (`LRUCacheWorkerLoRAManager`): before a step
//! runs, every adapter of the batch not in host memory is read from disk (evicting the least
//! recently used one past `max_cpu_loras`), and every one not in a GPU slot is copied there
//! (evicting the least recently used slot the batch does not need). The copies happen before
//! the forward pass, so they lengthen the step. SGLang's memory pool (`fetch_new_loras` before
//! a batch, `--max-loaded-loras` in host memory) behaves the same way.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

/// An adapter inside one engine: vLLM's `lora_int_id`, numbered from 1 in the order adapters
/// were loaded (the API server's counter).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct AdapterId(pub u32);

/// The adapter a request names: its number, and its name, which the KV events carry.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Adapter {
    pub id: AdapterId,
    pub name: Arc<str>,
}

/// A rank's LoRA limits and what moving an adapter costs.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    /// Distinct adapters one running batch may hold: vLLM's `--max-loras` (default 1), SGLang's
    /// `--max-loras-per-batch` (default 8). Also the adapters' GPU slots.
    pub max_loras: u32,
    /// The base model takes one of those (SGLang), or never counts (vLLM).
    pub base_takes_slot: bool,
    /// Adapters kept in host memory: vLLM's `--max-cpu-loras` (default `--max-loras`), SGLang's
    /// `--max-loaded-loras` (default: no bound). `None`: no bound.
    pub max_cpu_loras: Option<u32>,
    /// Copying an adapter from host memory into a GPU slot.
    pub load_from_cpu: Duration,
    /// Reading an adapter from disk into host memory.
    pub load_from_disk: Duration,
}

/// Adapter moves since the rank started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct AdapterCounters {
    /// Adapters copied from host memory into a GPU slot.
    pub loads_from_cpu: u64,
    /// Adapters read from disk (each then copied into a slot, or kept in host memory).
    pub loads_from_disk: u64,
    /// Requests that waited at least once because the batch's adapter slots were full of other
    /// adapters (each request counted once).
    pub slot_waits: u64,
}

/// Where the adapters' weights are, least recently used first in each tier.
#[derive(Debug, Clone)]
pub struct Residency {
    cfg: LoraConfig,
    gpu: Vec<AdapterId>,
    cpu: Vec<AdapterId>,
    counters: AdapterCounters,
}

impl Residency {
    pub fn new(cfg: LoraConfig) -> Self {
        Self {
            cfg,
            gpu: Vec::new(),
            cpu: Vec::new(),
            counters: AdapterCounters::default(),
        }
    }

    pub fn config(&self) -> &LoraConfig {
        &self.cfg
    }

    pub fn counters(&self) -> AdapterCounters {
        self.counters
    }

    /// Adapters in GPU slots, least recently used first.
    pub fn on_gpu(&self) -> &[AdapterId] {
        &self.gpu
    }

    /// Adapters in host memory, least recently used first.
    pub fn in_host_memory(&self) -> &[AdapterId] {
        &self.cpu
    }

    /// Whether a batch whose requests use `batch` (`None`: the base model) can take a request
    /// for `adapter` too.
    pub fn fits(&self, batch: &BTreeSet<Option<AdapterId>>, adapter: Option<AdapterId>) -> bool {
        if adapter.is_none() && !self.cfg.base_takes_slot {
            return true;
        }
        if batch.contains(&adapter) {
            return true;
        }
        let counted = batch
            .iter()
            .filter(|a| a.is_some() || self.cfg.base_takes_slot)
            .count();
        counted < self.cfg.max_loras as usize
    }

    /// A request that had to wait for a slot (counted once by the caller per request).
    pub(super) fn note_slot_wait(&mut self) {
        self.counters.slot_waits += 1;
    }

    /// Brings the adapters of a batch into GPU slots; returns how long the moves take.
    pub fn activate(&mut self, batch: &BTreeSet<AdapterId>) -> Duration {
        let mut cost = Duration::ZERO;
        for &id in batch {
            cost += self.bring_to_host_memory(id, batch);
            if let Some(at) = self.gpu.iter().position(|a| *a == id) {
                self.gpu.remove(at);
            } else {
                if self.gpu.len() >= self.cfg.max_loras as usize {
                    evict_one(&mut self.gpu, batch);
                }
                self.counters.loads_from_cpu += 1;
                cost += self.cfg.load_from_cpu;
            }
            self.gpu.push(id);
        }
        cost
    }

    /// An adapter loaded through the engine's API: read into host memory now, as vLLM's
    /// `add_lora` does. Returns how long the read takes (nothing when it is there already).
    pub fn preload(&mut self, id: AdapterId) -> Duration {
        self.bring_to_host_memory(id, &BTreeSet::new())
    }

    /// An adapter unloaded through the API: gone from every tier.
    pub fn forget(&mut self, id: AdapterId) {
        self.gpu.retain(|a| *a != id);
        self.cpu.retain(|a| *a != id);
    }

    /// Makes `id` the most recently used adapter in host memory, reading it from disk when it
    /// is not there; an adapter pushed out of host memory leaves its GPU slot too (vLLM's
    /// `remove_oldest_adapter` deactivates it).
    fn bring_to_host_memory(&mut self, id: AdapterId, batch: &BTreeSet<AdapterId>) -> Duration {
        if let Some(at) = self.cpu.iter().position(|a| *a == id) {
            self.cpu.remove(at);
            self.cpu.push(id);
            return Duration::ZERO;
        }
        if let Some(cap) = self.cfg.max_cpu_loras {
            if self.cpu.len() >= cap as usize {
                if let Some(gone) = evict_one(&mut self.cpu, batch) {
                    self.gpu.retain(|a| *a != gone);
                }
            }
        }
        self.cpu.push(id);
        self.counters.loads_from_disk += 1;
        self.cfg.load_from_disk
    }
}

/// Removes the least recently used adapter the batch does not need; returns it.
fn evict_one(tier: &mut Vec<AdapterId>, batch: &BTreeSet<AdapterId>) -> Option<AdapterId> {
    let at = tier.iter().position(|a| !batch.contains(a))?;
    Some(tier.remove(at))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn residency(max_loras: u32, max_cpu: Option<u32>) -> Residency {
        Residency::new(LoraConfig {
            max_loras,
            base_takes_slot: false,
            max_cpu_loras: max_cpu,
            load_from_cpu: Duration::from_millis(10),
            load_from_disk: Duration::from_millis(100),
        })
    }

    fn set(ids: &[u32]) -> BTreeSet<AdapterId> {
        ids.iter().map(|i| AdapterId(*i)).collect()
    }

    #[test]
    fn an_adapter_never_seen_is_read_from_disk_then_copied_to_a_slot() {
        let mut r = residency(2, None);
        assert_eq!(r.activate(&set(&[1])), Duration::from_millis(110));
        assert_eq!(r.activate(&set(&[1])), Duration::ZERO);
        let c = r.counters();
        assert_eq!((c.loads_from_disk, c.loads_from_cpu), (1, 1));
    }

    #[test]
    fn a_full_set_of_slots_gives_up_the_least_recently_used_adapter_the_batch_does_not_need() {
        let mut r = residency(2, None);
        r.activate(&set(&[1]));
        r.activate(&set(&[2]));
        r.activate(&set(&[1]));
        // Slot of 2 (least recently used) goes; 3 still has to come from disk.
        assert_eq!(r.activate(&set(&[3])), Duration::from_millis(110));
        assert_eq!(r.on_gpu(), &[AdapterId(1), AdapterId(3)]);
        // 2 is still in host memory: only the copy.
        assert_eq!(r.activate(&set(&[2, 3])), Duration::from_millis(10));
        assert_eq!(r.on_gpu(), &[AdapterId(2), AdapterId(3)]);
    }

    #[test]
    fn an_adapter_pushed_out_of_host_memory_is_read_from_disk_again_and_leaves_its_slot() {
        let mut r = residency(2, Some(2));
        r.activate(&set(&[1]));
        r.activate(&set(&[2]));
        r.activate(&set(&[3]));
        assert_eq!(r.in_host_memory(), &[AdapterId(2), AdapterId(3)]);
        assert!(!r.on_gpu().contains(&AdapterId(1)));
        assert_eq!(r.activate(&set(&[1])), Duration::from_millis(110));
        assert_eq!(r.counters().loads_from_disk, 4);
    }

    #[test]
    fn a_preloaded_adapter_costs_only_its_copy_when_first_used() {
        let mut r = residency(1, None);
        assert_eq!(r.preload(AdapterId(7)), Duration::from_millis(100));
        assert_eq!(r.preload(AdapterId(7)), Duration::ZERO);
        assert_eq!(r.activate(&set(&[7])), Duration::from_millis(10));
    }

    #[test]
    fn the_cap_counts_the_base_model_only_where_the_engine_does() {
        let batch: BTreeSet<Option<AdapterId>> = [None, Some(AdapterId(1))].into();
        let vllm = residency(1, None);
        assert!(vllm.fits(&batch, None));
        assert!(vllm.fits(&batch, Some(AdapterId(1))));
        assert!(!vllm.fits(&batch, Some(AdapterId(2))));
        let mut cfg = vllm.config().clone();
        cfg.max_loras = 2;
        cfg.base_takes_slot = true;
        let sglang = Residency::new(cfg);
        assert!(!sglang.fits(&batch, Some(AdapterId(2))));
        assert!(sglang.fits(&[Some(AdapterId(1))].into(), None));
    }
}
