//! Faults that can be injected into an engine, through the control listener or at startup.
//!
//! Most faults are standing conditions (`wedge`, `slow`, `hang`, ...) kept in a `FaultSet` that
//! the engine's loops and handlers read from a `watch` channel. Each imitates a failure as the
//! engines' own source has it (docs/simulator.md names the file and release of each). `crash`, `restart` and
//! `slow-start` are actions on the engine's process-like lifetime and are carried out by the
//! fleet. Sleep is not a fault but an operator's act (vLLM's `/sleep`); it lives in the same set
//! because the same loops must stop for it, and a restart wakes the engine as it clears faults.

use serde::{Deserialize, Serialize};

/// How the load endpoints (`/metrics`, `/load`, `/v1/loads`, `/get_load`) misbehave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LoadEndpointMode {
    /// Answer 500.
    Error,
    /// Answer 200 with an empty body.
    Empty,
    /// Never answer.
    Timeout,
}

/// What a wedged engine's load endpoints do (`/v1/loads`, `/get_load`; SGLang only: vLLM's
/// `/metrics` and `/load` are served by its API process, which is not stuck).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WedgedPolls {
    /// Answered at once with the figures of the last step: SGLang's scheduler writes a load
    /// snapshot after each batch into shared memory, which `/v1/loads` reads
    /// (`managers/load_snapshot.py`, `Scheduler.publish_load_snapshot`).
    #[default]
    Stale,
    /// Never answered: releases whose tokenizer manager asks the scheduler for its loads over
    /// ZMQ and waits for the reply without a timeout (`_Communicator` in
    /// `managers/tokenizer_communicator_mixin.py`), which a stuck scheduler never sends.
    Unanswered,
}

/// What vLLM's `/sleep?level=N` offloads or discards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SleepLevel {
    /// Level 1: weights offloaded to host memory, KV cache discarded.
    WeightsOffloaded,
    /// Level 2: weights and KV cache discarded.
    DiscardAll,
}

impl SleepLevel {
    /// vLLM's `level` query parameter.
    pub fn from_level(level: u8) -> Option<Self> {
        match level {
            1 => Some(SleepLevel::WeightsOffloaded),
            2 => Some(SleepLevel::DiscardAll),
            _ => None,
        }
    }

    /// The `sleep_state` label of `vllm:engine_sleep_state`.
    pub fn label(self) -> &'static str {
        match self {
            SleepLevel::WeightsOffloaded => "weights_offloaded",
            SleepLevel::DiscardAll => "discard_all",
        }
    }
}

