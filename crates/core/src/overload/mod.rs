//! Whether a worker is too loaded to take more work, and what to do when every worker is.
//!
//! Every signal is a veto on one worker; the route stage skips vetoed workers, and one rule
//! (`when_all_vetoed`) decides what a request gets when no candidate is left without one.
//!
//! - Ceilings (`overload_verdict`): the engine's waiting queue (summed over ranks) or its mean KV
//!   usage at or above the worker's ceiling. KV usage is judged once per load report; the queue
//!   is projected to each request between reports (`QueueGate`). No hysteresis.
//! - Busy ranks (`worker_busy`): a rank is busy when any configured check holds (decode blocks,
//!   absolute or fractional prefill tokens); a worker is busy only when all its ranks are.
//! - At capacity: the worker itself answered 529/429 "at capacity"; vetoed briefly.
//! - The interactive reserve (`StartRoom`): a less urgent request keeps off a worker that could
//!   start no more than the reserve beyond it, and an interactive request goes where it starts
//!   at once when such a worker exists (`seeks_room`).
//! - Liveness (`crate::liveness`): unreachable or wedged.
//!
//! ## Layout
//!
//! - `gate` — the waiting ceiling judged per request between reports (`QueueGate`), hopefully
//!   for arrivals and warily for the gateway queue (`Projection`), and the engine's running
//!   window learned from its reports.
//! - `reserve` — room kept on each worker for the interactive tier (`StartRoom`): what a report
//!   says the worker could still start, whether a less urgent request leaves it alone, and
//!   whether an interactive one would start there at once.
//! - `size` — the KV a running request settles at on a worker, learnt from its reports
//!   (`RunningSize`), in which the reserve counts room.

use std::fmt;

use serde::Serialize;

use crate::load::LoadReport;

mod gate;
mod reserve;
mod size;
pub use gate::{learned_window, Projection, QueueGate};
pub use reserve::{reserve_in_force, seeks_room, StartRoom, RESERVE_HOLD};
pub use size::{RunningSize, SIZE_MEMORY};

/// A worker's overload ceilings; `None` turns that signal off.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Ceilings {
    /// Waiting requests (summed over ranks) at or above which the worker is overloaded; >= 1.
    pub waiting_requests: Option<u64>,
    /// Mean KV usage over ranks at or above which the worker is overloaded; in (0, 1].
    pub token_usage: Option<f64>,
}

/// Which ceiling a report reached, with the numbers, for logs and `/workers`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "signal", rename_all = "snake_case")]
pub enum OverloadCause {
    Waiting {
        waiting: u64,
        ceiling: u64,
    },
    TokenUsage {
        usage: f64,
        ceiling: f64,
    },
    /// Requests preempted since the last report (or, SGLang, retracted lately).
    Preempting {
        preempted: u64,
    },
}

impl fmt::Display for OverloadCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OverloadCause::Waiting { waiting, ceiling } => {
                write!(f, "{waiting} waiting requests >= {ceiling}")
            }
            OverloadCause::TokenUsage { usage, ceiling } => {
                write!(f, "KV usage {usage:.3} >= {ceiling}")
            }
            OverloadCause::Preempting { preempted } => {
                write!(f, "{preempted} requests preempted since its last report")
            }
        }
    }
}

/// The overload verdict for one report (`previous`: the worker's report before it, which a
/// preemption counter is compared with): inclusive comparisons, the queue first.
pub fn overload_verdict(
    report: &LoadReport,
    previous: Option<&LoadReport>,
    c: &Ceilings,
) -> Option<OverloadCause> {
    let waiting = report.waiting();
    if let Some(ceiling) = c.waiting_requests {
        if waiting >= ceiling {
            return Some(OverloadCause::Waiting { waiting, ceiling });
        }
    }
    let usage = report.mean_kv_usage();
    match c.token_usage {
        Some(ceiling) if usage >= ceiling => Some(OverloadCause::TokenUsage { usage, ceiling }),
        Some(_) => match report.preempted_since(previous) {
            0 => None,
            preempted => Some(OverloadCause::Preempting { preempted }),
        },
        None => None,
    }
}

/// The per-rank busy checks (all off by default); a check is on when set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct BusyThresholds {
    /// Busy when the rank's KV blocks in use exceed this fraction of its blocks.
    pub active_decode_blocks_threshold: Option<f64>,
    /// Busy when more prompt tokens than this wait for prefill on the rank.
    pub active_prefill_tokens_threshold: Option<u64>,
    /// Busy when prompt tokens waiting for prefill exceed this multiple of the rank's
    /// `max_num_batched_tokens`.
    pub active_prefill_tokens_threshold_frac: Option<f64>,
}

