//! Prefill work and its time: a prompt's tokens and their causal attention, the seconds they
//! take fitted per worker, and the work queued on a worker as a fluid queue.
//!
//! A prefill's cost is the weights read for every token and the attention of each token to the
//! ones before it: `a * tokens + b * pairs`, with `pairs` about n²/2 for a prompt of n tokens
//! (vllm's and SGLang's attention kernels compute every causal pair once). Both constants are
//! fitted by least squares over the worker's first tokens, so a fleet of long prompts and one of
//! short ones are each predicted by what they cost there.

use tokio::time::Instant;

/// Thousands of tokens: the fit's unit, so its sums stay well within an `f64`'s precision.
const K: f64 = 1000.0;
/// Weight of the newest sample.
const WEIGHT: f64 = 0.05;
/// Samples before the attention term is fitted; tokens alone before that.
const MIN_SAMPLES: u32 = 16;

/// Prefill work: prompt tokens, and the causal attention pairs among them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Work {
    pub tokens: u64,
    pub pairs: u64,
}

impl Work {
    pub fn plus(self, tokens: u64, pairs: u64) -> Work {
        Work {
            tokens: self.tokens.saturating_add(tokens),
            pairs: self.pairs.saturating_add(pairs),
        }
    }

    /// The features of the fit, in thousands of tokens and millions of pairs.
    fn features(&self) -> (f64, f64) {
        (self.tokens as f64 / K, self.pairs as f64 / (K * K))
    }
}

/// The causal attention pairs of a prompt of `tokens`.
pub fn attention_of(tokens: u64) -> u64 {
    tokens.saturating_mul(tokens.saturating_add(1)) / 2
}

/// Exponentially weighted least squares of `seconds = a * tokens + b * pairs` (no intercept:
/// no work, no time), `a` and `b` never negative.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PrefillFit {
    /// Weighted means of x1², x1·x2, x2², x1·y, x2·y.
    s11: f64,
    s12: f64,
    s22: f64,
    s1y: f64,
    s2y: f64,
    samples: u32,
}

impl PrefillFit {
    /// A first token after `seconds` of prefill for `work`.
    pub fn add(&mut self, work: &Work, seconds: f64) {
        let (x1, x2) = work.features();
        if x1 <= 0.0 || !seconds.is_finite() {
            return;
        }
        let y = seconds.max(0.0);
        let w = if self.samples == 0 { 1.0 } else { WEIGHT };
        let mix = |old: &mut f64, new: f64| *old += w * (new - *old);
        mix(&mut self.s11, x1 * x1);
        mix(&mut self.s12, x1 * x2);
        mix(&mut self.s22, x2 * x2);
        mix(&mut self.s1y, x1 * y);
        mix(&mut self.s2y, x2 * y);
        self.samples = self.samples.saturating_add(1);
    }

    /// Seconds per thousand tokens and per million pairs; `None` before a first token (or
    /// while every sample took no time).
    pub fn coefficients(&self) -> Option<(f64, f64)> {
        if self.samples == 0 || self.s11 <= 0.0 {
            return None;
        }
        let det = self.s11 * self.s22 - self.s12 * self.s12;
        if self.samples >= MIN_SAMPLES && det > 1e-9 * self.s11 * self.s22 {
            let a = (self.s22 * self.s1y - self.s12 * self.s2y) / det;
            let b = (self.s11 * self.s2y - self.s12 * self.s1y) / det;
            if a > 0.0 && b >= 0.0 {
                return Some((a, b));
            }
        }
        let a = self.s1y / self.s11;
        (a > 0.0).then_some((a, 0.0))
    }

    /// The seconds `work` takes; `None` before a first token.
    pub fn seconds(&self, work: &Work) -> Option<f64> {
        let (a, b) = self.coefficients()?;
        let (x1, x2) = work.features();
        Some(a * x1 + b * x2)
    }

    /// Tokens a second of a short prompt (its attention aside).
    pub fn rate(&self) -> Option<f64> {
        self.coefficients().map(|(a, _)| K / a)
    }
}

/// The prefill work still to do on a worker, as a fluid queue: each prompt sent adds its work,
/// and the queue drains at one second of work a second by the worker's fit — never holding more
/// tokens than the prompts still waiting for their first token (`waiting`: a prompt answered is
/// done; one waiting may be part done). The count of waiting prompts alone would count a long
/// prompt half prefilled as whole, and every request behind it as waiting for all of it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Backlog {
    tokens: f64,
    pairs: f64,
    at: Option<Instant>,
}