/// One fault, as posted to `POST /engines/{i}/fault`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Fault {
    /// The engine core (vLLM) or scheduler (SGLang) is stuck inside a step — a CUDA kernel or
    /// collective that never returns: it takes in nothing (arrivals and aborts wait in its input
    /// queue), steps no more and publishes nothing, so every gauge it reports stands at the last
    /// step's value, however many requests pile up behind it. The API process is not stuck:
    /// it accepts requests (a stream's head is sent at once), vLLM's `/health` and `/metrics`
    /// answer 200 with the stale figures, SGLang's `/health` fails after 20 s without output
    /// and its load endpoints answer as `polls` says.
    Wedge {
        #[serde(default)]
        polls: WedgedPolls,
    },
    /// The scheduler keeps taking requests and aborts, and reporting them, but runs nothing:
    /// SGLang's `/pause_generation` in its `in_place` mode (an operator's act, for weight
    /// updates, not a failure).
    Pause,
    /// The listener closes and every connection is reset.
    Crash,
    /// The engine comes back, empty, on the same port.
    Restart,
    /// Every step takes `factor` times longer.
    Slow { factor: f64 },
    /// This share of requests is answered 500.
    ErrorRate { rate: f64 },
    /// The API process hangs (its event loop never yields): connections are accepted (by the
    /// kernel) and nothing is answered — generation, `/health`, `/metrics`, loads — and streams
    /// in flight stop; the engine behind it runs on. Lifting it delivers what was held, and
    /// serves the requests that waited, as a stalled event loop does when it resumes.
    Hang,
    /// Streams end mid-way without `data: [DONE]`.
    CutStreams,
    /// This share of requests fails inside the engine once half its answer is out: a stream
    /// gets an error event in the flavor's shape and then `data: [DONE]`, as vLLM's and
    /// SGLang's serving layers send it; a whole answer gets the error with that status. `code`
    /// 500 is the engine's failure; a 4xx (400: a tool call it could not parse) is the client's.
    ErrorEvent {
        #[serde(default = "always")]
        rate: f64,
        #[serde(default = "engine_failure")]
        code: u16,
    },
    /// The engine restarts and takes `secs` engine-seconds to start: SGLang answers `/health`
    /// 503 meanwhile (`ServerStatus.Starting`); vLLM's port refuses connections until then (it
    /// binds its socket before the engine is built, but listens only once serving).
    SlowStart { secs: f64 },
    /// Puts the engine to sleep as vLLM's `/sleep?level=N` does (1: weights offloaded, 2:
    /// discarded): nothing is scheduled until `wake`; `vllm:engine_sleep_state` shows it.
    Sleep {
        #[serde(default = "level_one")]
        level: u8,
    },
    /// Wakes a sleeping engine (vLLM's `/wake_up`).
    Wake,
    /// The load endpoints fail in the given way.
    LoadEndpoint { mode: LoadEndpointMode },
    /// The KV-event stream goes quiet: no more batches, no heartbeats, the stream left open;
    /// generation, polls and health answer as before (a servicer whose relay stalled).
    EventsStop,
    /// Nothing comes back from the engine any more — no answers, no tokens, no events, no
    /// heartbeats — while requests still reach it and connections stay up: a link that carries
    /// traffic one way only, which no transport error reports.
    OneWay,
    /// `GetTokenizer` fails with `FAILED_PRECONDITION`, as a servicer started without a
    /// tokenizer path answers it; everything else answers as before.
    NoTokenizer,
    /// Pins what the load endpoints report, without changing what the engine does. Fields left
    /// out keep their real value; `rank` picks one data-parallel rank (all when left out).
    Report {
        #[serde(default)]
        rank: Option<u32>,
        #[serde(default)]
        waiting: Option<u64>,
        #[serde(default)]
        running: Option<u64>,
        #[serde(default)]
        kv_usage: Option<f64>,
    },
    /// Removes every standing fault.
    Clear,
}

fn always() -> f64 {
    1.0
}

fn engine_failure() -> u16 {
    500
}

fn level_one() -> u8 {
    1
}

/// A reported load pinned by the `report` fault.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PinnedLoad {
    pub waiting: Option<u64>,
    pub running: Option<u64>,
    pub kv_usage: Option<f64>,
}

/// The standing faults of one engine.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FaultSet {
    /// Stuck inside a step, and what its load endpoints then do.
    pub wedged: Option<WedgedPolls>,
    /// Taking requests in, running none.
    pub paused: bool,
    pub slow_factor: f64,
    pub error_rate: f64,
    pub hang: bool,
    pub cut_streams: bool,
    /// The gRPC event stream sends nothing more.
    pub events_stopped: bool,
    /// Nothing the engine sends reaches its peer.
    pub one_way: bool,
    /// `GetTokenizer` is refused.
    pub no_tokenizer: bool,
    /// The share of requests failed by an error event, and the status it carries.
    pub error_event: Option<(f64, u16)>,
    /// Asleep, and how deeply.
    pub asleep: Option<SleepLevel>,
    pub load_endpoint: Option<LoadEndpointMode>,
    /// Pinned reports, one slot per data-parallel rank.
    pub report: Vec<PinnedLoad>,
}

