//! The matrix the `liveness` scenario runs: each failure as an engine really fails, each kind
//! of client as clients really behave.

use std::time::Duration;

use serde::Serialize;
use sluice_sim::{Fault, WedgedPolls};

use crate::client::{Behaviour, ClientKind, Patience};

/// How the faulty engine fails (docs/simulator.md cites each from the engine's source).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Failure {
    /// vLLM's engine core stuck inside a step: gauges stand at the last step, `/health` 200.
    VllmWedged,
    /// SGLang's scheduler stuck inside a step, its loads read from the last snapshot (newer
    /// releases).
    SglangWedged,
    /// The same on releases whose `/v1/loads` asks the scheduler: polls go unanswered.
    SglangWedgedSilentPolls,
    /// vLLM's API process hung: nothing answered, not even `/health`.
    ApiHung,
    /// The engine killed (SIGKILL) and started again.
    Crash,
    /// Every step four times longer: healthy, but slow.
    Slow,
    /// Healthy: a 128k-token prompt sent to it directly (another replica's client), prefilled
    /// for seconds without a byte. It ends by itself.
    LongPrefill,
}

/// How much longer a slow engine's steps take.
pub const SLOWDOWN: f64 = 4.0;
/// The long prompt, in tokens (4 bytes each as the simulator counts text): with its one answer
/// token, Llama 3's whole 131,072-token context.
pub const LONG_PROMPT_TOKENS: usize = 131_071;

impl Failure {
    pub const ALL: [Failure; 7] = [
        Failure::VllmWedged,
        Failure::SglangWedged,
        Failure::SglangWedgedSilentPolls,
        Failure::ApiHung,
        Failure::Crash,
        Failure::Slow,
        Failure::LongPrefill,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Failure::VllmWedged => "vllm-wedged",
            Failure::SglangWedged => "sglang-wedged",
            Failure::SglangWedgedSilentPolls => "sglang-wedged-silent-polls",
            Failure::ApiHung => "api-hung",
            Failure::Crash => "crash",
            Failure::Slow => "slow",
            Failure::LongPrefill => "long-prefill",
        }
    }

    /// The engines' wire: SGLang's for its own failures, vLLM's for the rest.
    pub fn flavor(self) -> &'static str {
        match self {
            Failure::SglangWedged | Failure::SglangWedgedSilentPolls => "sglang",
            _ => "vllm",
        }
    }

    /// The standing fault that makes it, if it is one (a crash and a long prompt are acts).
    pub fn fault(self) -> Option<Fault> {
        match self {
            Failure::VllmWedged | Failure::SglangWedged => Some(Fault::Wedge {
                polls: WedgedPolls::Stale,
            }),
            Failure::SglangWedgedSilentPolls => Some(Fault::Wedge {
                polls: WedgedPolls::Unanswered,
            }),
            Failure::ApiHung => Some(Fault::Hang),
            Failure::Slow => Some(Fault::Slow { factor: SLOWDOWN }),
            Failure::Crash | Failure::LongPrefill => None,
        }
    }

    /// A healthy engine that must never be taken out.
    pub fn healthy(self) -> bool {
        matches!(self, Failure::Slow | Failure::LongPrefill)
    }

    /// Whether the engine's own arrival counter can be read through it (a killed engine's
    /// cannot).
    pub fn counter_readable(self) -> bool {
        self != Failure::Crash
    }
}

/// How long a client waits before it gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Wait {
    /// The OpenAI SDK with `timeout=N` seconds: httpx's read timeout, retried twice while no
    /// answer has begun.
    Sdk { secs: u32 },
    /// Never gives up (the SDK's 600-second default is as good as never here).
    Patient,
    /// Sends `X-Request-Deadline-Ms` and gives up when it is spent; no retries.
    Deadline { ms: u32 },
}

/// One kind of client: streaming or not, how long it waits, how many send at once (each sends
/// its next request when its last one ended).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Clients {
    pub stream: bool,
    pub wait: Wait,
    pub count: u32,
}

impl Clients {
    /// The full matrix: streaming and not; SDK timeouts of 1, 3 and 30 s, none, a 2000-ms
    /// deadline; 1 client and 16 at once.
    pub fn all() -> Vec<Clients> {
        let waits = [
            Wait::Sdk { secs: 1 },
            Wait::Sdk { secs: 3 },
            Wait::Sdk { secs: 30 },
            Wait::Patient,
            Wait::Deadline { ms: 2000 },
        ];
        let mut all = Vec::new();
        for stream in [true, false] {
            for wait in waits {
                for count in [1, 16] {
                    all.push(Clients {
                        stream,
                        wait,
                        count,
                    });
                }
            }
        }
        all
    }

    /// `--quick`'s one kind: the report's own client, 16 of them streaming with the SDK's
    /// retries and a 3-second timeout.
    pub fn quick() -> Clients {
        Clients {
            stream: true,
            wait: Wait::Sdk { secs: 3 },
            count: 16,
        }
    }

    pub fn label(&self) -> String {
        let wait = match self.wait {
            Wait::Sdk { secs } => format!("sdk {secs}s"),
            Wait::Patient => "patient".to_string(),
            Wait::Deadline { ms } => format!("deadline {ms}ms"),
        };
        let shape = if self.stream { "stream" } else { "whole" };
        format!("{shape} {wait} x{}", self.count)
    }

    pub fn behaviour(&self) -> Behaviour {
        let (retries, patience) = match self.wait {
            Wait::Sdk { secs } => (
                ClientKind::Sdk,
                Patience {
                    idle: Some(Duration::from_secs(u64::from(secs))),
                    ..Patience::default()
                },
            ),
            Wait::Patient => (ClientKind::None, Patience::default()),
            Wait::Deadline { ms } => (
                ClientKind::None,
                Patience {
                    deadline: Some(Duration::from_millis(u64::from(ms))),
                    ..Patience::default()
                },
            ),
        };
        Behaviour {
            retries,
            patience,
            stream: self.stream,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_full_matrix_has_every_client_kind_once() {
        let all = Clients::all();
        assert_eq!(all.len(), 20);
        let labels: std::collections::BTreeSet<String> = all.iter().map(Clients::label).collect();
        assert_eq!(labels.len(), 20);
        assert!(labels.contains("whole deadline 2000ms x1"));
        assert!(all.contains(&Clients::quick()));
    }

    #[test]
    fn clients_behave_as_their_kind_says() {
        let sdk = Clients::quick().behaviour();
        assert_eq!(sdk.retries, ClientKind::Sdk);
        assert_eq!(sdk.patience.idle, Some(Duration::from_secs(3)));
        let deadline = Clients {
            stream: false,
            wait: Wait::Deadline { ms: 2000 },
            count: 1,
        }
        .behaviour();
        assert_eq!(deadline.retries, ClientKind::None);
        assert_eq!(deadline.patience.deadline, Some(Duration::from_secs(2)));
        assert!(!deadline.stream);
    }

    #[test]
    fn each_failure_is_made_as_the_engine_fails() {
        assert_eq!(Failure::ALL.len(), 7);
        assert_eq!(Failure::SglangWedged.flavor(), "sglang");
        assert_eq!(Failure::ApiHung.fault(), Some(Fault::Hang));
        assert!(Failure::Crash.fault().is_none() && !Failure::Crash.counter_readable());
        assert!(Failure::LongPrefill.healthy() && Failure::Slow.healthy());
        assert!(!Failure::VllmWedged.healthy());
    }
}
