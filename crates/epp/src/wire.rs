//! Envoy's ext_proc messages to and from the HTTP types the gateway works in, and the keys the
//! Gateway API Inference Extension's endpoint picker protocol puts in them
//! (kubernetes-sigs/gateway-api-inference-extension, `docs/proposals/004-endpoint-picker-protocol`,
//! v1.0.0).

use std::net::SocketAddr;

use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, Uri};
use envoy_types::pb::envoy::config::core::v3::header_value_option::HeaderAppendAction;
use envoy_types::pb::envoy::config::core::v3::{
    HeaderMap as WireHeaders, HeaderValue as WireHeader, HeaderValueOption, Metadata,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation, processing_response, BodyMutation, BodyResponse, CommonResponse, HeaderMutation,
    HeadersResponse, ImmediateResponse, ProcessingResponse, StreamedBodyResponse, TrailersResponse,
};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
use sluice_gateway::front::DataPlaneReply;

/// The header and metadata key that names the chosen endpoint (`ip:port`).
pub const DESTINATION: &str = "x-gateway-destination-endpoint";
/// The metadata namespace the chosen endpoint is written under (the protocol's default).
pub const DESTINATION_NAMESPACE: &str = "envoy.lb";
/// The metadata namespace and key of the data plane's subset hint: the endpoints it allows.
pub const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
pub const SUBSET: &str = "x-gateway-destination-endpoint-subset";

/// A message from the data plane that cannot be read as HTTP.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("the data plane sent no `{0}` pseudo-header")]
    Missing(&'static str),
    #[error("the data plane sent an unusable `{name}`")]
    Invalid { name: String },
}

/// A header's bytes: Envoy sends `raw_value`, older releases `value`.
fn value_bytes(header: &WireHeader) -> &[u8] {
    if header.raw_value.is_empty() {
        header.value.as_bytes()
    } else {
        &header.raw_value
    }
}

/// The regular headers of `wire` (pseudo-headers aside), and the pseudo-header `pseudo`'s value.
fn split(wire: Option<&WireHeaders>) -> (HeaderMap, Vec<(&str, &[u8])>) {
    let mut headers = HeaderMap::new();
    let mut pseudo = Vec::new();
    for header in wire.map(|w| w.headers.as_slice()).unwrap_or_default() {
        let value = value_bytes(header);
        if header.key.starts_with(':') {
            pseudo.push((header.key.as_str(), value));
            continue;
        }
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(header.key.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            headers.append(name, value);
        }
    }
    (headers, pseudo)
}

/// The regular headers of `wire` (trailers, say).
pub fn headers(wire: Option<&WireHeaders>) -> HeaderMap {
    split(wire).0
}

fn pseudo<'a>(pseudo: &[(&str, &'a [u8])], name: &'static str) -> Result<&'a [u8], WireError> {
    pseudo
        .iter()
        .find(|(key, _)| *key == name)
        .map(|(_, value)| *value)
        .ok_or(WireError::Missing(name))
}

/// The request's head as the data plane received it.
pub fn request_parts(wire: Option<&WireHeaders>) -> Result<Parts, WireError> {
    let (headers, pseudos) = split(wire);
    let invalid = |name: &str| WireError::Invalid {
        name: name.to_string(),
    };
    let method =
        Method::from_bytes(pseudo(&pseudos, ":method")?).map_err(|_| invalid(":method"))?;
    let uri = Uri::try_from(pseudo(&pseudos, ":path")?).map_err(|_| invalid(":path"))?;
    let mut request = Request::new(());
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.headers_mut() = headers;
    Ok(request.into_parts().0)
}

/// The response's status and headers as the worker sent them.
pub fn response_head(wire: Option<&WireHeaders>) -> Result<(StatusCode, HeaderMap), WireError> {
    let (headers, pseudos) = split(wire);
    let status =
        StatusCode::from_bytes(pseudo(&pseudos, ":status")?).map_err(|_| WireError::Invalid {
            name: ":status".to_string(),
        })?;
    Ok((status, headers))
}

/// The attribute that tells a worker's answer from the data plane's own reply (Envoy's
/// `response.code_details`: `via_upstream` for what the worker sent), asked for by
/// `response_attributes` in the ext_proc filter's configuration (deploy/envoy-epp.yaml).
pub const CODE_DETAILS: &str = "response.code_details";
/// The key the ext_proc filter files its attributes under.
const ATTRIBUTES_OF: &str = "envoy.filters.http.ext_proc";

