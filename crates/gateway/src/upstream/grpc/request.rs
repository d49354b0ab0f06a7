//! An OpenAI request body as SGLang's `GenerateRequest`: the prompt tokenized here (the chat
//! template applied), the sampling settings in SGLang's names. What the gRPC path cannot honour
//! is refused with a 400 that names the field, rather than silently dropped:
//!
//! | field | on gRPC workers |
//! | --- | --- |
//! | `n` | works (the engine samples each choice) |
//! | `stop`, `stop_token_ids`, `max_tokens`, `max_completion_tokens`, `min_tokens`, `ignore_eos`, `temperature`, `top_p`, `top_k`, `min_p`, penalties, `logit_bias`, `skip_special_tokens`, `stream_options.include_usage` | work |
//! | `response_format` | `json_schema` works (the engine's JSON-schema constraint); `json_object` is the schema `{"type": "object"}`; `text` is the default |
//! | `tools`, `tool_choice`, `functions`, `function_call` | refused: no tool-call parser runs on this path |
//! | `logprobs`, `top_logprobs` | refused: the log probabilities are not rendered on this path |
//! | reasoning output | not separated: a thinking model's thoughts arrive in `content` (no reasoning parser) |
//! | images, audio (content parts other than text) | refused |

use serde::Deserialize;
use serde_json::Value;
use sluice_proto::sglang_scheduler::sampling_params::Constraint;
use sluice_proto::sglang_scheduler::{
    DisaggregatedParams, GenerateRequest, SamplingParams, TokenizedInput,
};

use crate::tokens::{ChatMessage, Tokens, TokensError};

/// Which OpenAI route the request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    Chat,
    Completions,
}

/// Why a request cannot go to a gRPC worker: the client's to fix.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refused {
    #[error("`{field}` is not supported on gRPC workers: {why}")]
    Unsupported {
        field: &'static str,
        why: &'static str,
    },
    #[error("invalid request body: {0}")]
    Body(String),
    #[error("`{field}` {rule}")]
    Invalid {
        field: &'static str,
        rule: &'static str,
    },
    #[error(transparent)]
    Tokens(#[from] TokensError),
}

impl Refused {
    /// The request field it names, when it names one.
    pub(crate) fn param(&self) -> Option<&'static str> {
        match self {
            Refused::Unsupported { field, .. } | Refused::Invalid { field, .. } => Some(field),
            Refused::Body(_) | Refused::Tokens(_) => None,
        }
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

#[derive(Deserialize)]
struct Message {
    role: String,
    #[serde(default)]
    content: Option<Value>,
}

/// The fields read; the others are checked by name (`REFUSED`).
#[derive(Deserialize)]
struct Body {
    #[serde(default)]
    messages: Option<Vec<Message>>,
    #[serde(default)]
    prompt: Option<Prompt>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    max_tokens: Option<u32>,
    #[serde(default)]
    max_completion_tokens: Option<u32>,
    #[serde(default)]
    min_tokens: Option<u32>,
    #[serde(default)]
    n: Option<u32>,
    #[serde(default)]
    stop: Option<Stop>,
    #[serde(default)]
    stop_token_ids: Vec<u32>,
    #[serde(default)]
    ignore_eos: bool,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    #[serde(default)]
    top_k: Option<i32>,
    #[serde(default)]
    min_p: Option<f32>,
    #[serde(default)]
    frequency_penalty: Option<f32>,
    #[serde(default)]
    presence_penalty: Option<f32>,
    #[serde(default)]
    repetition_penalty: Option<f32>,
    #[serde(default)]
    logit_bias: Option<std::collections::HashMap<String, f32>>,
    #[serde(default)]
    skip_special_tokens: Option<bool>,
    #[serde(default)]
    response_format: Option<Value>,
    /// Where a disaggregated request's halves meet (the gateway's prefill/decode path sets
    /// them, as SGLang's HTTP engines read them).
    #[serde(default)]
    bootstrap_host: Option<String>,
    #[serde(default)]
    bootstrap_port: Option<u16>,
    #[serde(default)]
    bootstrap_room: Option<u64>,
}

/// Fields refused by name when present and not null (or `false`, for `logprobs`).
const REFUSED: [(&str, &str); 6] = [
    ("tools", "no tool-call parser runs on this path"),
    ("tool_choice", "no tool-call parser runs on this path"),
    ("functions", "no tool-call parser runs on this path"),
    ("function_call", "no tool-call parser runs on this path"),
    (
        "logprobs",
        "log probabilities are not rendered on this path",
    ),
    (
        "top_logprobs",
        "log probabilities are not rendered on this path",
    ),
];

/// What rendering the answer needs of the request.
#[derive(Debug, Clone)]
pub(crate) struct Asked {
    pub(crate) route: Route,
    pub(crate) stream: bool,
    pub(crate) include_usage: bool,
    pub(crate) choices: u32,
    pub(crate) stop: Vec<String>,
    pub(crate) prompt_tokens: u32,
}

fn refused_fields(raw: &Value) -> Result<(), Refused> {
    for (field, why) in REFUSED {
        match raw.get(field) {
            None | Some(Value::Null) | Some(Value::Bool(false)) => {}
            Some(_) => return Err(Refused::Unsupported { field, why }),
        }
    }
    Ok(())
}

/// A message's text: a string, or its text parts joined; any other part is refused.
fn message_text(content: Option<&Value>) -> Result<String, Refused> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for part in parts {
                match (part["type"].as_str(), part["text"].as_str()) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    _ => {
                        return Err(Refused::Unsupported {
                            field: "messages[].content",
                            why: "only text parts reach a gRPC worker (no images or audio)",
                        })
                    }
                }
            }
            Ok(text)
        }
        Some(_) => Err(Refused::Invalid {
            field: "messages[].content",
            rule: "must be a string or a list of parts",
        }),
    }
}

