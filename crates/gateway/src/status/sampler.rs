//! The status page's numbers over time, read from the gateway's own metrics: every tick the
//! registry is encoded and parsed as Prometheus would scrape it, so a rate or a quantile on the
//! page is the one a Grafana panel over `/metrics` shows.
//!
//! Rates and quantiles are taken over the last `WINDOW` of readings, so a point is steady at a
//! few updates a second and still turns within seconds.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::registry::Registry;
use serde::Serialize;
use sluice_core::histogram;
use sluice_core::prom_text::{self, Exposition};
use tokio::time::Instant;

/// What rates and quantiles are taken over.
const WINDOW: Duration = Duration::from_secs(5);

/// Points kept for a page that opens: ten minutes at one a second.
pub(crate) const HISTORY: usize = 600;

/// The series a reading sums (their sample lines begin so).
const READ: [&str; 6] = [
    "sluice_requests_total{",
    "sluice_tenant_requests_total{",
    "sluice_slo_attained_total{",
    "sluice_slo_missed_total{",
    "sluice_request_ttft_seconds_bucket{",
    "sluice_worker_inter_chunk_seconds_bucket{",
];

/// The counters and histograms one reading takes from the exposition.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Reading {
    /// Requests admission let in.
    pub(crate) admitted: f64,
    /// The gateway's own refusals by error code (429 and 5xx it answered itself).
    pub(crate) refused: BTreeMap<String, f64>,
    /// Answers that completed, and those of them within their tier's objectives.
    pub(crate) completed: f64,
    pub(crate) within_slo: f64,
    /// Time to first token from arrival, and gaps between chunks, as `(le, cumulative)`.
    pub(crate) ttft: Vec<(f64, f64)>,
    pub(crate) itl: Vec<(f64, f64)>,
}

/// Sums a histogram family's buckets over every label set but `le`.
fn buckets(exposition: &Exposition, family: &str) -> Vec<(f64, f64)> {
    let name = format!("{family}_bucket");
    let mut by_bound: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
    for sample in exposition.named(&name) {
        let Some(le) = sample.label("le").and_then(|le| le.parse::<f64>().ok()) else {
            continue;
        };
        // Bounds are positive: their bit patterns sort as the numbers do.
        let entry = by_bound.entry(le.to_bits()).or_insert((le, 0.0));
        entry.1 += sample.value;
    }
    by_bound.into_values().collect()
}

fn sum(exposition: &Exposition, name: &str, keep: impl Fn(&prom_text::Sample) -> bool) -> f64 {
    exposition
        .named(name)
        .filter(|s| keep(s))
        .map(|s| s.value)
        .sum()
}

impl Reading {
    pub(crate) fn of(exposition: &Exposition) -> Self {
        let mut refused = BTreeMap::new();
        for sample in exposition.named("sluice_requests_total") {
            let status: u16 = sample
                .label("status")
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            match sample.label("code") {
                Some(code) if code != "none" && (status == 429 || status >= 500) => {
                    *refused.entry(code.to_string()).or_insert(0.0) += sample.value;
                }
                _ => {}
            }
        }
        let within_slo = sum(exposition, "sluice_slo_attained_total", |_| true);
        Self {
            admitted: sum(exposition, "sluice_tenant_requests_total", |s| {
                s.label("outcome") == Some("admitted")
            }),
            refused,
            completed: within_slo + sum(exposition, "sluice_slo_missed_total", |_| true),
            within_slo,
            ttft: buckets(exposition, "sluice_request_ttft_seconds"),
            itl: buckets(exposition, "sluice_worker_inter_chunk_seconds"),
        }
    }

    /// Reads the registry as a scrape would; only the lines of the series it sums are parsed
    /// (a fleet's per-worker histograms are most of the page).
    pub(crate) fn of_registry(registry: &Registry) -> Self {
        let mut text = String::new();
        if prometheus_client::encoding::text::encode(&mut text, registry).is_err() {
            return Self::default();
        }
        let read: String = text
            .lines()
            .filter(|line| READ.iter().any(|series| line.starts_with(series)))
            .flat_map(|line| [line, "\n"])
            .collect();
        prom_text::parse(&read)
            .map(|e| Self::of(&e))
            .unwrap_or_default()
    }
}

/// One point of the page's charts.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct Point {
    /// Unix seconds.
    pub(crate) t: f64,
    /// Per second, over the window.
    pub(crate) admitted: f64,
    pub(crate) refused: BTreeMap<String, f64>,
    pub(crate) completed: f64,
    pub(crate) within_slo: f64,
    /// Seconds; `None` with nothing observed in the window.
    pub(crate) ttft_p50: Option<f64>,
    pub(crate) ttft_p95: Option<f64>,
    pub(crate) itl_p50: Option<f64>,
    pub(crate) itl_p95: Option<f64>,
}

fn per_second(later: f64, earlier: f64, secs: f64) -> f64 {
    // A counter that went back (a removed series) reads as no traffic rather than negative.
    ((later - earlier) / secs).max(0.0)
}

/// The point from `earlier` to `later`, `secs` apart.
pub(crate) fn point(t: f64, later: &Reading, earlier: &Reading, secs: f64) -> Point {
    let secs = secs.max(1e-3);
    let ttft = histogram::since(&later.ttft, &earlier.ttft);
    let itl = histogram::since(&later.itl, &earlier.itl);
    Point {
        t,
        admitted: per_second(later.admitted, earlier.admitted, secs),
        refused: later
            .refused
            .iter()
            .map(|(code, n)| {
                let before = earlier.refused.get(code).copied().unwrap_or(0.0);
                (code.clone(), per_second(*n, before, secs))
            })
            .filter(|(_, rate)| *rate > 0.0)
            .collect(),
        completed: per_second(later.completed, earlier.completed, secs),
        within_slo: per_second(later.within_slo, earlier.within_slo, secs),
        ttft_p50: histogram::quantile(0.5, &ttft),
        ttft_p95: histogram::quantile(0.95, &ttft),
        itl_p50: histogram::quantile(0.5, &itl),
        itl_p95: histogram::quantile(0.95, &itl),
    }
}