/// Who answered, as the response head's attributes say: `None` for the worker, or a data plane
/// that does not say (its configuration asks for no attributes).
pub fn data_plane_reply(
    attributes: &std::collections::HashMap<String, Struct>,
) -> Option<DataPlaneReply> {
    let details = match &attributes
        .get(ATTRIBUTES_OF)?
        .fields
        .get(CODE_DETAILS)?
        .kind
    {
        Some(Kind::StringValue(details)) => details.as_str(),
        _ => return None,
    };
    // Envoy's router: `via_upstream` when the worker's head is relayed; a reset before any head
    // (`upstream_reset_before_response_started{connection_failure…}`) when it could not reach it.
    if details == "via_upstream" {
        None
    } else if details.starts_with("upstream_reset_before_response_started") {
        Some(DataPlaneReply::Unreachable)
    } else {
        Some(DataPlaneReply::Other)
    }
}

/// The endpoints the data plane allows, when it sent a subset hint (an empty list allows none).
pub fn subset(metadata: Option<&Metadata>) -> Option<Vec<SocketAddr>> {
    let hint = metadata?.filter_metadata.get(SUBSET_NAMESPACE)?;
    let list = match &hint.fields.get(SUBSET)?.kind {
        Some(Kind::ListValue(list)) => list.values.as_slice(),
        _ => &[],
    };
    Some(
        list.iter()
            .filter_map(|value| match &value.kind {
                Some(Kind::StringValue(s)) => s.parse().ok(),
                _ => None,
            })
            .collect(),
    )
}

fn string_value(s: String) -> Value {
    Value {
        kind: Some(Kind::StringValue(s)),
    }
}

/// `{"envoy.lb": {"x-gateway-destination-endpoint": "<ip:port>"}}`.
pub fn destination_metadata(endpoint: SocketAddr) -> Struct {
    let inner = Struct {
        fields: [(DESTINATION.to_string(), string_value(endpoint.to_string()))].into(),
    };
    Struct {
        fields: [(
            DESTINATION_NAMESPACE.to_string(),
            Value {
                kind: Some(Kind::StructValue(inner)),
            },
        )]
        .into(),
    }
}

/// Sets each of `set`'s headers (its first value replacing what is there, the next ones added)
/// and removes `remove`.
/// `mutation` that also sets the answer's status (the data plane allows `:status` among the
/// response headers it lets an external processor change).
pub fn with_status(mut mutation: HeaderMutation, status: StatusCode) -> HeaderMutation {
    mutation.set_headers.push(HeaderValueOption {
        header: Some(WireHeader {
            key: ":status".to_string(),
            value: String::new(),
            raw_value: status.as_str().as_bytes().to_vec(),
        }),
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        ..HeaderValueOption::default()
    });
    mutation
}

pub fn mutation<'a>(
    set: impl IntoIterator<Item = (&'a HeaderName, &'a HeaderValue)>,
    remove: impl IntoIterator<Item = String>,
) -> HeaderMutation {
    let mut named: Vec<&HeaderName> = Vec::new();
    let set_headers = set
        .into_iter()
        .map(|(name, value)| {
            let action = if named.contains(&name) {
                HeaderAppendAction::AppendIfExistsOrAdd
            } else {
                named.push(name);
                HeaderAppendAction::OverwriteIfExistsOrAdd
            };
            HeaderValueOption {
                header: Some(WireHeader {
                    key: name.as_str().to_string(),
                    value: String::new(),
                    raw_value: value.as_bytes().to_vec(),
                }),
                append_action: action as i32,
                ..HeaderValueOption::default()
            }
        })
        .collect();
    HeaderMutation {
        set_headers,
        remove_headers: remove.into_iter().collect(),
    }
}

fn response(response: processing_response::Response) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(response),
        ..ProcessingResponse::default()
    }
}

/// The answer to the request's headers: where it goes (header and metadata, the same value) and
/// what its headers become.
pub fn route_to(endpoint: SocketAddr, headers: HeaderMutation) -> ProcessingResponse {
    let mut answer = response(processing_response::Response::RequestHeaders(
        HeadersResponse {
            response: Some(CommonResponse {
                header_mutation: Some(headers),
                ..CommonResponse::default()
            }),
        },
    ));
    answer.dynamic_metadata = Some(destination_metadata(endpoint));
    answer
}

