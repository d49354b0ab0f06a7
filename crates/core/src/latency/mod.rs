//! What a worker's answer to a request will take, predicted from the worker's own answers: the
//! time to first token and the time per output token, each learned online per worker, with the
//! error of each prediction tracked against what came.
//!
//! The model is the engines' own arithmetic, with the constants measured rather than assumed:
//! - **TTFT** = the prefill work ahead of the request and its own uncached prompt, plus one step
//!   of the batch it joins. Prefill work is tokens and their causal attention (a prompt of n
//!   tokens attends to about n²/2 pairs): its seconds are fitted as `a * tokens + b * pairs`
//!   (`prefill::PrefillFit`), since a 128k-token prompt takes far longer than 128 prompts of 1k. vLLM and SGLang schedule waiting prompts
//!   first come first served under a token budget per step (vllm/v1/core/sched/scheduler.py,
//!   SGLang's `PrefillAdder`), so the tokens queued ahead are what stands between a request and its
//!   first token; a prompt's cached prefix is not computed again. The prefix a policy claims
//!   cached is taken at the credit its worker's engine gives such claims (`claims`).
//! - **TPOT** = one decode step with the batch it joins, a step costing a fixed part (the weights
//!   read once) and a part per running sequence (their KV read): `base + per_seq * batch`, fitted
//!   by exponentially weighted least squares over the worker's (batch, TPOT) samples.
//!
//! The prefill rate is learned from each first token: the work the request waited for (ahead and
//! its own) over its TTFT less the predicted step, an exponential average. It is the same
//! estimate the liveness checker's prefill allowance needs, and may feed it.
//!
//! `place` is the `predicted` policy's decision over those predictions: the candidate that meets
//! the request's objectives with the most headroom, or, when none does, the soonest (for
//! admission to weigh).
//!
//! Pure: every sample and every question carries its numbers; nothing here reads a clock.

use std::time::Duration;

mod backlog;
mod claims;
mod prefill;

pub use backlog::Backlog;
pub use claims::{ClaimCheck, EngineHits};
use prefill::PrefillFit;
pub use prefill::{attention_of, Coefficients, Work};

/// Weight of the newest sample in each average.
const WEIGHT: f64 = 0.1;
/// Samples before a fit of step times is trusted; a flat step (the mean) before that.
const MIN_STEP_SAMPLES: u32 = 8;
/// Only first tokens at least this late count towards the TTFT error: shorter ones are noise of
/// the transport, and a percentage of them says nothing.
pub const ERROR_FLOOR: Duration = Duration::from_millis(100);

/// Where a request would stand on a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Situation {
    /// Prefill work queued ahead of it (`Backlog`).
    pub prefill_ahead: Work,
    /// Its prompt tokens the worker does not hold in cache.
    pub uncached_prompt: u64,
    /// Sequences in the batch it joins, itself included.
    pub batch: u64,
    /// Requests ahead of it waiting for one of the engine's running slots (none when the
    /// engine's slots are unknown).
    pub slot_queue: u64,
}

impl Situation {
    /// Its prefill's work: what is queued ahead and its own uncached prompt.
    pub fn work(&self) -> Work {
        self.prefill_ahead
            .plus(self.uncached_prompt, attention_of(self.uncached_prompt))
    }
}

/// What the model expects of one request on one worker.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Prediction {
    pub ttft: Duration,
    pub tpot: Duration,
}

/// What came of a request: the situation it was sent in, its first token and its pace after.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Observed {
    pub situation: Situation,
    pub ttft: Duration,
    /// The mean time between its output tokens; `None` for a single token.
    pub tpot: Option<Duration>,
}

/// An exponential average, unset until the first sample.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct Average(Option<f64>);

impl Average {
    fn add(&mut self, sample: f64) {
        self.0 = Some(match self.0 {
            Some(old) => old + WEIGHT * (sample - old),
            None => sample,
        });
    }
}

/// Exponentially weighted least squares of `y = base + slope * x`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct LinearFit {
    x: Average,
    y: Average,
    xx: Average,
    xy: Average,
    samples: u32,
}

impl LinearFit {
    fn add(&mut self, x: f64, y: f64) {
        self.x.add(x);
        self.y.add(y);
        self.xx.add(x * x);
        self.xy.add(x * y);
        self.samples = self.samples.saturating_add(1);
    }