/// A fault that cannot be applied.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FaultError {
    #[error("slow factor must be a finite number >= 1, got {0}")]
    SlowFactor(f64),
    #[error("error rate must be between 0 and 1, got {0}")]
    ErrorRate(f64),
    #[error("kv_usage must be between 0 and 1, got {0}")]
    KvUsage(f64),
    #[error("rank {rank} does not exist: the engine has {dp_size} data-parallel ranks")]
    NoSuchRank { rank: u32, dp_size: u32 },
    #[error("an error event's code must be an HTTP error status (400-599), got {0}")]
    ErrorCode(u16),
    #[error("sleep level must be 1 or 2, got {0}")]
    SleepLevel(u8),
    #[error("slow-start secs must be a finite number >= 0, got {0}")]
    StartSecs(f64),
}

impl FaultSet {
    /// The engine takes no step: paused, asleep or wedged inside one.
    pub fn stops_steps(&self) -> bool {
        self.paused || self.asleep.is_some() || self.wedged.is_some()
    }

    pub fn new(dp_size: u32) -> Self {
        Self {
            wedged: None,
            paused: false,
            slow_factor: 1.0,
            error_rate: 0.0,
            hang: false,
            cut_streams: false,
            events_stopped: false,
            one_way: false,
            no_tokenizer: false,
            error_event: None,
            asleep: None,
            load_endpoint: None,
            report: vec![PinnedLoad::default(); dp_size as usize],
        }
    }

    /// Applies a standing fault (crash and restart are not standing and change nothing here).
    pub fn apply(&mut self, fault: &Fault) -> Result<(), FaultError> {
        match *fault {
            Fault::Wedge { polls } => self.wedged = Some(polls),
            Fault::Pause => self.paused = true,
            Fault::Crash | Fault::Restart => {}
            Fault::SlowStart { secs } => {
                if !(secs.is_finite() && secs >= 0.0) {
                    return Err(FaultError::StartSecs(secs));
                }
            }
            Fault::Slow { factor } => {
                if !(factor.is_finite() && factor >= 1.0) {
                    return Err(FaultError::SlowFactor(factor));
                }
                self.slow_factor = factor;
            }
            Fault::ErrorRate { rate } => {
                if !(0.0..=1.0).contains(&rate) {
                    return Err(FaultError::ErrorRate(rate));
                }
                self.error_rate = rate;
            }
            Fault::Hang => self.hang = true,
            Fault::CutStreams => self.cut_streams = true,
            Fault::EventsStop => self.events_stopped = true,
            Fault::OneWay => self.one_way = true,
            Fault::NoTokenizer => self.no_tokenizer = true,
            Fault::ErrorEvent { rate, code } => {
                if !(0.0..=1.0).contains(&rate) {
                    return Err(FaultError::ErrorRate(rate));
                }
                if !(400..600).contains(&code) {
                    return Err(FaultError::ErrorCode(code));
                }
                self.error_event = Some((rate, code));
            }
            Fault::Sleep { level } => {
                self.asleep =
                    Some(SleepLevel::from_level(level).ok_or(FaultError::SleepLevel(level))?)
            }
            Fault::Wake => self.asleep = None,
            Fault::LoadEndpoint { mode } => self.load_endpoint = Some(mode),
            Fault::Report {
                rank,
                waiting,
                running,
                kv_usage,
            } => self.pin_report(rank, waiting, running, kv_usage)?,
            Fault::Clear => *self = Self::new(self.report.len() as u32),
        }
        Ok(())
    }

