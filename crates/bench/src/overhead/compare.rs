//! Ratios of CPU per request (and per event) between targets of one run, each marked like for
//! like or not. A proxy whose core is 59% busy wakes for a few requests at a time; one at 95%
//! takes many per wake-up, and its CPU per request falls as the core fills. A ratio between
//! the two compares two different regimes, so the report says so beside it instead of letting
//! the number stand alone.

use serde::Serialize;

use super::row::{Layout, Load, Row, SATURATED};

/// Utilisations further apart than this (a share of a core) are not the same regime.
const APART: f64 = 0.05;

/// The targets a ratio is taken against, the first present: the plain proxies.
pub const REFERENCES: [&str; 2] = ["nginx", "envoy"];

/// One target's CPU against the reference's, in the same window shape.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Ratio {
    pub target: String,
    pub reference: String,
    pub layout: Layout,
    pub load: Load,
    pub connections: usize,
    /// The target's CPU per request (per event for streams) over the reference's.
    pub ratio: f64,
    pub target_busy: Option<f64>,
    pub reference_busy: Option<f64>,
    /// Both cores saturated and within `APART` of each other (or one core shared by all).
    pub like_for_like: bool,
}

fn cpu(row: &Row) -> Option<f64> {
    match row.load {
        Load::Small => row.gateway_cpu_us_per_request,
        Load::Stream => row.gateway_cpu_us_per_sse_event,
    }
}

/// Whether two windows ran their gateways' cores in the same regime.
fn like_for_like(layout: Layout, a: Option<f64>, b: Option<f64>) -> bool {
    if layout == Layout::SharedCore {
        return true;
    }
    match (a, b) {
        (Some(a), Some(b)) => a >= SATURATED && b >= SATURATED && (a - b).abs() <= APART,
        _ => false,
    }
}

/// Every target's ratio against the first of `REFERENCES` the run measured.
pub fn ratios(rows: &[Row]) -> Vec<Ratio> {
    let Some(reference) = REFERENCES
        .iter()
        .find(|name| rows.iter().any(|r| r.target == **name))
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for base in rows.iter().filter(|r| r.target == *reference) {
        let Some(base_cpu) = cpu(base).filter(|c| *c > 0.0) else {
            continue;
        };
        let same_shape = |r: &&Row| {
            r.target != base.target
                && r.layout == base.layout
                && r.load == base.load
                && r.connections == base.connections
        };
        for row in rows.iter().filter(same_shape) {
            let Some(row_cpu) = cpu(row) else { continue };
            out.push(Ratio {
                target: row.target.clone(),
                reference: base.target.clone(),
                layout: row.layout,
                load: row.load,
                connections: row.connections,
                ratio: row_cpu / base_cpu,
                target_busy: row.gateway_core_busy,
                reference_busy: base.gateway_core_busy,
                like_for_like: like_for_like(
                    row.layout,
                    row.gateway_core_busy,
                    base.gateway_core_busy,
                ),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(target: &str, layout: Layout, cpu: f64, busy: f64) -> Row {
        Row {
            target: target.into(),
            layout,
            load: Load::Small,
            connections: 64,
            completed: 1000,
            failed: 0,
            reconnects: 0,
            requests_per_sec: 1000.0,
            sse_events_per_sec: 0.0,
            p50_us: 0.0,
            p99_us: 0.0,
            added_p50_us: None,
            added_p99_us: None,
            gateway_cpu_secs: None,
            gateway_cpu_us_per_request: Some(cpu),
            gateway_cpu_us_per_sse_event: None,
            gateway_core_busy: Some(busy),
            load_core_busy: Some(0.9),
        }
    }

    #[test]
    fn a_ratio_at_unequal_utilisation_is_marked_not_like_for_like() {
        let rows = [
            row("nginx", Layout::OwnCore, 19.1, 0.59),
            row("sluice", Layout::OwnCore, 27.3, 0.95),
            row("envoy", Layout::OwnCore, 57.8, 1.0),
            row("nginx", Layout::SharedCore, 12.0, 1.0),
            row("sluice", Layout::SharedCore, 35.0, 1.0),
        ];
        let got = ratios(&rows);
        let seen: Vec<(&str, Layout, String, bool)> = got
            .iter()
            .map(|r| {
                (
                    r.target.as_str(),
                    r.layout,
                    format!("{:.2}", r.ratio),
                    r.like_for_like,
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                ("sluice", Layout::OwnCore, "1.43".to_string(), false),
                ("envoy", Layout::OwnCore, "3.03".to_string(), false),
                ("sluice", Layout::SharedCore, "2.92".to_string(), true),
            ]
        );
        assert!(got.iter().all(|r| r.reference == "nginx"));
    }

    #[test]
    fn both_cores_full_and_close_are_like_for_like_and_without_a_reference_there_is_none() {
        assert!(like_for_like(Layout::OwnCore, Some(0.97), Some(0.99)));
        assert!(!like_for_like(Layout::OwnCore, Some(0.91), Some(0.99)));
        assert!(!like_for_like(Layout::OwnCore, None, Some(0.99)));
        let only = [row("sluice", Layout::OwnCore, 24.0, 0.95)];
        assert!(ratios(&only).is_empty());
        let envoy = [
            row("envoy", Layout::OwnCore, 45.0, 0.99),
            row("sluice", Layout::OwnCore, 24.0, 0.97),
        ];
        let got = ratios(&envoy);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].reference, "envoy");
        assert!(got[0].like_for_like);
    }
}
