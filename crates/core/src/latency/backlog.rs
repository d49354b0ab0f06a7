//! The prefill work queued on a worker, prompt by prompt in the order sent.
//!
//! vLLM and SGLang prefill waiting prompts first come first served, and a prompt part-way through
//! its chunks is scheduled before any waiting one (vllm/v1/core/sched/scheduler.py schedules the
//! running requests, then the waiting; SGLang keeps one `chunked_req` ahead of its queue): a
//! prompt waits for every prompt sent before it. So the backlog is a queue of prompts, not a sum
//! of tokens. The head advances at the pace of the worker's prefill fit, and a prompt leaves the
//! queue when its first token comes (or its request ends): the gateway knows which prompts are
//! still waiting, so an error of the fit on one prompt is not carried to the ones behind it.
//!
//! Attention makes a long prompt's later chunks cost more than its first: the head's progress is
//! kept in tokens, and the work left is the tokens after it with the attention pairs they have
//! (the pairs of the whole prompt less those of the part done), not a share of the whole.
//!
//! A head the fit said was done but that has not answered is **overdue**: the fit was wrong about
//! it, and nothing behind it has started. It is expected to take as long again as it has been
//! overdue (the longer a prompt has outrun its prediction, the more of it is left to expect),
//! counted as the tail of its prompt that would take that long.

use std::collections::VecDeque;

use tokio::time::Instant;

use super::prefill::{attention_of, Coefficients, Work, K};

/// One prompt sent and not yet answered.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Queued {
    key: u64,
    tokens: u64,
    /// Its tokens prefilled, as the fit paces the head.
    done: f64,
    /// Seconds since the fit said it was done.
    overdue: f64,
}

/// The causal attention pairs of the first `tokens` of a prompt.
fn pairs(tokens: f64) -> f64 {
    tokens * (tokens + 1.0) / 2.0
}

/// Seconds the fit gives the prompt's tokens `from..to`.
fn seconds(fit: &Coefficients, from: f64, to: f64) -> f64 {
    let [a, b, _] = *fit;
    a * (to - from) / K + b * (pairs(to) - pairs(from)) / (K * K)
}

impl Queued {
    /// The head after `elapsed` seconds of prefill under `fit`.
    fn advanced(mut self, elapsed: f64, fit: &Coefficients) -> Queued {
        let tokens = self.tokens as f64;
        let need = seconds(fit, self.done, tokens);
        if elapsed >= need {
            self.overdue += elapsed - need;
            self.done = tokens;
            return self;
        }
        // seconds(done, x) = elapsed: b/2K² x² + (a/K + b/2K²) x - (elapsed + seconds(0, done)) = 0.
        let [a, b, _] = *fit;
        let quadratic = b / (2.0 * K * K);
        let linear = a / K + quadratic;
        let constant = elapsed + seconds(fit, 0.0, self.done);
        let x = if quadratic > 0.0 {
            (-linear + (linear * linear + 4.0 * quadratic * constant).sqrt()) / (2.0 * quadratic)
        } else {
            constant / linear
        };
        self.done = x.clamp(self.done, tokens);
        self
    }

    /// The work left of it: the tokens after those done, and an overdue prompt's expected rest.
    fn left(&self, fit: Option<&Coefficients>) -> (f64, f64) {
        let tokens = self.tokens as f64;
        let mut from = self.done;
        if self.overdue > 0.0 {
            if let Some(fit) = fit {
                let whole = seconds(fit, 0.0, tokens);
                let share = if whole > 0.0 {
                    (self.overdue / whole).min(1.0)
                } else {
                    0.0
                };
                from = tokens * (1.0 - share);
            }
        }
        (tokens - from, pairs(tokens) - pairs(from))
    }
}

/// The prompts sent to a worker and not yet answered, in the order sent, the head paced by the
/// worker's prefill fit.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Backlog {
    queue: VecDeque<Queued>,
    /// The work of every prompt behind the head, none of it started: kept as prompts come and
    /// go, so a prediction reads the backlog in constant time however many wait.
    behind: Work,
    /// When the head's progress was last brought up to date.
    at: Option<Instant>,
    next_key: u64,
}

impl Backlog {
    /// The work left at `now` under `fit` (the head not advanced before one is learned).
    pub fn at(&self, now: Instant, fit: Option<Coefficients>) -> Work {
        let (tokens, pairs) = self
            .head_at(now, fit.as_ref())
            .map_or((0.0, 0.0), |head| head.left(fit.as_ref()));
        self.behind.plus(tokens as u64, pairs as u64)
    }

    /// A prompt of `tokens` to prefill joins at `now`: its key (for `answered`) and the work
    /// ahead of it.
    pub fn add(&mut self, now: Instant, fit: Option<Coefficients>, tokens: u64) -> (u64, Work) {
        self.advance(now, fit.as_ref());
        let ahead = self.at(now, fit);
        let key = self.next_key;
        self.next_key = self.next_key.wrapping_add(1);
        if !self.queue.is_empty() {
            self.behind = self.behind.plus(tokens, attention_of(tokens));
        }
        self.queue.push_back(Queued {
            key,
            tokens,
            done: 0.0,
            overdue: 0.0,
        });
        (key, ahead)
    }