fn constraint(format: Option<&Value>) -> Result<Option<Constraint>, Refused> {
    let Some(format) = format.filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    match format["type"].as_str() {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Constraint::JsonSchema(r#"{"type":"object"}"#.into()))),
        Some("json_schema") => {
            let schema = &format["json_schema"]["schema"];
            if schema.is_null() {
                return Err(Refused::Invalid {
                    field: "response_format.json_schema.schema",
                    rule: "is required",
                });
            }
            Ok(Some(Constraint::JsonSchema(schema.to_string())))
        }
        _ => Err(Refused::Invalid {
            field: "response_format.type",
            rule: "must be text, json_object or json_schema",
        }),
    }
}

/// The bootstrap fields as the protocol's `DisaggregatedParams`, if a room is named. The
/// protocol's room is an `int32` (smg-grpc-proto 0.4.28, `sglang_scheduler.proto`).
fn disaggregated(body: &Body) -> Result<Option<DisaggregatedParams>, Refused> {
    let Some(room) = body.bootstrap_room else {
        return Ok(None);
    };
    let room = i32::try_from(room).map_err(|_| Refused::Invalid {
        field: "bootstrap_room",
        rule: "must be below 2^31 on gRPC workers",
    })?;
    Ok(Some(DisaggregatedParams {
        bootstrap_host: body.bootstrap_host.clone().unwrap_or_default(),
        bootstrap_port: body.bootstrap_port.map_or(0, i32::from),
        bootstrap_room: room,
    }))
}

/// The prompt's token ids: a chat's messages through the chat template, a completion's text
/// tokenized, or its ids as given.
fn prompt_ids(route: Route, body: &Body, tokens: &Tokens) -> Result<Vec<u32>, Refused> {
    Ok(match route {
        Route::Chat => {
            let messages = body.messages.as_ref().ok_or(Refused::Invalid {
                field: "messages",
                rule: "is required",
            })?;
            let chat = messages
                .iter()
                .map(|m| {
                    Ok(ChatMessage {
                        role: m.role.clone(),
                        content: message_text(m.content.as_ref())?,
                    })
                })
                .collect::<Result<Vec<_>, Refused>>()?;
            tokens.chat_ids(&chat)?
        }
        Route::Completions => match body.prompt.as_ref() {
            Some(Prompt::Text(text)) => tokens.prompt_ids(text)?,
            Some(Prompt::Ids(ids)) => ids.clone(),
            None => {
                return Err(Refused::Invalid {
                    field: "prompt",
                    rule: "must be a string or a list of token ids",
                })
            }
        },
    })
}

/// The sampling the body asks for, with OpenAI's defaults where it says nothing.
fn sampling(body: &Body, stop: Vec<String>, n: u32) -> Result<SamplingParams, Refused> {
    Ok(SamplingParams {
        temperature: body.temperature.unwrap_or(1.0),
        top_p: body.top_p.unwrap_or(1.0),
        top_k: body.top_k.unwrap_or(-1),
        min_p: body.min_p.unwrap_or(0.0),
        frequency_penalty: body.frequency_penalty.unwrap_or(0.0),
        presence_penalty: body.presence_penalty.unwrap_or(0.0),
        repetition_penalty: body.repetition_penalty.unwrap_or(1.0),
        max_new_tokens: body.max_completion_tokens.or(body.max_tokens),
        // The engine stops on them (and so frees its slot), and the decoded text is cut here,
        // where the stream's pieces meet.
        stop,
        stop_token_ids: body.stop_token_ids.clone(),
        skip_special_tokens: body.skip_special_tokens.unwrap_or(true),
        spaces_between_special_tokens: true,
        constraint: constraint(body.response_format.as_ref())?,
        n,
        min_new_tokens: body.min_tokens.unwrap_or(0),
        ignore_eos: body.ignore_eos,
        logit_bias: body.logit_bias.clone().unwrap_or_default(),
        ..Default::default()
    })
}

/// Builds the engine's request; tokenizing is CPU work the caller runs off the runtime.
pub(crate) fn generate_request(
    route: Route,
    raw: &[u8],
    tokens: &Tokens,
    request_id: &str,
) -> Result<(GenerateRequest, Asked), Refused> {
    let value: Value = serde_json::from_slice(raw).map_err(|e| Refused::Body(e.to_string()))?;
    refused_fields(&value)?;
    let mut body: Body =
        serde_json::from_value(value.clone()).map_err(|e| Refused::Body(e.to_string()))?;
    let ids = prompt_ids(route, &body, tokens)?;
    let n = body.n.unwrap_or(1);
    if n == 0 {
        return Err(Refused::Invalid {
            field: "n",
            rule: "must be at least 1",
        });
    }
    let disaggregated_params = disaggregated(&body)?;
    let stop = match body.stop.take() {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
    };
    let sampling = sampling(&body, stop.clone(), n)?;
    let prompt_tokens = ids.len() as u32;
    let request = GenerateRequest {
        request_id: request_id.to_string(),
        tokenized: Some(TokenizedInput {
            original_text: String::new(),
            input_ids: ids,
        }),
        sampling_params: Some(sampling),
        stream: body.stream,
        disaggregated_params,
        ..Default::default()
    };
    let asked = Asked {
        route,
        stream: body.stream,
        include_usage: body.stream_options.is_some_and(|o| o.include_usage),
        choices: n,
        stop,
        prompt_tokens,
    };
    Ok((request, asked))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(json: Value) -> Body {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn the_bootstrap_fields_become_disaggregated_params_and_a_room_past_int32_is_refused() {
        assert_eq!(disaggregated(&body(serde_json::json!({}))).unwrap(), None);
        let meet = body(serde_json::json!({
            "bootstrap_host": "10.0.0.7", "bootstrap_port": 8998, "bootstrap_room": 0,
        }));
        assert_eq!(
            disaggregated(&meet).unwrap(),
            Some(DisaggregatedParams {
                bootstrap_host: "10.0.0.7".into(),
                bootstrap_port: 8998,
                bootstrap_room: 0,
            })
        );
        let wide = body(serde_json::json!({"bootstrap_room": 1u64 << 31}));
        let refused = disaggregated(&wide).unwrap_err();
        assert_eq!(refused.param(), Some("bootstrap_room"));
    }
}
