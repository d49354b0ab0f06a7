//! Reading a request body for what routing needs — and nothing else.
//!
//! The body is forwarded to the worker byte for byte, so it is never re-serialized: the fields the
//! gateway needs are read as raw JSON slices borrowed from the body (`RawValue`) and only those are
//! decoded. Everything else (sampling parameters, tools, images) passes through unread.
//! A field with the wrong type is rejected here, naming it, before a worker spends anything on it.

use std::borrow::Cow;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::http::RequestError;

/// The model-routed POST routes the gateway serves: OpenAI's three it checks, and the others
/// vLLM and SGLang serve, which it routes by model and passes through unread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiRoute {
    Chat,
    Completions,
    Embeddings,
    /// OpenAI's Responses API (vLLM).
    Responses,
    /// vLLM's rerank and score.
    Rerank,
    Score,
    /// vLLM's and SGLang's tokenizer endpoints.
    Tokenize,
    Detokenize,
    /// SGLang's native generation endpoint.
    Generate,
    /// OpenAI's audio: uploads (multipart forms) and speech (JSON).
    Transcriptions,
    Translations,
    Speech,
}

impl ApiRoute {
    pub(crate) const ALL: [ApiRoute; 12] = [
        ApiRoute::Chat,
        ApiRoute::Completions,
        ApiRoute::Embeddings,
        ApiRoute::Responses,
        ApiRoute::Rerank,
        ApiRoute::Score,
        ApiRoute::Tokenize,
        ApiRoute::Detokenize,
        ApiRoute::Generate,
        ApiRoute::Transcriptions,
        ApiRoute::Translations,
        ApiRoute::Speech,
    ];

    pub(crate) fn path(self) -> &'static str {
        match self {
            ApiRoute::Chat => "/v1/chat/completions",
            ApiRoute::Completions => "/v1/completions",
            ApiRoute::Embeddings => "/v1/embeddings",
            ApiRoute::Responses => "/v1/responses",
            ApiRoute::Rerank => "/v1/rerank",
            ApiRoute::Score => "/v1/score",
            ApiRoute::Tokenize => "/tokenize",
            ApiRoute::Detokenize => "/detokenize",
            ApiRoute::Generate => "/generate",
            ApiRoute::Transcriptions => "/v1/audio/transcriptions",
            ApiRoute::Translations => "/v1/audio/translations",
            ApiRoute::Speech => "/v1/audio/speech",
        }
    }

    /// The route a request for `path` takes, if it is one of these.
    pub(crate) fn at(path: &str) -> Option<ApiRoute> {
        ApiRoute::ALL.into_iter().find(|route| route.path() == path)
    }

    /// Whether the body is a multipart form (an audio upload) rather than JSON.
    pub(crate) fn is_form(self) -> bool {
        matches!(self, ApiRoute::Transcriptions | ApiRoute::Translations)
    }

    /// The field holding the prompt, which the route requires (OpenAI's three only).
    fn required_prompt(self) -> Option<&'static str> {
        match self {
            ApiRoute::Chat => Some("messages"),
            ApiRoute::Completions => Some("prompt"),
            ApiRoute::Embeddings => Some("input"),
            _ => None,
        }
    }

    /// Whether a request without `model` may have the model chosen for it spliced in: not for
    /// SGLang's `/generate`, whose body has no such field, nor for a form.
    pub(crate) fn takes_model(self) -> bool {
        self != ApiRoute::Generate && !self.is_form()
    }
}

/// What routing needs from a request.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestFacts<'a> {
    pub(crate) model: Option<Cow<'a, str>>,
    /// Where the `model` value (a string or `null`) stands in the body, its byte range: the
    /// model the gateway chose (for a `null`) or the one an alias names replaces it there,
    /// instead of adding a second `model` key.
    pub(crate) model_at: Option<std::ops::Range<usize>>,
    pub(crate) stream: bool,
    /// `max_completion_tokens`, else `max_tokens`, with the name of the field it came from.
    pub(crate) max_tokens: Option<u64>,
    pub(crate) max_tokens_param: &'static str,
    /// `n`, the choices asked for: 1 unless given.
    pub(crate) n: u64,
    pub(crate) user: Option<Cow<'a, str>>,
    /// SGLang's `lora_path`, when a string: the LoRA adapter a request for the base model names
    /// (`sglang_adapter`).
    pub(crate) lora_path: Option<Cow<'a, str>>,
    /// The raw JSON of the prompt (`messages`, `prompt` or `input`): what prefix affinity hashes
    /// and the size estimate counts.
    pub(crate) prompt: &'a [u8],
}

