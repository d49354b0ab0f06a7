//! Liveness trials by verdict (`sluice_worker_liveness_trials_total`), one series per worker
//! and verdict, deleted with the worker.

use prometheus_client::encoding::EncodeLabelSet;
use sluice_core::liveness::TrialVerdict;

use super::Metrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TrialLabels {
    pub(crate) worker: String,
    /// `TrialVerdict::label`.
    pub(crate) verdict: &'static str,
}

impl Metrics {
    /// A liveness trial on `worker` came to `verdict`.
    pub(crate) fn count_trial(&self, worker: &str, verdict: TrialVerdict) {
        self.liveness_trials
            .get_or_create(&TrialLabels {
                worker: worker.to_string(),
                verdict: verdict.label(),
            })
            .inc();
    }

    /// Deletes `worker`'s trial series.
    pub(super) fn forget_trials(&self, worker: &str) {
        for verdict in TrialVerdict::ALL {
            self.liveness_trials.remove(&TrialLabels {
                worker: worker.to_string(),
                verdict: verdict.label(),
            });
        }
    }
}
