//! LoRA adapters: what a worker's adapter slots mean for a request that names an adapter.
//!
//! An engine serving adapters batches only a few distinct ones at once (vLLM `--max-loras`,
//! SGLang `--max-loras-per-batch`): a request for an adapter already in the running batch joins
//! it; one for another adapter starts only if a slot is free, and waits otherwise, however idle
//! the rest of the engine is (vLLM `vllm/v1/core/sched/scheduler.py`, the waiting loop's
//! `max_loras` check; SGLang `python/sglang/srt/managers/scheduler.py`,
//! `_get_new_batch_prefill`). So where such a request goes decides whether it waits, and
//! the route stage ranks workers by `Affinity` before its policy chooses.
//!
//! What the engines tell (read by `load`): vLLM `vllm:lora_requests_info`, whose labels name the
//! adapters running and waiting and the slot count (`max_lora`), one series per combination
//! ever seen, the current one the newest (its value is the time it was set); SGLang
//! `lora.slots_used` and `slots_total` in `/v1/loads`, counts without names. Both are as old as
//! the last load poll; what this gateway has in flight on a worker is known at once, so the
//! adapters of its own requests there count as running too.

use serde::Serialize;

/// What an engine's last report says of its adapter slots.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AdapterSlots {
    /// Distinct adapters a running batch may hold (vLLM `max_lora`; SGLang `slots_total`, which
    /// also counts the base model when base requests run).
    pub max: Option<u32>,
    /// Adapters with requests in the running batch, by name (vLLM).
    pub running: Vec<String>,
    /// Adapters with requests waiting, by name (vLLM).
    pub waiting: Vec<String>,
    /// Slots in use, where only a count is reported (SGLang).
    pub used: Option<u32>,
}

impl AdapterSlots {
    /// Slots taken by the adapters reported running and by `here` (the adapters of this
    /// gateway's requests in flight on the worker): names counted once, a count taken as it is.
    pub fn taken(&self, here: &[&str]) -> u32 {
        let mut named: Vec<&str> = self.running.iter().map(String::as_str).collect();
        for adapter in here {
            if !named.contains(adapter) {
                named.push(adapter);
            }
        }
        (named.len() as u32).max(self.used.unwrap_or(0))
    }
}

/// Where a request for an adapter would stand on a worker, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Affinity {
    /// The adapter is in its running batch: the request joins it.
    Running,
    /// A slot is free (or the engine says nothing of its slots): it starts, after a load.
    FreeSlot,
    /// Every slot holds another adapter: it waits for one to empty.
    Waits,
}

/// Where a request for `adapter` stands on a worker whose engine last reported `slots` and where
/// this gateway has requests for the adapters `here` in flight.
pub fn affinity(adapter: &str, slots: Option<&AdapterSlots>, here: &[&str]) -> Affinity {
    if here.contains(&adapter) || slots.is_some_and(|s| s.running.iter().any(|r| r == adapter)) {
        return Affinity::Running;
    }
    let Some(max) = slots.and_then(|s| s.max) else {
        // Silent about its slots (no report yet, or not an adapter-serving engine): nothing to
        // prefer another worker over it for, and nothing to hold against it.
        return Affinity::FreeSlot;
    };
    let taken = slots.map_or(here.len() as u32, |s| s.taken(here));
    if taken < max {
        Affinity::FreeSlot
    } else {
        Affinity::Waits
    }
}

/// `items` in groups of equal affinity, the best group first: the route stage's policy chooses
/// within the first group that yields a worker.
pub fn groups<T>(mut items: Vec<(Affinity, T)>) -> Vec<Vec<T>> {
    items.sort_by_key(|(standing, _)| *standing);
    let mut groups: Vec<Vec<T>> = Vec::new();
    let mut last = None;
    for (standing, item) in items {
        match groups.last_mut() {
            Some(group) if last == Some(standing) => group.push(item),
            _ => groups.push(vec![item]),
        }
        last = Some(standing);
    }
    groups
}

/// One adapter a worker holds, as the choice of what to unload sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held<'a, T> {
    pub name: &'a str,
    /// Requests for it in flight through this gateway, or its engine reports it running.
    pub busy: bool,
    /// When it was last asked for there; `None`: never (since it was loaded, or the gateway
    /// started).
    pub last_used: Option<T>,
}

