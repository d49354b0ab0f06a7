//! The `predicted` policy in the scenarios: the configurations it is measured against (each
//! scenario's own with another policy), and its own error in a scenario, read from a sluice gateway's `/workers` at
//! the end of each point (each gateway starts fresh, so it covers that point alone): each
//! worker's mean absolute percentage error of its TTFT predictions (first tokens of 100 ms or
//! more) and of its TPOT predictions, pooled over the workers by how many each judged.

use std::fmt::Write;
use std::path::Path;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;

use super::{default_flags, quiet_sluice, wall_ms};
use crate::overhead::Template;

/// The policies `predicted` is measured against, each a gateway configured by `config` with one
/// policy: `{prefix}-least-load`, `{prefix}-power-of-two` and `{prefix}-predicted` (told the
/// tiers' time-per-token objectives in wall time; `config` must give their first-token ones,
/// as the queue's timers do). The default policy, cache_aware, is the scenario's `prefix`
/// configuration itself.
pub fn policy_configs(
    prefix: &str,
    time_scale: f64,
    config: impl Fn(&str, &[&str]) -> Template,
) -> Vec<Template> {
    let tpot = wall_ms(time_scale.max(1.0), |slo| slo.tpot);
    let predicted = ["--policy", "predicted", "--slo-tpot-ms-by-tier", &tpot];
    vec![
        config(&format!("{prefix}-least-load"), &["--policy", "least_load"]),
        config(
            &format!("{prefix}-power-of-two"),
            &["--policy", "power_of_two"],
        ),
        config(&format!("{prefix}-predicted"), &predicted),
    ]
}

/// `sluice` with each other policy `predicted` is measured against, and `predicted`.
pub fn default_policy_configs(exe: &Path, time_scale: f64) -> Vec<Template> {
    let defaults = default_flags(time_scale);
    policy_configs("sluice", time_scale, |name, flags| {
        let flags: Vec<&str> = defaults
            .iter()
            .map(String::as_str)
            .chain(flags.iter().copied())
            .collect();
        quiet_sluice(name, exe, &flags)
    })
}

/// A gateway's prediction error over one point.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PredictionError {
    /// Mean absolute percentage error of TTFT predictions, as a fraction.
    pub ttft: Option<f64>,
    pub ttft_judged: u64,
    pub tpot: Option<f64>,
    pub tpot_judged: u64,
}

impl PredictionError {
    /// Pooled from a `GET /workers` answer; `None` when it judged nothing (a gateway that is not
    /// sluice lists no latency).
    pub fn of_workers(view: &serde_json::Value) -> Option<Self> {
        let workers = view["workers"].as_array()?;
        let pooled = |error: &str, judged: &str| {
            let (sum, n) = workers.iter().fold((0.0, 0u64), |(sum, n), w| {
                let latency = &w["latency"];
                match (latency[error].as_f64(), latency[judged].as_u64()) {
                    (Some(e), Some(k)) if k > 0 => (sum + e * k as f64, n + k),
                    _ => (sum, n),
                }
            });
            ((n > 0).then(|| sum / n as f64), n)
        };
        let (ttft, ttft_judged) = pooled("ttft_error", "ttft_judged");
        let (tpot, tpot_judged) = pooled("tpot_error", "tpot_judged");
        (ttft_judged + tpot_judged > 0).then_some(Self {
            ttft,
            ttft_judged,
            tpot,
            tpot_judged,
        })
    }

    /// Read from the gateway at `url`; `None` when it has no such view or judged nothing.
    pub async fn read(url: &str) -> Option<Self> {
        let http = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let request = hyper::Request::get(format!("{url}/workers"))
            .body(Full::new(Bytes::new()))
            .ok()?;
        let response = http.request(request).await.ok()?;
        if !response.status().is_success() {
            return None;
        }
        let body = response.into_body().collect().await.ok()?.to_bytes();
        Self::of_workers(&serde_json::from_slice(&body).ok()?)
    }

    /// `TTFT 12.3% (340) / TPOT 8.1% (330)`.
    pub fn cell(&self) -> String {
        let one = |error: Option<f64>, n: u64| {
            error.map_or("–".to_string(), |e| format!("{:.1}% ({n})", 100.0 * e))
        };
        format!(
            "TTFT {} / TPOT {}",
            one(self.ttft, self.ttft_judged),
            one(self.tpot, self.tpot_judged)
        )
    }
}

/// The report's foot: each configuration's prediction error at each load, where one was read.
pub fn foot<'a>(rows: impl Iterator<Item = (&'a str, f64, Option<&'a PredictionError>)>) -> String {
    let mut out = String::new();
    for (config, load, error) in rows {
        if let Some(error) = error {
            if out.is_empty() {
                out.push_str(
                    "\nprediction error (mean absolute percentage error; TTFT over first tokens \
                     >= 100 ms wall, judged count in brackets)\n\n",
                );
            }
            let _ = writeln!(out, "- {config} at {load:.1}x: {}", error.cell());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_pooled_over_workers_by_what_each_judged() {
        let view = serde_json::json!({"workers": [
            {"latency": {"ttft_error": 0.1, "ttft_judged": 30, "tpot_error": 0.2, "tpot_judged": 10}},
            {"latency": {"ttft_error": 0.3, "ttft_judged": 10, "tpot_error": null, "tpot_judged": 0}},
            {"id": "not sluice"}
        ]});
        let e = PredictionError::of_workers(&view).unwrap();
        assert!((e.ttft.unwrap() - 0.15).abs() < 1e-9, "{e:?}");
        assert_eq!((e.ttft_judged, e.tpot_judged), (40, 10));
        assert!((e.tpot.unwrap() - 0.2).abs() < 1e-9);
        assert!(e.cell().starts_with("TTFT 15.0% (40) / TPOT 20.0% (10)"));
        let none = serde_json::json!({"workers": [{"id": "smg"}]});
        assert_eq!(PredictionError::of_workers(&none), None);
    }
}