impl Backlog {
    /// The work left at `now` under `fit` (none drained before one is learned), at most
    /// `waiting` tokens.
    pub fn at(&self, now: Instant, fit: Option<(f64, f64)>, waiting: u64) -> Work {
        let mut keep = 1.0;
        if let (Some(at), Some((a, b))) = (self.at, fit) {
            let total = a * self.tokens / K + b * self.pairs / (K * K);
            let elapsed = now.saturating_duration_since(at).as_secs_f64();
            if total > 0.0 {
                keep = ((total - elapsed) / total).max(0.0);
            }
        }
        let mut tokens = self.tokens * keep;
        let mut pairs = self.pairs * keep;
        if tokens > waiting as f64 {
            let cut = waiting as f64 / tokens;
            tokens = waiting as f64;
            pairs *= cut;
        }
        Work {
            tokens: tokens as u64,
            pairs: pairs as u64,
        }
    }

    /// A prompt of `tokens` to prefill joins at `now`, `waiting` tokens still waiting before
    /// it: returns the work ahead of it.
    pub fn add(
        &mut self,
        now: Instant,
        fit: Option<(f64, f64)>,
        waiting: u64,
        tokens: u64,
    ) -> Work {
        let ahead = self.at(now, fit, waiting);
        let after = ahead.plus(tokens, attention_of(tokens));
        self.tokens = after.tokens as f64;
        self.pairs = after.pairs as f64;
        self.at = Some(now);
        ahead
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const MS: Duration = Duration::from_millis(1);

    fn work(tokens: u64) -> Work {
        Work::default().plus(tokens, attention_of(tokens))
    }

    #[test]
    fn a_prefill_is_fitted_against_its_tokens_and_their_attention() {
        // 0.1 s per 1k tokens, 0.002 s per million pairs: 128k tokens take 12.8 + 16.4 s.
        let truth = |w: &Work| 0.1 * w.tokens as f64 / K + 0.002 * w.pairs as f64 / (K * K);
        let mut fit = PrefillFit::default();
        for i in 0..200u64 {
            let w = work(500 + (i * 7919) % 130_000);
            fit.add(&w, truth(&w));
        }
        let long = work(128_000);
        let predicted = fit.seconds(&long).unwrap();
        assert!(
            (predicted - truth(&long)).abs() < 0.05 * truth(&long),
            "{predicted}"
        );
        let rate = fit.rate().unwrap();
        assert!((rate - 10_000.0).abs() < 500.0, "{rate}");
    }

    #[test]
    fn before_enough_samples_tokens_alone_are_fitted() {
        let mut fit = PrefillFit::default();
        assert_eq!(fit.coefficients(), None);
        fit.add(&work(2000), 0.2);
        let (a, b) = fit.coefficients().unwrap();
        assert!(a > 0.0 && b == 0.0, "{a} {b}");
        fit.add(&Work::default(), 5.0);
        assert_eq!(fit.coefficients(), Some((a, b)), "no work: no sample");
    }

    #[test]
    fn the_backlog_drains_by_the_fit_and_never_past_what_still_waits() {
        let t0 = Instant::now();
        let mut backlog = Backlog::default();
        // 1 s per 1k tokens, no attention term: 1,000 tokens a second.
        let fit = Some((1.0, 0.0));
        assert_eq!(backlog.add(t0, fit, 0, 10_000).tokens, 0, "nothing ahead");
        let half = t0 + 500 * MS;
        assert_eq!(backlog.at(half, fit, 10_000).tokens, 9_500);
        assert_eq!(backlog.add(half, fit, 10_000, 2_000).tokens, 9_500);
        assert_eq!(
            backlog.at(half, fit, 11_500).tokens,
            11_500,
            "at most what waits"
        );
        assert_eq!(
            backlog.at(half + 20 * 1000 * MS, fit, 2_000).tokens,
            0,
            "drained"
        );
        let none = backlog.at(half + 1000 * MS, None, 50_000);
        assert_eq!(none.tokens, 11_500, "no fit: none drained");
        assert!(none.pairs > 0);
    }
}
