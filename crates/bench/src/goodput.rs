//! Goodput accounting: of the requests a run offered, how many completed within every objective
//! of their tier, per second — so refusing or dropping work can never pass for serving it.
//!
//! Every time is measured from when a request was *due* (the open-loop schedule), not from when
//! it was sent, so a load generator that falls behind shows up as latency instead of hiding it.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::stats::percentile;

/// A tier's service-level objectives; a request meets them when it completed and every one set
/// holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Slo {
    /// Time to first token.
    pub ttft: Option<Duration>,
    /// Time per output token after the first.
    pub tpot: Option<Duration>,
    /// End to end (for batch work).
    pub deadline: Option<Duration>,
}

impl Slo {
    /// The gateway's objectives for `tier` (`--slo-ttft-ms-by-tier`, `--slo-tpot-ms-by-tier`
    /// at their defaults), so a run is judged as the gateway and its status page judge.
    pub fn gateways(tier: sluice_core::admission::Tier) -> Self {
        let slo = sluice_core::slo::Slos::default().of(tier);
        Self {
            ttft: slo.ttft,
            tpot: slo.tpot,
            deadline: None,
        }
    }
}

/// A class of requests — a priority tier, or a tenant — its share of the requests and its
/// objectives.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Tier {
    pub name: String,
    pub share: f64,
    /// The tenant its requests name in SMG's tenant header (`x-smg-tenant-id`, which sluice
    /// takes with `--trust-tenant-header`), when the class is one tenant's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    pub slo: Slo,
}

/// What happened to one request, as the client saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// When it was due, from the start of the run.
    pub due: Duration,
    pub tier: usize,
    /// The final status (after any client retries); 0 when no answer came at all.
    pub status: u16,
    /// The error code of a refusal (`X-Sluice-Error-Code`, else the body's `error.code`).
    pub code: Option<String>,
    /// The answer ended normally (`[DONE]`, or a whole body).
    pub completed: bool,
    /// From due to the first token.
    pub ttft: Option<Duration>,
    /// From due to the end of the answer (or of the last attempt).
    pub e2e: Duration,
    pub output_tokens: u32,
    /// 1 plus the client's retries.
    pub attempts: u32,
    /// From due to the first refusal, when the first attempt was refused.
    pub rejected_after: Option<Duration>,
    /// How late the client sent it (from due): on a loaded machine the load generator's own
    /// delay, part of what the client saw but not of what the gateway took.
    pub sent_late: Duration,
}

impl Outcome {
    /// Time per output token after the first.
    pub fn tpot(&self) -> Option<Duration> {
        let ttft = self.ttft?;
        (self.output_tokens > 1).then(|| (self.e2e.saturating_sub(ttft)) / (self.output_tokens - 1))
    }

    /// What ended a request that did not complete: its refusal's code (the gateway's, or the
    /// client's own such as `idle_timeout`), else `status_<n>`, `no_answer` when nothing came
    /// back, `cut` for an answer that began and ended early.
    pub fn failure_code(&self) -> String {
        match (&self.code, self.status) {
            (Some(code), _) => code.clone(),
            (None, 0) => "no_answer".to_string(),
            (None, 200) => "cut".to_string(),
            (None, status) => format!("status_{status}"),
        }
    }

    fn admitted(&self) -> bool {
        self.completed && self.status == 200
    }

    /// Completed, and within every objective of `slo`.
    pub fn meets(&self, slo: &Slo) -> bool {
        let within = |limit: Option<Duration>, value: Option<Duration>| match (limit, value) {
            (None, _) => true,
            (Some(limit), Some(value)) => value <= limit,
            (Some(_), None) => false,
        };
        self.admitted()
            && within(slo.ttft, self.ttft)
            && (self.output_tokens <= 1 || within(slo.tpot, self.tpot()))
            && within(slo.deadline, Some(self.e2e))
    }
}

/// One tier's share of the result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TierReport {
    pub name: String,
    pub requests: u64,
    pub completed: u64,
    pub met_slo: u64,
    /// Met / requests.
    pub attainment: f64,
    /// Time to first token of its completed requests, p95, in seconds.
    pub ttft_p95: f64,
    /// Its requests whose final answer was a refusal, by code (as `Report::rejections`).
    pub rejections: BTreeMap<String, u64>,
}

