use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;

use super::*;
use std::collections::HashMap;

fn cost() -> StepCost {
    StepCost {
        base: Duration::from_millis(1),
        per_prefill_token: Duration::from_micros(10),
        per_decode_token: Duration::from_micros(100),
        per_kv_token_read: Duration::from_nanos(0),
        per_attention_kpair: Duration::ZERO,
        per_block_transfer: Duration::from_micros(50),
    }
}

fn config(blocks: u32, block_size: u32) -> SchedulerConfig {
    SchedulerConfig {
        max_num_seqs: 64,
        max_num_batched_tokens: 1024,
        num_gpu_blocks: blocks,
        block_size,
        watermark_blocks: 0,
        preemption: Preemption::Recompute,
        eviction: Eviction::Fcfs,
        cost: cost(),
        lora: None,
    }
}

fn seq(id: u64, prompt: u32, output: u32) -> NewSeq {
    NewSeq {
        id: SeqId(id),
        prompt_tokens: prompt,
        output_tokens: output,
        finish: FinishReason::Stop,
        prefix: Arc::from([]),
        prompt: Arc::from([]),
        preloaded: 0,
        adapter: None,
    }
}

fn tokens(step: &Step) -> Vec<u64> {
    step.events
        .iter()
        .filter_map(|e| match e {
            SeqEvent::Token(id) => Some(id.0),
            _ => None,
        })
        .collect()
}

fn preempted(step: &Step) -> Vec<u64> {
    step.events
        .iter()
        .filter_map(|e| match e {
            SeqEvent::Preempted(id) => Some(id.0),
            SeqEvent::Finished(id, FinishReason::Length) => Some(id.0),
            _ => None,
        })
        .collect()
}

/// A prompt of `len` tokens whose first `shared` tokens are the same for every `family`.
fn prompt_of(family: u32, unique: u64, shared: u32, len: u32) -> Vec<u32> {
    (0..len)
        .map(|i| {
            if i < shared {
                family * 1000 + i
            } else {
                (unique as u32) << 16 | i
            }
        })
        .collect()
}

fn cached_seq(id: u64, tokens: &[u32], output: u32, block_size: u32) -> NewSeq {
    NewSeq {
        prefix: prefix::block_hashes(tokens, block_size).into(),
        prompt: tokens.into(),
        ..seq(id, tokens.len() as u32, output)
    }
}

fn run_to_end(s: &mut Scheduler) -> Vec<Step> {
    std::iter::from_fn(|| s.step()).collect()
}

/// Blocks in use are the running requests' own blocks plus the cached blocks they hold, each
/// cached block held by exactly the requests that share it, and never more evictable than free.
fn check_blocks(s: &Scheduler) -> Result<(), TestCaseError> {
    let own: u32 = s.running().map(|q| q.blocks - q.shared).sum();
    prop_assert_eq!(s.pool().used(), own + s.prefix_cache().referenced());
    let mut holders: HashMap<u64, u32> = HashMap::new();
    for q in s.running() {
        for hash in &q.prefix[..q.shared as usize] {
            *holders.entry(*hash).or_default() += 1;
        }
    }
    for (hash, n) in holders {
        prop_assert_eq!(s.prefix_cache().refs(hash), Some(n));
    }
    prop_assert!(s.prefix_cache().evictable() <= s.pool().free());
    Ok(())
}

mod lora;
mod preemption;
mod prefix_cache;

#[test]
fn an_idle_scheduler_does_not_step() {
    let mut s = Scheduler::new(config(100, 16));
    assert!(s.step().is_none());
}

#[test]
fn one_step_prefills_every_waiting_prompt_that_fits_the_token_budget() {
    let mut s = Scheduler::new(config(100, 16));
    for id in 0..3 {
        s.add(seq(id, 10, 5));
    }
    let step = s.step().unwrap();
    assert_eq!(step.prefill_tokens, 30);
    assert_eq!(step.decode_tokens, 0);
    assert_eq!(
        tokens(&step),
        vec![0, 1, 2],
        "the prefill step samples each first token"
    );
    assert_eq!(
        step.duration,
        Duration::from_millis(1) + Duration::from_micros(10) * 30
    );

    let step = s.step().unwrap();
    assert_eq!((step.prefill_tokens, step.decode_tokens), (0, 3));
    assert_eq!(
        step.duration,
        Duration::from_millis(1) + Duration::from_micros(100) * 3
    );
}

