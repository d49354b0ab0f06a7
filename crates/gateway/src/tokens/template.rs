//! The model's chat template, rendered as Hugging Face's `apply_chat_template` renders it:
//! `messages`, `bos_token`, `eos_token` and `add_generation_prompt` in the context, the Python
//! string methods templates call (`.strip()`, `.startswith()`, ... through minijinja-contrib's
//! pycompat), and the helpers transformers gives templates (`raise_exception`, `strftime_now`).
//! A template that does not parse is refused at startup; one that fails on a conversation (a
//! `raise_exception`, say) fails that request.

use minijinja::{context, Environment, Error, ErrorKind};
use serde::Serialize;

use super::TokensError;

/// One message of a chat, its content as text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

/// A compiled chat template and the special tokens it is rendered with.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

const NAME: &str = "chat";

fn raise_exception(message: String) -> Result<String, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// Today's date (UTC) in strftime's format, as transformers' `strftime_now` gives templates that
/// write the date into a system prompt; the formats templates use (`%d %b %Y`, `%Y-%m-%d`).
fn strftime_now(format: String) -> String {
    let now = humantime::format_rfc3339(std::time::SystemTime::now()).to_string();
    let (year, month, day) = (&now[0..4], &now[5..7], &now[8..10]);
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month_name = month
        .parse::<usize>()
        .ok()
        .and_then(|m| MONTHS.get(m.wrapping_sub(1)))
        .copied()
        .unwrap_or("Jan");
    format
        .replace("%Y", year)
        .replace("%m", month)
        .replace("%d", day)
        .replace("%b", month_name)
}

impl ChatTemplate {
    /// Compiles `source`; `origin` names where it came from in the error.
    pub fn new(
        source: &str,
        bos_token: String,
        eos_token: String,
        origin: &str,
    ) -> Result<Self, TokensError> {
        let mut env = Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(NAME, source.to_string())
            .map_err(|e| TokensError::TemplateSyntax {
                origin: origin.to_string(),
                reason: e.to_string(),
            })?;
        Ok(Self {
            env,
            bos_token,
            eos_token,
        })
    }

    /// The conversation as the prompt text, the assistant's turn primed.
    pub(crate) fn render(&self, messages: &[ChatMessage]) -> Result<String, TokensError> {
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| TokensError::Render(e.to_string()))?;
        template
            .render(context! {
                messages => messages,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
                add_generation_prompt => true,
            })
            .map_err(|e| TokensError::Render(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }

    #[test]
    fn python_string_methods_and_the_transformers_helpers_work() {
        let source = "{% for m in messages %}{% if m.role == 'bad' %}\
            {{ raise_exception('no bad roles') }}{% endif %}\
            [{{ m.role.upper() }}]{{ m.content.strip() }}{% endfor %}{{ bos_token }}";
        let template = ChatTemplate::new(source, "<s>".into(), "</s>".into(), "test").unwrap();
        let text = template.render(&[message("user", "  hi  ")]).unwrap();
        assert_eq!(text, "[USER]hi<s>");
        let refused = template.render(&[message("bad", "x")]).unwrap_err();
        assert!(refused.to_string().contains("no bad roles"), "{refused}");
        let dated = ChatTemplate::new(
            "{{ strftime_now('%d %b %Y') }}",
            String::new(),
            String::new(),
            "t",
        )
        .unwrap()
        .render(&[])
        .unwrap();
        assert_eq!(dated.len(), 11, "{dated}");
    }

    #[test]
    fn a_template_that_does_not_parse_names_where_it_came_from() {
        let broken = ChatTemplate::new("{% for %}", String::new(), String::new(), "x.jinja");
        let Err(TokensError::TemplateSyntax { origin, .. }) = broken else {
            panic!("a syntax error must be refused");
        };
        assert_eq!(origin, "x.jinja");
    }
}