impl RequestFacts<'_> {
    /// A rough prompt size in tokens (about 4 bytes of JSON per token), without a tokenizer.
    pub(crate) fn prompt_tokens_estimate(&self) -> u64 {
        (self.prompt.len() as u64).div_ceil(4)
    }
}

#[derive(Deserialize)]
struct Fields<'a> {
    #[serde(borrow, default, deserialize_with = "null_kept")]
    model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    stream: Option<&'a RawValue>,
    #[serde(borrow, default)]
    max_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    max_completion_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    user: Option<&'a RawValue>,
    #[serde(borrow, default)]
    lora_path: Option<&'a RawValue>,
    #[serde(borrow, default)]
    n: Option<&'a RawValue>,
    #[serde(borrow, default)]
    messages: Option<&'a RawValue>,
    #[serde(borrow, default)]
    prompt: Option<&'a RawValue>,
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
    #[serde(borrow, default)]
    query: Option<&'a RawValue>,
    #[serde(borrow, default)]
    text_1: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    text: Option<&'a RawValue>,
}

/// The facts of a passed-through request: its model, its stream flag and `n` when it has them,
/// the rest unread.
fn passed_through<'a>(
    fields: &Fields<'a>,
    body: &[u8],
    prompt: Option<&'a RawValue>,
) -> Result<RequestFacts<'a>, RequestError> {
    let (model, model_at) = model(fields, body)?;
    Ok(RequestFacts {
        model,
        model_at,
        stream: stream(fields)?,
        max_tokens: None,
        max_tokens_param: "max_tokens",
        n: 1,
        user: None,
        lora_path: None,
        prompt: prompt.map_or(&[][..], |raw| raw.get().as_bytes()),
    })
}

/// The facts of a multipart form (an audio upload): its `model` field, read from the buffered
/// body; everything else, the audio included, passes through unread.
pub async fn parse_form<'a>(
    content_type: &str,
    body: &Bytes,
) -> Result<RequestFacts<'a>, RequestError> {
    let bad = |detail: String| RequestError::InvalidForm { detail };
    let boundary = multer::parse_boundary(content_type).map_err(|e| bad(e.to_string()))?;
    let chunk = body.clone();
    let stream =
        futures_util::stream::once(async move { Ok::<_, std::convert::Infallible>(chunk) });
    let mut form = multer::Multipart::new(stream, boundary);
    let mut model = None;
    while let Some(field) = form.next_field().await.map_err(|e| bad(e.to_string()))? {
        if field.name() == Some("model") {
            model = Some(field.text().await.map_err(|e| bad(e.to_string()))?);
            break;
        }
    }
    Ok(RequestFacts {
        model: model.map(Cow::Owned),
        model_at: None,
        stream: false,
        max_tokens: None,
        max_tokens_param: "max_tokens",
        n: 1,
        user: None,
        lora_path: None,
        prompt: &[],
    })
}

/// A field read as raw JSON with a `null` kept as itself (plain `Option` would make it `None`,
/// losing where it stands).
fn null_kept<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// Reads the facts of a request body for `route`.
pub fn parse(route: ApiRoute, body: &[u8]) -> Result<RequestFacts<'_>, RequestError> {
    // A derived struct would also accept a JSON array (field by position): refuse it first.
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first.is_some_and(|b| *b != b'{')
        && serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok()
    {
        return Err(RequestError::BodyNotObject);
    }
    let fields: Fields<'_> =
        serde_json::from_slice(body).map_err(|e| RequestError::InvalidJson {
            detail: e.to_string(),
        })?;
    let prompt = match route {
        ApiRoute::Chat => fields.messages,
        ApiRoute::Completions => fields.prompt,
        ApiRoute::Embeddings | ApiRoute::Responses => fields.input,
        ApiRoute::Rerank => fields.query,
        ApiRoute::Score => fields.text_1,
        ApiRoute::Tokenize => fields.prompt.or(fields.messages),
        ApiRoute::Detokenize => fields.tokens,
        ApiRoute::Generate => fields.text,
        ApiRoute::Speech => fields.input,
        ApiRoute::Transcriptions | ApiRoute::Translations => None,
    };
    let Some(param) = route.required_prompt() else {
        // Passed through unread: its prompt, when there is one, only places it.
        return passed_through(&fields, body, prompt);
    };
    let prompt = prompt.ok_or(RequestError::MissingParameter { param })?;
    let first = prompt.get().as_bytes().first().copied();
    let prompt_ok = match route {
        ApiRoute::Chat => first == Some(b'['),
        _ => matches!(first, Some(b'[' | b'"')),
    };
    if !prompt_ok {
        return Err(RequestError::InvalidType {
            param,
            expected: if route == ApiRoute::Chat {
                "an array of messages"
            } else {
                "a string or an array"
            },
        });
    }
    let (max_tokens, max_tokens_param) = max_tokens(&fields)?;
    let n = choices(&fields)?;
    let (model, model_at) = model(&fields, body)?;
    Ok(RequestFacts {
        model,
        model_at,
        stream: stream(&fields)?,
        max_tokens,
        max_tokens_param,
        n,
        user: fields.user.map(|raw| string(raw, "user")).transpose()?,
        // A list (one adapter per prompt of a batch) is SGLang's to read.
        lora_path: fields
            .lora_path
            .and_then(|raw| string(raw, "lora_path").ok()),
        prompt: prompt.get().as_bytes(),
    })
}

