//! A replica's share of budgets several gateway replicas spend together (`--redis-url`).
//!
//! The shared store holds each budget whole; a replica claims from it in chunks and spends its
//! claim locally, so most requests are decided without a round trip. What a replica holds and
//! has not spent is invisible to the others: it is given back when the replica falls idle, and
//! never more than a chunk and a request's worth of it is kept — the error this allows is
//! under-admission of at most one chunk per replica, never spending beyond the budget (claims
//! are partial when the store holds less).
//!
//! Concurrency caps work the same way with slots: a replica holds a grant of slots (its running
//! requests and a little headroom) and admits while it has a free one.

/// A replica claims this fraction of its share of a budget at a time.
const CHUNK_PARTS: u64 = 8;

/// How much a replica claims at once from a budget of `capacity` shared by `replicas`: an
/// eighth of its share, at least 1.
pub fn chunk(capacity: u64, replicas: u32) -> u64 {
    (capacity / (CHUNK_PARTS * u64::from(replicas.max(1)))).max(1)
}

/// What one replica may spend alone while the shared store is away: the budget split evenly,
/// at least 1.
pub fn share(capacity: u64, replicas: u32) -> u64 {
    capacity.div_ceil(u64::from(replicas.max(1))).max(1)
}

/// A replica's claim on a shared rate budget: claimed and not yet spent. Negative after a
/// request used more than it reserved (a debt the next claim pays first).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Allowance {
    held: i64,
}

impl Allowance {
    pub fn held(&self) -> i64 {
        self.held
    }

    /// Spends `amount` if the claim covers it.
    pub fn take(&mut self, amount: u64) -> bool {
        let amount = i64::try_from(amount).unwrap_or(i64::MAX);
        if self.held >= amount {
            self.held -= amount;
            return true;
        }
        false
    }

    /// What to claim so `amount` can be spent with `chunk` left over (the debt paid first).
    pub fn to_claim(&self, amount: u64, chunk: u64) -> u64 {
        let missing = i64::try_from(amount).unwrap_or(i64::MAX) - self.held;
        u64::try_from(missing.max(0)).unwrap_or(0) + chunk
    }

    /// A claim came back with `got`.
    pub fn credit(&mut self, got: u64) {
        self.held = self
            .held
            .saturating_add(i64::try_from(got).unwrap_or(i64::MAX));
    }

    /// A request that reserved `reserved` used `used`: the difference is this replica's again
    /// (or owed).
    pub fn settle(&mut self, reserved: u64, used: u64) {
        let back =
            i64::try_from(reserved).unwrap_or(i64::MAX) - i64::try_from(used).unwrap_or(i64::MAX);
        self.held = self.held.saturating_add(back);
    }

    /// What to give back to the store now: everything held when idle, else what is held
    /// beyond `keep`. Taken out of the allowance.
    pub fn give_back(&mut self, idle: bool, keep: u64) -> u64 {
        let keep = if idle {
            0
        } else {
            i64::try_from(keep).unwrap_or(i64::MAX)
        };
        let surplus = (self.held - keep).max(0);
        self.held -= surplus;
        u64::try_from(surplus).unwrap_or(0)
    }

    /// Forgets the claim (the store lost it, or this replica is starting over).
    pub fn reset(&mut self) {
        self.held = 0;
    }
}

/// A replica's grant of slots under a shared concurrency cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Grant {
    /// Slots the store counts as this replica's.
    pub granted: u64,
    /// Its requests running now.
    pub in_use: u64,
}

impl Grant {
    /// Takes a slot if the grant has a free one.
    pub fn enter(&mut self) -> bool {
        if self.in_use < self.granted {
            self.in_use += 1;
            return true;
        }
        false
    }

    pub fn leave(&mut self) {
        self.in_use = self.in_use.saturating_sub(1);
    }

    /// The grant to ask the store for: the running requests, `more` about to start, and
    /// `headroom` free slots.
    pub fn wanted(&self, more: u64, headroom: u64) -> u64 {
        self.in_use + more + headroom
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_an_eighth_of_a_replicas_share_and_never_zero() {
        assert_eq!(chunk(60, 2), 3);
        assert_eq!(chunk(1_000_000, 4), 31_250);
        assert_eq!(chunk(5, 3), 1);
        assert_eq!(chunk(60, 0), 7, "no replica seen yet counts as one");
        assert_eq!(share(60, 2), 30);
        assert_eq!(
            share(7, 2),
            4,
            "rounded up: a budget is never split to nothing"
        );
        assert_eq!(share(1, 5), 1);
    }

    #[test]
    fn an_allowance_spends_what_it_claimed_and_claims_the_shortfall_and_a_chunk() {
        let mut a = Allowance::default();
        assert!(!a.take(5));
        assert_eq!(a.to_claim(5, 3), 8);
        a.credit(8);
        assert!(a.take(5));
        assert_eq!(a.held(), 3);
        assert!(a.take(3));
        assert!(!a.take(1));
    }

    #[test]
    fn settling_refunds_or_owes_and_a_debt_is_claimed_first() {
        let mut a = Allowance::default();
        a.credit(100);
        assert!(a.take(100));
        a.settle(100, 40);
        assert_eq!(a.held(), 60, "unused tokens are the replica's again");
        a.settle(0, 90);
        assert_eq!(a.held(), -30, "used more than reserved: owed");
        assert_eq!(a.to_claim(10, 5), 45, "the debt, the request, a chunk");
    }

    #[test]
    fn surplus_is_given_back_beyond_a_chunk_and_all_of_it_when_idle() {
        let mut a = Allowance::default();
        a.credit(50);
        assert_eq!(a.give_back(false, 8), 42);
        assert_eq!(a.held(), 8);
        assert_eq!(a.give_back(true, 8), 8);
        assert_eq!(a.held(), 0);
        a.settle(0, 5);
        assert_eq!(a.give_back(true, 8), 0, "a debt is not given back");
        assert_eq!(a.held(), -5);
    }

    #[test]
    fn a_grant_admits_up_to_its_slots() {
        let mut g = Grant {
            granted: 2,
            in_use: 0,
        };
        assert!(g.enter() && g.enter());
        assert!(!g.enter());
        assert_eq!(g.wanted(1, 1), 4);
        g.leave();
        assert!(g.enter());
        g.leave();
        g.leave();
        g.leave();
        assert_eq!(g.in_use, 0, "never below zero");
    }
}
