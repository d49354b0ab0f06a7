//! A gRPC worker's replies as the OpenAI answer an HTTP engine would have sent: an event stream
//! (a role chunk, content deltas, each choice's finish, the usage when asked, `data: [DONE]`) or
//! one JSON completion, in the chat or the text-completion shape. Token ids become text through
//! each choice's `Detokenizer`, which also ends a choice at the request's first stop sequence.
//! An engine's error after the stream began is an error event and `[DONE]`, as vLLM writes one,
//! so the stream stage judges it as it judges an HTTP engine's.

use bytes::Bytes;
use serde_json::{json, Value};
use sluice_proto::sglang_scheduler::generate_response::Response as Reply;

use super::request::{Asked, Route};
use crate::tokens::{Detokenizer, Tokens};

/// One choice's progress.
struct Choice {
    decoder: Detokenizer,
    /// A whole answer's text so far.
    text: String,
    tokens: u32,
    finish: Option<&'static str>,
}

/// The answer of one request, built reply by reply.
pub(crate) struct Renderer {
    asked: Asked,
    id: String,
    created: u64,
    model: String,
    choices: Vec<Choice>,
    role_sent: bool,
    /// A stop sequence ended a choice before the engine did.
    cut: bool,
}

/// What one reply adds to a streamed answer.
#[derive(Debug, Default)]
pub(crate) struct Rendered {
    pub(crate) bytes: Vec<u8>,
    /// Every choice has finished: the stream's end follows, and the engine's remaining work
    /// (after a stop sequence) can be aborted.
    pub(crate) done: bool,
}

fn finish_reason(engine: &str) -> &'static str {
    match engine {
        "length" => "length",
        _ => "stop",
    }
}

impl Renderer {
    pub fn new(asked: Asked, tokens: &Tokens, model: &str, request_id: &str) -> Self {
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let prefix = match asked.route {
            Route::Chat => "chatcmpl",
            Route::Completions => "cmpl",
        };
        let choices = (0..asked.choices)
            .map(|_| Choice {
                decoder: tokens.detokenizer(asked.stop.clone()),
                text: String::new(),
                tokens: 0,
                finish: None,
            })
            .collect();
        Self {
            id: format!("{prefix}-{request_id}"),
            created,
            model: model.to_string(),
            choices,
            role_sent: false,
            cut: false,
            asked,
        }
    }

    /// Whether a stop sequence ended an answer the engine was still generating.
    pub(crate) fn cut_short(&self) -> bool {
        self.cut
    }

    fn done(&self) -> bool {
        self.choices.iter().all(|c| c.finish.is_some())
    }

    /// Takes one reply's tokens into its choice; the text that became ready, if any.
    fn take(&mut self, index: u32, ids: &[u32], finish: Option<&str>) -> (String, bool) {
        let Some(choice) = self.choices.get_mut(index as usize) else {
            return (String::new(), false);
        };
        if choice.finish.is_some() {
            return (String::new(), false);
        }
        let mut text = String::new();
        for id in ids {
            choice.tokens += 1;
            match choice.decoder.push(*id) {
                Ok(decoded) => {
                    text.push_str(&decoded.text);
                    if decoded.stopped.is_some() {
                        choice.finish = Some("stop");
                        self.cut = true;
                        return (text, true);
                    }
                }
                // An id the tokenizer does not know decodes to nothing (a model and tokenizer
                // out of step); the rest of the answer still does.
                Err(_) => continue,
            }
        }
        if let Some(reason) = finish {
            text.push_str(&choice.decoder.finish());
            choice.finish = Some(finish_reason(reason));
            return (text, true);
        }
        (text, false)
    }

