//! The body a worker gets: the client's byte for byte, told the model it is served by — the one
//! chosen for a request without one, or the one an alias or the ladder's cascade names.

use bytes::Bytes;

use crate::request::{ApiRoute, RequestFacts};

/// The body for a worker of the `served` model: the model spliced in where it differs from the
/// one asked for; the rest stays byte for byte.
pub(super) fn served_body(
    route: ApiRoute,
    facts: &RequestFacts<'_>,
    body: &Bytes,
    served: &str,
) -> Bytes {
    match (&facts.model, &facts.model_at) {
        _ if !route.takes_model() => body.clone(),
        (Some(asked), _) if asked == served => body.clone(),
        (_, Some(at)) => with_model_at(body, at.clone(), served),
        (_, None) => with_model(body, served),
    }
}

/// `body` (a JSON object) with `"model":<model>` as its first field.
fn with_model(body: &Bytes, model: &str) -> Bytes {
    let Some(open) = body.iter().position(|b| *b == b'{') else {
        return body.clone();
    };
    let field = serde_json::to_string(model).unwrap_or_default();
    let mut out = Vec::with_capacity(body.len() + field.len() + 10);
    out.extend_from_slice(&body[..=open]);
    out.extend_from_slice(b"\"model\":");
    out.extend_from_slice(field.as_bytes());
    // An empty object (the pass-through routes require no field) takes no separator.
    let rest = &body[open + 1..];
    if rest.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'}') {
        out.push(b',');
    }
    out.extend_from_slice(rest);
    Bytes::from(out)
}

/// `body` with the value at `at` (a `null`, or an alias) replaced by `model` as a JSON string.
fn with_model_at(body: &Bytes, at: std::ops::Range<usize>, model: &str) -> Bytes {
    let field = serde_json::to_string(model).unwrap_or_default();
    let mut out = Vec::with_capacity(body.len() + field.len());
    out.extend_from_slice(&body[..at.start]);
    out.extend_from_slice(field.as_bytes());
    out.extend_from_slice(&body[at.end..]);
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_is_spliced_in_without_touching_the_rest() {
        let body = Bytes::from_static(b" {\"messages\":[], \"x\": 1.50}");
        let out = with_model(&body, "m\"1");
        assert_eq!(
            &out[..],
            b" {\"model\":\"m\\\"1\",\"messages\":[], \"x\": 1.50}"
        );
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["model"], "m\"1");
    }

    #[test]
    fn an_empty_object_gets_the_model_as_its_only_field() {
        for body in [&b"{}"[..], b"{ \n}"] {
            let out = with_model(&Bytes::from_static(body), "m");
            let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
            assert_eq!(v, serde_json::json!({"model": "m"}));
        }
    }

    #[test]
    fn a_null_model_is_replaced_not_repeated() {
        let body = Bytes::from_static(br#"{"model": null, "messages":[]}"#);
        let out = with_model_at(&body, 10..14, "m");
        assert_eq!(&out[..], br#"{"model": "m", "messages":[]}"#);
    }
}
