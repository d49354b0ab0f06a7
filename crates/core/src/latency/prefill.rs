//! Prefill work and its time: a prompt's tokens and their causal attention, and the seconds they
//! take fitted per worker.
//!
//! A prefill's cost is the weights read for every token and the attention of each token to the
//! ones before it: `a * tokens + b * pairs`, with `pairs` about n²/2 for a prompt of n tokens
//! (vLLM's and SGLang's attention kernels compute every causal pair once). A request the engine
//! cannot start because its running slots are full (`--max-num-seqs`, `--max-running-requests`)
//! waits for running ones to finish as well: `c * queued`, `queued` the requests ahead of it in
//! that queue. The constants are fitted by least squares over the worker's first tokens, so a
//! fleet of long prompts and one of short ones are each predicted by what they cost there.

/// Thousands of tokens: the fit's unit, so its sums stay well within an `f64`'s precision.
pub(super) const K: f64 = 1000.0;
/// Weight of the newest sample: a memory of about fifty first tokens, since only one prompt in
/// many is long enough to show the attention term, and a fit that forgets it between long
/// prompts predicts the next one as if it had none.
const WEIGHT: f64 = 0.02;
/// Samples before the attention term is fitted; tokens alone before that.
const MIN_SAMPLES: u32 = 16;
/// Attention pairs per token, in thousands (the fit's millions of pairs over its thousands of
/// tokens), from which a sample's work shows its attention apart from its tokens: a prompt of
/// 8,192 tokens.
/// Among shorter prompts the pairs grow with the tokens over too narrow a range to tell the two
/// terms apart, and attention is a few percent of their prefill, within the samples' noise: a
/// fit of short prompts alone gives the attention term whatever the noise says, and a long
/// prompt predicted by it was 40-60x too slow (long-context at 0.8x, one engine's first long
/// prompt after forty short ones: 60 s predicted for the requests behind a 1.3-s prefill).
const ATTENTION_SHOWS: f64 = 4.096;

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

    pub fn minus(self, tokens: u64, pairs: u64) -> Work {
        Work {
            tokens: self.tokens.saturating_sub(tokens),
            pairs: self.pairs.saturating_sub(pairs),
        }
    }

    /// The features of the fit, in thousands of tokens and millions of pairs.
    fn features(&self) -> (f64, f64) {
        (self.tokens as f64 / K, self.pairs as f64 / (K * K))
    }

    /// Whether its attention can be told apart from its tokens (`ATTENTION_SHOWS`).
    pub fn shows_attention(&self) -> bool {
        let (x1, x2) = self.features();
        x1 > 0.0 && x2 >= ATTENTION_SHOWS * x1
    }
}

/// The causal attention pairs of a prompt of `tokens`.
pub fn attention_of(tokens: u64) -> u64 {
    tokens.saturating_mul(tokens.saturating_add(1)) / 2
}

/// The features of a first token's wait: prefill work (thousands of tokens, millions of
/// pairs) and the requests queued for a running slot ahead of it.
const FEATURES: usize = 3;

/// The coefficients fitted: seconds per thousand tokens, per million pairs, per request queued
/// for a slot.
pub type Coefficients = [f64; FEATURES];

/// The subsets of features tried in turn, the first whose coefficients are all positive winning:
/// tokens always (work takes time), then attention and the slot queue where the samples show
/// them.
const SUBSETS: [&[usize]; 4] = [&[0, 1, 2], &[0, 1], &[0, 2], &[0]];

/// Exponentially weighted least squares of `seconds = a * tokens + b * pairs + c * queued` (no
/// intercept: no work and no queue, no wait), every coefficient at least zero.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PrefillFit {
    /// Weighted means of xi·xj and of xi·y.
    xx: [[f64; FEATURES]; FEATURES],
    xy: [f64; FEATURES],
    /// The weighted mean of the attention feature squared over the samples whose work shows
    /// attention (`ATTENTION_SHOWS`), the others counted as zero: the part of `xx[1][1]` that
    /// can tell attention from tokens.
    xx_attention: f64,
    samples: u32,
}

impl PrefillFit {
    /// A first token after `seconds` of prefill for `work`, `queued` requests waiting for a
    /// running slot ahead of it.
    pub fn add(&mut self, work: &Work, queued: u64, seconds: f64) {
        let (x1, x2) = work.features();
        if x1 <= 0.0 || !seconds.is_finite() {
            return;
        }
        let x = [x1, x2, queued as f64];
        let y = seconds.max(0.0);
        let w = if self.samples == 0 { 1.0 } else { WEIGHT };
        let shows = if work.shows_attention() { x2 * x2 } else { 0.0 };
        self.xx_attention += w * (shows - self.xx_attention);
        for i in 0..FEATURES {
            for j in 0..FEATURES {
                self.xx[i][j] += w * (x[i] * x[j] - self.xx[i][j]);
            }
            self.xy[i] += w * (x[i] * y - self.xy[i]);
        }
        self.samples = self.samples.saturating_add(1);
    }

