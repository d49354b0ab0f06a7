//! The ladder's rewrites of a request body (a JSON object, as the client sent it): each shortens
//! what the request asks of an engine, and says what it did, for the `x-sluice-degraded` header
//! (`<step>=<value>`). A rewrite that finds nothing to shorten changes nothing and says nothing.

use serde_json::{Map, Value};

/// How a model is told to think less, in the form its engine honours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReasoningSwitch {
    /// `chat_template_kwargs: {"enable_thinking": false}` (Qwen3 and its kin, on vLLM and
    /// SGLang).
    Disable,
    /// `reasoning_effort: <effort>` (OpenAI's parameter; gpt-oss on vLLM).
    Effort(String),
    /// A thinking-token budget in the named top-level field, at most `tokens`.
    Budget { field: String, tokens: u64 },
}

/// One rewrite's note for the header: `step=value`.
pub type Applied = String;

/// Reasoning turned off or capped.
pub fn reasoning(body: &mut Map<String, Value>, switch: &ReasoningSwitch) -> Option<Applied> {
    match switch {
        ReasoningSwitch::Disable => {
            let kwargs = body
                .entry("chat_template_kwargs")
                .or_insert_with(|| Value::Object(Map::new()));
            let Value::Object(kwargs) = kwargs else {
                return None;
            };
            if kwargs.get("enable_thinking") == Some(&Value::Bool(false)) {
                return None;
            }
            kwargs.insert("enable_thinking".into(), Value::Bool(false));
            Some("reasoning=off".into())
        }
        ReasoningSwitch::Effort(effort) => {
            if body.get("reasoning_effort").and_then(Value::as_str) == Some(effort.as_str()) {
                return None;
            }
            body.insert("reasoning_effort".into(), Value::String(effort.clone()));
            Some(format!("reasoning=effort:{effort}"))
        }
        ReasoningSwitch::Budget { field, tokens } => {
            if body
                .get(field)
                .and_then(Value::as_u64)
                .is_some_and(|b| b <= *tokens)
            {
                return None;
            }
            body.insert(field.clone(), Value::from(*tokens));
            Some(format!("reasoning=budget:{tokens}"))
        }
    }
}

/// The request sent to model `to` instead.
pub fn cascade(body: &mut Map<String, Value>, to: &str) -> Option<Applied> {
    if body.get("model").and_then(Value::as_str) == Some(to) {
        return None;
    }
    body.insert("model".into(), Value::String(to.into()));
    Some(format!("cascade={to}"))
}

/// `max_tokens` (or `max_completion_tokens`, where the request uses it) at most `cap`; set when
/// the request gave none.
pub fn clamp_output(body: &mut Map<String, Value>, cap: u64) -> Option<Applied> {
    let field = if body.contains_key("max_completion_tokens") {
        "max_completion_tokens"
    } else {
        "max_tokens"
    };
    if body
        .get(field)
        .and_then(Value::as_u64)
        .is_some_and(|n| n <= cap)
    {
        return None;
    }
    body.insert(field.into(), Value::from(cap));
    Some(format!("max_tokens={cap}"))
}

/// What context pruning keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PruneBudget {
    /// Estimated prompt tokens the messages may come to (4 bytes of content a token).
    pub tokens: u64,
    /// The last non-system messages always kept.
    pub keep_last: usize,
}

/// The oldest non-system messages dropped while the chat's messages exceed the budget. System
/// (and developer) messages and the last `keep_last` others stay; an assistant message that
/// calls tools goes only with the tool results that answer it, so no result is left without its
/// call nor a call without its results.
pub fn prune_context(body: &mut Map<String, Value>, budget: PruneBudget) -> Option<Applied> {
    let Some(Value::Array(messages)) = body.get_mut("messages") else {
        return None;
    };
    let units = units(messages);
    let mut total: u64 = messages.iter().map(estimate).sum();
    let droppable = units
        .len()
        .saturating_sub(budget.keep_last_units(&units, messages));
    let mut drop = vec![false; messages.len()];
    let mut dropped = 0;
    for unit in units.iter().take(droppable) {
        if total <= budget.tokens {
            break;
        }
        if unit.iter().any(|&i| is_system(&messages[i])) {
            continue;
        }
        for &i in unit {
            total = total.saturating_sub(estimate(&messages[i]));
            drop[i] = true;
            dropped += 1;
        }
    }
    if dropped == 0 {
        return None;
    }
    let mut i = 0;
    messages.retain(|_| {
        let keep = !drop[i];
        i += 1;
        keep
    });
    Some(format!("prune={dropped}"))
}

impl PruneBudget {
    /// How many units at the end hold the last `keep_last` non-system messages.
    fn keep_last_units(&self, units: &[Vec<usize>], messages: &[Value]) -> usize {
        let mut kept = 0;
        let mut count = 0;
        for unit in units.iter().rev() {
            if kept >= self.keep_last {
                break;
            }
            kept += unit.iter().filter(|&&i| !is_system(&messages[i])).count();
            count += 1;
        }
        count
    }
}

/// Messages grouped so that a tool call and its results form one unit.
fn units(messages: &[Value]) -> Vec<Vec<usize>> {
    let mut units: Vec<Vec<usize>> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str);
        let answers_previous = role == Some("tool")
            && units
                .last()
                .and_then(|u| u.first())
                .is_some_and(|&first| calls_tools(&messages[first]));
        match units.last_mut() {
            Some(unit) if answers_previous => unit.push(i),
            _ => units.push(vec![i]),
        }
    }
    units
}

