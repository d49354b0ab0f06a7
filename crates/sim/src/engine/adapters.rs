//! The engine's LoRA metrics, each flavor's way.
//!
//! vLLM: `vllm:lora_requests_info`, a gauge whose labels name the adapters with requests
//! running and waiting (comma-joined, no counts) and `max_lora`, and whose value is the wall
//! clock when that combination was last current: it is set every step (`set_to_current_time`),
//! and prometheus_client keeps every label combination it was ever set with, so a scrape shows
//! past combinations beside the newest, which a reader tells apart by the value
//! (vllm/v1/metrics/loggers.py, `record`; the states in vllm/v1/metrics/stats.py,
//! `LoRARequestStates`, read at 28ed1fb).
//!
//! SGLang: `sglang:lora_pool_slots_used` (distinct adapters in the running batch, the base model
//! not counted), `sglang:lora_pool_slots_total` (`--max-loras-per-batch`) and
//! `sglang:lora_pool_utilization` (their ratio), and the same three under `lora` in `/v1/loads`
//! (python/sglang/srt/managers/scheduler_metrics_mixin.py, `update_lora_metrics`, `get_loads`).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::SystemTime;

use crate::config::Flavor;
use crate::scheduler::usage::AdapterUse;

/// Adapter -> (name, requests), as `AdapterUse` holds it.
type ByAdapter = BTreeMap<crate::scheduler::AdapterId, (std::sync::Arc<str>, u32)>;

/// A gauge of SGLang's: its name, help and value of a rank's slots.
type SlotGauge = (&'static str, &'static str, fn(Slots) -> f64);

/// The latest use per rank, and vLLM's label combinations with when each was last current.
#[derive(Debug, Default)]
pub struct AdapterStats {
    ranks: parking_lot::Mutex<Vec<Option<AdapterUse>>>,
    /// (running, waiting) labels -> unix seconds it was last set.
    combinations: parking_lot::Mutex<BTreeMap<(String, String), f64>>,
}

/// One rank's slots as SGLang reports them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slots {
    pub used: u32,
    pub total: u32,
}

impl Slots {
    pub fn utilization(self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            f64::from(self.used) / f64::from(self.total)
        }
    }
}

impl AdapterStats {
    pub fn new(ranks: usize) -> Self {
        Self {
            ranks: parking_lot::Mutex::new(vec![None; ranks]),
            combinations: parking_lot::Mutex::default(),
        }
    }