    /// `y` at `x`; the mean until enough samples spread over `x` make a slope, and never a
    /// slope below zero (a step never gets cheaper with more sequences).
    fn at(&self, x: f64) -> Option<f64> {
        let (mx, my) = (self.x.0?, self.y.0?);
        let variance = self.xx.0? - mx * mx;
        if self.samples < MIN_STEP_SAMPLES || variance < 1e-9 {
            return Some(my);
        }
        let slope = ((self.xy.0? - mx * my) / variance).max(0.0);
        Some((my + slope * (x - mx)).max(0.0))
    }
}

/// The absolute percentage errors of one kind of prediction.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ErrorTrack {
    /// Predictions judged.
    pub count: u64,
    sum: f64,
}

impl ErrorTrack {
    fn add(&mut self, predicted: Duration, actual: Duration) {
        let actual = actual.as_secs_f64();
        if actual <= 0.0 {
            return;
        }
        self.sum += (predicted.as_secs_f64() - actual).abs() / actual;
        self.count += 1;
    }

    /// The mean absolute percentage error so far, as a fraction; `None` before any.
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum / self.count as f64)
    }
}

/// One worker's latency model and how right it has been.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LatencyModel {
    /// Seconds a prefill takes against its tokens and their attention.
    prefill: PrefillFit,
    /// Seconds per decode step against the batch.
    step: LinearFit,
    /// The TTFT predictions' error, over first tokens at least `ERROR_FLOOR` late.
    pub ttft_error: ErrorTrack,
    pub tpot_error: ErrorTrack,
}

impl LatencyModel {
    /// The prefill rate learned, prompt tokens per second of a short prompt (its attention
    /// aside); `None` before a first token.
    pub fn prefill_rate(&self) -> Option<f64> {
        self.prefill.rate()
    }

    /// The prefill fit, for the backlog to drain by.
    pub fn prefill_fit(&self) -> Option<Coefficients> {
        self.prefill.coefficients()
    }

    /// One decode step with `batch` sequences; `None` before a pace was seen.
    fn step(&self, batch: u64) -> Option<Duration> {
        self.step.at(batch as f64).map(Duration::from_secs_f64)
    }

    /// What a request in `situation` should expect; `None` until a first token was seen.
    pub fn predict(&self, situation: &Situation) -> Option<Prediction> {
        let step = self.step(situation.batch).unwrap_or_default();
        let prefill = self
            .prefill
            .seconds(&situation.work(), situation.slot_queue)?;
        Some(Prediction {
            ttft: Duration::from_secs_f64(prefill) + step,
            tpot: step,
        })
    }

    /// Learns from a whole answer: its first token, then its pace.
    pub fn observe(&mut self, seen: &Observed) {
        self.first_token(&seen.situation, seen.ttft);
        if let Some(tpot) = seen.tpot {
            self.paced(seen.situation.batch, tpot);
        }
    }

    /// A request sent in `situation` had its first token after `ttft`: the prediction for it
    /// judged (when that late), then the prefill rate learned from it — unless a long prompt
    /// was ahead of it. How much of a long prompt is left is the backlog's estimate, paced by
    /// this fit, and the request behind it waits for all that is really left: its wait says
    /// as much about the estimate as about the engine. Learned from, a short request behind
    /// the last chunks of a long prompt (a few thousand tokens but hundreds of millions of
    /// pairs, as the backlog counted them) put its whole wait on those pairs, and the next long
    /// prompt was predicted 5x too slow (long-context at 1.5x, seed 1). A long prompt's cost is
    /// learned from its own first token.
    pub fn first_token(&mut self, situation: &Situation, ttft: Duration) {
        if let Some(predicted) = self.predict(situation).filter(|_| ttft >= ERROR_FLOOR) {
            self.ttft_error.add(predicted.ttft, ttft);
        }
        if situation.prefill_ahead.shows_attention() {
            return;
        }
        let step = self.step(situation.batch).unwrap_or_default();
        let prefill = ttft.saturating_sub(step).as_secs_f64();
        self.prefill
            .add(&situation.work(), situation.slot_queue, prefill);
    }

