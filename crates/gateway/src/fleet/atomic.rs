//! Two small typed cells for per-worker facts that the request path reads without a lock: an
//! enum in an atomic byte, and an instant in an atomic word.
//!
//! Why not a lock or an `ArcSwap`: these facts are read on every routing decision, for every
//! candidate, and written rarely by one owner; a relaxed or acquire load is the whole cost.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

use sluice_core::breaker::BreakerState;
use sluice_core::health::HealthState;
use sluice_core::liveness::LivenessVeto;
use tokio::time::Instant;

/// A small enum that fits a byte: every value listed once, in a fixed order (its index is the
/// byte). Listing the values is the whole encoding, so it cannot disagree with a decoder.
pub(crate) trait Packed: Copy + PartialEq + 'static {
    /// Every value; the first is what a fresh cell holds.
    const ALL: &'static [Self];
}

/// An enum in an atomic: stores are `Release`, loads `Acquire`, so a reader that sees a state also
/// sees what its writer did before storing it.
#[derive(Debug)]
pub(crate) struct AtomicEnum<T> {
    byte: AtomicU8,
    kind: PhantomData<T>,
}

impl<T: Packed> AtomicEnum<T> {
    pub fn new(value: T) -> Self {
        Self {
            byte: AtomicU8::new(Self::encode(value)),
            kind: PhantomData,
        }
    }

    fn encode(value: T) -> u8 {
        let at = T::ALL.iter().position(|v| *v == value).unwrap_or(0);
        u8::try_from(at).unwrap_or(0)
    }

    pub fn load(&self) -> T {
        let at = usize::from(self.byte.load(Ordering::Acquire));
        T::ALL.get(at).copied().unwrap_or(T::ALL[0])
    }

    pub(crate) fn store(&self, value: T) {
        self.byte.store(Self::encode(value), Ordering::Release);
    }
}

impl<T: Packed> Default for AtomicEnum<T> {
    fn default() -> Self {
        Self::new(T::ALL[0])
    }
}

impl Packed for HealthState {
    const ALL: &'static [Self] = &[
        HealthState::Pending,
        HealthState::Ready,
        HealthState::NotReady,
        HealthState::Failed,
        HealthState::Draining,
    ];
}

impl Packed for BreakerState {
    const ALL: &'static [Self] = &[
        BreakerState::Closed,
        BreakerState::Open,
        BreakerState::HalfOpen,
    ];
}

impl Packed for Option<LivenessVeto> {
    const ALL: &'static [Self] = &[
        None,
        Some(LivenessVeto::Unreachable),
        Some(LivenessVeto::Stale),
        Some(LivenessVeto::WedgedQueue),
        Some(LivenessVeto::WedgedPile),
        Some(LivenessVeto::EngineSilent),
        Some(LivenessVeto::Unresponsive),
    ];
}

/// An instant in an atomic, or none: one more than its nanoseconds after the cell's own base, so
/// that 0 means none.
/// Relaxed: an instant is a fact on its own, published with nothing else.
#[derive(Debug)]
pub(crate) struct AtomicInstant {
    base: Instant,
    nanos: AtomicU64,
}

impl AtomicInstant {
    /// A cell that holds no instant yet.
    pub(crate) fn none() -> Self {
        Self {
            base: Instant::now(),
            nanos: AtomicU64::new(0),
        }
    }

    /// A cell that holds now.
    pub(crate) fn now() -> Self {
        Self {
            base: Instant::now(),
            nanos: AtomicU64::new(1),
        }
    }

    /// `at` as stored: never 0, so a stored instant is never taken for none.
    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1)
    }

    pub fn load(&self) -> Option<Instant> {
        match self.nanos.load(Ordering::Relaxed) {
            0 => None,
            n => Some(self.base + Duration::from_nanos(n - 1)),
        }
    }

    pub(crate) fn store(&self, at: Instant) {
        self.nanos.store(self.nanos(at), Ordering::Relaxed);
    }

    /// Holds no instant any more.
    pub(crate) fn clear(&self) {
        self.nanos.store(0, Ordering::Relaxed);
    }

    /// Keeps the later of what it holds and `at`, so writers racing from several tasks can only
    /// move it forward.
    pub(crate) fn advance_to(&self, at: Instant) {
        self.nanos.fetch_max(self.nanos(at), Ordering::Relaxed);
    }

    /// The raw stored word, which changes exactly when the instant does (for "has it moved since
    /// I last looked").
    pub(crate) fn stamp(&self) -> u64 {
        self.nanos.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each listed value comes back as itself, and the lists are complete: a match with no
    /// wildcard fails to compile when a variant is added and not listed.
    #[test]
    fn every_value_round_trips() {
        fn check<T: Packed + std::fmt::Debug>() {
            let cell = AtomicEnum::<T>::default();
            assert_eq!(cell.load(), T::ALL[0]);
            for v in T::ALL {
                cell.store(*v);
                assert_eq!(cell.load(), *v);
            }
        }
        check::<HealthState>();
        check::<BreakerState>();
        check::<Option<LivenessVeto>>();
        let listed = |s: HealthState| match s {
            HealthState::Pending
            | HealthState::Ready
            | HealthState::NotReady
            | HealthState::Failed
            | HealthState::Draining => true,
        };
        assert!(HealthState::ALL.iter().all(|s| listed(*s)));
        assert_eq!(HealthState::ALL.len(), 5);
        let listed = |s: BreakerState| match s {
            BreakerState::Closed | BreakerState::Open | BreakerState::HalfOpen => true,
        };
        assert!(BreakerState::ALL.iter().all(|s| listed(*s)));
        assert_eq!(BreakerState::ALL.len(), 3);
        let listed = |v: LivenessVeto| match v {
            LivenessVeto::Unreachable
            | LivenessVeto::Stale
            | LivenessVeto::WedgedQueue
            | LivenessVeto::WedgedPile
            | LivenessVeto::EngineSilent
            | LivenessVeto::Unresponsive => true,
        };
        assert!(Option::<LivenessVeto>::ALL
            .iter()
            .flatten()
            .all(|v| listed(*v)));
        assert_eq!(Option::<LivenessVeto>::ALL.len(), 7);
    }

    #[tokio::test(start_paused = true)]
    async fn instants_are_kept_and_only_move_forward() {
        let never = AtomicInstant::none();
        assert_eq!(never.load(), None);
        let start = Instant::now();
        let cell = AtomicInstant::now();
        assert_eq!(cell.load(), Some(start));
        tokio::time::advance(Duration::from_secs(2)).await;
        let later = Instant::now();
        cell.advance_to(later);
        cell.advance_to(start);
        assert_eq!(
            cell.load(),
            Some(later),
            "an earlier instant does not move it back"
        );
        cell.store(start);
        assert_eq!(cell.load(), Some(start), "a store sets it");
        never.store(start);
        assert_eq!(
            never.load(),
            Some(start),
            "stored at its own base: still an instant"
        );
    }
}
