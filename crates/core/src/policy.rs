//! Load-balancing policies: pure functions that pick one worker out of a pool's candidates.
//!
//! The route stage has already removed every worker a request must not go to (not Ready, circuit
//! open, vetoed); a policy only chooses among the rest. It sees a snapshot of each candidate
//! (`Candidate`) and draws nothing itself: the round-robin ticket and the random number come in
//! `Draw`, so a choice is reproducible from its inputs and testable without a runtime.
//!
//! Guardrails: selectors are side-effect free; `choose` returns `None` only for an empty pool.

/// Which policy a pool uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Policy {
    /// Each worker in turn.
    RoundRobin,
    /// Uniformly at random.
    Random,
    /// The fewest requests in flight (this gateway's plus the worker's reported queue).
    LeastLoad,
    /// Two at random, the less loaded of them.
    PowerOfTwo,
    /// The worker most likely to hold the prompt's prefix in its KV cache, unless that would
    /// unbalance the pool.
    CacheAware(CacheAware),
    /// Rendezvous hashing on a routing key: the same key goes to the same worker while it is a
    /// candidate, and losing a worker moves only its keys.
    ConsistentHash,
    /// Where the request is predicted to meet its objectives with the most headroom
    /// (`latency::place`, which the caller runs over each worker's latency model); the
    /// cache-aware rule with these thresholds while a candidate's latency is not yet learned.
    Predicted(CacheAware),
}

impl Policy {
    pub fn name(&self) -> &'static str {
        match self {
            Policy::RoundRobin => "round_robin",
            Policy::Random => "random",
            Policy::LeastLoad => "least_load",
            Policy::PowerOfTwo => "power_of_two",
            Policy::CacheAware(_) => "cache_aware",
            Policy::ConsistentHash => "consistent_hash",
            Policy::Predicted(_) => "predicted",
        }
    }

    /// Whether `choose` reads `Candidate::prefix_match` (the caller can skip computing it).
    pub fn wants_prefix(&self) -> bool {
        matches!(self, Policy::CacheAware(_) | Policy::Predicted(_))
    }

    /// Whether the caller places by predicted latency first (`latency::place`), `choose`
    /// deciding only when that defers to it.
    pub fn predicts(&self) -> bool {
        matches!(self, Policy::Predicted(_))
    }
}

/// The cache-aware policy's affinity threshold and its spill gate (SMG 1.13's meaning of the
/// balance thresholds): the worker holding the prompt's prefix gives way to the least loaded
/// one when its load is past the pool's mean by both thresholds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CacheAware {
    /// Minimum share of the prompt's prefix blocks a worker must already hold to be preferred.
    pub cache_threshold: f64,
    /// The matched worker spills when its load exceeds the pool's mean by more than this
    /// (capped by `spill_margin`)...
    pub balance_abs_threshold: u64,
    /// ...and exceeds the mean times this.
    pub balance_rel_threshold: f64,
}

/// Loads within this of the mean are never a reason to spill, unless the absolute threshold
/// itself is lower.
const SPILL_FLOOR: f64 = 4.0;

/// How far past the pool's mean load a matched worker may be before it spills: the absolute
/// threshold, but no more than two standard deviations of an in-flight count at that mean
/// (a Poisson count's is its square root), so in a small pool, whose loads never differ by 64,
/// a hot worker can still spill.
pub fn spill_margin(abs_threshold: u64, mean: f64) -> f64 {
    let natural_swing = (2.0 * mean.max(0.0).sqrt()).max(SPILL_FLOOR);
    (abs_threshold as f64).min(natural_swing)
}

impl Default for CacheAware {
    fn default() -> Self {
        Self {
            cache_threshold: 0.3,
            balance_abs_threshold: 64,
            balance_rel_threshold: 1.5,
        }
    }
}