/// A run's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub requests: u64,
    pub window_secs: f64,
    pub offered_rps: f64,
    /// Completed requests per second that met every objective of their tier.
    pub goodput_rps: f64,
    pub throughput_rps: f64,
    pub tiers: Vec<TierReport>,
    /// Of admitted (completed) requests, in seconds.
    pub ttft_p50: f64,
    pub ttft_p99: f64,
    pub tpot_p50: f64,
    pub tpot_p99: f64,
    /// Requests whose final answer was a refusal, by code (`status_<n>` without one; `no_answer`
    /// when nothing came back).
    pub rejections: BTreeMap<String, u64>,
    pub rejection_rate: f64,
    /// Seconds from due to the first refusal, p99 over refused first attempts.
    pub time_to_reject_p99: f64,
    /// The same from when the client sent the request (the load generator's delay left out).
    pub time_to_reject_sent_p99: f64,
    /// Attempts per request (1.0: no client retried).
    pub retry_amplification: f64,
    /// Share of prompt tokens in blocks an earlier request of the run already began with
    /// (`prompts::sharing`): the ceiling of any prefix cache's hit rate on this load.
    pub prefix_sharing: f64,
}

/// Sums up `outcomes` of a run that offered them over `window`.
pub fn summarize(outcomes: &[Outcome], tiers: &[Tier], window: Duration) -> Report {
    let secs = window.as_secs_f64().max(f64::MIN_POSITIVE);
    let requests = outcomes.len() as u64;
    let (mut met, mut completed, mut attempts) = (0u64, 0u64, 0u64);
    let (mut ttfts, mut tpots, mut rejects) = (Vec::new(), Vec::new(), Vec::new());
    let mut rejects_sent = Vec::new();
    let mut rejections: BTreeMap<String, u64> = BTreeMap::new();
    for o in outcomes {
        attempts += u64::from(o.attempts.max(1));
        if let Some(r) = o.rejected_after {
            rejects.push(r.as_secs_f64());
            rejects_sent.push(r.saturating_sub(o.sent_late).as_secs_f64());
        }
        met += u64::from(tiers.get(o.tier).is_some_and(|t| o.meets(&t.slo)));
        if o.admitted() {
            completed += 1;
            ttfts.extend(o.ttft.map(|d| d.as_secs_f64()));
            tpots.extend(o.tpot().map(|d| d.as_secs_f64()));
        } else if o.status != 200 {
            *rejections.entry(o.failure_code()).or_default() += 1;
        }
    }
    Report {
        requests,
        window_secs: secs,
        offered_rps: requests as f64 / secs,
        goodput_rps: met as f64 / secs,
        throughput_rps: completed as f64 / secs,
        tiers: tiers
            .iter()
            .enumerate()
            .map(|(i, tier)| tier_report(tier, outcomes.iter().filter(|o| o.tier == i)))
            .collect(),
        ttft_p50: percentile(&ttfts, 0.5),
        ttft_p99: percentile(&ttfts, 0.99),
        tpot_p50: percentile(&tpots, 0.5),
        tpot_p99: percentile(&tpots, 0.99),
        rejection_rate: ratio(rejections.values().sum(), requests),
        rejections,
        time_to_reject_p99: percentile(&rejects, 0.99),
        time_to_reject_sent_p99: percentile(&rejects_sent, 0.99),
        retry_amplification: if requests == 0 {
            1.0
        } else {
            attempts as f64 / requests as f64
        },
        prefix_sharing: 0.0,
    }
}

/// One tier's share of a run: its requests, what met its objectives, and why the rest did not.
fn tier_report<'a>(tier: &Tier, outcomes: impl Iterator<Item = &'a Outcome>) -> TierReport {
    let mut report = TierReport {
        name: tier.name.clone(),
        requests: 0,
        completed: 0,
        met_slo: 0,
        attainment: 0.0,
        ttft_p95: 0.0,
        rejections: BTreeMap::new(),
    };
    let mut ttfts = Vec::new();
    for o in outcomes {
        report.requests += 1;
        report.completed += u64::from(o.admitted());
        report.met_slo += u64::from(o.meets(&tier.slo));
        if o.admitted() {
            ttfts.extend(o.ttft.map(|d| d.as_secs_f64()));
        } else if o.status != 200 {
            *report.rejections.entry(o.failure_code()).or_default() += 1;
        }
    }
    report.attainment = ratio(report.met_slo, report.requests);
    report.ttft_p95 = percentile(&ttfts, 0.95);
    report
}