    /// A request that joined a batch of `batch` produced its output tokens `tpot` apart: the
    /// prediction judged, then the step fitted.
    pub fn paced(&mut self, batch: u64, tpot: Duration) {
        if let Some(step) = self.step(batch) {
            self.tpot_error.add(step, tpot);
        }
        self.step.add(batch as f64, tpot.as_secs_f64());
    }
}

/// A request's objectives: its time to first token, and time per output token when its tier
/// has one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Objectives {
    pub ttft: Duration,
    pub tpot: Option<Duration>,
}

/// Where the predictions place a request among candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placed {
    /// The candidate predicted to meet both objectives with the most headroom.
    Meets(usize),
    /// None is predicted to meet them: the candidate predicted to answer first, for admission to
    /// weigh (queue, step down, or refuse with a Retry-After from the prediction).
    NoneMeets(usize),
    /// Some candidate has no prediction yet (nothing learned of it): the policy decides.
    Unknown,
}

/// The headroom of `p` under `objectives`: the smaller of the two objectives' slack, as a
/// share of the objective (negative when missed).
fn headroom(p: &Prediction, objectives: &Objectives) -> f64 {
    let share = |objective: Duration, predicted: Duration| {
        let objective = objective.as_secs_f64().max(1e-9);
        (objective - predicted.as_secs_f64()) / objective
    };
    let ttft = share(objectives.ttft, p.ttft);
    objectives
        .tpot
        .map_or(ttft, |tpot| ttft.min(share(tpot, p.tpot)))
}

/// A request's objectives as it stands at placement: its tier's first-token objective less
/// what it has already spent in the gateway (the objective counts from its arrival), never
/// past what is left of its client's deadline; its tier's time per output token. `None` when
/// nothing bounds its first token (a tier without objectives, no deadline).
pub fn objectives(
    ttft: Option<Duration>,
    tpot: Option<Duration>,
    waited: Duration,
    deadline_left: Option<Duration>,
) -> Option<Objectives> {
    let tier = ttft
        .filter(|t| !t.is_zero())
        .map(|t| t.saturating_sub(waited));
    let ttft = match (tier, deadline_left) {
        (Some(a), Some(b)) => a.min(b),
        (a, b) => a.or(b)?,
    };
    Some(Objectives {
        ttft,
        tpot: tpot.filter(|t| !t.is_zero()),
    })
}

/// How late the soonest first token predicted for a request would be against its first-token
/// objective; `None` when it is in time, or when either is unknown (nothing learned yet, or no
/// objective): admission refuses or holds a request only on a prediction.
pub fn lateness(soonest: Option<Duration>, objective: Option<Duration>) -> Option<Duration> {
    let (soonest, objective) = (soonest?, objective?);
    (soonest > objective).then(|| soonest - objective)
}

/// The prompt tokens a worker is claimed to hold cached of a request of `prompt_tokens`: the
/// cached `share` of the first `covered` tokens, the part its prefix was matched over (an index
/// matches a bounded prefix; a share of it says nothing of the rest).
pub fn claimed_cached(prompt_tokens: u64, share: f64, covered: u64) -> u64 {
    let matched = covered.min(prompt_tokens) as f64 * share.clamp(0.0, 1.0);
    (matched as u64).min(prompt_tokens)
}

/// Places a request by the candidates' predictions (in the candidates' order; ties go to the
/// first): with `objectives`, as `Placed` says; without (nothing bounds its first token), the
/// soonest. A candidate without a prediction makes the choice the policy's: the model knows
/// nothing of it, and a new worker must get requests to be learned.
pub fn place(predictions: &[Option<Prediction>], objectives: Option<&Objectives>) -> Placed {
    if predictions.is_empty() || predictions.iter().any(Option::is_none) {
        return Placed::Unknown;
    }
    let Some(objectives) = objectives else {
        return Placed::Meets(soonest(predictions));
    };
    let scored = predictions
        .iter()
        .enumerate()
        .filter_map(|(i, p)| p.map(|p| (i, headroom(&p, objectives))));
    let best = scored.fold(None::<(usize, f64)>, |best, (i, room)| match best {
        Some((_, top)) if top >= room => best,
        _ => Some((i, room)),
    });
    match best {
        Some((i, room)) if room >= 0.0 => Placed::Meets(i),
        _ => Placed::NoneMeets(soonest(predictions)),
    }
}

