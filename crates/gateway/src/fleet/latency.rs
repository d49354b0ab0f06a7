//! One worker's latency model (`sluice_core::latency`), learned from this gateway's requests to
//! it: the request path is its one writer (each first token and each stream's pace, through
//! `Lease`), views read it. The credit its prefix claims get (`ClaimCheck`) has two writers of
//! two facts: the request path adds the claims it sends, the worker's load monitor what the
//! engine found.

use serde::Serialize;
use std::time::Duration;

use sluice_core::latency::{
    Backlog, ClaimCheck, EngineHits, LatencyModel, Prediction, Situation, Work,
};
use tokio::time::Instant;

/// The model and the worker's prefill backlog, under one lock held for one update or one
/// read, never across an `.await`.
#[derive(Debug, Default)]
pub(crate) struct WorkerLatency {
    model: parking_lot::Mutex<Learned>,
    claims: parking_lot::Mutex<ClaimCheck>,
}

#[derive(Debug, Default)]
struct Learned {
    model: LatencyModel,
    /// The prompts sent and not yet answered, the head paced by the model.
    backlog: Backlog,
}

/// What `GET /workers` shows of it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct LatencyView {
    /// Prompt tokens a second, as learned; `None` before a first token.
    prefill_rate: Option<f64>,
    /// Mean absolute percentage error of its TTFT predictions (first tokens of 100 ms or more),
    /// and how many were judged.
    ttft_error: Option<f64>,
    ttft_judged: u64,
    tpot_error: Option<f64>,
    tpot_judged: u64,
    /// The share of a claimed cached prefix its engine is found to hold; `None` before both
    /// the claims and the engine's prefix-cache counts say.
    prefix_claim_credit: Option<f64>,
}

impl WorkerLatency {
    /// A request sent in `situation` had its first token after `ttft`.
    pub(crate) fn first_token(&self, situation: &Situation, ttft: Duration) {
        self.model.lock().model.first_token(situation, ttft);
    }

    /// A prompt of `tokens` to prefill is sent now: its place in the worker's backlog (for
    /// `answered`) and the work ahead of it.
    pub(crate) fn sent(&self, tokens: u64) -> (u64, Work) {
        let mut learned = self.model.lock();
        let fit = learned.model.prefill_fit();
        learned.backlog.add(Instant::now(), fit, tokens)
    }

    /// The prompt of `key` had its first token, or its request ended: it leaves the backlog.
    pub(crate) fn answered(&self, key: u64) {
        let mut learned = self.model.lock();
        let fit = learned.model.prefill_fit();
        learned.backlog.answered(Instant::now(), fit, key);
    }

    /// The prefill work ahead of a prompt sent now.
    pub(crate) fn ahead(&self) -> Work {
        let learned = self.model.lock();
        learned
            .backlog
            .at(Instant::now(), learned.model.prefill_fit())
    }

    /// What a request in `situation` should expect; `None` before a first token was seen.
    pub(crate) fn predict(&self, situation: &Situation) -> Option<Prediction> {
        self.model.lock().model.predict(situation)
    }

    /// Prompt tokens a second, as learned: the one estimate the latency predictions, the
    /// deadline check and the liveness checker's prefill allowance read.
    pub(crate) fn prefill_rate(&self) -> Option<f64> {
        self.model.lock().model.prefill_rate()
    }

    /// A request that joined a batch of `batch` produced its tokens `tpot` apart.
    pub(crate) fn paced(&self, batch: u64, tpot: Duration) {
        self.model.lock().model.paced(batch, tpot);
    }

    /// A prompt of `prompt` tokens is sent with `claimed` of them claimed cached.
    pub(crate) fn claimed(&self, prompt: u64, claimed: u64) {
        self.claims.lock().sent(prompt, claimed);
    }

    /// A load report said what the engine found in its prefix cache since the one before.
    pub(crate) fn engine_found(&self, found: Option<EngineHits>) {
        self.claims.lock().reported(found);
    }

    /// Of a prompt of `prompt` tokens with `claimed` claimed cached, what it must prefill.
    pub(crate) fn uncached(&self, prompt: u64, claimed: u64) -> u64 {
        self.claims.lock().uncached(prompt, claimed)
    }

    /// The mean absolute percentage errors of its TTFT and TPOT predictions, as fractions.
    pub(crate) fn errors(&self) -> [(&'static str, Option<f64>); 2] {
        let model = &self.model.lock().model;
        [
            ("ttft", model.ttft_error.mean()),
            ("tpot", model.tpot_error.mean()),
        ]
    }

    pub(crate) fn view(&self) -> LatencyView {
        let model = self.model.lock().model;
        LatencyView {
            prefill_rate: model.prefill_rate(),
            ttft_error: model.ttft_error.mean(),
            ttft_judged: model.ttft_error.count,
            tpot_error: model.tpot_error.mean(),
            tpot_judged: model.tpot_error.count,
            prefix_claim_credit: self.claims.lock().credit(),
        }
    }
}
