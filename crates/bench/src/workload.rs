//! Request shapes for benchmarks, drawn reproducibly from a seed.

use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, LogNormal};

/// How long prompts and answers are.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Workload {
    /// Prompt lengths are uniform in [min, max] tokens.
    pub prompt_min: u32,
    pub prompt_max: u32,
    /// Answer lengths are log-normal with this median (tokens), capped at `output_max`.
    pub output_median: f64,
    pub output_sigma: f64,
    pub output_max: u32,
}

/// One request's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub prompt_tokens: u32,
    pub output_tokens: u32,
}

/// Draws shapes from a workload.
pub struct ShapeSource {
    workload: Workload,
    rng: rand::rngs::StdRng,
    /// `None` when the spread is zero or invalid: every answer is the median.
    output: Option<LogNormal<f64>>,
}

impl ShapeSource {
    pub fn new(workload: Workload, seed: u64) -> Self {
        let output = (workload.output_sigma > 0.0)
            .then(|| {
                LogNormal::new(workload.output_median.max(1.0).ln(), workload.output_sigma).ok()
            })
            .flatten();
        Self {
            workload,
            rng: rand::rngs::StdRng::seed_from_u64(seed),
            output,
        }
    }

    pub fn next_shape(&mut self) -> Shape {
        let w = self.workload;
        let prompt_tokens = self
            .rng
            .random_range(w.prompt_min.max(1)..=w.prompt_max.max(w.prompt_min.max(1)));
        let output = match &self.output {
            Some(dist) => dist.sample(&mut self.rng).round() as u32,
            None => w.output_median.round() as u32,
        };
        Shape {
            prompt_tokens,
            output_tokens: output.clamp(1, w.output_max.max(1)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_are_reproducible_and_in_range() {
        let w = Workload {
            prompt_min: 100,
            prompt_max: 200,
            output_median: 50.0,
            output_sigma: 1.0,
            output_max: 120,
        };
        let a: Vec<Shape> = {
            let mut s = ShapeSource::new(w, 3);
            (0..200).map(|_| s.next_shape()).collect()
        };
        let b: Vec<Shape> = {
            let mut s = ShapeSource::new(w, 3);
            (0..200).map(|_| s.next_shape()).collect()
        };
        assert_eq!(a, b);
        assert!(a.iter().all(|s| (100..=200).contains(&s.prompt_tokens)));
        assert!(a.iter().all(|s| (1..=120).contains(&s.output_tokens)));
        assert!(
            a.iter().any(|s| s.output_tokens == 120),
            "the cap is reached"
        );
    }
}