/// What a policy knows about one candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// A stable hash of the worker's id (`key_of`).
    pub key: u64,
    /// Requests in flight through this gateway plus the worker's reported waiting queue.
    pub load: u64,
    /// Leading prompt blocks this worker is believed to hold (cache-aware only).
    pub prefix_match: u32,
}

/// The whole prompt, as a share (`prefix_share`): candidates whose matches are counted in
/// different blocks (an engine's KV blocks where its events flow, the approximate index's
/// 64-byte blocks elsewhere) are compared as shares of their prompt, `RouteInput::prefix_blocks`
/// set to this.
pub const PREFIX_SHARE_SCALE: u32 = 1 << 20;

/// `matched` of `of` blocks as a share of `PREFIX_SHARE_SCALE`.
pub fn prefix_share(matched: usize, of: usize) -> u32 {
    if of == 0 {
        return 0;
    }
    let share = matched.min(of) as u64 * u64::from(PREFIX_SHARE_SCALE) / of as u64;
    share as u32
}

/// Candidates scored two ways, compared as shares of the prompt: a candidate whose engine's KV
/// events say what it holds has its share in `held` (`prefix_share` of the engine's blocks); the
/// others keep their approximate match, of `approximate_of` blocks, turned into a share. Returns
/// the input to choose with; `None` when no candidate has a held share, the matches untouched.
pub fn by_shares(
    candidates: &mut [Candidate],
    held: &[Option<u32>],
    approximate_of: usize,
    input: &RouteInput,
) -> Option<RouteInput> {
    if held.iter().all(Option::is_none) {
        return None;
    }
    for (candidate, share) in candidates.iter_mut().zip(held) {
        candidate.prefix_match =
            share.unwrap_or_else(|| prefix_share(candidate.prefix_match as usize, approximate_of));
    }
    Some(RouteInput {
        prefix_blocks: PREFIX_SHARE_SCALE,
        ..*input
    })
}

/// What a policy knows about the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RouteInput {
    /// Hash of the routing key (header or `user`), for consistent hashing.
    pub routing_key: Option<u64>,
    /// Full prefix blocks in the prompt (cache-aware only).
    pub prefix_blocks: u32,
}

/// The randomness and sequence a choice may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Draw {
    /// A per-pool counter, incremented for every selection.
    pub ticket: u64,
    /// A uniformly random number.
    pub random: u64,
}

/// Picks the index of one candidate.
pub fn choose(
    policy: &Policy,
    candidates: &[Candidate],
    input: &RouteInput,
    draw: Draw,
) -> Option<usize> {
    let n = candidates.len();
    if n == 0 {
        return None;
    }
    let pick = match policy {
        Policy::RoundRobin => (draw.ticket % n as u64) as usize,
        Policy::Random => (draw.random % n as u64) as usize,
        Policy::LeastLoad => least_load(candidates, draw.ticket),
        Policy::PowerOfTwo => power_of_two(candidates, draw.random),
        Policy::CacheAware(cfg) | Policy::Predicted(cfg) => {
            cache_aware(cfg, candidates, input, draw.ticket)
        }
        Policy::ConsistentHash => match input.routing_key {
            Some(key) => rendezvous(candidates, key),
            None => (draw.random % n as u64) as usize,
        },
    };
    Some(pick)
}

/// The least loaded candidate; ties are taken in turn (by `ticket`), so an idle pool still
/// spreads its requests.
fn least_load(candidates: &[Candidate], ticket: u64) -> usize {
    let min = candidates.iter().map(|c| c.load).min().unwrap_or(0);
    nth_matching(candidates, ticket, |c| c.load == min)
}

/// The `ticket`-th (modulo) candidate satisfying `keep`; there must be at least one.
fn nth_matching(candidates: &[Candidate], ticket: u64, keep: impl Fn(&Candidate) -> bool) -> usize {
    let tied = candidates.iter().filter(|c| keep(c)).count().max(1);
    let nth = (ticket % tied as u64) as usize;
    candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| keep(c))
        .nth(nth)
        .map_or(0, |(i, _)| i)
}

