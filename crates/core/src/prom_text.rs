//! The Prometheus text exposition format (0.0.4, and the OpenMetrics text it overlaps with), as
//! engines serve it on `/metrics`.
//!
//! Why our own parser: the crates.io parsers we tried (prometheus-parse, openmetrics-parser)
//! reject metric names containing `:`, which the format allows and which every vLLM and SGLang
//! metric uses (`vllm:num_requests_waiting`). This one is strict about the sample grammar and
//! lenient only where real exporters differ: any `#` line that is not HELP or TYPE is a comment
//! (OpenMetrics' `# EOF` included), and a trailing comma inside labels is accepted.

use std::collections::HashMap;

/// A metric family's declared type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    Counter,
    Gauge,
    Histogram,
    Summary,
    Untyped,
}

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
    pub timestamp_ms: Option<i64>,
}

impl Sample {
    /// The value of one label, if present.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A parsed exposition.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Exposition {
    pub samples: Vec<Sample>,
    /// Declared types by family name.
    pub types: HashMap<String, MetricType>,
    /// Help text by family name.
    pub help: HashMap<String, String>,
}

impl Exposition {
    /// Samples with this exact name.
    pub fn named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| s.name == name)
    }
}

/// Where and why a payload is not Prometheus text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct ParseError {
    pub line: usize,
    pub reason: &'static str,
}

/// Parses a whole exposition.
pub fn parse(text: &str) -> Result<Exposition, ParseError> {
    let mut out = Exposition::default();
    for (index, raw) in text.lines().enumerate() {
        let line = raw.trim_end_matches('\r');
        let fail = |reason| ParseError {
            line: index + 1,
            reason,
        };
        if line.trim().is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            parse_descriptor(comment, &mut out).map_err(fail)?;
            continue;
        }
        out.samples.push(parse_sample(line).map_err(fail)?);
    }
    Ok(out)
}

fn parse_descriptor(comment: &str, out: &mut Exposition) -> Result<(), &'static str> {
    let mut words = comment.trim_start().splitn(3, ' ');
    match (words.next(), words.next(), words.next()) {
        (Some("HELP"), Some(name), text) => {
            check_name(name)?;
            out.help
                .insert(name.to_string(), text.unwrap_or("").to_string());
        }
        (Some("TYPE"), Some(name), Some(kind)) => {
            check_name(name)?;
            let kind = match kind.trim() {
                "counter" => MetricType::Counter,
                "gauge" => MetricType::Gauge,
                "histogram" => MetricType::Histogram,
                "summary" => MetricType::Summary,
                "untyped" | "unknown" => MetricType::Untyped,
                _ => return Err("unknown metric type"),
            };
            out.types.insert(name.to_string(), kind);
        }
        (Some("TYPE"), _, _) => return Err("TYPE needs a name and a type"),
        _ => {} // any other comment
    }
    Ok(())
}

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn check_name(name: &str) -> Result<(), &'static str> {
    let mut chars = name.chars();
    match chars.next() {
        Some(c) if is_name_start(c) => {}
        _ => return Err("invalid metric name"),
    }
    if chars.all(|c| is_name_start(c) || c.is_ascii_digit()) {
        Ok(())
    } else {
        Err("invalid metric name")
    }
}

fn parse_sample(line: &str) -> Result<Sample, &'static str> {
    let name_end = line
        .find(|c: char| !(is_name_start(c) || c.is_ascii_digit()))
        .unwrap_or(line.len());
    let name = &line[..name_end];
    check_name(name)?;
    if name_end == line.len() {
        return Err("a sample needs a value");
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        rest = parse_labels(after, &mut labels)?;
    }
    let mut fields = rest.split_ascii_whitespace();
    let value = parse_value(fields.next().ok_or("a sample needs a value")?)?;
    let timestamp_ms = match fields.next() {
        Some(t) => Some(t.parse().map_err(|_| "invalid timestamp")?),
        None => None,
    };
    if fields.next().is_some() {
        return Err("unexpected text after the sample");
    }
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
        timestamp_ms,
    })
}

