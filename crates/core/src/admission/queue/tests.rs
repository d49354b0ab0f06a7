//! The queue's order and what a full queue keeps, on `u32` items.

use std::time::Duration;

use super::*;
use proptest::prelude::*;

fn waiter(tier: Tier, tenant: &str, weight: f64, cost: u64, item: u32) -> Waiter<u32> {
    Waiter {
        tier,
        tenant: TenantId::new(tenant),
        weight,
        cost,
        deadline: None,
        item,
    }
}

#[test]
fn a_quiet_tenants_arrival_has_only_the_heavy_ones_next_request_ahead() {
    let mut q = FairQueue::new(100);
    q.push(waiter(Tier::Interactive, "chat", 1.0, 100, 0));
    for i in 1..=20 {
        q.push(waiter(Tier::Agent, "heavy", 1.0, 100, i));
    }
    let quiet = TenantId::new("quiet");
    let heavy = TenantId::new("heavy");
    assert_eq!(
        q.ahead_of_arrival(Tier::Agent, &quiet, 1.0),
        1 + 1,
        "the interactive one, and the heavy tenant's head (started at the clock too)"
    );
    assert_eq!(
        q.ahead_of_arrival(Tier::Agent, &heavy, 1.0),
        1 + 20,
        "the heavy tenant waits behind its own backlog"
    );
    // Served in the order counted: the quiet arrival goes second in its tier.
    q.push(waiter(Tier::Agent, "quiet", 1.0, 100, 99));
    let order = drain(&mut q);
    assert_eq!(&order[..3], &[0, 1, 99], "{order:?}");
}

fn drain(q: &mut FairQueue<u32>) -> Vec<u32> {
    std::iter::from_fn(|| q.pop().map(|(_, w)| w.item)).collect()
}

#[test]
fn tiers_are_strict() {
    let mut q = FairQueue::new(10);
    q.push(waiter(Tier::Batch, "a", 1.0, 1, 1));
    q.push(waiter(Tier::Agent, "a", 1.0, 1, 2));
    q.push(waiter(Tier::Interactive, "b", 1.0, 1, 3));
    q.push(waiter(Tier::Agent, "b", 1.0, 1, 4));
    assert_eq!(drain(&mut q), [3, 2, 4, 1]);
}

#[test]
fn within_a_tenant_the_earliest_deadline_goes_first_then_arrival() {
    let t0 = Instant::now();
    let mut q = FairQueue::new(10);
    let mut at = |item, deadline: Option<u64>| {
        let mut w = waiter(Tier::Agent, "a", 1.0, 1, item);
        w.deadline = deadline.map(|s| t0 + Duration::from_secs(s));
        q.push(w);
    };
    at(1, None);
    at(2, Some(30));
    at(3, Some(10));
    at(4, None);
    at(5, Some(10));
    assert_eq!(drain(&mut q), [3, 5, 2, 1, 4]);
}

#[test]
fn a_heavy_tenant_delays_itself_not_the_quiet_one() {
    let mut q = FairQueue::new(100);
    for i in 0..20 {
        q.push(waiter(Tier::Agent, "heavy", 1.0, 100, i));
    }
    // The heavy tenant has been served twice when the quiet one arrives.
    assert_eq!(drain_n(&mut q, 2), [0, 1]);
    q.push(waiter(Tier::Agent, "quiet", 1.0, 100, 100));
    assert_eq!(
        drain_n(&mut q, 1),
        [100],
        "the quiet tenant's request goes next"
    );
}

fn drain_n(q: &mut FairQueue<u32>, n: usize) -> Vec<u32> {
    (0..n)
        .filter_map(|_| q.pop().map(|(_, w)| w.item))
        .collect()
}

#[test]
fn an_idle_tenant_banks_no_credit() {
    let mut q = FairQueue::new(100);
    for i in 0..10 {
        q.push(waiter(Tier::Agent, "a", 1.0, 10, i));
    }
    drain_n(&mut q, 10);
    // b arrives after a long idle: it shares from now on, it does not get ten turns in a row.
    for i in 0..4 {
        q.push(waiter(Tier::Agent, "a", 1.0, 10, 10 + i));
        q.push(waiter(Tier::Agent, "b", 1.0, 10, 20 + i));
    }
    let order = drain(&mut q);
    let first_four: Vec<bool> = order[..4].iter().map(|i| *i >= 20).collect();
    assert_eq!(first_four.iter().filter(|b| **b).count(), 2, "{order:?}");
}