impl BusyThresholds {
    pub fn any(&self) -> bool {
        self.active_decode_blocks_threshold.is_some()
            || self.active_prefill_tokens_threshold.is_some()
            || self.active_prefill_tokens_threshold_frac.is_some()
    }
}

/// What the busy checks read for one rank.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RankActivity {
    /// Share of KV blocks in use, 0..=1.
    pub decode_blocks: f64,
    /// Prompt tokens waiting for prefill.
    pub prefill_tokens: u64,
    pub max_num_batched_tokens: Option<u64>,
}

/// Any configured check holds (strict comparisons, as Dynamo's).
pub fn rank_busy(r: &RankActivity, t: &BusyThresholds) -> bool {
    let decode = t
        .active_decode_blocks_threshold
        .is_some_and(|x| r.decode_blocks > x);
    let prefill = t
        .active_prefill_tokens_threshold
        .is_some_and(|x| r.prefill_tokens > x);
    let frac = match (
        t.active_prefill_tokens_threshold_frac,
        r.max_num_batched_tokens,
    ) {
        (Some(x), Some(max)) => r.prefill_tokens as f64 > x * max as f64,
        _ => false,
    };
    decode || prefill || frac
}

/// Busy only when every rank is, so a worker with a rank that can still admit work stays in.
pub fn worker_busy(ranks: &[RankActivity], t: &BusyThresholds) -> bool {
    t.any() && !ranks.is_empty() && ranks.iter().all(|r| rank_busy(r, t))
}

/// Why a candidate is vetoed, as the all-vetoed rule sorts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VetoClass {
    /// Full: over a ceiling, busy, or it said it is at capacity.
    Overload,
    /// Doubted: unreachable or wedged.
    Liveness,
    /// Kept for the interactive tier: it has room, but only within the interactive reserve
    /// (`StartRoom::keeps_off`), so a less urgent request goes elsewhere if it can.
    Reserve,
}

/// A worker that could take the request but for its veto (Ready, circuit not open).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Vetoed {
    pub class: VetoClass,
    /// Its waiting queue now: the last report's (0 without one), projected with this gateway's
    /// requests sent and started since (`QueueGate::projected_by`). Judged on the report alone,
    /// every request until the next report goes to the one worker that reported least, and a
    /// burst piles onto it; projected, each request steered raises its worker's queue by one,
    /// so the burst spreads by what each worker can absorb.
    pub waiting: u64,
    pub kv_usage: f64,
    /// Requests in flight through this gateway.
    pub in_flight: u64,
}

/// What a request gets when no candidate is free of vetoes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllVetoed {
    /// Route to this candidate anyway; `VetoClass` says which fallback it counts as.
    Steer(usize, VetoClass),
    /// Refuse at once (`--worker-overload-shed`): every candidate is full.
    Shed,
    /// No candidate at all, or mixed causes under shedding: 503 no_available_workers.
    Unavailable,
}

