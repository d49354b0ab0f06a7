//! What the gateway says about itself: its log filter (`--log-level`), its latency histograms'
//! buckets (`--prometheus-duration-buckets`) and its traces (`--enable-trace` and the OTLP
//! flags), each checked here.

use std::path::PathBuf;

use clap::Args;
use serde::{Deserialize, Serialize};
use sluice_core::slo::Slos;

use super::checks::invalid;
use super::ConfigError;

/// The levels `--log-level` takes alone, and what tracing calls them (SMG's Python names too).
const LOG_LEVELS: [(&str, &str); 8] = [
    ("trace", "trace"),
    ("debug", "debug"),
    ("info", "info"),
    ("warn", "warn"),
    ("warning", "warn"),
    ("error", "error"),
    ("critical", "error"),
    ("off", "off"),
];

/// The logging, metrics and tracing flags (`sluice serve --help`, "Metrics and logs",
/// "Traces").
#[derive(Debug, Clone, Args, Serialize, Deserialize, PartialEq)]
pub struct TelemetrySettings {
    /// Write one JSON line per request to this file (`-` for stdout).
    #[arg(long, value_name = "FILE")]
    #[serde(default)]
    #[arg(help_heading = "Metrics and logs")]
    pub(crate) access_log: Option<PathBuf>,

    /// Export a trace of each sampled request to an OpenTelemetry collector over OTLP (SMG's
    /// flag): the request, its admission and queue wait, each attempt on a worker, the first byte
    /// and the end. Workers get `traceparent`. Spans the collector cannot take in time are
    /// dropped and counted (`sluice_trace_spans_dropped_total`); requests never wait for it.
    #[arg(long)]
    #[arg(help_heading = "Traces")]
    #[serde(default)]
    pub(crate) enable_trace: bool,

    /// The collector, `HOST:PORT` (SMG's flag). Unset: localhost:4317 with gRPC, localhost:4318
    /// with HTTP.
    #[arg(long, value_name = "HOST:PORT")]
    #[arg(help_heading = "Traces")]
    #[serde(default)]
    pub(crate) otlp_traces_endpoint: Option<String>,

    /// OTLP over `grpc`, or `http` (HTTP/protobuf, to /v1/traces).
    #[arg(long, value_enum, default_value = "grpc")]
    #[arg(help_heading = "Traces")]
    pub(crate) otlp_traces_protocol: crate::trace::Protocol,

    /// The share of traces started here that are recorded, 0 to 1. A request whose client sent a
    /// `traceparent` follows the client's sampled flag instead.
    #[arg(long, default_value_t = 1.0, value_name = "RATIO")]
    #[arg(help_heading = "Traces")]
    pub(crate) trace_sample_ratio: f64,

    /// Bucket bounds, in seconds and increasing, of the request-duration and time-to-first-byte
    /// histograms (SMG's flag). Default: 0.005 to 300.
    #[arg(long, num_args = 1.., value_delimiter = ',', value_name = "SECONDS")]
    #[arg(help_heading = "Metrics and logs")]
    #[serde(default)]
    pub(crate) prometheus_duration_buckets: Vec<f64>,

    /// Log level: `trace`, `debug`, `info`, `warn` (or SMG's `warning`), `error` (or `critical`),
    /// `off`; or a filter in tracing's env-filter syntax, e.g. `info,sluice_gateway=debug`. An
    /// unknown level is refused at startup.
    #[arg(long, default_value = "info", env = "SLUICE_LOG")]
    #[arg(help_heading = "Metrics and logs")]
    pub(crate) log_level: String,

    /// Also write the logs to `sluice.log` in this directory, created when missing (SMG's flag).
    #[arg(long, value_name = "DIR")]
    #[arg(help_heading = "Metrics and logs")]
    #[serde(default)]
    pub log_dir: Option<PathBuf>,

    /// Log one JSON object per line (for log shippers) instead of text.
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Metrics and logs")]
    pub log_json: bool,
}