    /// The prompt of `key` had its first token, or its request ended, at `now`: it leaves, and
    /// the next starts from now.
    pub fn answered(&mut self, now: Instant, fit: Option<Coefficients>, key: u64) {
        self.advance(now, fit.as_ref());
        let Some(at) = self.queue.iter().position(|queued| queued.key == key) else {
            return;
        };
        let gone = self.queue.remove(at).map(|queued| queued.tokens);
        // What leaves the work behind the head: the prompt itself when it was behind, or, when
        // it was the head, its successor, which now leads.
        let leaves = if at == 0 {
            self.queue.front().map(|next| next.tokens)
        } else {
            gone
        };
        if let Some(tokens) = leaves {
            self.behind = self.behind.minus(tokens, attention_of(tokens));
        }
    }

    /// The head as it stands at `now`.
    fn head_at(&self, now: Instant, fit: Option<&Coefficients>) -> Option<Queued> {
        let head = *self.queue.front()?;
        Some(match (self.at, fit) {
            (Some(at), Some(fit)) => {
                head.advanced(now.saturating_duration_since(at).as_secs_f64(), fit)
            }
            _ => head,
        })
    }

    /// Brings the head up to `now`.
    fn advance(&mut self, now: Instant, fit: Option<&Coefficients>) {
        if let Some(head) = self.head_at(now, fit) {
            self.queue[0] = head;
        }
        self.at = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const MS: Duration = Duration::from_millis(1);
    /// 1 s per 1k tokens, no attention: 1,000 tokens a second.
    const FLAT: Option<Coefficients> = Some([1.0, 0.0, 0.0]);

    #[test]
    fn prompts_wait_for_those_sent_before_them_and_leave_when_answered() {
        let t0 = Instant::now();
        let mut backlog = Backlog::default();
        let (first, ahead) = backlog.add(t0, FLAT, 10_000);
        assert_eq!(ahead.tokens, 0, "nothing ahead");
        let half = t0 + 500 * MS;
        assert_eq!(backlog.at(half, FLAT).tokens, 9_500, "the head advances");
        let (second, ahead) = backlog.add(half, FLAT, 2_000);
        assert_eq!(ahead.tokens, 9_500);
        assert_eq!(
            backlog.at(half + 1000 * MS, FLAT).tokens,
            8_500 + 2_000,
            "nothing behind the head starts"
        );
        backlog.answered(half + 1000 * MS, FLAT, first);
        assert_eq!(backlog.at(half + 1000 * MS, FLAT).tokens, 2_000);
        assert_eq!(backlog.at(half + 1500 * MS, FLAT).tokens, 1_500);
        backlog.answered(half + 1500 * MS, FLAT, second);
        assert_eq!(backlog.at(half + 1500 * MS, FLAT), Work::default());
    }

    #[test]
    fn without_a_fit_nothing_advances() {
        let t0 = Instant::now();
        let mut backlog = Backlog::default();
        backlog.add(t0, None, 4_000);
        let later = backlog.at(t0 + 60_000 * MS, None);
        assert_eq!(later.tokens, 4_000);
        assert_eq!(later.pairs, 4_000 * 4_001 / 2);
    }

    #[test]
    fn a_long_prompt_half_done_has_three_quarters_of_its_attention_left() {
        // Attention alone: 1 s per million pairs; a 10k prompt is 50.005 M pairs.
        let fit = Some([1e-9, 1.0, 0.0]);
        let t0 = Instant::now();
        let mut backlog = Backlog::default();
        backlog.add(t0, fit, 10_000);
        // Its first 5k tokens are 12.5 M pairs: 12.5 s.
        let left = backlog.at(t0 + 12_502 * MS, fit);
        assert!(left.tokens.abs_diff(5_000) <= 2, "{left:?}");
        let share = left.pairs as f64 / (10_000.0 * 10_001.0 / 2.0);
        assert!((share - 0.75).abs() < 0.001, "{share}");
    }

    #[test]
    fn a_head_past_its_prediction_is_expected_to_take_as_long_again() {
        let t0 = Instant::now();
        let mut backlog = Backlog::default();
        let (head, _) = backlog.add(t0, FLAT, 1_000);
        backlog.add(t0, FLAT, 500);
        // Predicted done at 1 s; at 1.25 s it is a quarter of its whole overdue.
        let left = backlog.at(t0 + 1250 * MS, FLAT);
        assert_eq!(left.tokens, 250 + 500, "the rest of it, and all behind it");
        backlog.answered(t0 + 1500 * MS, FLAT, head);
        assert_eq!(backlog.at(t0 + 1500 * MS, FLAT).tokens, 500);
        let far = backlog.at(t0 + 9000 * MS, FLAT);
        assert_eq!(far.tokens, 500, "never more than the whole prompt");
    }

    #[test]
    fn the_work_behind_the_head_is_kept_as_prompts_come_and_go_in_any_order() {
        let t0 = Instant::now();
        let mut backlog = Backlog::default();
        let mut waiting: Vec<(u64, u64)> = Vec::new();
        for i in 0..200u64 {
            let tokens = 1 + (i * 7919) % 3000;
            let (key, ahead) = backlog.add(t0, None, tokens);
            let sum: u64 = waiting.iter().map(|(_, t)| t).sum();
            assert_eq!(ahead.tokens, sum);
            waiting.push((key, tokens));
            // Every third step a prompt answers: the head, the newest, or one between.
            if i % 3 == 2 {
                let at = (i as usize * 31) % waiting.len();
                let (key, _) = waiting.remove(at);
                backlog.answered(t0, None, key);
            }
        }
        let left = backlog.at(t0, None);
        let tokens: u64 = waiting.iter().map(|(_, t)| t).sum();
        let pairs: u64 = waiting.iter().map(|(_, t)| attention_of(*t)).sum();
        assert_eq!((left.tokens, left.pairs), (tokens, pairs));
    }
}
