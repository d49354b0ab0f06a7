//! What the gateway says about itself: its log filter (`--log-level`), its latency histograms'
//! buckets (`--prometheus-duration-buckets`) and its traces (`--enable-trace` and the OTLP
//! flags), each checked here.

use super::checks::invalid;
use super::{ConfigError, Settings};

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

impl Settings {
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
    pub(super) fn duration_buckets(&self) -> Result<Option<Vec<f64>>, ConfigError> {
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
    pub(super) fn trace(&self) -> Result<Option<crate::trace::TraceConfig>, ConfigError> {
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
