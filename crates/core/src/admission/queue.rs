//! The gateway queue's order: strict priority between tiers; within a tier, weighted fair between
//! tenants by tokens; within a tenant, earliest deadline first, then arrival.
//!
//! Fairness is start-time fair queuing over tokens: each tier keeps a virtual clock, and each
//! tenant's next request is tagged with the virtual time it may start, `max(clock, the tenant's
//! last finish)`; the smallest start tag goes first, and serving a request advances its tenant
//! by `cost / weight`. A tenant that sends ten times its share therefore runs ten times ahead of
//! the clock and waits behind everyone else's next request, while a quiet tenant's requests start
//! at the clock: the heavy tenant delays itself, not the others. An idle tenant banks no credit
//! (its tag never falls behind the clock).
//!
//! What a full queue keeps is fair too. A more urgent arrival takes the place of a waiter of the
//! least urgent tier present. An arrival of that tier itself takes a place only if its tenant is
//! under its weighted share of the tier's waiters — its weight over the weights of the tenants
//! with waiters there, its own included — and then from the tenant furthest over its share: a
//! tenant that fills the queue while another is quiet cannot keep the quiet one out. Either way
//! the waiter given up is the newest of the tenant furthest over its share in its tier (the one
//! that has waited least, of whoever holds most). Anything else arriving at a full queue is
//! refused: with one tenant, every arrival no more urgent than the queue.

use std::collections::{BTreeMap, HashMap};

use tokio::time::Instant;

use super::tier::Tier;
use crate::TenantId;

/// One request waiting, with what orders it.
#[derive(Debug)]
pub struct Waiter<T> {
    pub tier: Tier,
    pub tenant: TenantId,
    /// The tenant's weight within its tier (its configured `weight`, > 0).
    pub weight: f64,
    /// What the request is expected to cost, in tokens (at least 1 is charged).
    pub cost: u64,
    /// The client's deadline, if it gave one.
    pub deadline: Option<Instant>,
    pub item: T,
}

/// A waiter's place in the queue, to take it out early (its client left, its time ran out).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket(u64);

/// What became of an arrival.
#[derive(Debug)]
pub enum Pushed<T> {
    Queued(Ticket),
    /// Queued, and this less urgent waiter was evicted to make room.
    Evicted(Ticket, Waiter<T>),
    /// The queue is full of waiters at least as urgent: the arrival is handed back.
    Full(Waiter<T>),
}

/// Earliest deadline first (none last), then arrival.
type Order = (bool, Option<Instant>, Ticket);

fn order<T>(w: &Waiter<T>, ticket: Ticket) -> Order {
    (w.deadline.is_none(), w.deadline, ticket)
}

#[derive(Debug)]
struct TenantLine<T> {
    waiting: BTreeMap<Order, Waiter<T>>,
    /// The virtual time the tenant's next request may start.
    start: f64,
    /// Its weight, as its latest arrival gave it.
    weight: f64,
}

impl<T> TenantLine<T> {
    /// Waiters per unit of weight: set against the tier's level, over or under its share.
    fn held(&self) -> f64 {
        self.waiting.len() as f64 / self.weight.max(f64::MIN_POSITIVE)
    }

    /// Its most recent arrival still waiting.
    fn newest(&self) -> Option<Ticket> {
        self.waiting.keys().map(|key| key.2).max()
    }
}

#[derive(Debug)]
struct TierLine<T> {
    tenants: HashMap<TenantId, TenantLine<T>>,
    /// The start tag of the last request served.
    clock: f64,
    len: usize,
}

impl<T> TierLine<T> {
    /// The waiter a full queue gives up in this tier: the newest of the tenant holding most per
    /// unit of weight (ties to the one with the newer waiter, so the choice is the same however
    /// the tenants are stored).
    fn furthest_over(&self) -> Option<(f64, Ticket)> {
        self.tenants
            .values()
            .filter_map(|t| Some((t.held(), t.newest()?)))
            .max_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
    }

