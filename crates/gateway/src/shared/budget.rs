//! A rate budget every replica spends from (a tenant's requests or tokens per minute, the
//! gateway's request rate), claimed from Redis in chunks (`sluice_core::admission::shared`).
//!
//! While Redis is away (`--redis-fail-open`), the replica spends from a local bucket of its
//! share (the budget over the live replicas it last counted), and keeps the sum; when Redis
//! answers again that sum is charged to the shared bucket, so the replicas' spending apart is
//! paid back out of the budget rather than forgotten.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use sluice_core::admission::shared::{chunk, share, Allowance};
use sluice_core::admission::{Bucket, Level, Refusal};
use tokio::time::Instant;

use super::store::Store;

/// Why a shared budget did not give what was asked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Short {
    Refused(Refusal),
    /// Redis is away and `--redis-fail-open` is off.
    Unavailable,
}

/// A replica falls idle on a budget after this long without spending: it gives back all it
/// holds.
const IDLE: Duration = Duration::from_secs(1);

#[derive(Debug)]
struct State {
    allowance: Allowance,
    last_spent: Instant,
    /// The shared bucket's level when Redis last said.
    level: f64,
    /// The local bucket while Redis is away.
    apart: Option<Bucket>,
    /// Spent from `apart`, to charge when Redis is back.
    spent_apart: u64,
    /// The last claim found the shared bucket short until then: requests are refused without
    /// asking again (under overload, the refused cost no round trip).
    dry_until: Option<Instant>,
}

/// One shared budget.
#[derive(Debug)]
pub(crate) struct SharedBudget {
    store: Arc<Store>,
    key: String,
    capacity: u64,
    period: Duration,
    state: Mutex<State>,
    /// One claim at a time: requests short at once wait for it rather than each claiming (which
    /// would pull the whole budget to the replica that asked first).
    claiming: tokio::sync::Mutex<()>,
}

impl SharedBudget {
    /// A budget of `capacity` refilled per `period`, stored as `name`.
    pub fn new(store: Arc<Store>, name: &str, capacity: u64, period: Duration) -> Self {
        Self {
            key: store.key(name),
            store,
            capacity,
            period,
            state: Mutex::new(State {
                allowance: Allowance::default(),
                last_spent: Instant::now(),
                level: capacity as f64,
                apart: None,
                spent_apart: 0,
                dry_until: None,
            }),
            claiming: tokio::sync::Mutex::new(()),
        }
    }

    fn rate(&self) -> f64 {
        self.capacity as f64 / self.period.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    fn chunk(&self) -> u64 {
        chunk(self.capacity, self.store.replicas())
    }

    /// Takes `amount`: from this replica's claim, claiming more (one bounded round trip) when
    /// it falls short.
    pub(crate) async fn reserve(&self, amount: u64, now: Instant) -> Result<(), Short> {
        if amount > self.capacity {
            return Err(Short::Refused(Refusal::TooBig {
                capacity: self.capacity,
            }));
        }
        if self.store.up() {
            if self.take(amount, now) {
                return Ok(());
            }
            if let Some(retry_after) = self.dry(now) {
                return Err(Short::Refused(Refusal::NotYet { retry_after }));
            }
            let _claiming = self.claiming.lock().await;
            if self.take(amount, now) {
                // The claim this request waited for covered it.
                return Ok(());
            }
            let want = self.state.lock().allowance.to_claim(amount, self.chunk());
            let claimed = self
                .store
                .claim(&self.key, self.capacity, self.rate(), want, 0);
            if let Ok((given, level)) = claimed.await {
                return self.claimed(amount, given, level, now);
            }
        }
        self.reserve_apart(amount, now)
    }

    /// How long the shared bucket is known to stay short.
    fn dry(&self, now: Instant) -> Option<Duration> {
        let until = self.state.lock().dry_until?;
        (until > now).then(|| until - now)
    }

    /// Spends from what this replica holds, if it covers `amount`.
    fn take(&self, amount: u64, now: Instant) -> bool {
        let mut state = self.state.lock();
        if state.allowance.take(amount) {
            state.last_spent = now;
            return true;
        }
        false
    }

    fn claimed(&self, amount: u64, given: u64, level: f64, now: Instant) -> Result<(), Short> {
        let mut state = self.state.lock();
        state.allowance.credit(given);
        state.level = level;
        if state.allowance.take(amount) {
            state.last_spent = now;
            return Ok(());
        }
        // What it holds stays its own (the next request may fit); the rest refills.
        let missing = amount as f64 - state.allowance.held() as f64 - level;
        let retry_after = Duration::from_secs_f64(missing.max(1.0) / self.rate());
        state.dry_until = Some(now + retry_after);
        Err(Short::Refused(Refusal::NotYet { retry_after }))
    }

    fn reserve_apart(&self, amount: u64, now: Instant) -> Result<(), Short> {
        if !self.store.fail_open {
            return Err(Short::Unavailable);
        }
        let mut state = self.state.lock();
        let share = share(self.capacity, self.store.replicas());
        let period = self.period;
        let bucket = state
            .apart
            .get_or_insert_with(|| Bucket::new(share, period, now));
        bucket.reserve(amount, now).map_err(Short::Refused)?;
        state.spent_apart += amount;
        Ok(())
    }

    /// The end of a request that reserved `reserved` and used `used`.
    pub(crate) fn settle(&self, reserved: u64, used: u64, now: Instant) {
        let mut state = self.state.lock();
        if let Some(bucket) = &mut state.apart {
            bucket.settle(reserved, used, now);
            state.spent_apart = (state.spent_apart + used).saturating_sub(reserved);
        } else {
            state.allowance.settle(reserved, used);
        }
    }

    /// The budget as this replica sees it, for `x-ratelimit-*`.
    pub(crate) fn level(&self, now: Instant) -> Level {
        let mut state = self.state.lock();
        if let Some(bucket) = &mut state.apart {
            return bucket.level(now);
        }
        let remaining = (state.level + state.allowance.held() as f64).max(0.0);
        Level {
            limit: self.capacity,
            remaining: remaining as u64,
            reset: Duration::from_secs_f64(
                (self.capacity as f64 - remaining).max(0.0) / self.rate(),
            ),
        }
    }

    /// Gives back what this replica holds and does not need (all of it once idle).
    pub(crate) async fn give_back(&self, now: Instant) {
        let surplus = {
            let mut state = self.state.lock();
            let idle = now.saturating_duration_since(state.last_spent) >= IDLE;
            state.allowance.give_back(idle, 2 * self.chunk())
        };
        if surplus == 0 {
            return;
        }
        let charge = -i64::try_from(surplus).unwrap_or(i64::MAX);
        if let Ok((_, level)) = self
            .store
            .claim(&self.key, self.capacity, self.rate(), 0, charge)
            .await
        {
            self.state.lock().level = level;
        }
    }

    /// Redis is back: what was spent apart is charged to the shared bucket (less what this
    /// replica still held of its claim), and the claim starts over. Whether Redis took it.
    pub(crate) async fn reconcile(&self) -> bool {
        let (spent, held) = {
            let state = self.state.lock();
            (state.spent_apart, state.allowance.held().max(0))
        };
        let charge = i64::try_from(spent).unwrap_or(i64::MAX) - held;
        let Ok((_, level)) = self
            .store
            .claim(&self.key, self.capacity, self.rate(), 0, charge)
            .await
        else {
            return false;
        };
        let mut state = self.state.lock();
        state.level = level;
        state.apart = None;
        state.allowance.reset();
        state.spent_apart = state.spent_apart.saturating_sub(spent);
        true
    }
}