    /// A rank's use after a step; vLLM's gauge is set for the engine's union of them.
    pub fn record(&self, rank: usize, adapter_use: AdapterUse) {
        let (running, waiting) = {
            let mut ranks = self.ranks.lock();
            if let Some(slot) = ranks.get_mut(rank) {
                *slot = Some(adapter_use);
            }
            let names = |pick: fn(&AdapterUse) -> &ByAdapter| {
                let mut by_id = BTreeMap::new();
                for u in ranks.iter().flatten() {
                    for (id, (name, _)) in pick(u) {
                        by_id.insert(*id, name.clone());
                    }
                }
                by_id
                    .values()
                    .map(|n| n.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            };
            (names(|u| &u.running), names(|u| &u.waiting))
        };
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.combinations.lock().insert((running, waiting), now);
    }

    /// Every rank's latest use (`None` before its first step).
    pub fn ranks(&self) -> Vec<Option<AdapterUse>> {
        self.ranks.lock().clone()
    }

    /// Adapter moves and slot waits over the ranks.
    pub fn totals(&self) -> crate::scheduler::AdapterCounters {
        let ranks = self.ranks.lock();
        let mut sum = crate::scheduler::AdapterCounters::default();
        for c in ranks.iter().flatten().map(|u| u.counters) {
            sum.loads_from_cpu += c.loads_from_cpu;
            sum.loads_from_disk += c.loads_from_disk;
            sum.slot_waits += c.slot_waits;
        }
        sum
    }

    /// A rank's slots, SGLang's way.
    pub fn slots(&self, rank: usize) -> Option<Slots> {
        let ranks = self.ranks.lock();
        let u = ranks.get(rank)?.as_ref()?;
        Some(Slots {
            used: u.running.len() as u32,
            total: u.slots,
        })
    }

    /// The flavor's LoRA families in Prometheus text, for `/metrics`.
    pub fn render(&self, flavor: Flavor, model: &str, max_lora: u32) -> String {
        let mut out = String::new();
        match flavor {
            Flavor::Vllm => {
                out.push_str("# HELP vllm:lora_requests_info Running stats on lora requests.\n");
                out.push_str("# TYPE vllm:lora_requests_info gauge\n");
                for ((running, waiting), at) in self.combinations.lock().iter() {
                    let _ = writeln!(
                        out,
                        "vllm:lora_requests_info{{max_lora=\"{max_lora}\",waiting_lora_adapters=\"{waiting}\",running_lora_adapters=\"{running}\"}} {at:e}"
                    );
                }
            }
            Flavor::Sglang => self.render_sglang(&mut out, model),
        }
        out
    }

    fn render_sglang(&self, out: &mut String, model: &str) {
        let count = self.ranks.lock().len();
        let slots: Vec<(usize, Slots)> = (0..count)
            .filter_map(|r| self.slots(r).map(|s| (r, s)))
            .collect();
        let families: [SlotGauge; 3] = [
            (
                "sglang:lora_pool_slots_used",
                "Number of LoRA adapter slots currently occupied in GPU memory.",
                |s| f64::from(s.used),
            ),
            (
                "sglang:lora_pool_slots_total",
                "Total number of LoRA adapter slots available (max_loras_per_batch).",
                |s| f64::from(s.total),
            ),
            (
                "sglang:lora_pool_utilization",
                "LoRA pool utilization ratio (used/total).",
                Slots::utilization,
            ),
        ];
        for (name, help, value) in families {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for (rank, s) in &slots {
                let _ = writeln!(
                    out,
                    "{name}{{model_name=\"{model}\",engine=\"{rank}\"}} {}",
                    value(*s)
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::{AdapterCounters, AdapterId};

    fn adapter_use(running: &[(u32, &str, u32)], waiting: &[(u32, &str, u32)]) -> AdapterUse {
        let by = |list: &[(u32, &str, u32)]| {
            list.iter()
                .map(|(id, name, n)| (AdapterId(*id), ((*name).into(), *n)))
                .collect()
        };
        AdapterUse {
            running: by(running),
            waiting: by(waiting),
            counters: AdapterCounters::default(),
            slots: 2,
        }
    }

    #[test]
    fn vllm_keeps_every_combination_it_was_set_with_the_newest_the_latest_value() {
        let stats = AdapterStats::new(2);
        stats.record(0, adapter_use(&[(1, "sql", 3)], &[(2, "med", 1)]));
        stats.record(1, adapter_use(&[(3, "law", 1)], &[]));
        stats.record(0, adapter_use(&[], &[]));
        let text = stats.render(Flavor::Vllm, "m", 2);
        let series: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(series.len(), 3, "{text}");
        // Names in adapter order, joined without counts; ranks joined into one engine.
        assert!(text.contains(
            "{max_lora=\"2\",waiting_lora_adapters=\"med\",running_lora_adapters=\"sql,law\"}"
        ));
        assert!(text
            .contains("{max_lora=\"2\",waiting_lora_adapters=\"\",running_lora_adapters=\"law\"}"));
        let value = |labels: &str| -> f64 {
            let line = series.iter().find(|l| l.contains(labels)).unwrap();
            line.rsplit(' ').next().unwrap().parse().unwrap()
        };
        assert!(value("running_lora_adapters=\"law\"}") >= value("running_lora_adapters=\"sql\"}"));
        assert!(
            value("running_lora_adapters=\"law\"}") > 1.7e9,
            "a unix time"
        );
    }

    #[test]
    fn sglang_counts_the_adapters_running_against_its_slots() {
        let stats = AdapterStats::new(1);
        stats.record(0, adapter_use(&[(1, "sql", 3)], &[(2, "med", 4)]));
        let slots = stats.slots(0).unwrap();
        assert_eq!((slots.used, slots.total), (1, 2));
        let text = stats.render(Flavor::Sglang, "m", 2);
        assert!(text.contains("sglang:lora_pool_slots_used{model_name=\"m\",engine=\"0\"} 1\n"));
        assert!(text.contains("sglang:lora_pool_utilization{model_name=\"m\",engine=\"0\"} 0.5\n"));
    }
}
