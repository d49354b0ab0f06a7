//! The incident report as Markdown: one summary row per configuration, then goodput over time.

use std::fmt::Write;

use super::{Incident, TimelineReport};

fn secs(x: Option<f64>, none: &str) -> String {
    x.map_or_else(|| none.to_string(), |s| format!("{s:.1}"))
}

fn percent(x: Option<f64>) -> String {
    x.map_or_else(|| "–".to_string(), |s| format!("{:.0}%", 100.0 * s))
}

impl TimelineReport {
    pub fn table(&self) -> String {
        self.heading() + &self.summary() + &self.whole_run() + &self.over_time()
    }

    /// One row per configuration over the whole run: goodput, its share of the offered load,
    /// the time to a first token; then each sluice's prediction error.
    fn whole_run(&self) -> String {
        let mut out = String::from(
            "
| config | goodput (req/engine-s) | goodput / offered | TTFT p50 / p99 (s) |\n\
             | --- | ---: | ---: | ---: |\n",
        );
        for r in &self.rows {
            let _ = writeln!(
                out,
                "| {} | {:.2} | {:.0}% | {:.2} / {:.2} |",
                r.config,
                r.goodput,
                100.0 * r.goodput / r.offered.max(f64::MIN_POSITIVE),
                r.ttft_p50,
                r.ttft_p99,
            );
        }
        let load = self.base_rate / self.capacity.max(f64::MIN_POSITIVE);
        out + &crate::scenario::prediction::foot(
            self.rows
                .iter()
                .map(|r| (r.config.as_str(), load, r.prediction.as_ref())),
        )
    }

    /// What happened when, and at what load.
    fn heading(&self) -> String {
        let t = &self.timing;
        let what = match self.incident {
            Incident::Spike => "the offered load triples",
            Incident::WorkerCrash => "engine 0 is killed (SIGKILL)",
            Incident::FrozenEngine => "engine 0 freezes",
            Incident::SlowWorker => "engine 0 slows down 4x",
            Incident::LongContext => "nothing (long prompts all along; engine 0 is watched)",
        };
        let back = match self.incident {
            Incident::Spike => "it drops back",
            Incident::WorkerCrash => "engine 0 is started again",
            Incident::LongContext => "the watch ends",
            _ => "engine 0 is back to normal",
        };
        let (fault, restore, end) = (
            t.before.as_secs_f64(),
            (t.before + t.during).as_secs_f64(),
            (t.before + t.during + t.after).as_secs_f64(),
        );
        format!(
            "{}: {} engines, capacity C = {:.1} requests per engine-second, {:.1} offered ({:.0}% \
             of C). At t = {fault:.0} s {what}; at t = {restore:.0} s {back}; arrivals end at \
             t = {end:.0} s. Times are wall seconds, by due time; the engines run at time scale \
             {}, the gateways' timers do not.\n\n",
            self.incident.name(),
            self.engines,
            self.capacity,
            self.base_rate,
            100.0 * self.base_rate / self.capacity,
            self.time_scale,
        )
    }

    /// One row per configuration.
    fn summary(&self) -> String {
        let mut out = String::new();
        let target = self.incident != Incident::Spike;
        let excluded = match self.incident {
            Incident::WorkerCrash => "last failure after kill (s)",
            _ => "excluded after (s)",
        };
        let _ = writeln!(
            out,
            "| config | requests | within SLO | within SLO during | failed | refused | TTFT p99 during (engine s) | TPOT p99 during (engine ms) |{} recovered after (s) | vetoes: liveness, overload | preemptions | wasted tokens | late engine steps |",
            if target {
                format!(" {excluded} | rejoined after (s) | target's share during |")
            } else {
                String::new()
            }
        );
        let _ = writeln!(
            out,
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |{} ---: | ---: | ---: | ---: | ---: |",
            if target { " ---: | ---: | ---: |" } else { "" }
        );
        for r in &self.rows {
            let _ = writeln!(
                out,
                "| {} | {} | {:.0}% | {:.0}% | {} | {} | {:.2} | {:.0} |{} {} | {} | {} | {} | {:.1}% |",
                r.config,
                r.requests,
                100.0 * r.attainment,
                100.0 * r.attainment_during,
                r.failed,
                r.refused,
                r.ttft_p99_during,
                1000.0 * r.tpot_p99_during,
                if target {
                    format!(
                        " {} | {} | {} |",
                        secs(r.excluded_after, "never"),
                        secs(r.rejoined_after, "never"),
                        percent(r.target_share)
                    )
                } else {
                    String::new()
                },
                secs(r.recovered_after, "never"),
                r.vetoes.map_or("–".to_string(), |v| format!("{}, {}", v.liveness, v.overload)),
                r.engines.preemptions,
                r.engines.wasted_tokens,
                100.0 * r.engines.late_share(),
            );
        }
        out
    }

    /// Share within objectives per slice, one column per configuration.
    fn over_time(&self) -> String {
        let mut out = String::from("\nwithin SLO by due time (the incident marked *)\n\n| t (s) |");
        let mut rule = String::from("| ---: |");
        for r in &self.rows {
            let _ = write!(out, " {} |", r.config);
            rule.push_str(" ---: |");
        }
        let _ = writeln!(out, "\n{rule}");
        let phases = self.timing.phases();
        let slices = self.rows.first().map_or(0, |r| r.buckets.len());
        for i in 0..slices {
            let start = self.rows[0].buckets[i].start_secs;
            let during =
                start + 1e-9 >= phases.fault.as_secs_f64() && start < phases.restore.as_secs_f64();
            let _ = write!(out, "| {start:.0}{} |", if during { "*" } else { "" });
            for r in &self.rows {
                match r.buckets.get(i) {
                    Some(b) => {
                        let _ = write!(out, " {:.0}% |", 100.0 * b.attainment());
                    }
                    None => out.push_str(" – |"),
                }
            }
            out.push('\n');
        }
        out
    }
}