    fn pin_report(
        &mut self,
        rank: Option<u32>,
        waiting: Option<u64>,
        running: Option<u64>,
        kv_usage: Option<f64>,
    ) -> Result<(), FaultError> {
        if let Some(kv) = kv_usage {
            if !(0.0..=1.0).contains(&kv) {
                return Err(FaultError::KvUsage(kv));
            }
        }
        let dp_size = self.report.len() as u32;
        let slots: Vec<&mut PinnedLoad> = match rank {
            Some(r) if r >= dp_size => return Err(FaultError::NoSuchRank { rank: r, dp_size }),
            Some(r) => vec![&mut self.report[r as usize]],
            None => self.report.iter_mut().collect(),
        };
        for slot in slots {
            slot.waiting = waiting.or(slot.waiting);
            slot.running = running.or(slot.running);
            slot.kv_usage = kv_usage.or(slot.kv_usage);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_parse_from_the_documented_json() {
        let parse = |s: &str| serde_json::from_str::<Fault>(s).unwrap();
        assert_eq!(
            parse(r#"{"kind":"wedge"}"#),
            Fault::Wedge {
                polls: WedgedPolls::Stale
            }
        );
        assert_eq!(
            parse(r#"{"kind":"wedge","polls":"unanswered"}"#),
            Fault::Wedge {
                polls: WedgedPolls::Unanswered
            }
        );
        assert_eq!(parse(r#"{"kind":"pause"}"#), Fault::Pause);
        assert!(
            serde_json::from_str::<Fault>(r#"{"kind":"freeze"}"#).is_err(),
            "no engine freezes that way: `wedge` or `pause`"
        );
        assert_eq!(
            parse(r#"{"kind":"slow","factor":3}"#),
            Fault::Slow { factor: 3.0 }
        );
        assert_eq!(
            parse(r#"{"kind":"error-rate","rate":0.5}"#),
            Fault::ErrorRate { rate: 0.5 }
        );
        assert_eq!(
            parse(r#"{"kind":"load-endpoint","mode":"timeout"}"#),
            Fault::LoadEndpoint {
                mode: LoadEndpointMode::Timeout
            }
        );
        assert_eq!(
            parse(r#"{"kind":"error-event"}"#),
            Fault::ErrorEvent {
                rate: 1.0,
                code: 500
            }
        );
        assert_eq!(parse(r#"{"kind":"sleep"}"#), Fault::Sleep { level: 1 });
        assert_eq!(parse(r#"{"kind":"events-stop"}"#), Fault::EventsStop);
        assert_eq!(parse(r#"{"kind":"one-way"}"#), Fault::OneWay);
        assert_eq!(parse(r#"{"kind":"no-tokenizer"}"#), Fault::NoTokenizer);
        assert_eq!(
            parse(r#"{"kind":"slow-start","secs":30}"#),
            Fault::SlowStart { secs: 30.0 }
        );
        assert!(serde_json::from_str::<Fault>(r#"{"kind":"melt"}"#).is_err());
        assert!(serde_json::from_str::<Fault>(r#"{"kind":"slow"}"#).is_err());
    }

    #[test]
    fn a_report_pins_only_the_fields_and_ranks_it_names() {
        let mut set = FaultSet::new(2);
        let report = |rank, waiting, kv_usage| Fault::Report {
            rank,
            waiting,
            running: None,
            kv_usage,
        };
        set.apply(&report(None, Some(5), None)).unwrap();
        set.apply(&report(Some(1), None, Some(0.9))).unwrap();
        assert_eq!(set.report[0].waiting, Some(5));
        assert_eq!(set.report[0].kv_usage, None);
        assert_eq!(set.report[1].kv_usage, Some(0.9));
        assert_eq!(set.report[1].waiting, Some(5));
        assert_eq!(
            set.apply(&report(Some(2), None, None)),
            Err(FaultError::NoSuchRank {
                rank: 2,
                dp_size: 2
            })
        );
        set.apply(&Fault::Clear).unwrap();
        assert_eq!(set, FaultSet::new(2));
    }

    #[test]
    fn out_of_range_faults_are_refused() {
        let mut set = FaultSet::new(1);
        assert!(set.apply(&Fault::Slow { factor: 0.5 }).is_err());
        assert!(set.apply(&Fault::ErrorRate { rate: 1.5 }).is_err());
        assert!(set
            .apply(&Fault::ErrorEvent {
                rate: 1.0,
                code: 200
            })
            .is_err());
        assert!(set.apply(&Fault::Sleep { level: 3 }).is_err());
        assert!(set.apply(&Fault::SlowStart { secs: -1.0 }).is_err());
        assert_eq!(set, FaultSet::new(1));
    }
}
