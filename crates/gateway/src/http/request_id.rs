//! `x-request-id`: a client's own id is kept when it is sane, otherwise one is made. The id goes
//! to the worker and back to the client, so one request can be followed through every log.

use axum::http::{HeaderMap, HeaderName, HeaderValue};

/// The header that carries it, both ways.
pub(crate) const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Longest client id kept.
const MAX_LEN: usize = 128;

fn acceptable(id: &[u8]) -> bool {
    !id.is_empty()
        && id.len() <= MAX_LEN
        && id
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:/+=@".contains(b))
}

/// The client's id from the first of `names` it sent, if acceptable, else a fresh random one.
pub(crate) fn accept_or_make(headers: &HeaderMap, names: &[HeaderName]) -> HeaderValue {
    names
        .iter()
        .find_map(|name| headers.get(name).filter(|id| acceptable(id.as_bytes())))
        .cloned()
        .unwrap_or_else(make)
}

/// 32 random hex digits, written directly (the formatting machinery cost more than the random
/// number, once per request).
fn make() -> HeaderValue {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut n = rand::random::<u128>();
    let mut id = [0u8; 32];
    for digit in id.iter_mut().rev() {
        *digit = HEX[(n & 0xf) as usize];
        n >>= 4;
    }
    #[allow(clippy::expect_used)]
    HeaderValue::from_bytes(&id).expect("hex is a valid header value")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(id: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(REQUEST_ID, HeaderValue::from_str(id).unwrap());
        h
    }

    #[test]
    fn sane_ids_are_kept_others_replaced() {
        let names = [REQUEST_ID];
        assert_eq!(
            accept_or_make(&with("req-42_a.b:c"), &names),
            "req-42_a.b:c"
        );
        for bad in ["", "has space", "quote\"", &"x".repeat(129)] {
            let id = accept_or_make(&with(bad), &names);
            assert_ne!(id, bad);
            assert_eq!(id.len(), 32);
        }
        assert_eq!(accept_or_make(&HeaderMap::new(), &names).len(), 32);
    }

    #[test]
    fn the_first_configured_header_with_a_sane_id_wins() {
        let correlation = HeaderName::from_static("x-correlation-id");
        let mut h = with("from-request-id");
        h.insert(correlation.clone(), HeaderValue::from_static("has space"));
        let names = [correlation.clone(), REQUEST_ID];
        assert_eq!(
            accept_or_make(&h, &names),
            "from-request-id",
            "an insane one is passed over"
        );
        h.insert(correlation, HeaderValue::from_static("corr-1"));
        assert_eq!(accept_or_make(&h, &names), "corr-1");
    }
}
