//! A reasoning model (`--reasoning`): before its answer the engine thinks, and streams the
//! thought as `reasoning_content` deltas, as vLLM's reasoning parsers emit it. How long it thinks
//! is drawn per choice around a median, and the request's switches shorten it the way engines
//! honour them:
//!
//! - `chat_template_kwargs: {"enable_thinking": false}` — no thinking (Qwen3's template);
//! - `reasoning_effort`: `minimal` x 0.1, `low` x 0.25, `medium` x 0.5, `high` x 1 of the median;
//! - `thinking_token_budget: N` — at most N thinking tokens.
//!
//! Thinking tokens are output tokens: they count in `max_tokens` and in `completion_tokens`.

use serde::Deserialize;

/// What a request asks of the model's thinking.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ThinkingAsk {
    pub enabled: bool,
    /// A share of the median thinking length (`reasoning_effort`).
    pub scale: f64,
    /// At most this many thinking tokens.
    pub budget: Option<u32>,
}

impl Default for ThinkingAsk {
    fn default() -> Self {
        Self {
            enabled: true,
            scale: 1.0,
            budget: None,
        }
    }
}

/// The body fields that switch thinking.
#[derive(Debug, Default, Deserialize)]
pub struct ThinkingFields {
    #[serde(default)]
    chat_template_kwargs: Option<serde_json::Value>,
    #[serde(default)]
    reasoning_effort: Option<String>,
    #[serde(default)]
    thinking_token_budget: Option<u32>,
}

impl ThinkingFields {
    pub fn ask(&self) -> ThinkingAsk {
        let disabled = self
            .chat_template_kwargs
            .as_ref()
            .and_then(|k| k.get("enable_thinking"))
            .and_then(serde_json::Value::as_bool)
            == Some(false);
        let scale = match self.reasoning_effort.as_deref() {
            Some("minimal") => 0.1,
            Some("low") => 0.25,
            Some("medium") => 0.5,
            _ => 1.0,
        };
        ThinkingAsk {
            enabled: !disabled,
            scale,
            budget: self.thinking_token_budget,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(json: &str) -> ThinkingAsk {
        serde_json::from_str::<ThinkingFields>(json).unwrap().ask()
    }

    #[test]
    fn each_switch_as_engines_honour_it() {
        assert_eq!(ask("{}"), ThinkingAsk::default());
        assert!(!ask(r#"{"chat_template_kwargs":{"enable_thinking":false}}"#).enabled);
        assert!(ask(r#"{"chat_template_kwargs":{"enable_thinking":true}}"#).enabled);
        assert_eq!(ask(r#"{"reasoning_effort":"low"}"#).scale, 0.25);
        assert_eq!(ask(r#"{"thinking_token_budget":64}"#).budget, Some(64));
    }
}
