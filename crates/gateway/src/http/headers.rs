//! Which headers cross the gateway.
//!
//! Upstream: the client's headers, minus hop-by-hop headers (they describe the client's
//! connection, not the request), minus `Host` (the worker's is set from its URL) and minus the
//! client's credentials — the gateway sends the worker's own key instead, so a client key never
//! reaches a worker. Downstream: the worker's headers, minus hop-by-hop ones and minus
//! `X-Sluice-Error-Code`, which only this gateway may set.

use axum::http::{header, HeaderMap, HeaderName};

use super::REQUEST_ID;
use crate::error::ERROR_CODE_HEADER;

/// Hop-by-hop headers (RFC 9110 7.6.1) and their common non-standard relatives.
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// The client's credentials: never sent to a worker (it gets its own key, or none).
pub const CLIENT_CREDENTIALS: [HeaderName; 5] = [
    header::AUTHORIZATION,
    header::PROXY_AUTHORIZATION,
    header::COOKIE,
    HeaderName::from_static("x-api-key"),
    HeaderName::from_static("api-key"),
];

/// Other headers that are the client's business alone. The length is set again from the body
/// actually sent.
const CLIENT_ONLY: [HeaderName; 3] = [header::HOST, header::CONTENT_LENGTH, header::EXPECT];

/// Headers named in `Connection` are hop-by-hop too.
fn named_in_connection(headers: &HeaderMap, name: &HeaderName) -> bool {
    headers.get_all(header::CONNECTION).iter().any(|v| {
        v.to_str().is_ok_and(|v| {
            v.split(',')
                .any(|token| token.trim().eq_ignore_ascii_case(name.as_str()))
        })
    })
}

/// Copies the client's headers that may go to a worker.
pub fn copy_request_headers(from: &HeaderMap, to: &mut HeaderMap) {
    let has_connection = from.contains_key(header::CONNECTION);
    for (name, value) in from {
        if HOP_BY_HOP.contains(name)
            || CLIENT_ONLY.contains(name)
            || CLIENT_CREDENTIALS.contains(name)
            || *name == REQUEST_ID
            || (has_connection && named_in_connection(from, name))
        {
            continue;
        }
        to.append(name.clone(), value.clone());
    }
}

/// Removes from a worker's response what must not reach the client.
pub fn clean_response_headers(headers: &mut HeaderMap) {
    // The usual answer has none of them: one pass over its few names instead of a hashed
    // removal per name (eight a response, 1.2k instructions).
    let unwanted = |name: &HeaderName| HOP_BY_HOP.contains(name) || *name == ERROR_CODE_HEADER;
    if !headers.keys().any(unwanted) {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::try_from(t.trim()).ok())
        .collect();
    for name in HOP_BY_HOP.iter().chain(named.iter()) {
        headers.remove(name);
    }
    headers.remove(ERROR_CODE_HEADER);
}

/// Whether a response is a server-sent event stream.
pub fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("text/event-stream"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(
                HeaderName::try_from(*k).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        m
    }

    #[test]
    fn client_credentials_and_hop_by_hop_headers_stay_behind() {
        let from = map(&[
            ("authorization", "Bearer client-key"),
            ("x-api-key", "k"),
            ("cookie", "c=1"),
            ("host", "gateway:30000"),
            ("connection", "keep-alive, x-hop"),
            ("x-hop", "1"),
            ("transfer-encoding", "chunked"),
            ("content-type", "application/json"),
            ("x-session-id", "s1"),
            ("x-request-id", "client-id"),
            ("openai-organization", "org"),
            ("content-length", "12"),
        ]);
        let mut to = HeaderMap::new();
        copy_request_headers(&from, &mut to);
        let mut kept: Vec<_> = to.keys().map(|k| k.as_str().to_string()).collect();
        kept.sort();
        assert_eq!(
            kept,
            vec!["content-type", "openai-organization", "x-session-id"]
        );
    }

    #[test]
    fn a_workers_error_code_header_is_stripped() {
        let mut h = map(&[
            ("x-sluice-error-code", "forged"),
            ("connection", "close"),
            ("content-type", "text/event-stream"),
            ("x-vllm-thing", "1"),
        ]);
        clean_response_headers(&mut h);
        assert!(h.get("x-sluice-error-code").is_none());
        assert!(h.get("connection").is_none());
        assert!(is_event_stream(&h));
        assert_eq!(h["x-vllm-thing"], "1");
    }

    #[test]
    fn each_unwanted_header_is_found_alone_and_a_clean_answer_is_left_as_it_is() {
        for unwanted in [
            "x-sluice-error-code",
            "keep-alive",
            "transfer-encoding",
            "upgrade",
        ] {
            let mut h = map(&[(unwanted, "x"), ("content-type", "application/json")]);
            clean_response_headers(&mut h);
            assert!(h.get(unwanted).is_none(), "{unwanted}");
            assert_eq!(h.len(), 1);
        }
        let clean = map(&[
            ("content-type", "application/json"),
            ("content-length", "2"),
        ]);
        let mut h = clean.clone();
        clean_response_headers(&mut h);
        assert_eq!(h, clean);
    }
}