/// The answer to the response's headers.
pub fn response_headers(headers: HeaderMutation) -> ProcessingResponse {
    response(processing_response::Response::ResponseHeaders(
        HeadersResponse {
            response: Some(CommonResponse {
                header_mutation: Some(headers),
                ..CommonResponse::default()
            }),
        },
    ))
}

/// A piece of a body passed on in full-duplex streamed mode (the data plane sends on only what
/// comes back this way). `request`: the request's body, else the response's.
pub fn body_chunk(request: bool, body: Vec<u8>, end_of_stream: bool) -> ProcessingResponse {
    let answer = BodyResponse {
        response: Some(CommonResponse {
            body_mutation: Some(BodyMutation {
                mutation: Some(body_mutation::Mutation::StreamedResponse(
                    StreamedBodyResponse {
                        body,
                        end_of_stream,
                        ..StreamedBodyResponse::default()
                    },
                )),
            }),
            ..CommonResponse::default()
        }),
    };
    response(if request {
        processing_response::Response::RequestBody(answer)
    } else {
        processing_response::Response::ResponseBody(answer)
    })
}

/// The answer to trailers: passed on unchanged.
pub fn trailers(request: bool) -> ProcessingResponse {
    let answer = TrailersResponse::default();
    response(if request {
        processing_response::Response::RequestTrailers(answer)
    } else {
        processing_response::Response::ResponseTrailers(answer)
    })
}

/// The gateway's own answer, sent to the client instead of a worker's.
pub fn immediate(status: StatusCode, headers: &HeaderMap, body: Vec<u8>) -> ProcessingResponse {
    let code = headers
        .get(sluice_gateway::error::ERROR_CODE_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    response(processing_response::Response::ImmediateResponse(
        ImmediateResponse {
            status: Some(HttpStatus {
                code: i32::from(status.as_u16()),
            }),
            headers: Some(mutation(headers, [])),
            body,
            details: code,
            ..ImmediateResponse::default()
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::google::protobuf::ListValue;

    fn wire(pairs: &[(&str, &str)]) -> WireHeaders {
        WireHeaders {
            headers: pairs
                .iter()
                .map(|(k, v)| WireHeader {
                    key: k.to_string(),
                    value: String::new(),
                    raw_value: v.as_bytes().to_vec(),
                })
                .collect(),
        }
    }

    #[test]
    fn a_request_head_keeps_its_method_path_and_headers_but_not_its_pseudo_headers() {
        let head = wire(&[
            (":method", "POST"),
            (":path", "/v1/chat/completions?x=1"),
            (":authority", "gw"),
            ("content-type", "application/json"),
        ]);
        let parts = request_parts(Some(&head)).unwrap();
        assert_eq!(parts.method, Method::POST);
        assert_eq!(parts.uri.path(), "/v1/chat/completions");
        assert_eq!(parts.uri.query(), Some("x=1"));
        assert_eq!(parts.headers.len(), 1);
        assert_eq!(
            request_parts(Some(&wire(&[(":method", "GET")]))).err(),
            Some(WireError::Missing(":path"))
        );
    }

    #[test]
    fn a_subset_hint_is_read_and_an_absent_one_allows_all() {
        assert_eq!(subset(None), None);
        let list = Value {
            kind: Some(Kind::ListValue(ListValue {
                values: vec![
                    string_value("10.0.0.1:8000".into()),
                    string_value("not an address".into()),
                ],
            })),
        };
        let mut metadata = Metadata::default();
        metadata.filter_metadata.insert(
            SUBSET_NAMESPACE.into(),
            Struct {
                fields: [(SUBSET.to_string(), list)].into(),
            },
        );
        let expected: SocketAddr = "10.0.0.1:8000".parse().unwrap();
        assert_eq!(subset(Some(&metadata)), Some(vec![expected]));
    }

    #[test]
    fn the_destination_is_the_same_in_the_header_and_the_metadata() {
        let at: SocketAddr = "[fd00::1]:8000".parse().unwrap();
        let meta = destination_metadata(at);
        let Some(Kind::StructValue(inner)) = &meta.fields[DESTINATION_NAMESPACE].kind else {
            panic!("no namespace");
        };
        assert_eq!(
            inner.fields[DESTINATION].kind,
            Some(Kind::StringValue("[fd00::1]:8000".into()))
        );
    }
}