#[test]
fn long_prompts_are_prefilled_in_chunks_beside_running_decodes() {
    let mut cfg = config(100, 16);
    cfg.max_num_batched_tokens = 100;
    let mut s = Scheduler::new(cfg);
    s.add(seq(0, 10, 50));
    s.step().unwrap();
    s.add(seq(1, 250, 5));

    let chunks: Vec<(u32, u32, Vec<u64>)> = (0..4)
        .map(|_| {
            let step = s.step().unwrap();
            (step.prefill_tokens, step.decode_tokens, tokens(&step))
        })
        .collect();
    assert_eq!(
        chunks,
        vec![
            (99, 1, vec![0]),
            (99, 1, vec![0]),
            (52, 1, vec![0, 1]),
            (0, 2, vec![0, 1]),
        ],
        "the decode goes first and the prompt takes what is left of the budget"
    );
}

#[test]
fn the_running_batch_is_capped_at_max_num_seqs() {
    let mut cfg = config(100, 16);
    cfg.max_num_seqs = 2;
    let mut s = Scheduler::new(cfg);
    for id in 0..5 {
        s.add(seq(id, 4, 3));
    }
    let step = s.step().unwrap();
    assert_eq!(tokens(&step), vec![0, 1]);
    assert_eq!((s.running_len(), s.waiting_len()), (2, 3));
}

#[test]
fn a_long_prompt_takes_its_blocks_chunk_by_chunk_and_is_counted_when_its_prefill_ends() {
    let mut cfg = config(100, 16);
    cfg.max_num_batched_tokens = 64;
    let mut s = Scheduler::new(cfg);
    s.add(seq(0, 200, 3));
    let mut held = Vec::new();
    let mut counted = Vec::new();
    while s.counters().tokens_generated == 0 {
        let step = s.step().unwrap();
        held.push(s.pool().used());
        counted.push(step.prompt_tokens_counted);
        if s.counters().tokens_generated == 0 {
            assert_eq!(s.chunked_len(), 1, "part-way through its prefill");
        }
    }
    assert_eq!(
        held,
        vec![4, 8, 12, 13],
        "64-token chunks of 16-token blocks"
    );
    assert_eq!(
        counted,
        vec![0, 0, 0, 200],
        "the prompt counts when its first token comes"
    );
    assert_eq!(s.chunked_len(), 0);
    assert_eq!(s.counters().prompt_tokens_counted, 200);
    assert_eq!(s.counters().prompt_tokens_computed, 200);
}

#[test]
fn a_prompt_growing_chunk_by_chunk_preempts_the_newest_when_blocks_run_out() {
    let mut cfg = config(10, 4);
    cfg.max_num_batched_tokens = 9;
    let mut s = Scheduler::new(cfg);
    s.add(seq(0, 4, 30)); // decoding, it grows to 9 blocks
    s.step().unwrap();
    s.add(seq(1, 36, 1)); // admitted beside it on its first chunk's 2 blocks
    let mut preemptions = Vec::new();
    while let Some(step) = s.step() {
        preemptions.extend(preempted(&step));
    }
    assert!(
        !preemptions.is_empty() && preemptions.iter().all(|id| *id == 1),
        "the long prompt, the newest admission, gave its blocks back whenever the decode needed \
         one (and was admitted again on its first chunk): {preemptions:?}"
    );
    assert_eq!(s.counters().prompt_tokens_counted, 4 + 36);
}

#[test]
fn a_prompt_recomputed_after_preemption_is_counted_once() {
    let mut cfg = config(4, 4);
    cfg.max_num_batched_tokens = 64;
    let mut s = Scheduler::new(cfg);
    s.add(seq(0, 4, 9)); // grows to 3 blocks
    s.add(seq(1, 4, 9));
    run_to_end(&mut s);
    assert!(
        s.counters().preemptions > 0,
        "two growing answers cannot share 4 blocks"
    );
    assert_eq!(s.counters().prompt_tokens_counted, 8);
    assert!(
        s.counters().prompt_tokens_computed > 8,
        "recomputed prompts are work again"
    );
}

