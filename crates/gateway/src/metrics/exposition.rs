//! `/metrics` in the format the scraper asks for: Prometheus text 0.0.4 by default, OpenMetrics
//! 1.0 when its `Accept` names `application/openmetrics-text`.
//!
//! Why a small writer: prometheus-client, which holds the gateway's metrics, writes OpenMetrics
//! only, and most scrapers and tools (`promtool check metrics`, curl-and-grep, older Prometheus,
//! many agents) read 0.0.4. The two differ, for what this gateway exports, in three things, so
//! the 0.0.4 page is the OpenMetrics one rewritten line by line rather than a second registry:
//! a counter's family is named with its `_total` suffix (`# TYPE x_total counter`, as its
//! samples are), there is no `# UNIT` line, and no `# EOF` terminator.

/// The content type of a 0.0.4 page.
pub(crate) const TEXT_0_0_4: &str = "text/plain; version=0.0.4; charset=utf-8";
/// The content type of an OpenMetrics page.
pub(crate) const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Whether an `Accept` header asks for OpenMetrics.
pub(crate) fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.contains("application/openmetrics-text"))
}

/// The OpenMetrics text of a registry rewritten as Prometheus text 0.0.4.
pub(crate) fn to_text_0_0_4(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // A family's HELP comes before its TYPE, which says whether the name needs `_total`.
    let mut help: Option<&str> = None;
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            if let Some(held) = help.replace(rest) {
                push_help(&mut out, held, "");
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let suffix = if kind == "counter" && !name.ends_with("_total") {
                "_total"
            } else {
                ""
            };
            if let Some(held) = help.take() {
                push_help(&mut out, held, suffix);
            }
            out.push_str("# TYPE ");
            out.push_str(name);
            out.push_str(suffix);
            out.push(' ');
            out.push_str(
                if kind == "info" || kind == "stateset" || kind == "unknown" {
                    "untyped"
                } else {
                    kind
                },
            );
            out.push('\n');
            continue;
        }
        if let Some(held) = help.take() {
            push_help(&mut out, held, "");
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// `# HELP <name><suffix> <text>`, from the OpenMetrics `<name> <text>`.
fn push_help(out: &mut String, held: &str, suffix: &str) {
    let (name, text) = held.split_once(' ').unwrap_or((held, ""));
    out.push_str("# HELP ");
    out.push_str(name);
    out.push_str(suffix);
    out.push(' ');
    out.push_str(text);
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_take_their_total_name_and_openmetrics_only_lines_go() {
        let om = "# HELP sluice_requests Requests answered.\n# TYPE sluice_requests counter\n\
                  sluice_requests_total{route=\"/v1/chat/completions\"} 3\n\
                  # HELP sluice_in_flight In flight.\n# TYPE sluice_in_flight gauge\n\
                  # UNIT sluice_in_flight requests\nsluice_in_flight 2\n# EOF\n";
        assert_eq!(
            to_text_0_0_4(om),
            "# HELP sluice_requests_total Requests answered.\n\
             # TYPE sluice_requests_total counter\n\
             sluice_requests_total{route=\"/v1/chat/completions\"} 3\n\
             # HELP sluice_in_flight In flight.\n# TYPE sluice_in_flight gauge\n\
             sluice_in_flight 2\n"
        );
    }

    #[test]
    fn the_scraper_chooses() {
        assert!(!wants_openmetrics(None));
        assert!(!wants_openmetrics(Some(
            "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
        )));
        assert!(wants_openmetrics(Some(
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
        )));
    }
}