/// Parses `name="value",...}` and returns what follows the closing brace.
fn parse_labels<'a>(
    mut rest: &'a str,
    labels: &mut Vec<(String, String)>,
) -> Result<&'a str, &'static str> {
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix('}') {
            return Ok(after);
        }
        let eq = rest.find('=').ok_or("a label needs a value")?;
        let name = rest[..eq].trim();
        let valid = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err("invalid label name");
        }
        rest = rest[eq + 1..].trim_start();
        rest = rest
            .strip_prefix('"')
            .ok_or("a label value must be quoted")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c @ ('\\' | '"'))) => value.push(c),
                    _ => return Err("invalid escape in a label value"),
                },
                Some((_, c)) => value.push(c),
                None => return Err("unterminated label value"),
            }
        };
        labels.push((name.to_string(), value));
        rest = rest[end + 1..].trim_start();
        if let Some(after) = rest.strip_prefix(',') {
            rest = after;
        } else if !rest.starts_with('}') {
            return Err("labels must be separated by commas");
        }
    }
}

fn parse_value(text: &str) -> Result<f64, &'static str> {
    match text {
        "+Inf" | "Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => text.parse().map_err(|_| "invalid sample value"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VLLM: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 8.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.42
vllm:cache_config_info{block_size="16",num_gpu_blocks="29205",enable_prefix_caching="True",engine="0"} 1.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 12.0
vllm:num_preemptions_created{engine="0",model_name="m"} 1.7e+09
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 5.0
weird{path="a\"b\\c\nd",} NaN 1700000000000
# EOF
"#;

    #[test]
    fn parses_real_shaped_vllm_metrics() {
        let e = parse(VLLM).unwrap();
        let running: Vec<f64> = e
            .named("vllm:num_requests_running")
            .map(|s| s.value)
            .collect();
        assert_eq!(running, vec![8.0, 3.0]);
        assert_eq!(e.types["vllm:kv_cache_usage_perc"], MetricType::Gauge);
        assert_eq!(e.types["vllm:num_preemptions_total"], MetricType::Counter);
        let config = e.named("vllm:cache_config_info").next().unwrap();
        assert_eq!(config.label("num_gpu_blocks"), Some("29205"));
        assert_eq!(config.label("engine"), Some("0"));
        let inf = e
            .named("vllm:time_to_first_token_seconds_bucket")
            .next()
            .unwrap();
        assert_eq!(inf.label("le"), Some("+Inf"));
        let weird = e.named("weird").next().unwrap();
        assert_eq!(weird.label("path"), Some("a\"b\\c\nd"));
        assert!(weird.value.is_nan());
        assert_eq!(weird.timestamp_ms, Some(1_700_000_000_000));
        assert_eq!(
            e.named("vllm:num_preemptions_created")
                .next()
                .unwrap()
                .value,
            1.7e9
        );
    }

    #[test]
    fn rejects_what_is_not_the_format() {
        for (text, reason) in [
            ("9lives 1", "invalid metric name"),
            ("m{a=\"1\" b=\"2\"} 1", "labels must be separated by commas"),
            ("m{a=1} 1", "a label value must be quoted"),
            ("m{a=\"1} 1", "unterminated label value"),
            ("m one", "invalid sample value"),
            ("m", "a sample needs a value"),
            ("m 1 2 3", "unexpected text after the sample"),
            ("# TYPE m colour", "unknown metric type"),
            ("<html>", "invalid metric name"),
        ] {
            assert_eq!(parse(text).unwrap_err().reason, reason, "{text}");
        }
        assert_eq!(parse("ok 1\n\nbad").unwrap_err().line, 3);
    }

    #[test]
    fn an_empty_body_is_an_empty_exposition() {
        assert_eq!(parse("").unwrap(), Exposition::default());
    }
}