/// What the gateway records of its requests besides serving them, checked: taken whole by the
/// assembly, which opens the access log, starts the trace exporter and registers the metrics.
#[derive(Debug, Clone)]
pub struct TelemetryConfig {
    /// `--access-log`: one JSON line per request, to this file (`-`: stdout).
    pub access_log: Option<PathBuf>,
    /// `--enable-trace` and its settings; `None`: off.
    pub trace: Option<crate::trace::TraceConfig>,
    /// `--prometheus-duration-buckets`; `None`: the defaults.
    pub duration_buckets: Option<Vec<f64>>,
    /// `--slo-ttft-ms-by-tier`, `--slo-tpot-ms-by-tier`: what the metrics and the status page
    /// count a request against (the status section's flags).
    pub slos: Slos,
    /// `--smg-defaults`: what was not given took SMG's default (said in the startup log).
    pub(crate) smg_defaults: bool,
}

impl TelemetrySettings {
    /// The checked telemetry, with the objectives and the defaults' origin other sections give.
    pub(super) fn validate(
        &self,
        slos: Slos,
        smg_defaults: bool,
    ) -> Result<TelemetryConfig, ConfigError> {
        Ok(TelemetryConfig {
            access_log: self.access_log.clone(),
            trace: self.trace()?,
            duration_buckets: self.duration_buckets()?,
            slos,
            smg_defaults,
        })
    }

    /// The log filter `--log-level` asks for, in tracing's syntax: a level by any of its names,
    /// or a filter with directives (`target=level`, comma-separated) passed as is. An unknown
    /// bare word is refused, rather than turning every log line off.
    pub fn log_filter(&self) -> Result<String, ConfigError> {
        let asked = self.log_level.trim();
        if asked.contains('=') || asked.contains(',') {
            return Ok(asked.to_string());
        }
        LOG_LEVELS
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(asked))
            .map(|(_, level)| (*level).to_string())
            .ok_or_else(|| {
                invalid(
                    "log-level",
                    format!(
                        "unknown level '{asked}' (trace, debug, info, warn or warning, error or \
                         critical, off; or target=level directives)"
                    ),
                )
            })
    }

    /// `--prometheus-duration-buckets`, checked: positive, finite, increasing.
    fn duration_buckets(&self) -> Result<Option<Vec<f64>>, ConfigError> {
        let b = &self.prometheus_duration_buckets;
        if b.is_empty() {
            return Ok(None);
        }
        let increasing = b.windows(2).all(|w| w[0] < w[1]);
        if !increasing || b.iter().any(|x| !(x.is_finite() && *x > 0.0)) {
            return Err(invalid(
                "prometheus-duration-buckets",
                format!("{b:?} must be positive seconds in increasing order"),
            ));
        }
        Ok(Some(b.clone()))
    }

    /// `--enable-trace`: where spans go and how many, checked.
    fn trace(&self) -> Result<Option<crate::trace::TraceConfig>, ConfigError> {
        if !self.enable_trace {
            return Ok(None);
        }
        let ratio = self.trace_sample_ratio;
        if !(0.0..=1.0).contains(&ratio) {
            return Err(invalid(
                "trace-sample-ratio",
                format!("{ratio} is not between 0 and 1"),
            ));
        }
        let protocol = self.otlp_traces_protocol;
        let endpoint = match &self.otlp_traces_endpoint {
            Some(given) => {
                let given = given.trim();
                let port = given
                    .rsplit_once(':')
                    .map(|(host, port)| (host, port.parse::<u16>()));
                match port {
                    Some((host, Ok(port))) if !host.is_empty() && port > 0 => given.to_string(),
                    _ => {
                        return Err(invalid(
                            "otlp-traces-endpoint",
                            format!("'{given}' is not HOST:PORT"),
                        ))
                    }
                }
            }
            None => format!("localhost:{}", protocol.default_port()),
        };
        Ok(Some(crate::trace::TraceConfig::new(
            endpoint, protocol, ratio,
        )))
    }
}
