//! A worker's URL in one spelling per address, so one socket is one worker (and one id).

use axum::http::Uri;

use super::{spec_error, SpecError};

/// `http[s]://host[:port][/]` -> `http[s]://host:port`; `grpc://host:port` (SMG's form for a
/// worker behind its gRPC servicer) keeps its scheme and must name its port.
pub(super) fn normalize_url(url: &str) -> Result<String, SpecError> {
    let uri: Uri = url
        .parse()
        .map_err(|_| spec_error("url", format!("'{url}' is not a URL")))?;
    let (scheme, default_port) = match uri.scheme_str() {
        Some("http") => ("http", 80),
        Some("https") => ("https", 443),
        Some("grpc") => ("grpc", 0),
        _ => {
            return Err(spec_error(
                "url",
                format!("'{url}' must start with http://, https:// or grpc://"),
            ))
        }
    };
    let Some(authority) = uri.authority() else {
        return Err(spec_error("url", format!("'{url}' has no host")));
    };
    if authority.as_str().contains('@') {
        return Err(spec_error(
            "url",
            "credentials in the URL are not allowed; use api_key",
        ));
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(spec_error(
            "url",
            format!("'{url}' must be a base URL without a path"),
        ));
    }
    let port = authority.port_u16().unwrap_or(default_port);
    if port == 0 && authority.port_u16().is_none() {
        return Err(spec_error(
            "url",
            format!("'{url}' must name the port of the worker's gRPC service"),
        ));
    }
    if port == 0 {
        return Err(spec_error(
            "url",
            "port 0 is not a port a worker listens on",
        ));
    }
    Ok(format!(
        "{scheme}://{}:{port}",
        canonical_host(authority.host(), scheme == "https")
    ))
}

/// One spelling per address, so one socket is one worker: IPv4 in any form `inet_aton` takes
/// (`127.1`, `0x7f000001`, `2130706433`, `0177.0.0.1`) as a dotted quad, IPv6 in its shortest
/// form, `localhost` as `127.0.0.1` (over plain HTTP: over TLS the name is what the worker's
/// certificate is checked against, so it stays), other names in lower case. Nothing is looked up.
fn canonical_host(host: &str, tls: bool) -> String {
    let lower = host.trim_end_matches('.').to_ascii_lowercase();
    if lower == "localhost" && !tls {
        return "127.0.0.1".into();
    }
    if let Some(v6) = lower
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .and_then(|h| h.parse::<std::net::Ipv6Addr>().ok())
    {
        return format!("[{v6}]");
    }
    match ipv4_any_form(&lower) {
        Some(v4) => v4.to_string(),
        None => lower,
    }
}

/// An IPv4 address written as `inet_aton` reads it: one to four parts, each decimal, hex (`0x`)
/// or octal (a leading `0`), the last part filling the bytes the others leave.
fn ipv4_any_form(host: &str) -> Option<std::net::Ipv4Addr> {
    let parts: Vec<&str> = host.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let numbers: Vec<u64> = parts
        .iter()
        .map(|p| {
            let (digits, radix) = if let Some(hex) = p.strip_prefix("0x") {
                (hex, 16)
            } else if p.len() > 1 && p.starts_with('0') {
                (&p[1..], 8)
            } else {
                (*p, 10)
            };
            if digits.is_empty() && radix != 16 {
                return None;
            }
            u64::from_str_radix(digits, radix).ok()
        })
        .collect::<Option<_>>()?;
    let (head, last) = numbers.split_at(numbers.len() - 1);
    if head.iter().any(|n| *n > 255) || last[0] >= 1u64 << (8 * (4 - head.len())) {
        return None;
    }
    let value = head
        .iter()
        .enumerate()
        .fold(last[0], |acc, (i, n)| acc | n << (8 * (3 - i)));
    u32::try_from(value).ok().map(std::net::Ipv4Addr::from)
}

#[cfg(test)]
mod tests {
    use super::super::WorkerSpec;
    use super::*;

    #[test]
    fn one_socket_is_one_url_whatever_the_spelling() {
        let url = |u: &str| WorkerSpec::from_url(u, None).unwrap().url;
        for same in [
            "http://127.0.0.1:8001",
            "http://localhost:8001",
            "http://LOCALHOST.:8001/",
            "http://127.1:8001",
            "http://0x7f000001:8001",
            "http://2130706433:8001",
            "http://0177.0.0.1:8001",
            "http://127.0.1:8001",
        ] {
            assert_eq!(url(same), "http://127.0.0.1:8001", "{same}");
        }
        assert_eq!(url("http://[0:0:0:0:0:0:0:1]:9"), "http://[::1]:9");
        assert_eq!(
            url("http://Engine-A.Example:9"),
            "http://engine-a.example:9"
        );
        assert_eq!(url("http://10.0.0.5"), "http://10.0.0.5:80");
        assert_eq!(
            url("https://Engine-A.example"),
            "https://engine-a.example:443"
        );
        assert_eq!(url("https://LOCALHOST:8443/"), "https://localhost:8443");
        assert_ne!(url("https://10.0.0.5:80"), url("http://10.0.0.5:80"));
        for not_v4 in ["256.1.1.1", "1.2.3.4.5", "0x", "08.1.1.1", "1.2.65536"] {
            assert_eq!(ipv4_any_form(not_v4), None, "{not_v4}");
        }
        assert_eq!(
            WorkerSpec::from_url("http://127.0.0.1:0", None)
                .unwrap_err()
                .field,
            "url"
        );
    }
}