/// The one rule for a pool with no unvetoed candidate.
///
/// - A candidate kept only by the interactive reserve has room: the least loaded of those is
///   taken first, shedding or not. The reserve holds less urgent work back where the gateway
///   queue can hold it (it waits there before it is routed); with nowhere to wait, refusing work
///   the fleet has room for, or sending it to a full worker, would cost more than the reserve
///   keeps.
/// - Steering (the default) takes the least loaded candidate — lowest waiting queue as projected
///   now (`Vetoed::waiting`), then KV usage, then in-flight — preferring the full over the
///   doubted.
/// - With `shed`, a full worker is never the fallback: doubted ones are still steered to; a pool
///   of only full candidates is shed, unless some of the pool's workers are out for another
///   reason (`others_out`: unhealthy, circuit open), which is plain unavailability.
pub fn when_all_vetoed(candidates: &[Vetoed], shed: bool, others_out: bool) -> AllVetoed {
    let least = |class: VetoClass| {
        candidates
            .iter()
            .enumerate()
            .filter(|(_, c)| c.class == class)
            .min_by(|(_, a), (_, b)| {
                a.waiting
                    .cmp(&b.waiting)
                    .then(a.kv_usage.total_cmp(&b.kv_usage))
                    .then(a.in_flight.cmp(&b.in_flight))
            })
            .map(|(i, _)| AllVetoed::Steer(i, class))
    };
    if let Some(steer) = least(VetoClass::Reserve) {
        return steer;
    }
    if !shed {
        return least(VetoClass::Overload)
            .or_else(|| least(VetoClass::Liveness))
            .unwrap_or(AllVetoed::Unavailable);
    }
    if let Some(steer) = least(VetoClass::Liveness) {
        return steer;
    }
    if candidates.is_empty() || others_out {
        AllVetoed::Unavailable
    } else {
        AllVetoed::Shed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::RankLoad;

    pub(super) fn report(ranks: &[(u64, f64)]) -> LoadReport {
        LoadReport {
            ranks: ranks
                .iter()
                .enumerate()
                .map(|(i, &(waiting, kv_usage))| RankLoad {
                    rank: i as u32,
                    waiting,
                    kv_usage,
                    ..RankLoad::default()
                })
                .collect(),
            ..LoadReport::default()
        }
    }

    const DEFAULTS: Ceilings = Ceilings {
        waiting_requests: Some(8),
        token_usage: Some(0.8),
    };

    #[test]
    fn preempting_is_overload_under_the_kv_ceiling_only() {
        let rank = |preemptions: f64| RankLoad {
            preemptions: Some(preemptions),
            kv_usage: 0.5,
            ..RankLoad::default()
        };
        let at = |p: f64| LoadReport {
            ranks: vec![rank(p)],
            ..LoadReport::default()
        };
        assert_eq!(
            overload_verdict(&at(5.0), Some(&at(3.0)), &DEFAULTS),
            Some(OverloadCause::Preempting { preempted: 2 })
        );
        assert_eq!(overload_verdict(&at(5.0), Some(&at(5.0)), &DEFAULTS), None);
        let queue_only = Ceilings {
            token_usage: None,
            ..DEFAULTS
        };
        assert_eq!(
            overload_verdict(&at(5.0), Some(&at(3.0)), &queue_only),
            None
        );
    }

    #[test]
    fn ceilings_are_inclusive_and_read_the_sum_and_the_mean() {
        assert_eq!(
            overload_verdict(&report(&[(7, 0.79)]), None, &DEFAULTS),
            None
        );
        assert_eq!(
            overload_verdict(&report(&[(8, 0.0)]), None, &DEFAULTS),
            Some(OverloadCause::Waiting {
                waiting: 8,
                ceiling: 8
            })
        );
        assert_eq!(
            overload_verdict(&report(&[(4, 0.1), (4, 0.1)]), None, &DEFAULTS),
            Some(OverloadCause::Waiting {
                waiting: 8,
                ceiling: 8
            }),
            "waiting is summed over ranks"
        );
        assert_eq!(
            overload_verdict(&report(&[(0, 1.0), (0, 0.5)]), None, &DEFAULTS),
            None,
            "one saturated rank does not lift the mean (0.75) to 0.8"
        );
        assert!(matches!(
            overload_verdict(&report(&[(0, 0.8)]), None, &DEFAULTS),
            Some(OverloadCause::TokenUsage { .. })
        ));
    }

    #[test]
    fn a_signal_that_is_off_never_trips() {
        let off = Ceilings::default();
        assert_eq!(overload_verdict(&report(&[(1000, 1.0)]), None, &off), None);
        let queue_only = Ceilings {
            waiting_requests: Some(2),
            token_usage: None,
        };
        assert_eq!(
            overload_verdict(&report(&[(0, 1.0)]), None, &queue_only),
            None
        );
    }

    fn rank(decode: f64, prefill: u64) -> RankActivity {
        RankActivity {
            decode_blocks: decode,
            prefill_tokens: prefill,
            max_num_batched_tokens: Some(8192),
        }
    }

    #[test]
    fn a_worker_is_busy_only_when_every_rank_is() {
        let t = BusyThresholds {
            active_decode_blocks_threshold: Some(0.9),
            ..BusyThresholds::default()
        };
        assert!(!worker_busy(&[rank(0.95, 0), rank(0.5, 0)], &t));
        assert!(worker_busy(&[rank(0.95, 0), rank(0.91, 0)], &t));
        assert!(!worker_busy(&[rank(0.9, 0)], &t), "strictly greater");
        assert!(!worker_busy(&[], &t));
        assert!(
            !worker_busy(&[rank(1.0, 1 << 20)], &BusyThresholds::default()),
            "all off"
        );
    }

    #[test]
    fn busy_checks_are_ored_per_rank() {
        let t = BusyThresholds {
            active_decode_blocks_threshold: Some(0.9),
            active_prefill_tokens_threshold: Some(10_000),
            active_prefill_tokens_threshold_frac: Some(2.0),
        };
        assert!(rank_busy(&rank(0.95, 0), &t));
        assert!(rank_busy(&rank(0.1, 10_001), &t));
        let frac_only = BusyThresholds {
            active_prefill_tokens_threshold_frac: Some(1.5),
            ..BusyThresholds::default()
        };
        assert!(rank_busy(&rank(0.0, 12_289), &frac_only), "> 1.5 x 8192");
        assert!(!rank_busy(&rank(0.0, 12_288), &frac_only));
        let unknown_batch = RankActivity {
            max_num_batched_tokens: None,
            ..rank(0.0, 1 << 30)
        };
        assert!(
            !rank_busy(&unknown_batch, &frac_only),
            "no batch size: the check cannot hold"
        );
    }

    fn v(class: VetoClass, waiting: u64, kv_usage: f64, in_flight: u64) -> Vetoed {
        Vetoed {
            class,
            waiting,
            kv_usage,
            in_flight,
        }
    }

    use VetoClass::{Liveness, Overload, Reserve};

    #[test]
    fn steering_takes_the_truly_least_loaded_full_worker_first() {
        let c = [
            v(Overload, 9, 0.5, 1),
            v(Overload, 8, 0.9, 7),
            v(Overload, 8, 0.7, 9),
            v(Liveness, 0, 0.0, 0),
        ];
        assert_eq!(
            when_all_vetoed(&c, false, false),
            AllVetoed::Steer(2, Overload)
        );
        let ties = [v(Overload, 8, 0.7, 9), v(Overload, 8, 0.7, 3)];
        assert_eq!(
            when_all_vetoed(&ties, false, false),
            AllVetoed::Steer(1, Overload)
        );
        let doubted = [v(Liveness, 3, 0.0, 2), v(Liveness, 1, 0.0, 5)];
        assert_eq!(
            when_all_vetoed(&doubted, false, false),
            AllVetoed::Steer(1, Liveness)
        );
        assert_eq!(when_all_vetoed(&[], false, false), AllVetoed::Unavailable);
    }

    #[test]
    fn shedding_refuses_full_pools_but_still_steers_doubt() {
        let full = [v(Overload, 9, 0.5, 1), v(Overload, 8, 0.9, 7)];
        assert_eq!(when_all_vetoed(&full, true, false), AllVetoed::Shed);
        assert_eq!(
            when_all_vetoed(&full, true, true),
            AllVetoed::Unavailable,
            "mixed causes are not a shed"
        );
        let mixed = [v(Overload, 0, 0.0, 0), v(Liveness, 5, 0.9, 9)];
        assert_eq!(
            when_all_vetoed(&mixed, true, false),
            AllVetoed::Steer(1, Liveness),
            "a full worker is never the fallback while shedding"
        );
        assert_eq!(when_all_vetoed(&[], true, false), AllVetoed::Unavailable);
    }

    #[test]
    fn a_burst_steered_onto_a_full_fleet_spreads_as_the_projected_queues_grow() {
        // Three full workers that reported 19, 19 and 31 waiting; each request steered joins
        // its worker's projected queue, as the gateway's own pending count makes it.
        let mut fleet: Vec<Vetoed> = [19, 19, 31]
            .map(|waiting| Vetoed {
                class: VetoClass::Overload,
                waiting,
                kv_usage: 0.9,
                in_flight: 0,
            })
            .to_vec();
        let mut sent = [0u64; 3];
        for _ in 0..30 {
            let AllVetoed::Steer(i, VetoClass::Overload) = when_all_vetoed(&fleet, false, false)
            else {
                panic!("a full fleet is steered to");
            };
            sent[i] += 1;
            fleet[i].waiting += 1;
            fleet[i].in_flight += 1;
        }
        assert_eq!(
            sent,
            [14, 14, 2],
            "the two shorter queues first, then all three alike"
        );
        let queues: Vec<u64> = fleet.iter().map(|c| c.waiting).collect();
        assert_eq!(queues, [33, 33, 33]);
    }

    #[test]
    fn a_worker_kept_only_by_the_reserve_is_taken_before_any_full_or_doubted_one() {
        let c = [
            v(Overload, 0, 0.1, 0),
            v(Reserve, 0, 0.7, 4),
            v(Liveness, 0, 0.0, 0),
            v(Reserve, 0, 0.6, 9),
        ];
        for shed in [false, true] {
            assert_eq!(
                when_all_vetoed(&c, shed, true),
                AllVetoed::Steer(3, Reserve),
                "shedding: {shed}"
            );
        }
    }
}
