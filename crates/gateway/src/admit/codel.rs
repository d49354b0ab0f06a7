//! CoDel on each tier of the gateway queue: the controller of each tier
//! (`sluice_core::adaptive::Codel`) judges the tier's head — its oldest waiter — whenever the
//! dispatcher looks, and the heads it drops are handed back to be refused (`codel_drop`).

use parking_lot::Mutex;
use serde::Serialize;
use sluice_core::adaptive::{Codel, CodelConfig, HeadVerdict};
use sluice_core::admission::{FairQueue, Tier, Waiter};
use tokio::time::Instant;

/// The tiers' controllers.
#[derive(Debug)]
pub(super) struct TierCodels {
    tiers: Mutex<[Codel; 3]>,
}

/// A tier's CoDel as `/admission` shows it.
#[derive(Debug, Serialize)]
pub(super) struct CodelView {
    target_ms: u64,
    interval_ms: u64,
    /// The head's wait has stood at or above target since it was last under: a whole interval
    /// of it starts dropping.
    above_target: bool,
    /// Cutting a standing queue now.
    dropping: bool,
    /// Heads dropped in the current (or last) dropping state.
    count: u32,
}

impl TierCodels {
    pub(super) fn new(configs: [CodelConfig; 3], now: Instant) -> Self {
        Self {
            tiers: Mutex::new(configs.map(|c| Codel::new(c, now))),
        }
    }

    /// Judges each tier's head at `now`, taking out of `queue` every head its tier's CoDel
    /// drops (`arrived` reads when a waiter came). Returns the dropped, and when to look again
    /// if nothing else happens.
    pub(super) fn cut<T>(
        &self,
        queue: &mut FairQueue<T>,
        arrived: impl Fn(&T) -> Instant,
        now: Instant,
    ) -> (Vec<Waiter<T>>, Option<Instant>) {
        let mut tiers = self.tiers.lock();
        let mut dropped = Vec::new();
        let mut next_look: Option<Instant> = None;
        for tier in Tier::ALL {
            let codel = &mut tiers[tier.index()];
            let head_since = loop {
                let Some((ticket, head)) = queue.oldest(tier) else {
                    codel.empty(now);
                    break None;
                };
                let since = arrived(&head.item);
                let sojourn = now.saturating_duration_since(since);
                match codel.judge(sojourn, now) {
                    HeadVerdict::Keep => break Some(since),
                    HeadVerdict::Drop => {
                        if let Some(waiter) = queue.remove(ticket) {
                            dropped.push(waiter);
                        }
                    }
                }
            };
            if let Some(at) = codel.next_look(head_since, now) {
                next_look = Some(next_look.map_or(at, |n| n.min(at)));
            }
        }
        (dropped, next_look)
    }

    /// Whether `tier`'s queue is being cut now.
    pub(super) fn dropping(&self, tier: Tier) -> bool {
        self.tiers.lock()[tier.index()].dropping()
    }

    /// Whether an arrival of `tier` expected to wait `expected` may join at `now`
    /// (`Codel::admits`).
    pub(super) fn admits(
        &self,
        tier: Tier,
        expected: Option<std::time::Duration>,
        now: Instant,
    ) -> bool {
        self.tiers.lock()[tier.index()].admits(expected, now)
    }

    pub(super) fn view(&self, tier: Tier) -> CodelView {
        let tiers = self.tiers.lock();
        let codel = &tiers[tier.index()];
        let config = codel.config();
        CodelView {
            target_ms: config.target.as_millis() as u64,
            interval_ms: config.interval.as_millis() as u64,
            above_target: codel.above_target(),
            dropping: codel.dropping(),
            count: codel.count(),
        }
    }
}
