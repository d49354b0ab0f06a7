//! Preemption: which running request each eviction policy takes, and what each mode does to it.

use super::*;

/// Three running requests with distinct attained service and remaining work, and not one free
/// block: the first decode forces an eviction, and the victim tells which policy chose it.
fn victim_under(eviction: Eviction) -> u64 {
    let mut cfg = config(9, 1);
    cfg.eviction = eviction;
    let mut s = Scheduler::new(cfg);
    s.add(seq(0, 5, 100)); // attained 6 after prefill, 99 to go, oldest
    s.add(seq(1, 1, 3)); // attained 2, 2 to go
    s.add(seq(2, 3, 50)); // attained 4, 49 to go, newest
    let step = s.step().unwrap();
    assert_eq!(s.pool().free(), 0);
    assert!(preempted(&step).is_empty());
    let step = s.step().unwrap();
    let victims = preempted(&step);
    assert!(!victims.is_empty());
    victims[0]
}

#[test]
fn fcfs_evicts_the_most_recently_admitted() {
    assert_eq!(victim_under(Eviction::Fcfs), 2);
}

#[test]
fn las_evicts_the_request_with_the_least_attained_service() {
    assert_eq!(victim_under(Eviction::Las), 1);
}

#[test]
fn srpt_evicts_the_request_furthest_from_completion() {
    assert_eq!(victim_under(Eviction::Srpt), 0);
}

#[test]
fn recompute_sends_the_victim_to_the_front_of_the_queue_and_wastes_its_work() {
    let mut s = Scheduler::new(config(3, 4));
    s.add(seq(0, 4, 10));
    s.add(seq(1, 4, 10));
    s.step().unwrap();
    s.add(seq(2, 4, 10));
    let step = s.step().unwrap();
    assert_eq!(preempted(&step), vec![1]);
    let victim = s.seq(SeqId(1)).unwrap();
    assert_eq!(victim.phase, Phase::Waiting);
    assert_eq!(victim.computed, 0);
    assert_eq!(
        victim.prefill_target,
        4 + 1,
        "prompt plus the token it generated"
    );
    assert_eq!(
        s.waiting.iter().map(|id| id.0).collect::<Vec<_>>(),
        vec![1, 2],
        "the victim goes ahead of requests that never ran"
    );
    assert_eq!(s.counters().wasted_tokens, 4, "its prefill was thrown away");
}

#[test]
fn a_recomputed_request_looks_its_prefix_up_again_counted_apart_as_vllm_does() {
    let mut s = Scheduler::new(config(3, 4));
    s.add(seq(0, 4, 6));
    s.add(seq(1, 4, 6));
    s.step().unwrap();
    s.add(seq(2, 4, 6));
    assert_eq!(preempted(&s.step().unwrap()), vec![1]);
    run_to_end(&mut s);
    let c = s.counters();
    assert_eq!(c.prefix_queries, 3 * 4, "each request's first lookup");
    assert!(
        c.preempted_queries > 4,
        "the victim's prompt and its token, again: {}",
        c.preempted_queries
    );
}

#[test]
fn swap_keeps_the_work_and_pays_the_transfer_both_ways() {
    let mut cfg = config(3, 4);
    cfg.preemption = Preemption::Swap;
    let mut s = Scheduler::new(cfg);
    s.add(seq(0, 4, 2));
    s.add(seq(1, 4, 10));
    s.step().unwrap();
    // Seq 0 takes the last block for its final token; seq 1 finds none and goes to host memory.
    let step = s.step().unwrap();
    assert!(step
        .events
        .contains(&SeqEvent::Finished(SeqId(0), FinishReason::Stop)));
    assert_eq!(preempted(&step), vec![1]);
    assert_eq!(s.swapped_len(), 1);
    let decode_only = Duration::from_millis(1) + Duration::from_micros(100);
    assert_eq!(
        step.duration,
        decode_only + Duration::from_micros(50),
        "swap-out moves one block"
    );
    assert_eq!(s.counters().wasted_tokens, 0);

    // Seq 0's blocks are free: seq 1 comes back (one block in) and decodes in the same step.
    let step = s.step().unwrap();
    assert_eq!(s.swapped_len(), 0);
    assert_eq!(tokens(&step), vec![1]);
    assert_eq!(
        s.seq(SeqId(1)).unwrap().computed,
        5,
        "nothing was recomputed"
    );
    assert_eq!(step.duration, decode_only + Duration::from_micros(50));
}

#[test]
fn truncate_finishes_the_victim_with_length() {
    let mut cfg = config(3, 4);
    cfg.preemption = Preemption::Truncate;
    let mut s = Scheduler::new(cfg);
    s.add(seq(0, 4, 10));
    s.add(seq(1, 4, 10));
    s.step().unwrap();
    let step = s.step().unwrap();
    assert!(step
        .events
        .contains(&SeqEvent::Finished(SeqId(1), FinishReason::Length)));
    assert!(s.seq(SeqId(1)).is_none());
    assert_eq!(s.counters().wasted_tokens, 0, "its partial answer is kept");
}