    /// The coefficients; `None` before a first token (or while every sample took no time).
    /// Before `MIN_SAMPLES`, tokens alone; attention only while most of what the samples say
    /// of it comes from work long enough to show it (a long prompt's leverage keeps it so for
    /// hundreds of short samples after).
    pub fn coefficients(&self) -> Option<Coefficients> {
        if self.samples < MIN_SAMPLES {
            return self.solve(SUBSETS[3]);
        }
        let attention = self.xx_attention >= 0.5 * self.xx[1][1];
        SUBSETS
            .iter()
            .filter(|subset| attention || !subset.contains(&1))
            .find_map(|subset| self.solve(subset))
    }

    /// The least-squares coefficients over `subset` of the features (the others zero), when
    /// the system is well posed and every one is positive.
    fn solve(&self, subset: &[usize]) -> Option<Coefficients> {
        let n = subset.len();
        let mut m = [[0.0; FEATURES + 1]; FEATURES];
        for (r, &i) in subset.iter().enumerate() {
            for (c, &j) in subset.iter().enumerate() {
                m[r][c] = self.xx[i][j];
            }
            m[r][n] = self.xy[i];
        }
        // Gaussian elimination with partial pivoting on the n x (n + 1) system.
        for col in 0..n {
            let pivot = (col..n).max_by(|&a, &b| m[a][col].abs().total_cmp(&m[b][col].abs()))?;
            m.swap(col, pivot);
            let scale = self.xx[subset[col]][subset[col]]
                .abs()
                .max(f64::MIN_POSITIVE);
            if m[col][col].abs() <= 1e-9 * scale {
                return None;
            }
            let pivot_row = m[col];
            for (r, row) in m.iter_mut().enumerate().take(n) {
                if r != col {
                    let f = row[col] / pivot_row[col];
                    for (cell, p) in row.iter_mut().zip(pivot_row).take(n + 1).skip(col) {
                        *cell -= f * p;
                    }
                }
            }
        }
        let mut out = [0.0; FEATURES];
        for (r, &i) in subset.iter().enumerate() {
            let value = m[r][n] / m[r][r];
            if !(value > 0.0 && value.is_finite()) {
                return None;
            }
            out[i] = value;
        }
        Some(out)
    }

    /// The seconds `work` takes with `queued` ahead of it for a slot; `None` before a first
    /// token.
    pub fn seconds(&self, work: &Work, queued: u64) -> Option<f64> {
        let [a, b, c] = self.coefficients()?;
        let (x1, x2) = work.features();
        Some(a * x1 + b * x2 + c * queued as f64)
    }

    /// Tokens a second of a short prompt (its attention aside).
    pub fn rate(&self) -> Option<f64> {
        self.coefficients().map(|[a, _, _]| K / a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            fit.add(&w, 0, truth(&w));
        }
        let long = work(128_000);
        let predicted = fit.seconds(&long, 0).unwrap();
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
        fit.add(&work(2000), 3, 0.2);
        let [a, b, c] = fit.coefficients().unwrap();
        assert!(a > 0.0 && b == 0.0 && c == 0.0, "{a} {b} {c}");
        fit.add(&Work::default(), 0, 5.0);
        assert_eq!(fit.coefficients(), Some([a, b, c]), "no work: no sample");
    }

    #[test]
    fn short_prompts_alone_fit_no_attention_and_a_long_one_then_does() {
        // Prompts of 128-384 tokens whose times bend upwards (the measured noise of one run
        // fitted 0.015 s per million pairs from forty of them): no attention term from them.
        let mut fit = PrefillFit::default();
        for i in 0..60u64 {
            let w = work(128 + (i * 7919) % 256);
            fit.add(
                &w,
                0,
                0.009 * w.tokens as f64 / K + 0.015 * w.pairs as f64 / (K * K),
            );
        }
        let [a, b, _] = fit.coefficients().unwrap();
        assert!(a > 0.0 && b == 0.0, "{a} {b}");
        let long = work(88_000);
        let tokens_only = fit.seconds(&long, 0).unwrap();
        assert!(tokens_only < 2.0, "{tokens_only}");
        // One 94k prompt's first token after 1.4 s, as the engine took: attention is fitted,
        // and the 88k prompt is predicted near what it took (1.25 s), not a minute.
        let seen = work(94_000);
        fit.add(&seen, 0, 1.4);
        let [_, b, _] = fit.coefficients().unwrap();
        assert!(b > 0.0, "{b}");
        let predicted = fit.seconds(&long, 0).unwrap();
        assert!((0.9..1.6).contains(&predicted), "{predicted}");
    }

    #[test]
    fn a_queue_for_running_slots_is_fitted_beside_the_prefill() {
        // 0.1 s per 1k tokens, and 0.25 s per request queued ahead for a slot.
        let mut fit = PrefillFit::default();
        for i in 0..300u64 {
            let w = work(200 + (i * 7919) % 4000);
            let queued = (i * 31) % 20;
            let seconds = 0.1 * w.tokens as f64 / K + 0.25 * queued as f64;
            fit.add(&w, queued, seconds);
        }
        let [a, _, c] = fit.coefficients().unwrap();
        assert!((a - 0.1).abs() < 0.01 && (c - 0.25).abs() < 0.01, "{a} {c}");
        let predicted = fit.seconds(&work(1000), 10).unwrap();
        assert!((predicted - 2.6).abs() < 0.1, "{predicted}");
    }
}
