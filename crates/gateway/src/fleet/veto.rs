//! A worker's vetoes: the reasons, other than health and its circuit, it should get no new
//! request right now. Each has one writer (the load monitor for the overload and busy verdicts,
//! the forward stage for at-capacity answers, the liveness checker for liveness); the route stage
//! reads them all lock-free on every selection.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use serde::Serialize;
use sluice_core::liveness::LivenessVeto;
use sluice_core::load::LoadReport;
use sluice_core::overload::{OverloadCause, VetoClass};
use tokio::time::Instant;

/// The last load report of a worker and what was concluded from it.
#[derive(Debug, Clone, Serialize)]
pub struct EngineLoad {
    #[serde(flatten)]
    pub report: LoadReport,
    /// Where it came from: `/metrics`, `/v1/loads` or `/get_load`.
    pub source: &'static str,
    #[serde(skip)]
    pub at: Instant,
    /// The ceiling it reached, if any.
    pub overload: Option<OverloadCause>,
    /// Every rank busy by the busy thresholds.
    pub busy: bool,
    /// Since when its token counter has stood still with requests running.
    #[serde(skip)]
    pub silent_since: Option<Instant>,
}

fn encode(veto: Option<LivenessVeto>) -> u8 {
    match veto {
        None => 0,
        Some(LivenessVeto::Unreachable) => 1,
        Some(LivenessVeto::Stale) => 2,
        Some(LivenessVeto::WedgedQueue) => 3,
        Some(LivenessVeto::WedgedPile) => 4,
        Some(LivenessVeto::EngineSilent) => 5,
    }
}

fn decode(v: u8) -> Option<LivenessVeto> {
    match v {
        1 => Some(LivenessVeto::Unreachable),
        2 => Some(LivenessVeto::Stale),
        3 => Some(LivenessVeto::WedgedQueue),
        4 => Some(LivenessVeto::WedgedPile),
        5 => Some(LivenessVeto::EngineSilent),
        _ => None,
    }
}

/// One worker's vetoes.
#[derive(Debug)]
pub struct Vetoes {
    /// Instants are stored as nanoseconds after this.
    base: Instant,
    overloaded: AtomicBool,
    busy: AtomicBool,
    /// Until when its own at-capacity answer keeps it out; 0: not at all.
    at_capacity_until: AtomicU64,
    liveness: AtomicU8,
    load: ArcSwapOption<EngineLoad>,
}

impl Default for Vetoes {
    fn default() -> Self {
        Self {
            base: Instant::now(),
            overloaded: AtomicBool::new(false),
            busy: AtomicBool::new(false),
            at_capacity_until: AtomicU64::new(0),
            liveness: AtomicU8::new(0),
            load: ArcSwapOption::empty(),
        }
    }
}

impl Vetoes {
    /// The veto in force, if any: doubt (liveness) outranks fullness, so the all-vetoed rule
    /// takes a merely full worker first.
    pub fn class(&self) -> Option<VetoClass> {
        if self.liveness.load(Ordering::Acquire) != 0 {
            return Some(VetoClass::Liveness);
        }
        let full = self.overloaded.load(Ordering::Acquire)
            || self.busy.load(Ordering::Acquire)
            || self.at_capacity();
        full.then_some(VetoClass::Overload)
    }

    pub fn overloaded(&self) -> bool {
        self.overloaded.load(Ordering::Acquire)
    }

    pub fn busy(&self) -> bool {
        self.busy.load(Ordering::Acquire)
    }

    pub fn at_capacity(&self) -> bool {
        let until = self.at_capacity_until.load(Ordering::Acquire);
        until != 0 && self.nanos(Instant::now()) < until
    }

    pub fn liveness(&self) -> Option<LivenessVeto> {
        decode(self.liveness.load(Ordering::Acquire))
    }

    pub fn load(&self) -> Option<Arc<EngineLoad>> {
        self.load.load_full()
    }

    /// A report arrived (the load monitor); returns the previous verdicts (overloaded, busy).
    pub(crate) fn report(&self, load: EngineLoad) -> (bool, bool) {
        let overloaded = self
            .overloaded
            .swap(load.overload.is_some(), Ordering::AcqRel);
        let busy = self.busy.swap(load.busy, Ordering::AcqRel);
        self.load.store(Some(Arc::new(load)));
        (overloaded, busy)
    }

    /// No opinion: a poll without a report, a worker that left Ready, a replacement. Returns the
    /// previous verdicts (overloaded, busy).
    pub(crate) fn clear_load(&self) -> (bool, bool) {
        self.load.store(None);
        (
            self.overloaded.swap(false, Ordering::AcqRel),
            self.busy.swap(false, Ordering::AcqRel),
        )
    }

    /// The worker answered "at capacity": keep it out for `period`.
    pub(crate) fn at_capacity_for(&self, period: Duration) {
        let until = self.nanos(Instant::now() + period).max(1);
        self.at_capacity_until.store(until, Ordering::Release);
    }

    pub(crate) fn set_liveness(&self, veto: Option<LivenessVeto>) {
        self.liveness.store(encode(veto), Ordering::Release);
    }

    fn nanos(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(overload: Option<OverloadCause>, busy: bool) -> EngineLoad {
        EngineLoad {
            report: LoadReport::default(),
            source: "/metrics",
            at: Instant::now(),
            overload,
            busy,
            silent_since: None,
        }
    }

    #[test]
    fn verdicts_come_and_go_with_reports() {
        let v = Vetoes::default();
        assert_eq!(v.class(), None);
        let cause = OverloadCause::Waiting {
            waiting: 9,
            ceiling: 8,
        };
        assert_eq!(v.report(load(Some(cause), false)), (false, false));
        assert_eq!(v.class(), Some(VetoClass::Overload));
        assert_eq!(v.report(load(None, true)), (true, false));
        assert_eq!(v.class(), Some(VetoClass::Overload), "busy is full too");
        assert_eq!(v.clear_load(), (false, true));
        assert_eq!(v.class(), None);
        assert!(v.load().is_none());
    }

    #[test]
    fn liveness_outranks_fullness() {
        let v = Vetoes::default();
        v.report(load(None, true));
        v.set_liveness(Some(LivenessVeto::WedgedPile));
        assert_eq!(v.class(), Some(VetoClass::Liveness));
        assert_eq!(v.liveness(), Some(LivenessVeto::WedgedPile));
        v.set_liveness(None);
        assert_eq!(v.class(), Some(VetoClass::Overload));
    }

    #[tokio::test(start_paused = true)]
    async fn an_at_capacity_answer_keeps_the_worker_out_briefly() {
        let v = Vetoes::default();
        v.at_capacity_for(Duration::from_secs(1));
        assert_eq!(v.class(), Some(VetoClass::Overload));
        tokio::time::advance(Duration::from_millis(999)).await;
        assert!(v.at_capacity());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(!v.at_capacity());
        assert_eq!(v.class(), None);
    }
}
