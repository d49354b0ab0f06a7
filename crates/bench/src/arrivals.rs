//! Open-loop arrivals: when each request is due, decided before the run and independent of how
//! earlier requests fare, so a slow server cannot slow the load down (no coordinated omission).
//!
//! The offered rate follows a schedule (a base rate, step spikes, linear ramps). Gaps between
//! arrivals are exponential (Poisson) or gamma with a burstiness parameter, as in vLLM's serving
//! benchmark: burstiness 1 is Poisson, below 1 burstier, above 1 more even. Each gap is drawn at
//! the rate in force when it starts, which follows a step to within one gap.

use std::time::Duration;

use rand::SeedableRng;
use rand_distr::{Distribution, Gamma};

/// A change to the base rate over part of the run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Segment {
    /// `factor` x the base rate from `start` to `end` (e.g. 1x -> 3x for 60 s -> 1x).
    Step {
        start: Duration,
        end: Duration,
        factor: f64,
    },
    /// From `from` x to `to` x the base rate, linearly, between `start` and `end`; `to` holds
    /// after `end`.
    Ramp {
        start: Duration,
        end: Duration,
        from: f64,
        to: f64,
    },
}

/// The offered rate over time.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// Requests per second.
    pub base: f64,
    pub segments: Vec<Segment>,
}

impl Schedule {
    pub fn constant(rate: f64) -> Self {
        Self {
            base: rate,
            segments: Vec::new(),
        }
    }

    /// Requests per second at `t`: the base times the factor of the last segment covering `t`.
    pub fn rate_at(&self, t: Duration) -> f64 {
        let mut factor = 1.0;
        for segment in &self.segments {
            match *segment {
                Segment::Step {
                    start,
                    end,
                    factor: f,
                } if t >= start && t < end => factor = f,
                Segment::Ramp {
                    start,
                    end,
                    from,
                    to,
                } if t >= start => {
                    factor = if t >= end || end <= start {
                        to
                    } else {
                        let x = (t - start).as_secs_f64() / (end - start).as_secs_f64();
                        from + (to - from) * x
                    };
                }
                _ => {}
            }
        }
        (self.base * factor).max(0.0)
    }
}

/// The shape of the gaps between arrivals.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Process {
    Poisson,
    /// Gamma gaps with shape `burstiness` (coefficient of variation 1/sqrt(burstiness)).
    Gamma {
        burstiness: f64,
    },
}

/// Why a schedule cannot produce arrivals.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ArrivalError {
    #[error("burstiness must be greater than 0, not {0}")]
    Burstiness(f64),
}

