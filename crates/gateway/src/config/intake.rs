//! The intake's settings: where a client's request id is read from, the largest body, the bodies
//! held at once, what a body may ask for, and the time it has to arrive. They build the front
//! stage's `FrontConfig` (with the overload section's `Answers`), which it takes whole (and admin
//! reads the body time of).

use clap::Args;
use serde::{Deserialize, Serialize};

use super::checks::{invalid, positive_count, positive_seconds};
use super::{header_names, ConfigError};
use crate::front::{Answers, FrontConfig, Intake, RequestLimits};

/// The request flags (`sluice serve --help`, "Requests", and the body's time).
#[derive(Debug, Clone, Args, Serialize, Deserialize, PartialEq)]
pub struct IntakeSettings {
    /// Request headers a client's own request id is taken from, the first present and sane one
    /// winning (SMG's flag; several after one flag, comma-separated or repeated); the id goes to
    /// the worker and back to the client as `x-request-id`.
    #[arg(
        long,
        value_delimiter = ',',
        num_args = 1..,
        default_values_t = ["x-request-id".to_string()]
    )]
    #[arg(help_heading = "Requests")]
    pub request_id_headers: Vec<String>,

    /// Largest request body accepted, in bytes.
    #[arg(long, default_value_t = 64 * 1024 * 1024)]
    #[arg(help_heading = "Requests")]
    pub(crate) max_payload_size: usize,

    /// Bytes of request bodies the gateway holds at once (each is read whole, then sent on);
    /// past it a request is refused with 503 `request_buffers_full` and `Retry-After` rather than
    /// grow the gateway's memory. At least --max-payload-size.
    #[arg(long, default_value_t = 256 * 1024 * 1024)]
    #[arg(help_heading = "Requests")]
    pub(crate) max_buffered_body_bytes: usize,

    /// Largest `n` (choices per request) accepted; more is a 400 naming `n`. Each choice is a
    /// sequence the engine runs, and counts in a worker's load. 128 is OpenAI's own maximum.
    #[arg(long, default_value_t = 128)]
    #[arg(help_heading = "Requests")]
    pub(crate) max_n: u64,

    /// Largest `max_tokens` / `max_completion_tokens` accepted; more is a 400 naming the field.
    /// Unset: the engine's context length is the only bound.
    #[arg(long, value_name = "TOKENS")]
    #[serde(default)]
    #[arg(help_heading = "Requests")]
    pub(crate) max_tokens_limit: Option<u64>,

    /// Time a client has to send a whole request body once its head arrived; a stalled or
    /// dripping body is cut with 408 `body_read_timeout` (and cannot hold shutdown longer).
    #[arg(long, default_value_t = 30.0)]
    #[arg(help_heading = "Listener")]
    pub(crate) body_read_timeout_secs: f64,
}

impl IntakeSettings {
    /// The front stage's config; `answers`: how refusals are answered (the overload section's).
    pub(super) fn validate(&self, answers: Answers) -> Result<FrontConfig, ConfigError> {
        Ok(FrontConfig {
            intake: self.intake()?,
            request_id_headers: header_names("request-id-headers", &self.request_id_headers)?,
            answers,
        })
    }

    fn intake(&self) -> Result<Intake, ConfigError> {
        Ok(Intake {
            max_payload: self.max_payload_size,
            max_buffered: self.body_budget()?,
            body_read_timeout: positive_seconds(
                "body-read-timeout-secs",
                self.body_read_timeout_secs,
            )?,
            limits: RequestLimits {
                max_n: positive_count("max-n", self.max_n)?,
                max_tokens: match self.max_tokens_limit {
                    Some(n) => Some(positive_count("max-tokens-limit", n)?),
                    None => None,
                },
            },
        })
    }

    /// `--max-buffered-body-bytes`: at least one body of the largest size, and in a semaphore's
    /// range.
    fn body_budget(&self) -> Result<usize, ConfigError> {
        let budget = self.max_buffered_body_bytes;
        if budget < self.max_payload_size || u32::try_from(budget).is_err() {
            return Err(invalid(
                "max-buffered-body-bytes",
                format!(
                    "{budget} must be at least --max-payload-size ({}) and under 4 GiB",
                    self.max_payload_size
                ),
            ));
        }
        Ok(budget)
    }
}