/// The readings of the last window, and the points made from them.
#[derive(Debug, Default)]
pub(crate) struct Series {
    readings: VecDeque<(Instant, Reading)>,
    pub(crate) points: VecDeque<Point>,
}

impl Series {
    /// Takes a reading made `at`; returns the new point.
    pub(crate) fn push(&mut self, at: Instant, reading: Reading) -> Point {
        while self
            .readings
            .get(1)
            .is_some_and(|(then, _)| at.saturating_duration_since(*then) >= WINDOW)
        {
            self.readings.pop_front();
        }
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let point = match self.readings.front() {
            Some((then, earlier)) => point(
                t,
                &reading,
                earlier,
                at.saturating_duration_since(*then).as_secs_f64(),
            ),
            None => Point {
                t,
                ..Point::default()
            },
        };
        self.readings.push_back((at, reading));
        if self.points.len() == HISTORY {
            self.points.pop_front();
        }
        self.points.push_back(point.clone());
        point
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = r#"# TYPE sluice_requests counter
sluice_requests_total{route="/v1/chat/completions",status="200",code="none"} 90
sluice_requests_total{route="/v1/chat/completions",status="503",code="queue_full"} 6
sluice_requests_total{route="/v1/completions",status="503",code="queue_full"} 2
sluice_requests_total{route="/v1/chat/completions",status="400",code="invalid_request"} 3
sluice_requests_total{route="/v1/chat/completions",status="502",code="none"} 1
# TYPE sluice_tenant_requests counter
sluice_tenant_requests_total{tenant="default",tier="agent",outcome="admitted"} 92
sluice_tenant_requests_total{tenant="default",tier="agent",outcome="rejected"} 8
# TYPE sluice_slo_attained counter
sluice_slo_attained_total{tier="interactive"} 70
sluice_slo_attained_total{tier="agent"} 10
# TYPE sluice_slo_missed counter
sluice_slo_missed_total{tier="agent"} 5
# TYPE sluice_request_ttft_seconds histogram
sluice_request_ttft_seconds_bucket{tier="interactive",le="0.1"} 40
sluice_request_ttft_seconds_bucket{tier="interactive",le="1.0"} 80
sluice_request_ttft_seconds_bucket{tier="interactive",le="+Inf"} 80
sluice_request_ttft_seconds_bucket{tier="agent",le="0.1"} 0
sluice_request_ttft_seconds_bucket{tier="agent",le="1.0"} 5
sluice_request_ttft_seconds_bucket{tier="agent",le="+Inf"} 5
"#;

    #[test]
    fn a_reading_sums_over_labels_and_counts_only_the_gateways_refusals() {
        let r = Reading::of(&prom_text::parse(PAGE).unwrap());
        assert_eq!(r.admitted, 92.0);
        assert_eq!(
            r.refused,
            BTreeMap::from([("queue_full".to_string(), 8.0)]),
            "a client's bad request and a worker's relayed 502 are not shedding"
        );
        assert_eq!((r.completed, r.within_slo), (85.0, 80.0));
        assert_eq!(
            r.ttft,
            vec![(0.1, 40.0), (1.0, 85.0), (f64::INFINITY, 85.0)]
        );
        assert!(r.itl.is_empty());
    }

    #[test]
    fn a_point_is_rates_and_quantiles_between_two_readings() {
        let earlier = Reading {
            admitted: 10.0,
            refused: BTreeMap::from([("queue_full".into(), 4.0), ("gone".into(), 1.0)]),
            ttft: vec![(0.1, 10.0), (1.0, 10.0), (f64::INFINITY, 10.0)],
            ..Reading::default()
        };
        let later = Reading {
            admitted: 30.0,
            refused: BTreeMap::from([("queue_full".into(), 8.0), ("gone".into(), 1.0)]),
            completed: 8.0,
            within_slo: 6.0,
            ttft: vec![(0.1, 10.0), (1.0, 20.0), (f64::INFINITY, 20.0)],
            ..Reading::default()
        };
        let p = point(100.0, &later, &earlier, 2.0);
        assert_eq!(p.admitted, 10.0);
        assert_eq!(p.refused, BTreeMap::from([("queue_full".into(), 2.0)]));
        assert_eq!((p.completed, p.within_slo), (4.0, 3.0));
        let p50 = p.ttft_p50.unwrap();
        assert!(
            (p50 - 0.55).abs() < 1e-9,
            "only the window's answers: {p50}"
        );
        assert_eq!(p.itl_p50, None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_series_keeps_a_window_of_readings_and_a_bounded_history() {
        let mut series = Series::default();
        let at = |n: f64| Reading {
            admitted: n,
            ..Reading::default()
        };
        let start = Instant::now();
        assert_eq!(
            series.push(start, at(0.0)).admitted,
            0.0,
            "nothing to compare"
        );
        for s in 1..=20u64 {
            let p = series.push(start + Duration::from_secs(s), at(s as f64 * 3.0));
            assert_eq!(p.admitted, 3.0, "at {s} s");
        }
        assert!(series.readings.len() <= 6, "{}", series.readings.len());
        for s in 21..=(HISTORY as u64 + 30) {
            series.push(start + Duration::from_secs(s), at(0.0));
        }
        assert_eq!(series.points.len(), HISTORY);
    }
}