    /// The waiter an arrival of this tier from `tenant` (of `weight`) may take the place of:
    /// only while the tenant is under its share, and only from a tenant over its own.
    fn fair_swap(&self, tenant: &TenantId, weight: f64) -> Option<Ticket> {
        let own = self.tenants.get(tenant).filter(|t| !t.waiting.is_empty());
        let others: f64 = self
            .tenants
            .iter()
            .filter(|(name, t)| *name != tenant && !t.waiting.is_empty())
            .map(|(_, t)| t.weight)
            .sum();
        let weight = weight.max(f64::MIN_POSITIVE);
        // Waiters per unit of weight each tenant would hold if the tier were shared fairly.
        let level = self.len as f64 / (others + weight);
        let held = own.map_or(0, |t| t.waiting.len()) as f64 / weight;
        if held >= level {
            return None;
        }
        let (over, victim) = self.furthest_over()?;
        (over > level).then_some(victim)
    }
}

impl<T> Default for TierLine<T> {
    fn default() -> Self {
        Self {
            tenants: HashMap::new(),
            clock: 0.0,
            len: 0,
        }
    }
}

/// The queue.
#[derive(Debug)]
pub struct FairQueue<T> {
    capacity: usize,
    tiers: [TierLine<T>; 3],
    places: HashMap<Ticket, (Tier, TenantId, Order)>,
    next: u64,
}