#[test]
fn a_full_queue_evicts_the_newest_least_urgent_or_refuses() {
    let mut q = FairQueue::new(3);
    q.push(waiter(Tier::Batch, "a", 1.0, 1, 1));
    q.push(waiter(Tier::Batch, "a", 1.0, 1, 2));
    q.push(waiter(Tier::Agent, "a", 1.0, 1, 3));
    match q.push(waiter(Tier::Batch, "a", 1.0, 1, 4)) {
        Pushed::Full(w) => assert_eq!(w.item, 4, "no more urgent, and holding all it may"),
        other => panic!("{other:?}"),
    }
    match q.push(waiter(Tier::Interactive, "b", 1.0, 1, 5)) {
        Pushed::Evicted(_, victim) => assert_eq!(victim.item, 2, "the newest batch waiter"),
        other => panic!("{other:?}"),
    }
    match q.push(waiter(Tier::Agent, "b", 1.0, 1, 6)) {
        Pushed::Evicted(_, victim) => assert_eq!(victim.item, 1),
        other => panic!("{other:?}"),
    }
    match q.push(waiter(Tier::Agent, "a", 1.0, 1, 7)) {
        Pushed::Full(w) => assert_eq!(w.item, 7, "at its share of the least urgent tier"),
        other => panic!("{other:?}"),
    }
    assert_eq!(drain(&mut q), [5, 3, 6]);
}

fn held(q: &FairQueue<u32>, tier: Tier) -> Vec<(String, usize)> {
    let mut held: Vec<(String, usize)> = q.tenants(tier).map(|(t, n)| (t.to_string(), n)).collect();
    held.sort();
    held
}

#[test]
fn a_tenant_under_its_share_takes_the_place_of_the_newest_of_the_one_over_it() {
    let mut q = FairQueue::new(8);
    for i in 0..8 {
        q.push(waiter(Tier::Agent, "noisy", 1.0, 1, i));
    }
    for i in 0..4 {
        match q.push(waiter(Tier::Agent, "quiet", 1.0, 1, 100 + i)) {
            Pushed::Evicted(_, victim) => {
                assert_eq!((victim.item, victim.tenant.as_str()), (7 - i, "noisy"))
            }
            other => panic!("quiet arrival {i}: {other:?}"),
        }
    }
    assert_eq!(
        held(&q, Tier::Agent),
        [("noisy".into(), 4), ("quiet".into(), 4)]
    );
    for (tenant, item) in [("quiet", 104), ("noisy", 8)] {
        match q.push(waiter(Tier::Agent, tenant, 1.0, 1, item)) {
            Pushed::Full(w) => assert_eq!(w.item, item, "{tenant} is at its share"),
            other => panic!("{tenant}: {other:?}"),
        }
    }
}

#[test]
fn shares_of_a_full_queue_follow_the_weights() {
    let mut q = FairQueue::new(8);
    for i in 0..8 {
        q.push(waiter(Tier::Agent, "small", 1.0, 1, i));
    }
    // "big" is owed 6 of 8 at weight 3: it takes places until it holds them.
    let taken = (0..10)
        .filter(|i| {
            matches!(
                q.push(waiter(Tier::Agent, "big", 3.0, 1, 100 + i)),
                Pushed::Evicted(..)
            )
        })
        .count();
    assert_eq!(taken, 6);
    assert_eq!(
        held(&q, Tier::Agent),
        [("big".into(), 6), ("small".into(), 2)]
    );
}