impl Report {
    /// Markdown: the headline figures, then one row per tier and per rejection code.
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "| offered req/s | goodput req/s | throughput req/s | TTFT p50/p99 (s) | TPOT p50/p99 (ms) | rejected | time to reject p99 (ms) | retry amplification |\n\
             | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n\
             | {:.2} | {:.2} | {:.2} | {:.3} / {:.3} | {:.1} / {:.1} | {:.1}% | {:.1} | {:.2} |",
            self.offered_rps,
            self.goodput_rps,
            self.throughput_rps,
            self.ttft_p50,
            self.ttft_p99,
            self.tpot_p50 * 1e3,
            self.tpot_p99 * 1e3,
            self.rejection_rate * 100.0,
            self.time_to_reject_p99 * 1e3,
            self.retry_amplification,
        );
        let _ = writeln!(
            out,
            "\nprompt tokens shared with an earlier request: {:.1}%",
            self.prefix_sharing * 100.0
        );
        let _ = writeln!(out, "\n| tier | requests | completed | within SLO | attainment |\n| --- | ---: | ---: | ---: | ---: |");
        for t in &self.tiers {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {:.1}% |",
                t.name,
                t.requests,
                t.completed,
                t.met_slo,
                t.attainment * 100.0
            );
        }
        if !self.rejections.is_empty() {
            let _ = writeln!(out, "\n| rejected with | requests |\n| --- | ---: |");
            for (code, n) in &self.rejections {
                let _ = writeln!(out, "| {code} | {n} |");
            }
        }
        out
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn tiers() -> Vec<Tier> {
        vec![
            Tier {
                name: "interactive".into(),
                share: 0.8,
                tenant: None,
                slo: Slo {
                    ttft: Some(ms(1000)),
                    tpot: Some(ms(100)),
                    deadline: None,
                },
            },
            Tier {
                name: "batch".into(),
                share: 0.2,
                tenant: None,
                slo: Slo {
                    deadline: Some(ms(60_000)),
                    ..Slo::default()
                },
            },
        ]
    }

    fn served(tier: usize, ttft: u64, e2e: u64, tokens: u32) -> Outcome {
        Outcome {
            due: Duration::ZERO,
            tier,
            status: 200,
            code: None,
            completed: true,
            ttft: Some(ms(ttft)),
            e2e: ms(e2e),
            output_tokens: tokens,
            attempts: 1,
            rejected_after: None,
            sent_late: Duration::ZERO,
        }
    }

    fn refused(code: Option<&str>, status: u16, after: u64) -> Outcome {
        Outcome {
            due: Duration::ZERO,
            tier: 0,
            status,
            code: code.map(String::from),
            completed: false,
            ttft: None,
            e2e: ms(after),
            output_tokens: 0,
            attempts: 1,
            rejected_after: Some(ms(after)),
            sent_late: Duration::ZERO,
        }
    }

    #[test]
    fn tpot_is_the_time_per_token_after_the_first() {
        assert_eq!(served(0, 200, 1200, 11).tpot(), Some(ms(100)));
        assert_eq!(served(0, 200, 200, 1).tpot(), None);
    }

    #[test]
    fn only_completed_requests_within_every_objective_are_goodput() {
        let retried = Outcome {
            attempts: 3,
            rejected_after: Some(ms(2)),
            sent_late: Duration::ZERO,
            ..served(0, 900, 1800, 10)
        };
        let cut = Outcome {
            completed: false,
            ..served(0, 100, 500, 5)
        };
        let outcomes = vec![
            served(0, 500, 1400, 10),     // met
            served(0, 1500, 2000, 10),    // TTFT missed
            served(0, 500, 2500, 10),     // TPOT missed (222 ms)
            retried,                      // met after two client retries
            cut,                          // a stream cut mid-way: not served
            served(1, 5000, 50_000, 100), // batch within its deadline
            served(1, 5000, 70_000, 100), // batch too late
            refused(Some("worker_overload_shed"), 503, 3),
            refused(None, 529, 1),
            refused(None, 0, 30_000),
        ];
        let r = summarize(&outcomes, &tiers(), Duration::from_secs(10));
        assert_eq!(r.requests, 10);
        assert_eq!(r.goodput_rps, 0.3, "3 met in 10 s");
        assert_eq!(r.throughput_rps, 0.6, "6 completed");
        assert_eq!(r.tiers[0].requests, 8);
        assert_eq!((r.tiers[0].completed, r.tiers[0].met_slo), (4, 2));
        assert_eq!(r.tiers[0].attainment, 0.25);
        assert_eq!((r.tiers[1].requests, r.tiers[1].met_slo), (2, 1));
        assert_eq!(
            (r.tiers[0].ttft_p95, r.tiers[1].ttft_p95),
            (1.5, 5.0),
            "each tier's own completed requests"
        );
        assert_eq!(
            r.rejections,
            BTreeMap::from([
                ("no_answer".to_string(), 1),
                ("status_529".to_string(), 1),
                ("worker_overload_shed".to_string(), 1),
            ])
        );
        assert_eq!(r.rejection_rate, 0.3);
        assert_eq!(r.time_to_reject_p99, 30.0);
        assert_eq!(r.retry_amplification, 1.2, "12 attempts for 10 requests");
        assert_eq!(r.ttft_p50, 0.9);
    }

    #[test]
    fn an_empty_run_reports_zeros() {
        let r = summarize(&[], &tiers(), Duration::from_secs(5));
        assert_eq!((r.requests, r.goodput_rps, r.rejection_rate), (0, 0.0, 0.0));
        assert_eq!(r.retry_amplification, 1.0);
    }
}