impl<T> FairQueue<T> {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            tiers: Default::default(),
            places: HashMap::new(),
            next: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.places.len()
    }

    pub fn is_empty(&self) -> bool {
        self.places.is_empty()
    }

    /// Waiters in `tier`.
    pub fn depth(&self, tier: Tier) -> usize {
        self.tiers[tier.index()].len
    }

    /// Waiters that would go before an arrival of `tier` from `tenant` (of `weight`): every
    /// waiter of a more urgent tier, the tenant's own, and each other tenant's of the same tier
    /// whose start tag comes before the arrival's. A quiet tenant's request starts at the tier's
    /// clock, so a heavy tenant's backlog is not ahead of it, and judging its wait by the whole
    /// tier would refuse the very request fairness lets through.
    pub fn ahead_of_arrival(&self, tier: Tier, tenant: &TenantId, weight: f64) -> usize {
        let urgent: usize = Tier::ALL[..tier.index()]
            .iter()
            .map(|t| self.depth(*t))
            .sum();
        let line = &self.tiers[tier.index()];
        let advance = |cost: u64, weight: f64| cost.max(1) as f64 / weight.max(f64::MIN_POSITIVE);
        let (own, starts_at) = match line.tenants.get(tenant) {
            Some(t) => (
                t.waiting.len(),
                t.start.max(line.clock)
                    + t.waiting
                        .values()
                        .map(|w| advance(w.cost, weight))
                        .sum::<f64>(),
            ),
            None => (0, line.clock),
        };
        let others: usize = line
            .tenants
            .iter()
            .filter(|(name, _)| *name != tenant)
            .map(|(_, t)| {
                let mut tag = t.start;
                t.waiting
                    .values()
                    .take_while(|w| {
                        // A tie goes to the earlier arrival.
                        let before = tag <= starts_at;
                        tag += advance(w.cost, w.weight);
                        before
                    })
                    .count()
            })
            .sum();
        urgent + own + others
    }

    /// Queues `waiter`; when the queue is full, in the place of the waiter `victim_for` names,
    /// or not at all.
    pub fn push(&mut self, waiter: Waiter<T>) -> Pushed<T> {
        let evicted = if self.len() >= self.capacity {
            match self.victim_for(&waiter) {
                Some(victim) => self.remove(victim),
                None => return Pushed::Full(waiter),
            }
        } else {
            None
        };
        let ticket = Ticket(self.next);
        self.next += 1;
        let key = order(&waiter, ticket);
        let line = &mut self.tiers[waiter.tier.index()];
        let clock = line.clock;
        let tenant = line
            .tenants
            .entry(waiter.tenant.clone())
            .or_insert_with(|| TenantLine {
                waiting: BTreeMap::new(),
                start: clock,
                weight: waiter.weight,
            });
        tenant.weight = waiter.weight;
        if tenant.waiting.is_empty() {
            // Newly backlogged: no credit for the time it was idle.
            tenant.start = tenant.start.max(clock);
        }
        self.places
            .insert(ticket, (waiter.tier, waiter.tenant.clone(), key));
        tenant.waiting.insert(key, waiter);
        line.len += 1;
        match evicted {
            Some(victim) => Pushed::Evicted(ticket, victim),
            None => Pushed::Queued(ticket),
        }
    }

    /// Whose place a full queue gives to `arrival` (see the module's doc): a waiter of the least
    /// urgent tier present, when the arrival is more urgent; of the arrival's own tier, when that
    /// is the least urgent present and the arrival's tenant is under its share there.
    fn victim_for(&self, arrival: &Waiter<T>) -> Option<Ticket> {
        let least = *Tier::ALL.iter().rev().find(|t| self.depth(**t) > 0)?;
        let line = &self.tiers[least.index()];
        if arrival.tier < least {
            line.furthest_over().map(|(_, victim)| victim)
        } else if arrival.tier == least {
            line.fair_swap(&arrival.tenant, arrival.weight)
        } else {
            None
        }
    }

    /// Takes a waiter out before its turn.
    pub fn remove(&mut self, ticket: Ticket) -> Option<Waiter<T>> {
        let (tier, tenant, key) = self.places.remove(&ticket)?;
        let line = &mut self.tiers[tier.index()];
        let queue = line.tenants.get_mut(&tenant)?;
        let waiter = queue.waiting.remove(&key)?;
        line.len -= 1;
        let clock = line.clock;
        if queue.waiting.is_empty() && queue.start <= clock {
            line.tenants.remove(&tenant);
        }
        Some(waiter)
    }

    /// Takes out, before their turn, every waiter `doomed` picks (as `remove` does each).
    pub fn remove_where(&mut self, mut doomed: impl FnMut(&Waiter<T>) -> bool) -> Vec<Waiter<T>> {
        let tickets: Vec<Ticket> = self
            .tiers
            .iter()
            .flat_map(|l| l.tenants.values())
            .flat_map(|t| t.waiting.iter())
            .filter(|(_, w)| doomed(w))
            .map(|(key, _)| key.2)
            .collect();
        tickets.into_iter().filter_map(|t| self.remove(t)).collect()
    }

    /// The next waiter to serve: the most urgent tier, its tenant with the smallest start tag
    /// (ties to the earliest arrival), that tenant's earliest deadline.
    pub fn pop(&mut self) -> Option<(Ticket, Waiter<T>)> {
        self.pop_first(|_| true)
    }

    /// The next waiter to serve among those `ready` takes (a waiter whose model has a worker
    /// free for its tier): the same order as `pop`, skipping the others without moving them.
    pub fn pop_first(&mut self, ready: impl Fn(&Waiter<T>) -> bool) -> Option<(Ticket, Waiter<T>)> {
        let (line, name, key) = self.tiers.iter_mut().find_map(|line| {
            let (name, key) = line
                .tenants
                .iter()
                .filter_map(|(name, t)| {
                    let (key, _) = t.waiting.iter().find(|(_, w)| ready(w))?;
                    Some((name, *key, t.start))
                })
                .min_by(|a, b| a.2.total_cmp(&b.2).then(a.1 .2.cmp(&b.1 .2)))
                .map(|(name, key, _)| (name.clone(), key))?;
            Some((line, name, key))
        })?;
        let tenant = line.tenants.get_mut(&name)?;
        let waiter = tenant.waiting.remove(&key)?;
        line.len -= 1;
        line.clock = tenant.start;
        tenant.start += waiter.cost.max(1) as f64 / waiter.weight.max(f64::MIN_POSITIVE);
        let clock = line.clock;
        // A tenant with nothing waiting is remembered only while it is ahead of the clock.
        line.tenants
            .retain(|_, t| !t.waiting.is_empty() || t.start > clock);
        self.places.remove(&key.2);
        Some((key.2, waiter))
    }

    /// The waiter of `tier` that arrived first (CoDel's head: it has waited longest).
    pub fn oldest(&self, tier: Tier) -> Option<(Ticket, &Waiter<T>)> {
        self.tiers[tier.index()]
            .tenants
            .values()
            .flat_map(|t| t.waiting.iter())
            .min_by_key(|(key, _)| key.2)
            .map(|(key, waiter)| (key.2, waiter))
    }

    /// Every waiter, in no particular order.
    pub fn waiters(&self) -> impl Iterator<Item = &Waiter<T>> {
        self.tiers
            .iter()
            .flat_map(|l| l.tenants.values())
            .flat_map(|t| t.waiting.values())
    }

    /// Waiters of `tier` per tenant, with the earliest arrival among them (for `/admission`).
    pub fn tenants(&self, tier: Tier) -> impl Iterator<Item = (&TenantId, usize)> {
        self.tiers[tier.index()]
            .tenants
            .iter()
            .filter(|(_, t)| !t.waiting.is_empty())
            .map(|(name, t)| (name, t.waiting.len()))
    }
}

#[cfg(test)]
mod tests;