fn power_of_two(candidates: &[Candidate], random: u64) -> usize {
    let n = candidates.len() as u64;
    if n == 1 {
        return 0;
    }
    let first = random % n;
    let mut second = (random / n) % (n - 1);
    if second >= first {
        second += 1;
    }
    let (a, b) = (first as usize, second as usize);
    if candidates[b].load < candidates[a].load {
        b
    } else {
        a
    }
}

fn cache_aware(
    cfg: &CacheAware,
    candidates: &[Candidate],
    input: &RouteInput,
    ticket: u64,
) -> usize {
    if input.prefix_blocks == 0 {
        return least_load(candidates, ticket);
    }
    let best = candidates.iter().map(|c| c.prefix_match).max().unwrap_or(0);
    if f64::from(best) / f64::from(input.prefix_blocks) < cfg.cache_threshold {
        return least_load(candidates, ticket);
    }
    // Among the best matches, the least loaded; ties in turn.
    let least = candidates
        .iter()
        .filter(|c| c.prefix_match == best)
        .map(|c| c.load)
        .min()
        .unwrap_or(0);
    let mean = candidates.iter().map(|c| c.load as f64).sum::<f64>() / candidates.len() as f64;
    let load = least as f64;
    if load - mean > spill_margin(cfg.balance_abs_threshold, mean)
        && load > mean * cfg.balance_rel_threshold
    {
        return least_load(candidates, ticket);
    }
    nth_matching(candidates, ticket, |c| {
        c.prefix_match == best && c.load == least
    })
}

fn rendezvous(candidates: &[Candidate], key: u64) -> usize {
    candidates
        .iter()
        .enumerate()
        .max_by_key(|(_, c)| (mix(key ^ mix(c.key)), c.key))
        .map_or(0, |(i, _)| i)
}