/// The adapters to unload from a worker that holds `held` so that one more (`loading`) fits in
/// `max_loaded`: idle ones only (never `loading`, never a busy one), least recently used first,
/// those never used before any. Fewer than needed when too many are busy.
pub fn to_unload<'a, T: Ord + Copy>(
    held: &[Held<'a, T>],
    loading: &str,
    max_loaded: u32,
) -> Vec<&'a str> {
    let over = (held.len() + 1).saturating_sub(max_loaded as usize);
    let mut idle: Vec<&Held<'a, T>> = held
        .iter()
        .filter(|h| !h.busy && h.name != loading)
        .collect();
    idle.sort_by_key(|h| h.last_used);
    idle.into_iter().take(over).map(|h| h.name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vllm(max: u32, running: &[&str]) -> AdapterSlots {
        AdapterSlots {
            max: Some(max),
            running: running.iter().map(|s| s.to_string()).collect(),
            ..AdapterSlots::default()
        }
    }

    #[test]
    fn an_adapter_running_there_by_the_report_or_by_this_gateways_requests_is_joined() {
        assert_eq!(
            affinity("sql", Some(&vllm(1, &["sql"])), &[]),
            Affinity::Running
        );
        assert_eq!(
            affinity("sql", Some(&vllm(1, &["med"])), &["sql"]),
            Affinity::Running
        );
    }

    #[test]
    fn slots_full_of_other_adapters_mean_a_wait_and_one_free_slot_a_start() {
        assert_eq!(
            affinity("law", Some(&vllm(2, &["sql", "med"])), &[]),
            Affinity::Waits
        );
        assert_eq!(
            affinity("law", Some(&vllm(2, &["sql"])), &[]),
            Affinity::FreeSlot
        );
        // The gateway's own request for another adapter fills the last slot before any report.
        assert_eq!(
            affinity("law", Some(&vllm(2, &["sql"])), &["med"]),
            Affinity::Waits
        );
        // Counted once when both tell of it.
        assert_eq!(
            affinity("law", Some(&vllm(2, &["sql"])), &["sql"]),
            Affinity::FreeSlot
        );
    }

    #[test]
    fn a_count_without_names_fills_slots_as_names_do() {
        let sglang = AdapterSlots {
            max: Some(4),
            used: Some(4),
            ..AdapterSlots::default()
        };
        assert_eq!(affinity("sql", Some(&sglang), &[]), Affinity::Waits);
        let room = AdapterSlots {
            used: Some(2),
            ..sglang
        };
        assert_eq!(
            affinity("sql", Some(&room), &["a", "b"]),
            Affinity::FreeSlot
        );
        assert_eq!(
            affinity("sql", Some(&room), &["a", "b", "c", "d"]),
            Affinity::Waits
        );
    }

    #[test]
    fn an_engine_silent_about_its_slots_is_neither_preferred_nor_avoided() {
        assert_eq!(affinity("sql", None, &["med", "law"]), Affinity::FreeSlot);
        let unknown = AdapterSlots {
            running: vec!["med".into()],
            ..AdapterSlots::default()
        };
        assert_eq!(affinity("sql", Some(&unknown), &[]), Affinity::FreeSlot);
    }

    #[test]
    fn workers_are_grouped_by_affinity_best_first_keeping_their_order_within() {
        use Affinity::*;
        let ranked = groups(vec![(Waits, 0), (FreeSlot, 1), (Running, 2), (FreeSlot, 3)]);
        assert_eq!(ranked, vec![vec![2], vec![1, 3], vec![0]]);
        assert_eq!(
            groups(vec![(Waits, 'a'), (Waits, 'b')]),
            vec![vec!['a', 'b']]
        );
        assert!(groups::<u8>(Vec::new()).is_empty());
    }

    #[test]
    fn the_least_recently_used_idle_adapters_make_room() {
        let held = |name, busy, last_used| Held {
            name,
            busy,
            last_used,
        };
        let worker = [
            held("a", false, Some(5)),
            held("b", true, Some(1)),
            held("c", false, None),
            held("d", false, Some(2)),
        ];
        assert_eq!(to_unload(&worker, "e", 8), Vec::<&str>::new(), "room left");
        assert_eq!(
            to_unload(&worker, "e", 4),
            vec!["c"],
            "never used goes first"
        );
        assert_eq!(
            to_unload(&worker, "e", 3),
            vec!["c", "d"],
            "then the oldest; b is busy"
        );
        assert_eq!(
            to_unload(&worker, "a", 1),
            vec!["c", "d"],
            "never the one loading"
        );
    }
}