#[test]
fn attention_makes_a_prompts_later_chunks_cost_more() {
    let mut cfg = config(1000, 16);
    cfg.max_num_batched_tokens = 1000;
    cfg.cost = StepCost {
        per_attention_kpair: Duration::from_millis(1),
        ..StepCost::ZERO
    };
    let mut s = Scheduler::new(cfg);
    s.add(seq(0, 3000, 1));
    let steps: Vec<Duration> = (0..3).map(|_| s.step().unwrap().duration).collect();
    // 1000 * 1001 / 2, then 1000 * 1000 more each chunk: 500.5, 1500.5, 2500.5 thousand pairs.
    assert_eq!(
        steps,
        vec![
            Duration::from_micros(500_500),
            Duration::from_micros(1_500_500),
            Duration::from_micros(2_500_500),
        ]
    );
}

#[test]
fn admission_needs_the_first_chunk_plus_the_watermark_in_free_blocks() {
    let mut cfg = config(10, 4);
    cfg.watermark_blocks = 2;
    let mut s = Scheduler::new(cfg);
    s.add(seq(0, 4 * 8, 1)); // 8 blocks + 2 watermark = 10: fits exactly
    s.add(seq(1, 1, 1)); // 1 block, but only 2 free and the watermark needs them
    let step = s.step().unwrap();
    assert_eq!(tokens(&step), vec![0]);
    assert_eq!(s.waiting_len(), 1, "the second prompt waits for blocks");
    let step = s.step().unwrap();
    assert_eq!(
        tokens(&step),
        vec![1],
        "admitted once the first one freed its blocks"
    );
}

#[test]
fn nothing_is_preempted_until_the_blocks_run_out() {
    // Two prompts of one block each, three blocks: the first decode block fits, the second does not.
    let mut s = Scheduler::new(config(3, 4));
    s.add(seq(0, 4, 10));
    s.add(seq(1, 4, 10));
    let step = s.step().unwrap();
    assert!(preempted(&step).is_empty());
    assert_eq!(s.pool().used(), 2);

    let step = s.step().unwrap();
    assert_eq!(tokens(&step), vec![0]);
    assert_eq!(
        preempted(&step),
        vec![1],
        "FCFS evicts the newest admission"
    );
    assert_eq!(s.counters().preemptions, 1);
    assert_eq!(s.pool().used(), 2, "the victim's block is back in the pool");
}

#[test]
fn a_sequence_ends_after_its_output_length_with_its_finish_reason() {
    let mut s = Scheduler::new(config(10, 4));
    s.add(NewSeq {
        finish: FinishReason::Length,
        ..seq(0, 4, 3)
    });
    let mut events = Vec::new();
    while let Some(step) = s.step() {
        events.extend(step.events);
    }
    assert_eq!(
        events,
        vec![
            SeqEvent::Token(SeqId(0)),
            SeqEvent::Token(SeqId(0)),
            SeqEvent::Token(SeqId(0)),
            SeqEvent::Finished(SeqId(0), FinishReason::Length),
        ]
    );
    assert_eq!(s.pool().used(), 0);
    assert_eq!(s.counters().finished, 1);
}

#[test]
fn aborts_free_blocks_and_count_the_work_as_wasted() {
    let mut s = Scheduler::new(config(10, 4));
    s.add(seq(0, 8, 10));
    s.add(seq(1, 8, 10));
    s.step().unwrap();
    s.add(seq(2, 8, 10));
    assert_eq!(s.pool().used(), 4);
    assert!(s.abort(SeqId(0)));
    assert_eq!(s.pool().used(), 2);
    assert!(s.abort(SeqId(2)), "a waiting request can be aborted too");
    assert!(!s.abort(SeqId(2)));
    assert_eq!(s.counters().aborted, 2);
    assert_eq!(s.counters().wasted_tokens, 8);
    assert_eq!((s.running_len(), s.waiting_len()), (1, 0));
}

#[test]
fn kv_reads_make_long_contexts_decode_slower() {
    let mut cfg = config(1000, 16);
    cfg.cost.per_kv_token_read = Duration::from_micros(1);
    let decode_time = |prompt: u32| {
        let mut s = Scheduler::new(cfg.clone());
        s.add(seq(0, prompt, 5));
        s.step().unwrap();
        s.step().unwrap().duration
    };
    assert_eq!(
        decode_time(1000) - decode_time(100),
        Duration::from_micros(900)
    );
}

