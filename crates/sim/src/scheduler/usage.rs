//! Which adapters the rank's requests use, running and waiting: what the engines' LoRA metrics
//! count (vLLM's per-adapter request states, SGLang's slots in use).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{AdapterCounters, AdapterId, Scheduler, Seq};

/// Requests per adapter, by where they are; the base model's are not counted.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AdapterUse {
    /// Adapter -> (name, requests running under it).
    pub running: BTreeMap<AdapterId, (Arc<str>, u32)>,
    /// Adapter -> (name, requests waiting, or swapped out, under it).
    pub waiting: BTreeMap<AdapterId, (Arc<str>, u32)>,
    /// The adapters' moves and slot waits so far.
    pub counters: AdapterCounters,
    /// Distinct adapters a running batch may hold (the slots).
    pub slots: u32,
}

impl Scheduler {
    /// The adapters in use; `None` when the engine serves no adapters.
    pub fn adapter_use(&self) -> Option<AdapterUse> {
        let residency = self.adapters.as_ref()?;
        let tally = |ids: &mut dyn Iterator<Item = &Seq>| {
            let mut by: BTreeMap<AdapterId, (Arc<str>, u32)> = BTreeMap::new();
            for adapter in ids.filter_map(|s| s.adapter.as_ref()) {
                by.entry(adapter.id)
                    .or_insert_with(|| (adapter.name.clone(), 0))
                    .1 += 1;
            }
            by
        };
        let queued = self.waiting.iter().chain(self.swapped.iter());
        Some(AdapterUse {
            running: tally(&mut self.running()),
            waiting: tally(&mut queued.filter_map(|id| self.seqs.get(id))),
            counters: residency.counters(),
            slots: residency.config().max_loras,
        })
    }
}