#[test]
fn the_place_given_up_is_taken_from_whoever_holds_most_per_weight() {
    let mut q = FairQueue::new(9);
    for (tenant, n) in [("a", 4), ("b", 3), ("c", 2)] {
        for i in 0..n {
            q.push(waiter(Tier::Agent, tenant, 1.0, 1, i));
        }
    }
    match q.push(waiter(Tier::Agent, "d", 1.0, 1, 99)) {
        Pushed::Evicted(_, victim) => assert_eq!(victim.tenant.as_str(), "a"),
        other => panic!("{other:?}"),
    }
    // Now a and b hold 3 each: a tie goes to the newer waiter, b's.
    match q.push(waiter(Tier::Agent, "d", 1.0, 1, 98)) {
        Pushed::Evicted(_, victim) => {
            assert_eq!((victim.tenant.as_str(), victim.item), ("b", 2))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_less_urgent_tier_gives_up_its_places_first() {
    let mut q = FairQueue::new(6);
    for i in 0..4 {
        q.push(waiter(Tier::Agent, "noisy", 1.0, 1, i));
    }
    q.push(waiter(Tier::Batch, "x", 1.0, 1, 10));
    q.push(waiter(Tier::Batch, "y", 1.0, 1, 20));
    assert!(
        matches!(
            q.push(waiter(Tier::Batch, "y", 1.0, 1, 21)),
            Pushed::Full(_)
        ),
        "y holds its share of the batch tier"
    );
    for expect in [("y", 20), ("x", 10), ("noisy", 3)] {
        match q.push(waiter(Tier::Agent, "quiet", 1.0, 1, 100)) {
            Pushed::Evicted(_, v) => assert_eq!((v.tenant.as_str(), v.item), expect),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(q.depth(Tier::Batch), 0);
    // Then the agent tier's own shares: quiet holds 3 of 6, as does noisy.
    assert!(matches!(
        q.push(waiter(Tier::Agent, "quiet", 1.0, 1, 101)),
        Pushed::Full(_)
    ));
}

#[test]
fn with_one_tenant_a_full_queue_refuses_its_own_tier() {
    let mut q = FairQueue::new(2);
    q.push(waiter(Tier::Agent, "a", 1.0, 1, 1));
    q.push(waiter(Tier::Agent, "a", 1.0, 1, 2));
    assert!(matches!(
        q.push(waiter(Tier::Agent, "a", 1.0, 1, 3)),
        Pushed::Full(_)
    ));
    assert_eq!(drain(&mut q), [1, 2]);
}

#[test]
fn waiters_that_cannot_go_yet_keep_their_place() {
    let mut q = FairQueue::new(10);
    q.push(waiter(Tier::Interactive, "a", 1.0, 1, 10)); // model 0: full
    q.push(waiter(Tier::Agent, "a", 1.0, 1, 21));
    q.push(waiter(Tier::Agent, "b", 1.0, 1, 30));
    let free = |w: &Waiter<u32>| w.item % 10 != 0;
    assert_eq!(q.pop_first(free).map(|(_, w)| w.item), Some(21));
    assert_eq!(q.pop_first(free).map(|(_, w)| w.item), None);
    assert_eq!(drain(&mut q), [10, 30], "the skipped keep their order");
}

#[test]
fn the_oldest_of_a_tier_is_its_first_arrival_whatever_the_order() {
    let mut q = FairQueue::new(10);
    assert!(q.oldest(Tier::Interactive).is_none());
    q.push(waiter(Tier::Agent, "a", 1.0, 1, 0));
    q.push(waiter(Tier::Interactive, "b", 1.0, 1, 1));
    let mut urgent = waiter(Tier::Interactive, "b", 1.0, 1, 2);
    urgent.deadline = Some(Instant::now());
    q.push(urgent);
    assert_eq!(q.oldest(Tier::Interactive).map(|(_, w)| w.item), Some(1));
    assert_eq!(
        q.pop().map(|(_, w)| w.item),
        Some(2),
        "the tenant's deadline goes first"
    );
    let (ticket, oldest) = q.oldest(Tier::Agent).unwrap();
    assert_eq!(oldest.item, 0);
    assert_eq!(q.remove(ticket).map(|w| w.item), Some(0));
    assert!(q.oldest(Tier::Agent).is_none());
}

#[test]
fn a_waiter_taken_out_early_is_gone() {
    let mut q = FairQueue::new(10);
    let Pushed::Queued(t) = q.push(waiter(Tier::Agent, "a", 1.0, 1, 1)) else {
        panic!()
    };
    q.push(waiter(Tier::Agent, "a", 1.0, 1, 2));
    assert_eq!(q.remove(t).map(|w| w.item), Some(1));
    assert!(q.remove(t).is_none());
    assert_eq!((q.len(), q.depth(Tier::Agent)), (1, 1));
    assert_eq!(drain(&mut q), [2]);
    assert!(q.is_empty());
}

proptest! {
    // Each case serves 10,000 requests; 32 cases of random weights and sizes suffice.
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Tenants that always have work get tokens in proportion to their weights, within 5%,
    /// over 10,000 requests of mixed sizes.
    #[test]
    fn shares_follow_the_weights(
        weights in proptest::collection::vec(1u32..10, 2..5),
        costs in proptest::collection::vec(1u64..1000, 64),
    ) {
        let mut q = FairQueue::new(usize::MAX);
        let names: Vec<String> = (0..weights.len()).map(|i| format!("t{i}")).collect();
        let mut next_cost = 0usize;
        let mut push = |q: &mut FairQueue<u32>, i: usize| {
            let cost = costs[next_cost % costs.len()];
            next_cost += 1;
            q.push(waiter(Tier::Agent, &names[i], f64::from(weights[i]), cost, i as u32));
        };
        for i in 0..weights.len() {
            for _ in 0..3 {
                push(&mut q, i);
            }
        }
        let mut served = vec![0u64; weights.len()];
        for _ in 0..10_000 {
            let (_, w) = q.pop().unwrap();
            let i = w.item as usize;
            served[i] += w.cost;
            push(&mut q, i);
        }
        let total: u64 = served.iter().sum();
        let weight_total: u32 = weights.iter().sum();
        for (i, s) in served.iter().enumerate() {
            let share = *s as f64 / total as f64;
            let owed = f64::from(weights[i]) / f64::from(weight_total);
            prop_assert!((share - owed).abs() <= 0.05 * owed, "tenant {i}: {share} against {owed}");
        }
    }

    /// Whatever order tenants arrive at a full queue in (nothing served meanwhile), each ends
    /// holding everything it sent or more than one waiter short of its weighted share of the
    /// queue among the tenants that sent any.
    #[test]
    fn a_full_queue_keeps_every_tenant_its_share(
        weights in proptest::collection::vec(1u32..5, 2..5),
        arrivals in proptest::collection::vec(0usize..4, 1..200),
        capacity in 1usize..24,
    ) {
        let mut q = FairQueue::new(capacity);
        let mut sent = vec![0usize; weights.len()];
        for (n, i) in arrivals.iter().map(|i| i % weights.len()).enumerate() {
            sent[i] += 1;
            q.push(waiter(Tier::Agent, &format!("t{i}"), f64::from(weights[i]), 1, n as u32));
            prop_assert!(q.len() <= capacity);
        }
        let active: u32 = (0..weights.len()).filter(|i| sent[*i] > 0).map(|i| weights[i]).sum();
        for (i, sent) in sent.iter().enumerate() {
            let name = TenantId::new(format!("t{i}"));
            let held = q.tenants(Tier::Agent).find(|(t, _)| **t == name).map_or(0, |(_, n)| n);
            let fair = capacity as f64 * f64::from(weights[i]) / f64::from(active.max(1));
            prop_assert!(
                held == *sent || held as f64 > fair - 1.0,
                "t{i} holds {held} of {capacity} (sent {sent}), owed {fair:.2}"
            );
        }
    }
}

#[test]
fn waiters_taken_out_early_leave_the_others_in_their_order() {
    let mut q = FairQueue::new(10);
    for (tier, tenant, item) in [
        (Tier::Interactive, "a", 10),
        (Tier::Agent, "a", 21),
        (Tier::Agent, "b", 30),
        (Tier::Batch, "b", 41),
    ] {
        q.push(waiter(tier, tenant, 1.0, 1, item));
    }
    let mut out: Vec<u32> = q
        .remove_where(|w| w.item % 10 == 0)
        .into_iter()
        .map(|w| w.item)
        .collect();
    out.sort_unstable();
    assert_eq!(out, [10, 30]);
    assert_eq!(q.len(), 2);
    assert_eq!(drain(&mut q), [21, 41]);
}
