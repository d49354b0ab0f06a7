//! Configurations with adaptive control (seed 003) for the incident scenarios: per-worker
//! concurrency limits learned from latency (`--adaptive-concurrency`) and CoDel on the gateway
//! queue, next to the same gateway without them.
//!
//! Every target and window is the seed's, in engine time, turned into wall time under the
//! engines' speed-up (the gateway's timers are not scaled): a 25 ms inter-token breach at 4x is
//! 6.25 wall milliseconds, a 10 s window 2.5 wall seconds, CoDel's 5 s interval 1.25.

use std::path::Path;

use crate::overhead::Template;

/// The seed's inter-token targets (breach, healthy) and window, in engine time.
pub const SEED_ITL_MS: (f64, f64) = (25.0, 15.0);
/// Inter-token targets at the scenarios' own objective (100 ms per output token): a breach at it,
/// healthy well under it.
pub const SLO_ITL_MS: (f64, f64) = (100.0, 60.0);
const WINDOW_SECS: f64 = 10.0;
/// The engines' running window (`--max-num-seqs 64` of the scenarios' engines): where a limit
/// starts, as an operator of vLLM, whose metrics do not carry it, would set it.
const RUNNING_WINDOW: &str = "64";

/// What a configuration adds to plain sluice.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Controls {
    /// `--policy round_robin` instead of the default cache-aware policy.
    pub round_robin: bool,
    /// The gateway queue (requests may ask for any tier).
    pub queue: bool,
    /// CoDel on the queue's tiers.
    pub codel: bool,
    /// Adaptive concurrency limits, with these inter-token targets (breach, healthy) in engine
    /// milliseconds.
    pub adaptive: Option<(f64, f64)>,
}

/// sluice with `controls`, its load poll and every adaptive target scaled to the engines' clock.
pub fn controlled_config(name: &str, exe: &Path, time_scale: f64, controls: Controls) -> Template {
    let scale = time_scale.max(1.0);
    let wall_ms = |ms: f64| format!("{}", ms / scale);
    let mut argv: Vec<String> = [
        "--log-level",
        "info",
        "--load-monitor-interval",
        &super::load_poll(scale),
    ]
    .map(String::from)
    .to_vec();
    let mut add = |flags: &[&str]| argv.extend(flags.iter().map(|f| f.to_string()));
    if controls.round_robin {
        add(&["--policy", "round_robin"]);
    }
    if controls.queue {
        add(&["--queue-size", "1024", "--default-priority", "0"]);
        if controls.codel {
            let codel = super::codel_flags(scale);
            add(&codel.each_ref().map(String::as_str));
        } else {
            add(&["--disable-codel"]);
        }
    }
    if let Some((breach, healthy)) = controls.adaptive {
        add(&[
            "--adaptive-concurrency",
            "--adaptive-window-secs",
            &format!("{}", WINDOW_SECS / scale),
            "--adaptive-itl-breach-ms",
            &wall_ms(breach),
            "--adaptive-itl-healthy-ms",
            &wall_ms(healthy),
            "--adaptive-initial-limit",
            RUNNING_WINDOW,
        ]);
    }
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    crate::overhead::sluice_template(name, exe, &argv)
}

/// The default (cache-aware) policy alone, none of the controls.
const NO_CONTROLS: Controls = Controls {
    round_robin: false,
    queue: false,
    codel: false,
    adaptive: None,
};

/// The queue with CoDel and the adaptive limit at the seed's inter-token target.
const ALL_CONTROLS: Controls = Controls {
    queue: true,
    codel: true,
    adaptive: Some(SEED_ITL_MS),
    ..NO_CONTROLS
};

/// The configurations the incident scenarios add: for a slow worker, limits with and without
/// round robin; for a spike, the queue without CoDel, with it, and with limits too (at the
/// seed's inter-token targets, and at the scenarios' objective).
pub fn incident_configs(incident: super::Incident, exe: &Path, time_scale: f64) -> Vec<Template> {
    let (none, all) = (NO_CONTROLS, ALL_CONTROLS);
    let named: Vec<(&str, Controls)> = match incident {
        super::Incident::SlowWorker => vec![
            ("sluice-adaptive", all),
            (
                "sluice-rr",
                Controls {
                    round_robin: true,
                    ..none
                },
            ),
            (
                "sluice-rr-adaptive",
                Controls {
                    round_robin: true,
                    ..all
                },
            ),
        ],
        super::Incident::Spike => vec![
            (
                "sluice-queue",
                Controls {
                    queue: true,
                    ..none
                },
            ),
            (
                "sluice-codel",
                Controls {
                    queue: true,
                    codel: true,
                    ..none
                },
            ),
            ("sluice-adaptive", all),
            (
                "sluice-adaptive-slo",
                Controls {
                    adaptive: Some(SLO_ITL_MS),
                    ..all
                },
            ),
        ],
        _ => Vec::new(),
    };
    named
        .into_iter()
        .map(|(name, controls)| controlled_config(name, exe, time_scale, controls))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_and_windows_are_the_defaults_in_wall_time() {
        let t = controlled_config(
            "x",
            Path::new("/bin/sluice"),
            4.0,
            Controls {
                round_robin: true,
                queue: true,
                codel: true,
                adaptive: Some(SEED_ITL_MS),
            },
        );
        let argv = t.argv.join(" ");
        for flags in [
            "--codel-target-ms-by-tier 50,250,7500",
            "--codel-interval-ms 1250",
            "--adaptive-window-secs 2.5",
            "--adaptive-itl-breach-ms 6.25",
            "--adaptive-itl-healthy-ms 3.75",
            "--policy round_robin",
        ] {
            assert!(argv.contains(flags), "{flags} in {argv}");
        }
    }
}