/// Arrival times from the start of the run, bounded by `max_requests` and `duration`.
pub fn arrivals(
    schedule: &Schedule,
    process: Process,
    seed: u64,
    max_requests: usize,
    duration: Duration,
) -> Result<Vec<Duration>, ArrivalError> {
    let shape = match process {
        Process::Poisson => 1.0,
        Process::Gamma { burstiness } if burstiness > 0.0 && burstiness.is_finite() => burstiness,
        Process::Gamma { burstiness } => return Err(ArrivalError::Burstiness(burstiness)),
    };
    // Unit-mean gaps, scaled by the rate in force.
    let unit = Gamma::new(shape, 1.0 / shape).map_err(|_| ArrivalError::Burstiness(shape))?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    let mut t = Duration::ZERO;
    // Where the rate is zero, time advances in small steps until it is not.
    let idle_step = Duration::from_millis(10);
    while out.len() < max_requests {
        let rate = schedule.rate_at(t);
        if rate <= 0.0 {
            t += idle_step;
            if t >= duration {
                break;
            }
            continue;
        }
        let gap = unit.sample(&mut rng) / rate;
        t += Duration::try_from_secs_f64(gap).unwrap_or(duration);
        if t >= duration {
            break;
        }
        out.push(t);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn gaps(times: &[Duration]) -> Vec<f64> {
        let mut prev = Duration::ZERO;
        times
            .iter()
            .map(|&t| {
                let g = (t - prev).as_secs_f64();
                prev = t;
                g
            })
            .collect()
    }

    fn mean_and_cv(xs: &[f64]) -> (f64, f64) {
        let n = xs.len() as f64;
        let mean = xs.iter().sum::<f64>() / n;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
        (mean, var.sqrt() / mean)
    }

    #[test]
    fn poisson_arrivals_keep_the_rate_and_a_cv_of_one() {
        let t = arrivals(
            &Schedule::constant(100.0),
            Process::Poisson,
            7,
            20_000,
            secs(1_000),
        )
        .unwrap();
        assert_eq!(t.len(), 20_000);
        let (mean, cv) = mean_and_cv(&gaps(&t));
        assert!((mean - 0.01).abs() < 0.0003, "mean gap {mean}");
        assert!((cv - 1.0).abs() < 0.05, "cv {cv}");
    }

    #[test]
    fn burstiness_sets_the_spread_not_the_rate() {
        for (burstiness, want_cv) in [(0.25, 2.0), (4.0, 0.5)] {
            let t = arrivals(
                &Schedule::constant(50.0),
                Process::Gamma { burstiness },
                11,
                40_000,
                secs(10_000),
            )
            .unwrap();
            let (mean, cv) = mean_and_cv(&gaps(&t));
            assert!(
                (mean - 0.02).abs() < 0.001,
                "burstiness {burstiness}: mean gap {mean}"
            );
            assert!(
                (cv - want_cv).abs() < want_cv * 0.1,
                "burstiness {burstiness}: cv {cv}"
            );
        }
        assert_eq!(
            arrivals(
                &Schedule::constant(1.0),
                Process::Gamma { burstiness: 0.0 },
                1,
                10,
                secs(10)
            ),
            Err(ArrivalError::Burstiness(0.0))
        );
    }

    #[test]
    fn a_step_spike_triples_the_arrivals_in_its_window() {
        let schedule = Schedule {
            base: 20.0,
            segments: vec![Segment::Step {
                start: secs(60),
                end: secs(120),
                factor: 3.0,
            }],
        };
        let t = arrivals(&schedule, Process::Poisson, 3, usize::MAX, secs(180)).unwrap();
        let count =
            |a: u64, b: u64| t.iter().filter(|&&x| x >= secs(a) && x < secs(b)).count() as f64;
        let (before, during, after) = (count(0, 60), count(60, 120), count(120, 180));
        assert!((during / before - 3.0).abs() < 0.3, "{before} {during}");
        assert!((after / before - 1.0).abs() < 0.15, "{before} {after}");
    }

    #[test]
    fn ramps_interpolate_and_hold() {
        let schedule = Schedule {
            base: 10.0,
            segments: vec![Segment::Ramp {
                start: secs(10),
                end: secs(20),
                from: 1.0,
                to: 4.0,
            }],
        };
        assert_eq!(schedule.rate_at(secs(5)), 10.0);
        assert_eq!(schedule.rate_at(secs(15)), 25.0);
        assert_eq!(schedule.rate_at(secs(30)), 40.0);
    }

    #[test]
    fn runs_are_bounded_and_reproducible() {
        let s = Schedule::constant(1000.0);
        let a = arrivals(&s, Process::Poisson, 42, 100, secs(60)).unwrap();
        let b = arrivals(&s, Process::Poisson, 42, 100, secs(60)).unwrap();
        assert_eq!(a, b, "same seed, same run");
        assert_eq!(a.len(), 100, "bounded by count");
        let c = arrivals(&s, Process::Poisson, 43, 100, secs(60)).unwrap();
        assert_ne!(a, c);
        let short = arrivals(
            &s,
            Process::Poisson,
            42,
            usize::MAX,
            Duration::from_millis(500),
        )
        .unwrap();
        assert!(
            short.iter().all(|t| *t < Duration::from_millis(500)),
            "bounded by time"
        );
        assert!(short.windows(2).all(|w| w[0] <= w[1]), "in order");
        let silent = Schedule {
            base: 10.0,
            segments: vec![Segment::Step {
                start: secs(0),
                end: secs(5),
                factor: 0.0,
            }],
        };
        let t = arrivals(&silent, Process::Poisson, 1, usize::MAX, secs(10)).unwrap();
        assert!(
            t.first().is_some_and(|f| *f >= secs(5)),
            "no arrival while the rate is zero"
        );
    }
}
