//! The adapter cap, the adapters' moves and the prefix cache per adapter.

use super::*;
use crate::scheduler::prefix::block_hashes_under;

const FROM_CPU: Duration = Duration::from_millis(20);
const FROM_DISK: Duration = Duration::from_millis(300);

fn with_lora(max_loras: u32, base_takes_slot: bool) -> SchedulerConfig {
    SchedulerConfig {
        lora: Some(LoraConfig {
            max_loras,
            base_takes_slot,
            max_cpu_loras: None,
            load_from_cpu: FROM_CPU,
            load_from_disk: FROM_DISK,
        }),
        ..config(100, 16)
    }
}

fn adapter(id: u32) -> Adapter {
    Adapter {
        id: AdapterId(id),
        name: format!("a{id}").into(),
    }
}

fn under(id: u64, adapter_id: Option<u32>, prompt: u32, output: u32) -> NewSeq {
    NewSeq {
        adapter: adapter_id.map(adapter),
        ..seq(id, prompt, output)
    }
}

fn admitted(s: &Scheduler) -> Vec<u64> {
    let mut ids: Vec<u64> = s.running().map(|q| q.id.0).collect();
    ids.sort_unstable();
    ids
}

#[test]
fn vllm_passes_over_a_request_for_a_second_adapter_and_admits_those_behind_it() {
    let mut s = Scheduler::new(with_lora(1, false));
    s.add(under(0, Some(1), 10, 3));
    s.add(under(1, Some(2), 10, 3));
    s.add(under(2, None, 10, 3));
    s.add(under(3, Some(1), 10, 3));
    s.step().unwrap();
    assert_eq!(
        admitted(&s),
        [0, 2, 3],
        "the base model never takes a slot in vLLM"
    );
    assert_eq!(s.queued_ids(), [SeqId(1)], "passed over, not moved back");
    assert_eq!(s.adapters().unwrap().counters().slot_waits, 1);
    // Still waiting while adapter 1 runs; counted once however many steps it waits.
    s.step().unwrap();
    assert_eq!(s.queued_ids(), [SeqId(1)]);
    assert_eq!(s.adapters().unwrap().counters().slot_waits, 1);
    while s.queued_ids() == [SeqId(1)] {
        s.step().unwrap();
    }
    assert_eq!(
        admitted(&s),
        [1],
        "admitted once adapter 1's requests are done"
    );
}

#[test]
fn sglang_counts_the_base_model_as_one_of_the_batch_adapters() {
    let mut s = Scheduler::new(with_lora(2, true));
    s.add(under(0, None, 10, 3));
    s.add(under(1, Some(1), 10, 3));
    s.add(under(2, Some(2), 10, 3));
    s.add(under(3, None, 10, 3));
    s.step().unwrap();
    assert_eq!(admitted(&s), [0, 1, 3]);
    assert_eq!(s.queued_ids(), [SeqId(2)]);
}

#[test]
fn a_step_that_brings_an_adapter_in_takes_its_load_time_longer() {
    let plain = Scheduler::new(with_lora(1, false))
        .tap_add(under(0, None, 10, 2))
        .step()
        .unwrap()
        .duration;
    let mut s = Scheduler::new(with_lora(1, false)).tap_add(under(0, Some(1), 10, 2));
    assert_eq!(s.step().unwrap().duration, plain + FROM_DISK + FROM_CPU);
    // In its slot now: the decode step costs what a base one does.
    let decode = s.step().unwrap().duration;
    let mut base = Scheduler::new(with_lora(1, false)).tap_add(under(0, None, 10, 2));
    base.step();
    assert_eq!(decode, base.step().unwrap().duration);
    let c = s.adapters().unwrap().counters();
    assert_eq!((c.loads_from_disk, c.loads_from_cpu), (1, 1));
}

#[test]
fn an_adapter_loaded_through_the_api_is_read_once_and_holds_the_next_step() {
    let mut s = Scheduler::new(with_lora(1, false));
    assert_eq!(s.preload_adapter(AdapterId(1)), FROM_DISK);
    let plain = Scheduler::new(with_lora(1, false))
        .tap_add(under(0, None, 10, 2))
        .step()
        .unwrap()
        .duration;
    s.add(under(0, Some(1), 10, 2));
    // The read held the loop before this step; the step itself only copies the adapter in.
    assert_eq!(s.step().unwrap().duration, plain + FROM_DISK + FROM_CPU);
    assert_eq!(s.adapters().unwrap().counters().loads_from_disk, 1);
    s.forget_adapter(AdapterId(1));
    assert!(s.adapters().unwrap().in_host_memory().is_empty());
}

#[test]
fn the_same_prompt_under_two_adapters_shares_no_cached_block() {
    let mut s = Scheduler::new(with_lora(2, false));
    let tokens: Vec<u32> = (0..64).collect();
    let cached = |id, adapter_id: Option<u32>| NewSeq {
        prefix: block_hashes_under(&tokens, 16, adapter_id.map(|i| format!("a{i}")).as_deref())
            .into(),
        prompt: tokens.clone().into(),
        ..under(id, adapter_id, 64, 1)
    };
    s.add(cached(0, Some(1)));
    run_to_end(&mut s);
    s.add(cached(1, Some(2)));
    s.add(cached(2, None));
    run_to_end(&mut s);
    assert_eq!(s.counters().prefix_hits, 0);
    s.add(cached(3, Some(1)));
    run_to_end(&mut s);
    assert_eq!(
        s.counters().prefix_hits,
        48,
        "three full blocks before the last token"
    );
}

#[test]
fn stored_blocks_carry_the_adapter_they_were_computed_under() {
    let mut s = Scheduler::new(with_lora(1, false));
    let tokens: Vec<u32> = (0..32).collect();
    s.add(NewSeq {
        prefix: block_hashes_under(&tokens, 16, Some("a1")).into(),
        prompt: tokens.clone().into(),
        ..under(0, Some(1), 32, 1)
    });
    run_to_end(&mut s);
    let adapters: Vec<_> = s
        .take_cache_events()
        .into_iter()
        .filter_map(|e| match e {
            prefix::CacheEvent::Stored { adapter, .. } => Some(adapter),
            prefix::CacheEvent::Removed(_) => None,
        })
        .collect();
    assert_eq!(adapters, [Some(adapter(1)), Some(adapter(1))]);
}

trait TapAdd {
    fn tap_add(self, seq: NewSeq) -> Self;
}

impl TapAdd for Scheduler {
    fn tap_add(mut self, seq: NewSeq) -> Self {
        self.add(seq);
        self
    }
}
