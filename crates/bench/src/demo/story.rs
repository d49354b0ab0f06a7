//! The demo's story: acts over the run, each with the load it offers (a share of the fleet's
//! capacity) and what happens to the fleet. Pure: `Story::of` lays the acts out in time, the
//! driver plays them.

use std::time::Duration;

use crate::arrivals::{Schedule, Segment};

/// What the fleet goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// Steady load, a surge to three times capacity, an engine that freezes, an engine that
    /// crashes and restarts, then calm.
    Story,
    /// Steady, the surge, calm.
    Surge,
    /// Steady, a frozen engine, calm.
    Freeze,
    /// Steady, a crash and restart, calm.
    Crash,
}

/// What happens to the fleet in an act.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Incident {
    None,
    /// One engine's scheduler stops; its HTTP side keeps answering. Cleared when the act ends.
    Freeze,
    /// One engine is killed (SIGKILL); it is started again halfway through the act.
    Crash,
}

/// One act.
#[derive(Debug, Clone, PartialEq)]
pub struct Act {
    pub name: &'static str,
    /// The line printed and shown as it begins.
    pub narration: &'static str,
    /// Offered load, as a share of the fleet's capacity.
    pub load: f64,
    pub incident: Incident,
    pub start: Duration,
    pub end: Duration,
}

const STEADY: f64 = 0.6;
const SURGE: f64 = 3.0;
const INCIDENT_LOAD: f64 = 0.6;
const CALM: f64 = 0.3;

fn act(name: &'static str, narration: &'static str, load: f64, incident: Incident) -> Act {
    Act {
        name,
        narration,
        load,
        incident,
        start: Duration::ZERO,
        end: Duration::ZERO,
    }
}

/// The acts of a run, laid out in time.
#[derive(Debug, Clone, PartialEq)]
pub struct Story {
    pub acts: Vec<Act>,
}

impl Story {
    /// `scenario`'s acts, sharing `duration` equally.
    pub fn of(scenario: Scenario, duration: Duration) -> Self {
        let steady = act(
            "steady",
            "steady load, 60% of what the fleet can serve",
            STEADY,
            Incident::None,
        );
        let surge = act(
            "surge",
            "a surge: three times what the fleet can serve",
            SURGE,
            Incident::None,
        );
        let freeze = act(
            "freeze",
            "an engine freezes: it still answers health checks, but generates nothing",
            INCIDENT_LOAD,
            Incident::Freeze,
        );
        let crash = act(
            "crash",
            "an engine crashes (SIGKILL), and restarts halfway through the act",
            INCIDENT_LOAD,
            Incident::Crash,
        );
        let calm = act(
            "calm",
            "calm: 30% load, the fleet whole again",
            CALM,
            Incident::None,
        );
        let mut acts = match scenario {
            Scenario::Story => vec![steady, surge, freeze, crash, calm],
            Scenario::Surge => vec![steady, surge, calm],
            Scenario::Freeze => vec![steady, freeze, calm],
            Scenario::Crash => vec![steady, crash, calm],
        };
        let each = duration / acts.len() as u32;
        for (i, act) in acts.iter_mut().enumerate() {
            act.start = each * i as u32;
            act.end = each * (i as u32 + 1);
        }
        Self { acts }
    }

    pub fn duration(&self) -> Duration {
        self.acts.last().map_or(Duration::ZERO, |a| a.end)
    }

    /// The offered rate over the story for a model whose capacity is `capacity` requests per
    /// wall second.
    pub fn schedule(&self, capacity: f64) -> Schedule {
        let mut schedule = Schedule::constant(capacity);
        schedule.segments = self
            .acts
            .iter()
            .map(|a| Segment::Step {
                start: a.start,
                end: a.end,
                factor: a.load,
            })
            .collect();
        schedule
    }

    /// The act under way at `t`.
    pub fn at(&self, t: Duration) -> Option<(usize, &Act)> {
        self.acts
            .iter()
            .enumerate()
            .find(|(_, a)| t >= a.start && t < a.end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_story_has_five_acts_in_order_sharing_the_duration() {
        let story = Story::of(Scenario::Story, Duration::from_secs(150));
        let names: Vec<_> = story.acts.iter().map(|a| a.name).collect();
        assert_eq!(names, ["steady", "surge", "freeze", "crash", "calm"]);
        assert_eq!(story.acts[1].start, Duration::from_secs(30));
        assert_eq!(story.duration(), Duration::from_secs(150));
        assert_eq!(story.acts[1].load, 3.0, "three times capacity");
        assert_eq!(story.acts[2].incident, Incident::Freeze);
        assert_eq!(story.acts[3].incident, Incident::Crash);
        assert_eq!(story.at(Duration::from_secs(45)).map(|(i, _)| i), Some(1));
        assert_eq!(story.at(Duration::from_secs(150)), None, "over");
    }

    #[test]
    fn the_schedule_offers_each_acts_share_of_capacity() {
        let story = Story::of(Scenario::Surge, Duration::from_secs(30));
        let schedule = story.schedule(20.0);
        let at = |s| schedule.rate_at(Duration::from_secs(s));
        assert_eq!((at(5), at(15), at(25)), (12.0, 60.0, 6.0));
    }
}
