//! Rendering a generation as the engine's OpenAI responses: SSE chunks or one JSON body.
//!
//! Chunks are formatted from prefixes computed once per request, since a streaming engine writes
//! one event per token and the simulator must never be what limits a gateway benchmark.

use std::fmt::Write;

use serde_json::json;

use crate::config::Flavor;
use crate::request::Route;
use crate::scheduler::FinishReason;
use crate::vocab::token_text;

/// An event stream's response: `body` with the engines' content type.
pub fn event_stream(body: axum::body::Body) -> axum::response::Response {
    use axum::response::IntoResponse;
    let mut response = body.into_response();
    response.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    response
}

/// Formats one request's chunks.
pub struct Renderer {
    route: Route,
    flavor: Flavor,
    id: String,
    created: u64,
    model: String,
    /// The model name as a JSON string literal, for hand-formatted chunks.
    model_json: String,
    prefix: String,
    /// Each choice's first tokens that are thinking (`reasoning_content`).
    thinking: Vec<u32>,
}

/// Token counts for the usage object.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

impl Renderer {
    pub fn new(route: Route, flavor: Flavor, id: String, created: u64, model: &str) -> Self {
        let object = match route {
            Route::Chat => "chat.completion.chunk",
            Route::Completions => "text_completion",
        };
        let model_json = serde_json::Value::from(model).to_string();
        let prefix = format!(
            r#"data: {{"id":"{id}","object":"{object}","created":{created},"model":{model_json},"choices":[{{"index":"#
        );
        Self {
            route,
            flavor,
            id,
            created,
            model: model.to_string(),
            model_json,
            prefix,
            thinking: Vec::new(),
        }
    }

    pub fn flavor(&self) -> Flavor {
        self.flavor
    }

    /// With each choice's first `thinking` tokens rendered as `reasoning_content`.
    pub fn thinking(mut self, thinking: Vec<u32>) -> Self {
        self.thinking = thinking;
        self
    }

    fn thinks(&self, choice: u32, index: u32) -> bool {
        self.thinking
            .get(choice as usize)
            .is_some_and(|t| index < *t)
    }

    /// Chat streams open each choice with the assistant's role.
    pub fn role(&self, out: &mut String, choice: u32) {
        if self.route == Route::Chat {
            let _ = write!(
                out,
                "{}{choice},\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n",
                self.prefix
            );
        }
    }

    pub fn token(&self, out: &mut String, choice: u32, index: u32) {
        let text = token_text(choice, index);
        match self.route {
            Route::Chat => {
                let field = if self.thinks(choice, index) {
                    "reasoning_content"
                } else {
                    "content"
                };
                write!(
                    out,
                    "{}{choice},\"delta\":{{\"{field}\":\"{text}\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n",
                    self.prefix
                )
            }
            Route::Completions => write!(
                out,
                "{}{choice},\"text\":\"{text}\",\"logprobs\":null,\"finish_reason\":null}}]}}\n\n",
                self.prefix
            ),
        }
        .unwrap_or_default();
    }

    pub fn finish(&self, out: &mut String, choice: u32, reason: FinishReason) {
        let reason = reason.as_str();
        match self.route {
            Route::Chat => write!(
                out,
                "{}{choice},\"delta\":{{}},\"logprobs\":null,\"finish_reason\":\"{reason}\",\"stop_reason\":null}}]}}\n\n",
                self.prefix
            ),
            Route::Completions => write!(
                out,
                "{}{choice},\"text\":\"\",\"logprobs\":null,\"finish_reason\":\"{reason}\",\"stop_reason\":null}}]}}\n\n",
                self.prefix
            ),
        }
        .unwrap_or_default();
    }

    pub fn usage(&self, out: &mut String, usage: Usage) {
        let object = match self.route {
            Route::Chat => "chat.completion.chunk",
            Route::Completions => "text_completion",
        };
        let _ = write!(
            out,
            "data: {{\"id\":\"{}\",\"object\":\"{object}\",\"created\":{},\"model\":{},\"choices\":[],\"usage\":{}}}\n\n",
            self.id,
            self.created,
            self.model_json,
            usage_json(usage)
        );
    }

    pub fn done(out: &mut String) {
        out.push_str("data: [DONE]\n\n");
    }

    /// The event that ends a failed stream (`ApiError::event`), before `data: [DONE]`.
    pub fn error(out: &mut String, event: &serde_json::Value) {
        let _ = write!(out, "data: {event}\n\n");
    }

    /// The whole answer as one JSON body.
    pub fn complete(&self, choices: &[(u32, FinishReason)], usage: Usage) -> serde_json::Value {
        let choices: Vec<serde_json::Value> = choices
            .iter()
            .enumerate()
            .map(|(index, &(tokens, reason))| {
                let thought = self.thinking.get(index).copied().unwrap_or(0).min(tokens);
                let text: String = (thought..tokens)
                    .map(|i| token_text(index as u32, i))
                    .collect();
                let mut choice = match self.route {
                    Route::Chat => json!({
                        "index": index,
                        "message": {"role": "assistant", "content": text, "tool_calls": [],
                                    "reasoning_content": (thought > 0).then(|| (0..thought)
                                        .map(|i| token_text(index as u32, i))
                                        .collect::<String>())},
                        "logprobs": null, "finish_reason": reason.as_str(), "stop_reason": null,
                    }),
                    Route::Completions => json!({
                        "index": index, "text": text, "logprobs": null,
                        "finish_reason": reason.as_str(), "stop_reason": null,
                    }),
                };
                if self.flavor == Flavor::Sglang {
                    // SGLang names the stop it matched; for an end-of-sequence that is the EOS id.
                    let matched = (reason == FinishReason::Stop).then_some(128_009);
                    choice["matched_stop"] = json!(matched);
                }
                choice
            })
            .collect();
        let object = match self.route {
            Route::Chat => "chat.completion",
            Route::Completions => "text_completion",
        };
        json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": {
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            },
        })
    }
}

fn usage_json(usage: Usage) -> String {
    format!(
        "{{\"prompt_tokens\":{},\"completion_tokens\":{},\"total_tokens\":{}}}",
        usage.prompt_tokens,
        usage.completion_tokens,
        usage.prompt_tokens + usage.completion_tokens
    )
}