fn is_system(m: &Value) -> bool {
    matches!(
        m.get("role").and_then(Value::as_str),
        Some("system" | "developer")
    )
}

fn calls_tools(m: &Value) -> bool {
    m.get("role").and_then(Value::as_str) == Some("assistant")
        && m.get("tool_calls")
            .and_then(Value::as_array)
            .is_some_and(|c| !c.is_empty())
}

/// A message's estimated tokens: its serialised size over 4, at least 1.
fn estimate(m: &Value) -> u64 {
    (serde_json::to_string(m).map_or(0, |s| s.len()) as u64 / 4).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    #[test]
    fn reasoning_in_each_form_the_engines_honour() {
        let mut body = object(json!({"model": "qwen3", "messages": []}));
        assert_eq!(
            reasoning(&mut body, &ReasoningSwitch::Disable).as_deref(),
            Some("reasoning=off")
        );
        assert_eq!(
            Value::Object(body.clone()),
            json!({"model": "qwen3", "messages": [], "chat_template_kwargs": {"enable_thinking": false}})
        );
        assert_eq!(
            reasoning(&mut body, &ReasoningSwitch::Disable),
            None,
            "already off"
        );
        let mut kept = object(json!({"chat_template_kwargs": {"add_generation_prompt": true}}));
        reasoning(&mut kept, &ReasoningSwitch::Disable);
        assert_eq!(
            kept["chat_template_kwargs"],
            json!({"add_generation_prompt": true, "enable_thinking": false}),
            "the client's other kwargs stay"
        );
        let mut effort = object(json!({"reasoning_effort": "high"}));
        assert_eq!(
            reasoning(&mut effort, &ReasoningSwitch::Effort("low".into())).as_deref(),
            Some("reasoning=effort:low")
        );
        assert_eq!(effort["reasoning_effort"], "low");
        let budget = ReasoningSwitch::Budget {
            field: "thinking_token_budget".into(),
            tokens: 256,
        };
        let mut big = object(json!({"thinking_token_budget": 4096}));
        assert_eq!(
            reasoning(&mut big, &budget).as_deref(),
            Some("reasoning=budget:256")
        );
        let mut small = object(json!({"thinking_token_budget": 100}));
        assert_eq!(
            reasoning(&mut small, &budget),
            None,
            "already under the cap"
        );
    }

    #[test]
    fn a_cascade_names_the_other_model_and_clamping_caps_or_sets_the_output() {
        let mut body = object(json!({"model": "llama-70b", "max_tokens": 2048}));
        assert_eq!(
            cascade(&mut body, "llama-8b").as_deref(),
            Some("cascade=llama-8b")
        );
        assert_eq!(
            clamp_output(&mut body, 512).as_deref(),
            Some("max_tokens=512")
        );
        assert_eq!(
            Value::Object(body.clone()),
            json!({"model": "llama-8b", "max_tokens": 512})
        );
        assert_eq!(clamp_output(&mut body, 512), None);
        let mut unset = object(json!({"model": "m"}));
        clamp_output(&mut unset, 512);
        assert_eq!(unset["max_tokens"], 512, "no limit given: the cap is set");
        let mut newer = object(json!({"max_completion_tokens": 4000}));
        clamp_output(&mut newer, 300);
        assert_eq!(
            Value::Object(newer),
            json!({"max_completion_tokens": 300}),
            "the field the client used"
        );
    }

    fn chat() -> Map<String, Value> {
        let filler = "x".repeat(400);
        object(json!({"model": "m", "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": filler},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": filler},
            {"role": "user", "content": filler},
            {"role": "assistant", "content": filler},
            {"role": "user", "content": "and now?"}
        ]}))
    }

    #[test]
    fn pruning_drops_the_oldest_turns_never_the_system_prompt_nor_half_a_tool_call() {
        let mut body = chat();
        let budget = PruneBudget {
            tokens: 260,
            keep_last: 2,
        };
        assert_eq!(prune_context(&mut body, budget).as_deref(), Some("prune=3"));
        let roles: Vec<&str> = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(
            roles,
            ["system", "user", "assistant", "user"],
            "the first user turn, then the tool call with its result, went together"
        );
        let mut roomy = chat();
        let all = PruneBudget {
            tokens: 100_000,
            keep_last: 2,
        };
        assert_eq!(prune_context(&mut roomy, all), None, "under budget");
        assert_eq!(roomy, chat());
        let mut tight = chat();
        let keep_all = PruneBudget {
            tokens: 1,
            keep_last: 6,
        };
        assert_eq!(
            prune_context(&mut tight, keep_all),
            None,
            "the last six are kept whatever the budget"
        );
        let mut no_messages = object(json!({"prompt": "hi"}));
        assert_eq!(prune_context(&mut no_messages, budget), None);
    }

    #[test]
    fn a_tool_call_is_dropped_only_with_every_result_that_answers_it() {
        let filler = "y".repeat(800);
        let mut body = object(json!({"messages": [
            {"role": "user", "content": filler},
            {"role": "assistant", "tool_calls": [{"id": "a"}, {"id": "b"}]},
            {"role": "tool", "tool_call_id": "a", "content": filler},
            {"role": "tool", "tool_call_id": "b", "content": filler},
            {"role": "user", "content": "last"}
        ]}));
        let budget = PruneBudget {
            tokens: 250,
            keep_last: 1,
        };
        assert_eq!(prune_context(&mut body, budget).as_deref(), Some("prune=4"));
        assert_eq!(
            Value::Object(body),
            json!({"messages": [{"role": "user", "content": "last"}]})
        );
    }
}