/// `max_completion_tokens`, else `max_tokens`, and the name of the one given.
fn max_tokens(fields: &Fields<'_>) -> Result<(Option<u64>, &'static str), RequestError> {
    Ok(match fields.max_completion_tokens {
        Some(raw) => (
            Some(count(raw, "max_completion_tokens")?),
            "max_completion_tokens",
        ),
        None => (
            fields
                .max_tokens
                .map(|raw| count(raw, "max_tokens"))
                .transpose()?,
            "max_tokens",
        ),
    })
}

/// `stream`, false unless given.
fn stream(fields: &Fields<'_>) -> Result<bool, RequestError> {
    Ok(fields
        .stream
        .map(|raw| boolean(raw, "stream"))
        .transpose()?
        .unwrap_or(false))
}

/// `n`, 1 unless given; at least 1.
fn choices(fields: &Fields<'_>) -> Result<u64, RequestError> {
    let n = fields
        .n
        .map(|raw| count(raw, "n"))
        .transpose()?
        .unwrap_or(1);
    if n == 0 {
        return Err(RequestError::BelowMin {
            param: "n",
            min: 1,
            got: 0,
        });
    }
    Ok(n)
}

/// The model named (none for `null`), and where its value stands in the body.
type ModelField<'a> = (Option<Cow<'a, str>>, Option<std::ops::Range<usize>>);

/// `model` as a string, and where its value (a string or `null`) stands in `body`.
fn model<'a>(fields: &Fields<'a>, body: &[u8]) -> Result<ModelField<'a>, RequestError> {
    let Some(raw) = fields.model else {
        return Ok((None, None));
    };
    // Borrowed from `body`: its place is its distance from the body's start.
    let start = raw.get().as_ptr() as usize - body.as_ptr() as usize;
    let at = Some(start..start + raw.get().len());
    if raw.get() == "null" {
        return Ok((None, at));
    }
    Ok((Some(string(raw, "model")?), at))
}

fn string<'a>(raw: &'a RawValue, param: &'static str) -> Result<Cow<'a, str>, RequestError> {
    let wrong = RequestError::InvalidType {
        param,
        expected: "a string",
    };
    if !raw.get().starts_with('"') {
        return Err(wrong);
    }
    if let Ok(s) = serde_json::from_str::<&str>(raw.get()) {
        return Ok(Cow::Borrowed(s));
    }
    // Escapes: decoding needs an owned string.
    serde_json::from_str::<String>(raw.get())
        .map(Cow::Owned)
        .map_err(|_| wrong)
}

fn boolean(raw: &RawValue, param: &'static str) -> Result<bool, RequestError> {
    serde_json::from_str(raw.get()).map_err(|_| RequestError::InvalidType {
        param,
        expected: "a boolean",
    })
}

