//! The liveness report as Markdown: one row per cell, grouped by failure.

use std::fmt::Write;

use super::LivenessReport;

fn secs(x: Option<f64>) -> String {
    x.map_or_else(|| "–".to_string(), |s| format!("{s:.1}"))
}

fn count(x: Option<u64>) -> String {
    x.map_or_else(|| "–".to_string(), |n| n.to_string())
}

impl LivenessReport {
    pub fn table(&self) -> String {
        let t = &self.timing;
        let (fault, restore) = (t.before.as_secs_f64(), (t.before + t.during).as_secs_f64());
        let mut out = format!(
            "liveness: 2 engines, engine 0 fails at t = {fault:.0} s and recovers at t = \
             {restore:.0} s (a crashed engine is started again; a long prompt ends by itself); \
             clients send until t = {:.0} s. Failed: requests that got an error, a refusal, a \
             timeout or a cut stream — over before the failure / in flight when it came or \
             sent during it / sent after the recovery. Vetoed: seconds \
             from the failure to the gateway's first liveness veto of engine 0 (sluice's log; \
             \"–\" none), and from the first request engine 0 received during the failure (at \
             the earliest it can have come; a crash: the failure) to that veto. Sent: requests engine 0 received during the failure, and after the \
             veto. Last sent: seconds from the failure to its last request during it. Back: \
             seconds from the recovery to its first request after.\n",
            (t.before + t.during + t.after).as_secs_f64()
        );
        let mut failure = None;
        for row in &self.rows {
            if failure != Some(row.failure) {
                failure = Some(row.failure);
                let _ = write!(
                    out,
                    "\n### {}{}\n\n| clients | gateway | requests | failed before/during/after \
                     | vetoed (s) | after first sent (s) | vetoes | sent during | sent after veto | last sent (s) | \
                     back (s) |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: \
                     | ---: | ---: |\n",
                    row.failure.name(),
                    if row.failure.healthy() {
                        " (healthy: must never be vetoed)"
                    } else {
                        ""
                    }
                );
            }
            let _ = writeln!(
                out,
                "| {} | {} | {} | {}/{}/{} | {} | {} | {} | {} | {} | {} | {} |",
                row.clients,
                row.gateway,
                row.requests,
                row.failed[0],
                row.failed[1],
                row.failed[2],
                secs(row.vetoed_after),
                secs(row.vetoed_after_first_sent),
                count(row.vetoes),
                count(row.sent_during),
                count(row.sent_after_veto),
                secs(row.last_sent_after),
                secs(row.readmitted_after),
            );
        }
        out
    }
}