    /// The stream's bytes for one reply.
    pub(crate) fn stream(&mut self, reply: &Reply) -> Rendered {
        let mut out = Vec::new();
        if !self.role_sent && self.asked.route == Route::Chat {
            self.role_sent = true;
            for index in 0..self.asked.choices {
                self.event(
                    &mut out,
                    index,
                    json!({"role": "assistant", "content": ""}),
                    None,
                );
            }
        }
        let (index, ids, finish) = match reply {
            Reply::Chunk(c) => (c.index, c.token_ids.as_slice(), None),
            Reply::Complete(c) => (c.index, &[][..], Some(c.finish_reason.as_str())),
        };
        let (text, finished) = self.take(index, ids, finish);
        if !text.is_empty() {
            self.event(&mut out, index, json!({"content": text}), None);
        }
        if finished {
            let reason = self.choices[index as usize].finish;
            self.event(&mut out, index, json!({}), reason);
        }
        Rendered {
            bytes: out,
            done: self.done(),
        }
    }

    /// A whole answer's reply: its choice's tokens kept; true once every choice has finished.
    pub(crate) fn whole(&mut self, reply: &Reply) -> bool {
        let (index, ids, finish) = match reply {
            Reply::Chunk(c) => (c.index, c.token_ids.as_slice(), None),
            Reply::Complete(c) => (
                c.index,
                c.output_ids.as_slice(),
                Some(c.finish_reason.as_str()),
            ),
        };
        let (text, _) = self.take(index, ids, finish);
        if let Some(choice) = self.choices.get_mut(index as usize) {
            choice.text.push_str(&text);
        }
        self.done()
    }

    fn usage(&self) -> Value {
        let completion: u32 = self.choices.iter().map(|c| c.tokens).sum();
        let prompt = self.asked.prompt_tokens * self.asked.choices;
        json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        })
    }

    /// One SSE event of choice `index`: a chat delta, or a completion's text.
    fn event(&self, out: &mut Vec<u8>, index: u32, delta: Value, finish: Option<&str>) {
        let choice = match self.asked.route {
            Route::Chat => json!({"index": index, "delta": delta, "finish_reason": finish}),
            Route::Completions => json!({
                "index": index,
                "text": delta.get("content").cloned().unwrap_or(json!("")),
                "logprobs": null,
                "finish_reason": finish,
            }),
        };
        let chunk = json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        });
        write_event(out, &chunk);
    }

    fn object(&self, streamed: bool) -> &'static str {
        match (self.asked.route, streamed) {
            (Route::Chat, true) => "chat.completion.chunk",
            (Route::Chat, false) => "chat.completion",
            (Route::Completions, _) => "text_completion",
        }
    }

    /// The stream's end: the usage when asked, then `[DONE]`.
    pub(crate) fn end(&self) -> Bytes {
        let mut out = Vec::new();
        if self.asked.include_usage {
            let chunk = json!({
                "id": self.id,
                "object": self.object(true),
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": self.usage(),
            });
            write_event(&mut out, &chunk);
        }
        out.extend_from_slice(b"data: [DONE]\n\n");
        Bytes::from(out)
    }

    /// The whole answer.
    pub(crate) fn completion(&self) -> Bytes {
        let choices: Vec<Value> = self
            .choices
            .iter()
            .enumerate()
            .map(|(index, c)| match self.asked.route {
                Route::Chat => json!({
                    "index": index,
                    "message": {"role": "assistant", "content": c.text},
                    "finish_reason": c.finish,
                }),
                Route::Completions => json!({
                    "index": index,
                    "text": c.text,
                    "logprobs": null,
                    "finish_reason": c.finish,
                }),
            })
            .collect();
        let body = json!({
            "id": self.id,
            "object": self.object(false),
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self.usage(),
        });
        Bytes::from(body.to_string())
    }
}

fn write_event(out: &mut Vec<u8>, value: &Value) {
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(value.to_string().as_bytes());
    out.extend_from_slice(b"\n\n");
}

/// An engine's failure after the stream began: vLLM's error event, then `[DONE]`.
pub(crate) fn error_event(status: u16, message: &str) -> Bytes {
    let mut out = Vec::new();
    let kind = if status < 500 {
        "BadRequestError"
    } else {
        "InternalServerError"
    };
    write_event(
        &mut out,
        &json!({"error": {"message": message, "type": kind, "param": null, "code": status}}),
    );
    out.extend_from_slice(b"data: [DONE]\n\n");
    Bytes::from(out)
}