/// The splitmix64 finalizer: spreads nearby inputs over the whole range.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A stable hash of bytes (a worker id, a routing key): the same input gives the same key in
/// every process and release (`hash::stable_hash`).
pub fn key_of(bytes: &[u8]) -> u64 {
    crate::hash::stable_hash(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pool(loads: &[u64]) -> Vec<Candidate> {
        loads
            .iter()
            .enumerate()
            .map(|(i, &load)| Candidate {
                key: key_of(format!("w{i}").as_bytes()),
                load,
                prefix_match: 0,
            })
            .collect()
    }

    fn pick(policy: Policy, c: &[Candidate], input: RouteInput, ticket: u64, random: u64) -> usize {
        choose(&policy, c, &input, Draw { ticket, random }).unwrap()
    }

    #[test]
    fn shares_compare_matches_counted_in_different_blocks() {
        assert_eq!(prefix_share(0, 0), 0);
        assert_eq!(prefix_share(4, 4), PREFIX_SHARE_SCALE);
        assert_eq!(
            prefix_share(9, 4),
            PREFIX_SHARE_SCALE,
            "never past the whole"
        );
        // 3 of 4 engine blocks beats 10 of 16 approximate ones, and the threshold reads shares.
        let mut c = pool(&[6, 5]);
        c[0].prefix_match = prefix_share(3, 4);
        c[1].prefix_match = prefix_share(10, 16);
        let input = RouteInput {
            routing_key: None,
            prefix_blocks: PREFIX_SHARE_SCALE,
        };
        let policy = Policy::CacheAware(CacheAware::default());
        assert_eq!(choose(&policy, &c, &input, Draw::default()), Some(0));
        c[0].prefix_match = prefix_share(1, 4);
        c[1].prefix_match = prefix_share(1, 16);
        assert_eq!(
            choose(&policy, &c, &input, Draw::default()),
            Some(1),
            "25% is under the threshold: the least loaded"
        );
    }

    #[test]
    fn held_shares_and_approximate_matches_meet_as_shares() {
        let input = RouteInput {
            routing_key: Some(7),
            prefix_blocks: 16,
        };
        let mut c = pool(&[1, 1]);
        c[1].prefix_match = 8;
        assert_eq!(by_shares(&mut c, &[None, None], 16, &input), None);
        assert_eq!(c[1].prefix_match, 8, "no held share: untouched");
        let held = [Some(prefix_share(3, 4)), None];
        let blended = by_shares(&mut c, &held, 16, &input).unwrap();
        assert_eq!(blended.prefix_blocks, PREFIX_SHARE_SCALE);
        assert_eq!(blended.routing_key, Some(7));
        assert_eq!(c[0].prefix_match, PREFIX_SHARE_SCALE / 4 * 3);
        assert_eq!(
            c[1].prefix_match,
            PREFIX_SHARE_SCALE / 2,
            "8 of 16 approximate blocks"
        );
        let policy = Policy::CacheAware(CacheAware::default());
        assert_eq!(choose(&policy, &c, &blended, Draw::default()), Some(0));
    }

    #[test]
    fn empty_pool_has_no_choice() {
        assert_eq!(
            choose(
                &Policy::RoundRobin,
                &[],
                &RouteInput::default(),
                Draw::default()
            ),
            None
        );
    }

    #[test]
    fn round_robin_takes_each_in_turn() {
        let c = pool(&[5, 0, 9]);
        let picks: Vec<_> = (0..6)
            .map(|t| pick(Policy::RoundRobin, &c, RouteInput::default(), t, 0))
            .collect();
        assert_eq!(picks, vec![0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn least_load_prefers_the_idle_and_rotates_ties() {
        let c = pool(&[3, 1, 7, 1]);
        let picks: Vec<_> = (0..4)
            .map(|t| pick(Policy::LeastLoad, &c, RouteInput::default(), t, 0))
            .collect();
        assert_eq!(picks, vec![1, 3, 1, 3]);
    }

    #[test]
    fn power_of_two_takes_the_lighter_of_two_distinct() {
        let c = pool(&[10, 0]);
        for r in 0..50 {
            assert_eq!(pick(Policy::PowerOfTwo, &c, RouteInput::default(), 0, r), 1);
        }
        let one = pool(&[4]);
        assert_eq!(
            pick(Policy::PowerOfTwo, &one, RouteInput::default(), 0, 7),
            0
        );
    }

    #[test]
    fn power_of_two_never_picks_the_heaviest_of_three() {
        let c = pool(&[1, 2, 9]);
        for r in 0..500 {
            assert_ne!(pick(Policy::PowerOfTwo, &c, RouteInput::default(), 0, r), 2);
        }
    }

    #[test]
    fn cache_aware_follows_the_prefix_while_balanced() {
        let mut c = pool(&[4, 2, 3]);
        c[0].prefix_match = 8;
        c[2].prefix_match = 2;
        let input = RouteInput {
            routing_key: None,
            prefix_blocks: 10,
        };
        let policy = Policy::CacheAware(CacheAware::default());
        assert_eq!(pick(policy, &c, input, 0, 0), 0);
    }

    #[test]
    fn cache_aware_balances_when_the_match_is_weak_or_the_pool_is_lopsided() {
        let policy = Policy::CacheAware(CacheAware::default());
        let input = RouteInput {
            routing_key: None,
            prefix_blocks: 10,
        };
        let mut weak = pool(&[4, 2]);
        weak[0].prefix_match = 2; // 20% < 30%
        assert_eq!(pick(policy, &weak, input, 0, 0), 1);

        let mut lopsided = pool(&[200, 10]);
        lopsided[0].prefix_match = 10;
        assert_eq!(pick(policy, &lopsided, input, 0, 0), 1);
    }

    #[test]
    fn the_matched_worker_spills_once_past_the_mean_by_both_thresholds() {
        let policy = Policy::CacheAware(CacheAware::default());
        let input = RouteInput {
            routing_key: None,
            prefix_blocks: 10,
        };
        let matched_at = |loads: &[u64]| {
            let mut c = pool(loads);
            c[0].prefix_match = 10;
            pick(policy, &c, input, 0, 0)
        };
        // Mean 3, margin 4 (the floor): 6 is 3 past it, within the swing of a small pool.
        assert_eq!(matched_at(&[6, 0]), 0);
        // Mean 5, margin 2 x sqrt(5) = 4.47: 10 is 5 past it and twice the mean.
        assert_eq!(matched_at(&[10, 0]), 1);
        // Mean 233, margin 30.5: 67 past it, but not 1.5 times it, so it stays.
        assert_eq!(matched_at(&[300, 200, 200]), 0);
        // A large pool's margin is capped by the absolute threshold.
        assert_eq!(spill_margin(64, 10_000.0), 64.0);
        assert_eq!(
            spill_margin(2, 1.0),
            2.0,
            "a threshold under the floor holds"
        );
        assert_eq!(spill_margin(64, 0.0), 4.0);
    }

    #[test]
    fn consistent_hash_is_sticky_and_falls_back_to_random_without_a_key() {
        let c = pool(&[0, 0, 0, 0]);
        let input = RouteInput {
            routing_key: Some(key_of(b"session-42")),
            prefix_blocks: 0,
        };
        let first = pick(Policy::ConsistentHash, &c, input, 0, 1);
        for r in 0..20 {
            assert_eq!(pick(Policy::ConsistentHash, &c, input, r, r * 7), first);
        }
        let keyless: std::collections::HashSet<_> = (0..40)
            .map(|r| pick(Policy::ConsistentHash, &c, RouteInput::default(), 0, r))
            .collect();
        assert!(keyless.len() > 1);
    }

    #[test]
    fn consistent_hash_spreads_keys() {
        let c = pool(&[0; 4]);
        let mut counts = [0u32; 4];
        for k in 0..4000u32 {
            let input = RouteInput {
                routing_key: Some(key_of(&k.to_le_bytes())),
                prefix_blocks: 0,
            };
            counts[pick(Policy::ConsistentHash, &c, input, 0, 0)] += 1;
        }
        for n in counts {
            assert!((800..1200).contains(&n), "{counts:?}");
        }
    }

    proptest! {
        /// Removing one worker moves exactly the keys that were on it; every other key stays.
        #[test]
        fn consistent_hash_moves_only_the_removed_workers_keys(
            workers in 2usize..12,
            removed in 0usize..12,
            keys in proptest::collection::vec(any::<u64>(), 1..200),
        ) {
            let removed = removed % workers;
            let all = pool(&vec![0; workers]);
            let mut rest = all.clone();
            let gone = rest.remove(removed);
            for k in keys {
                let input = RouteInput { routing_key: Some(k), prefix_blocks: 0 };
                let before = all[pick(Policy::ConsistentHash, &all, input, 0, 0)];
                let after = rest[pick(Policy::ConsistentHash, &rest, input, 0, 0)];
                if before.key != gone.key {
                    prop_assert_eq!(before.key, after.key);
                }
            }
        }

        /// Every policy returns an index inside the pool.
        #[test]
        fn choices_are_in_range(
            loads in proptest::collection::vec(0u64..100, 1..16),
            ticket in any::<u64>(),
            random in any::<u64>(),
            key in proptest::option::of(any::<u64>()),
        ) {
            let c = pool(&loads);
            let input = RouteInput { routing_key: key, prefix_blocks: 4 };
            for policy in [Policy::RoundRobin, Policy::Random, Policy::LeastLoad, Policy::PowerOfTwo,
                           Policy::CacheAware(CacheAware::default()), Policy::ConsistentHash] {
                let i = pick(policy, &c, input, ticket, random);
                prop_assert!(i < c.len());
            }
        }
    }
}