/// The candidate predicted to answer first (the first of equals).
fn soonest(predictions: &[Option<Prediction>]) -> usize {
    predictions
        .iter()
        .enumerate()
        .filter_map(|(i, p)| p.map(|p| (i, p.ttft)))
        .min_by_key(|(_, ttft)| *ttft)
        .map_or(0, |(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A worker that prefills 8,000 tokens a second (attention aside) and steps in 20 ms +
    /// 0.5 ms a sequence.
    fn truth(s: &Situation) -> (Duration, Duration) {
        let step = Duration::from_secs_f64(0.020 + 0.0005 * s.batch as f64);
        let prefill = Duration::from_secs_f64(s.work().tokens as f64 / 8000.0);
        (prefill + step, step)
    }

    fn situation(i: u64) -> Situation {
        Situation {
            prefill_ahead: Work::default().plus((i * 7919) % 6000, 0),
            uncached_prompt: 200 + (i * 104_729) % 3000,
            batch: 1 + (i * 31) % 64,
            slot_queue: 0,
        }
    }

    fn learned(samples: u64) -> LatencyModel {
        let mut model = LatencyModel::default();
        for i in 0..samples {
            let s = situation(i);
            let (ttft, tpot) = truth(&s);
            model.observe(&Observed {
                situation: s,
                ttft,
                tpot: Some(tpot),
            });
        }
        model
    }

    fn within(predicted: Duration, actual: Duration, share: f64) -> bool {
        (predicted.as_secs_f64() - actual.as_secs_f64()).abs() <= share * actual.as_secs_f64()
    }

    #[test]
    fn nothing_is_predicted_before_a_first_token() {
        assert_eq!(LatencyModel::default().predict(&situation(1)), None);
        assert_eq!(LatencyModel::default().ttft_error.mean(), None);
    }

    #[test]
    fn a_worker_is_learned_from_its_answers_and_predicted_within_a_few_percent() {
        let model = learned(400);
        for i in 1_000..1_050 {
            let s = situation(i);
            let (ttft, tpot) = truth(&s);
            let p = model.predict(&s).unwrap();
            assert!(within(p.ttft, ttft, 0.05), "{s:?}: {p:?} vs {ttft:?}");
            assert!(within(p.tpot, tpot, 0.05), "{s:?}: {p:?} vs {tpot:?}");
        }
        let rate = model.prefill_rate().unwrap();
        assert!((rate - 8000.0).abs() < 400.0, "{rate}");
    }

    #[test]
    fn the_error_shrinks_as_the_model_learns_and_counts_only_late_first_tokens() {
        let model = learned(400);
        let mean = model.ttft_error.mean().unwrap();
        assert!(mean < 0.15, "{mean}");
        let mut fresh = learned(400);
        let before = fresh.ttft_error.count;
        fresh.observe(&Observed {
            situation: Situation {
                prefill_ahead: Work::default(),
                uncached_prompt: 10,
                batch: 1,
                slot_queue: 0,
            },
            ttft: 30 * MS,
            tpot: None,
        });
        assert_eq!(
            fresh.ttft_error.count, before,
            "under the floor: not judged"
        );
    }

    #[test]
    fn a_wait_behind_a_long_prompt_is_judged_but_not_learned() {
        let mut model = learned(100);
        let fit = model.prefill_fit();
        let judged = model.ttft_error.count;
        // The last chunks of a 91k-token prompt as the backlog counted them (a few thousand
        // tokens, hundreds of millions of pairs), then a short prompt, which waited 0.4 s for
        // what the engine really had left of the long one.
        let behind_long = Situation {
            prefill_ahead: Work::default().plus(2_716, 244_000_000),
            uncached_prompt: 261,
            batch: 6,
            slot_queue: 0,
        };
        model.first_token(&behind_long, 415 * MS);
        assert_eq!(model.ttft_error.count, judged + 1, "judged");
        assert_eq!(model.prefill_fit(), fit, "not learned");
        let behind_short = Situation {
            prefill_ahead: Work::default().plus(2_716, attention_of(2_716)),
            ..behind_long
        };
        model.first_token(&behind_short, 415 * MS);
        assert_ne!(model.prefill_fit(), fit, "learned");
    }

    #[test]
    fn more_work_ahead_or_a_bigger_batch_never_predicts_sooner() {
        let model = learned(200);
        let base = situation(5);
        let p = model.predict(&base).unwrap();
        let more_ahead = Situation {
            prefill_ahead: base.prefill_ahead.plus(1000, 0),
            ..base
        };
        let bigger = Situation {
            batch: base.batch + 10,
            ..base
        };
        assert!(model.predict(&more_ahead).unwrap().ttft > p.ttft);
        assert!(model.predict(&bigger).unwrap().tpot >= p.tpot);
    }

    fn predicted(ttft_ms: u32, tpot_ms: u32) -> Option<Prediction> {
        Some(Prediction {
            ttft: ttft_ms * MS,
            tpot: tpot_ms * MS,
        })
    }

    #[test]
    fn a_request_goes_where_both_objectives_keep_the_most_headroom() {
        let objectives = Objectives {
            ttft: 1000 * MS,
            tpot: Some(100 * MS),
        };
        // 0: fast first token, slow pace (90% of its TPOT); 1: 50% headroom on both.
        let candidates = [predicted(100, 90), predicted(500, 50), predicted(900, 10)];
        assert_eq!(place(&candidates, Some(&objectives)), Placed::Meets(1));
        let no_tpot = Objectives {
            tpot: None,
            ..objectives
        };
        assert_eq!(place(&candidates, Some(&no_tpot)), Placed::Meets(0));
    }

    #[test]
    fn when_none_meets_them_the_soonest_is_named_and_an_unknown_worker_defers_to_the_policy() {
        let objectives = Objectives {
            ttft: 100 * MS,
            tpot: None,
        };
        let late = [predicted(400, 10), predicted(300, 10), predicted(900, 10)];
        assert_eq!(place(&late, Some(&objectives)), Placed::NoneMeets(1));
        assert_eq!(
            place(&[predicted(10, 10), None], Some(&objectives)),
            Placed::Unknown
        );
        assert_eq!(place(&[], Some(&objectives)), Placed::Unknown);
        assert_eq!(
            place(&late, None),
            Placed::Meets(1),
            "no objective: the soonest"
        );
    }

    #[test]
    fn objectives_count_from_arrival_and_end_at_the_deadline() {
        let (two_s, tenth) = (Some(2000 * MS), Some(100 * MS));
        let o = objectives(two_s, tenth, 500 * MS, None).unwrap();
        assert_eq!((o.ttft, o.tpot), (1500 * MS, tenth));
        let o = objectives(two_s, tenth, 500 * MS, Some(800 * MS)).unwrap();
        assert_eq!(o.ttft, 800 * MS, "the deadline is nearer");
        let o = objectives(None, None, Duration::ZERO, Some(800 * MS)).unwrap();
        assert_eq!((o.ttft, o.tpot), (800 * MS, None));
        assert_eq!(objectives(None, None, Duration::ZERO, None), None);
        assert_eq!(
            objectives(Some(Duration::ZERO), tenth, Duration::ZERO, None),
            None,
            "zero: none"
        );
        let spent = objectives(two_s, None, 3000 * MS, None).unwrap();
        assert_eq!(spent.ttft, Duration::ZERO, "already late");
    }

    #[test]
    fn a_request_is_late_only_on_a_prediction_past_its_objective() {
        assert_eq!(lateness(Some(900 * MS), Some(1000 * MS)), None);
        assert_eq!(lateness(Some(1500 * MS), Some(1000 * MS)), Some(500 * MS));
        assert_eq!(lateness(None, Some(1000 * MS)), None, "nothing learned");
        assert_eq!(lateness(Some(1500 * MS), None), None, "no objective");
    }

    #[test]
    fn the_cached_share_counts_over_the_part_matched() {
        assert_eq!(claimed_cached(1000, 0.0, 1000), 0);
        assert_eq!(claimed_cached(1000, 0.5, 1000), 500);
        assert_eq!(claimed_cached(100_000, 1.0, 32_768), 32_768);
        assert_eq!(
            claimed_cached(1000, 1.0, 4000),
            1000,
            "never past the prompt"
        );
        assert_eq!(claimed_cached(1000, 7.0, 1000), 1000);
    }
}