#[derive(Debug, Clone)]
enum Op {
    Add {
        prompt: u32,
        output: u32,
        family: u32,
    },
    Abort(u64),
    Step,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1u32..200, 1u32..200, 0u32..4).prop_map(|(prompt, output, family)| Op::Add {
            prompt,
            output,
            family
        }),
        (0u64..40).prop_map(Op::Abort),
        Just(Op::Step),
        Just(Op::Step),
        Just(Op::Step),
    ]
}

fn policy() -> impl Strategy<Value = (Preemption, Eviction)> {
    let preemption = prop_oneof![
        Just(Preemption::Recompute),
        Just(Preemption::Swap),
        Just(Preemption::Truncate)
    ];
    let eviction = prop_oneof![
        Just(Eviction::Fcfs),
        Just(Eviction::Las),
        Just(Eviction::Srpt)
    ];
    (preemption, eviction)
}

proptest! {
    #[test]
    fn blocks_in_use_always_equal_the_blocks_running_requests_hold_once(
        ops in prop::collection::vec(op(), 1..300),
        (preemption, eviction) in policy(),
        max_num_seqs in 1u32..16,
        max_num_batched_tokens in 1u32..300,
        watermark_blocks in 0u32..3,
        lora in prop::option::of((1u32..3, any::<bool>())),
    ) {
        // 25 blocks of 16 tokens hold the longest possible request (400 tokens) beside the watermark.
        let cfg = SchedulerConfig {
            max_num_seqs,
            max_num_batched_tokens,
            num_gpu_blocks: 25 + watermark_blocks,
            block_size: 16,
            watermark_blocks,
            preemption,
            eviction,
            cost: cost(),
            lora: lora.map(|(max_loras, base_takes_slot)| LoraConfig {
                max_loras,
                base_takes_slot,
                max_cpu_loras: Some(2),
                load_from_cpu: Duration::from_millis(1),
                load_from_disk: Duration::from_millis(5),
            }),
        };
        let mut s = Scheduler::new(cfg);
        let mut next = 0;
        for op in ops {
            match op {
                Op::Add { prompt, output, family } => {
                    // Family 0 is uncached; the others share their first 100 tokens. With
                    // adapters on, each family but 0 runs under an adapter of its own.
                    let mut new = if family == 0 {
                        seq(next, prompt, output)
                    } else {
                        cached_seq(next, &prompt_of(family, next, 100, prompt), output, 16)
                    };
                    if lora.is_some() && family > 0 {
                        new.adapter = Some(Adapter { id: AdapterId(family), name: "f".into() });
                    }
                    s.add(new);
                    next += 1;
                }
                Op::Abort(id) => {
                    s.abort(SeqId(id));
                }
                Op::Step => {
                    s.step();
                }
            }
            check_blocks(&s)?;
            prop_assert!(s.pool().used() <= s.pool().total());
            prop_assert!(s.running_len() <= max_num_seqs as usize);
            if let Some((max_loras, base_takes_slot)) = lora {
                let distinct: std::collections::BTreeSet<_> = s
                    .running()
                    .filter(|q| base_takes_slot || q.adapter.is_some())
                    .map(|q| q.adapter.as_ref().map(|a| a.id))
                    .collect();
                prop_assert!(distinct.len() <= max_loras as usize, "{distinct:?}");
            }
            prop_assert_eq!(
                s.running_len() + s.waiting_len() + s.swapped_len(),
                s.seqs.len(),
                "every live sequence is in exactly one queue"
            );
        }
        // Whatever happened, the work drains and returns every block.
        let mut guard = 0;
        while s.step().is_some() {
            guard += 1;
            prop_assert!(guard < 100_000, "the scheduler must make progress");
        }
        prop_assert_eq!(s.pool().used(), 0);
        prop_assert_eq!(s.seqs.len(), 0);
    }
}

#[test]
fn work_in_flight_is_what_the_live_sequences_computed_and_leaves_with_them() {
    let mut s = Scheduler::new(config(100, 16));
    s.add(seq(0, 10, 5));
    s.add(seq(1, 20, 1));
    assert_eq!(s.work_in_flight(), 0, "nothing computed yet");
    s.step().unwrap();
    // Both prompts prefilled (sampling each first token); sequence 1 is done.
    assert_eq!(s.work_in_flight(), 10);
    s.step().unwrap();
    assert_eq!(s.work_in_flight(), 11, "one decoded token more");
    assert!(s.abort(SeqId(0)));
    assert_eq!(
        s.work_in_flight(),
        0,
        "an aborted sequence's work is wasted, not in flight"
    );
}