fn count(raw: &RawValue, param: &'static str) -> Result<u64, RequestError> {
    serde_json::from_str(raw.get()).map_err(|_| RequestError::InvalidType {
        param,
        expected: "a non-negative integer",
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Answerable;

    #[test]
    fn every_route_is_found_at_its_path_and_nothing_else_is() {
        for route in ApiRoute::ALL {
            assert_eq!(ApiRoute::at(route.path()), Some(route));
        }
        for other in [
            "/v1/models",
            "/v1/chat/completions/",
            "/V1/chat/completions",
            "",
            "/",
        ] {
            assert_eq!(ApiRoute::at(other), None, "{other}");
        }
    }

    #[test]
    fn reads_only_what_routing_needs() {
        let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,
            "max_tokens":7,"user":"u-1","temperature":0.2,"tools":[{"x":1}]}"#;
        let f = parse(ApiRoute::Chat, body).unwrap();
        assert_eq!(f.model.as_deref(), Some("m"));
        assert!(matches!(f.model, Some(Cow::Borrowed(_))), "no copy");
        assert!(f.stream);
        assert_eq!(f.max_tokens, Some(7));
        assert_eq!(f.user.as_deref(), Some("u-1"));
        assert_eq!(f.prompt, br#"[{"role":"user","content":"hi"}]"#);
    }

    #[test]
    fn nulls_are_absent_and_escapes_decode() {
        let f = parse(
            ApiRoute::Completions,
            br#"{"model":"a\"b","prompt":"x","stream":null,"max_tokens":null,"max_completion_tokens":3}"#,
        )
        .unwrap();
        assert_eq!(f.model.as_deref(), Some("a\"b"));
        assert_eq!(f.model_at, Some(9..15), "the escaped string's place");
        assert!(!f.stream);
        assert_eq!(f.max_tokens, Some(3));
        let e = parse(ApiRoute::Embeddings, br#"{"input":["a","b"]}"#).unwrap();
        assert_eq!(e.model, None);
        let body = br#"{"input":"a", "model" :  null }"#;
        let n = parse(ApiRoute::Embeddings, body).unwrap();
        assert_eq!(n.model, None);
        let at = n.model_at.unwrap();
        assert_eq!(&body[at], b"null", "where the null stands");
    }

    #[test]
    fn every_bad_input_has_its_code_and_param() {
        let cases: &[(ApiRoute, &str, &str, Option<&str>)] = &[
            (ApiRoute::Chat, "{", "invalid_json", None),
            (ApiRoute::Chat, "", "invalid_json", None),
            (ApiRoute::Chat, "[1,2]", "invalid_type", None),
            (ApiRoute::Chat, "\"text\"", "invalid_type", None),
            (ApiRoute::Chat, "[1,", "invalid_json", None),
            (
                ApiRoute::Chat,
                r#"{"model":"m"}"#,
                "missing_required_parameter",
                Some("messages"),
            ),
            (
                ApiRoute::Completions,
                r#"{"model":"m"}"#,
                "missing_required_parameter",
                Some("prompt"),
            ),
            (
                ApiRoute::Embeddings,
                r#"{"model":"m"}"#,
                "missing_required_parameter",
                Some("input"),
            ),
            (
                ApiRoute::Chat,
                r#"{"model":5,"messages":[]}"#,
                "invalid_type",
                Some("model"),
            ),
            (
                ApiRoute::Chat,
                r#"{"messages":"hi"}"#,
                "invalid_type",
                Some("messages"),
            ),
            (
                ApiRoute::Completions,
                r#"{"prompt":5}"#,
                "invalid_type",
                Some("prompt"),
            ),
            (
                ApiRoute::Chat,
                r#"{"messages":[],"stream":"yes"}"#,
                "invalid_type",
                Some("stream"),
            ),
            (
                ApiRoute::Chat,
                r#"{"messages":[],"max_tokens":-1}"#,
                "invalid_type",
                Some("max_tokens"),
            ),
            (
                ApiRoute::Chat,
                r#"{"messages":[],"max_tokens":1.5}"#,
                "invalid_type",
                Some("max_tokens"),
            ),
            (
                ApiRoute::Chat,
                r#"{"messages":[],"user":{}}"#,
                "invalid_type",
                Some("user"),
            ),
        ];
        for (route, body, code, param) in cases {
            let e = parse(*route, body.as_bytes()).unwrap_err();
            assert_eq!((e.code(), e.param()), (*code, *param), "{body}");
        }
    }

    #[test]
    fn the_prompt_estimate_counts_bytes() {
        let f = parse(ApiRoute::Completions, br#"{"prompt":"abcdefgh"}"#).unwrap();
        assert_eq!(f.prompt_tokens_estimate(), 3, "10 bytes of JSON");
    }
}
