//! Answers judged against their tier's objectives (`--slo-ttft-ms-by-tier`,
//! `--slo-tpot-ms-by-tier`), and the time to first token the client saw, by tier.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use sluice_core::admission::Tier;
use sluice_core::slo::{Served, Slos};

/// Finer than the duration buckets where objectives usually sit (0.1 s to 10 s), so a quantile
/// read from them lands near the truth.
const TTFT_BUCKETS: [f64; 20] = [
    0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 20.0,
    30.0, 60.0, 120.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TierLabel {
    pub(crate) tier: &'static str,
}

/// The SLO families' series, one per tier, resolved at registration so the request path never
/// looks a label set up; and the objectives they judge by.
#[derive(Debug)]
pub(crate) struct SloMetrics {
    pub(crate) slos: Slos,
    attained: [Counter; 3],
    missed: [Counter; 3],
    ttft: [Histogram; 3],
}

fn ttft_histogram() -> Histogram {
    Histogram::new(TTFT_BUCKETS)
}

impl SloMetrics {
    /// The families, every tier's series at zero from startup.
    pub(crate) fn register(registry: &mut Registry, slos: Slos) -> Self {
        let attained = Family::<TierLabel, Counter>::default();
        let missed = Family::<TierLabel, Counter>::default();
        let ttft =
            Family::<TierLabel, Histogram>::new_with_constructor(ttft_histogram as fn() -> _);
        registry.register(
            "slo_attained",
            "Answers that completed within every objective of their tier (--slo-ttft-ms-by-tier, --slo-tpot-ms-by-tier)",
            attained.clone(),
        );
        registry.register(
            "slo_missed",
            "Answers that completed outside an objective of their tier",
            missed.clone(),
        );
        registry.register(
            "request_ttft_seconds",
            "Time from a request's arrival to the first byte of a worker's answer relayed to its client, by tier",
            ttft.clone(),
        );
        let label = |tier: Tier| TierLabel { tier: tier.name() };
        Self {
            slos,
            attained: Tier::ALL.map(|t| attained.get_or_create(&label(t)).clone()),
            missed: Tier::ALL.map(|t| missed.get_or_create(&label(t)).clone()),
            ttft: Tier::ALL.map(|t| ttft.get_or_create(&label(t)).clone()),
        }
    }

    /// A successful answer's first byte went to its client `ttft` after arrival.
    pub(crate) fn first_byte(&self, tier: Tier, ttft: std::time::Duration) {
        self.ttft[tier.index()].observe(ttft.as_secs_f64());
    }

    /// A successful answer completed: counted against its tier's objectives.
    pub(crate) fn completed(&self, tier: Tier, served: &Served) {
        let counters = if served.within(&self.slos.of(tier)) {
            &self.attained
        } else {
            &self.missed
        };
        counters[tier.index()].inc();
    }
}
