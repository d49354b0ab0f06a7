//! The prefix cache's shared blocks, and prompts whose KV arrives from another engine.

use super::*;

#[test]
fn a_prompt_whose_leading_blocks_are_cached_prefills_only_the_rest() {
    let mut s = Scheduler::new(config(100, 16));
    let first = prompt_of(1, 1, 64, 70);
    s.add(cached_seq(0, &first, 2, 16));
    assert_eq!(run_to_end(&mut s)[0].prefill_tokens, 70);
    let second = prompt_of(1, 2, 64, 90);
    s.add(cached_seq(1, &second, 2, 16));
    let steps = run_to_end(&mut s);
    assert_eq!(
        steps[0].prefill_tokens,
        90 - 64,
        "four shared blocks are not prefilled"
    );
    assert!(steps[0].duration < Duration::from_millis(1) + Duration::from_micros(10 * 27));
    let c = s.counters();
    assert_eq!((c.prefix_queries, c.prefix_hits), (160, 64));
    assert_eq!(c.prompt_tokens_computed, 70 + 26);
}

#[test]
fn a_whole_cached_prompt_still_computes_its_last_block() {
    let mut s = Scheduler::new(config(100, 16));
    let tokens = prompt_of(1, 1, 64, 64);
    s.add(cached_seq(0, &tokens, 1, 16));
    run_to_end(&mut s);
    s.add(cached_seq(1, &tokens, 1, 16));
    assert_eq!(s.step().unwrap().prefill_tokens, 16);
}

#[test]
fn running_requests_share_cached_blocks_and_count_them_once() {
    let mut s = Scheduler::new(config(100, 16));
    s.add(cached_seq(0, &prompt_of(1, 1, 64, 64), 50, 16));
    s.step();
    assert_eq!(s.pool().used(), 4);
    s.add(cached_seq(1, &prompt_of(1, 2, 64, 80), 50, 16));
    s.step();
    assert_eq!(
        s.pool().used(),
        4 + 1 + 1,
        "the shared four, the second's fifth, the first's block for its decode"
    );
    assert_eq!(
        s.prefix_cache().referenced(),
        4 + 1,
        "its own full block is cached too"
    );
    check_blocks(&s).unwrap();
    s.abort(SeqId(0));
    s.abort(SeqId(1));
    assert_eq!(s.pool().used(), 0);
    assert_eq!(
        s.prefix_cache().evictable(),
        5,
        "their prompts' full blocks stay cached"
    );
}

#[test]
fn new_demand_evicts_the_least_recently_released_cached_blocks() {
    let mut s = Scheduler::new(config(8, 16));
    s.add(cached_seq(0, &prompt_of(1, 1, 64, 64), 1, 16));
    run_to_end(&mut s);
    s.add(cached_seq(1, &prompt_of(2, 2, 64, 64), 1, 16));
    run_to_end(&mut s);
    assert_eq!(s.prefix_cache().evictable(), 8);
    // Needs six blocks: the oldest released (family 1's) go first.
    s.add(cached_seq(2, &prompt_of(3, 3, 96, 96), 1, 16));
    run_to_end(&mut s);
    s.add(cached_seq(3, &prompt_of(2, 4, 64, 80), 1, 16));
    assert_eq!(
        s.step().unwrap().prefill_tokens,
        80 - 32,
        "family 2 kept its two newest blocks"
    );
}

#[test]
fn without_block_hashes_nothing_is_shared() {
    let mut s = Scheduler::new(config(100, 16));
    for id in 0..2 {
        s.add(seq(id, 64, 1));
        assert_eq!(run_to_end(&mut s)[0].prefill_tokens, 64);
    }
    assert_eq!(s.counters().prefix_hits, 0);
}

#[test]
fn a_preloaded_prompt_computes_only_its_last_token_and_holds_its_blocks() {
    let mut s = Scheduler::new(config(20, 4));
    s.add(NewSeq {
        preloaded: 40,
        ..seq(0, 40, 2)
    });
    let step = s.step().unwrap();
    assert_eq!(s.counters().prompt_tokens_computed, 1);
    assert_eq!(
        tokens(&step).len(),
        1,
        "the first token comes with the first step"
    );
    assert_eq!(
        s.running().next().unwrap().blocks,
        10,
        "the whole prompt's blocks"
    );
}
