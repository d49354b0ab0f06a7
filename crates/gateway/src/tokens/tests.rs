//! The simulated model's files (`sluice_sim::vocab`) stand in for a real model's.

use std::path::PathBuf;

use sluice_sim::vocab::Vocab;

use super::*;

/// A fresh directory for one test, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("sluice-tokens-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Vocab::new().write_model_dir(&dir, "test-model").unwrap();
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn model(dir: &Scratch) -> ModelFiles {
    ModelFiles {
        model_path: Some(dir.0.clone()),
        ..ModelFiles::default()
    }
}

fn user(content: &str) -> ChatMessage {
    ChatMessage {
        role: "user".into(),
        content: content.into(),
    }
}

#[test]
fn a_chat_is_templated_and_tokenized_with_the_models_special_tokens() {
    let dir = Scratch::new("chat");
    let tokens = Tokens::load(&model(&dir)).unwrap();
    let vocab = Vocab::new();
    assert_eq!(tokens.vocab_size() as u32, vocab.size());
    let ids = tokens.chat_ids(&[user("Hello there")]).unwrap();
    assert_eq!(ids[0], vocab.bos());
    assert_eq!(ids.iter().filter(|id| **id == vocab.eos()).count(), 1);
    assert_eq!(
        tokens.prompt_ids(" the engine").unwrap(),
        [vocab.answer_token(0, 0), vocab.answer_token(0, 1)]
    );
}

#[test]
fn the_chat_template_flag_wins_over_the_directorys() {
    let dir = Scratch::new("flag");
    let own = dir.0.join("mine.jinja");
    std::fs::write(&own, "{% for m in messages %}{{ m.content }}{% endfor %}").unwrap();
    let files = ModelFiles {
        chat_template: Some(own),
        ..model(&dir)
    };
    let tokens = Tokens::load(&files).unwrap();
    let ids = tokens.chat_ids(&[user("abc")]).unwrap();
    assert_eq!(ids, tokens.prompt_ids("abc").unwrap());
}

#[test]
fn missing_and_broken_files_are_errors_that_name_them() {
    let gone = ModelFiles {
        model_path: Some("/nonexistent/meta-llama/Llama-3.1-8B".into()),
        ..ModelFiles::default()
    };
    let missing = Tokens::load(&gone).err().unwrap();
    assert!(
        matches!(
            missing,
            TokensError::Missing {
                flag: "--model-path",
                ..
            }
        ),
        "{missing}"
    );
    assert!(
        missing.to_string().contains("downloads nothing"),
        "{missing}"
    );
    assert!(matches!(
        Tokens::load(&ModelFiles::default()),
        Err(TokensError::NoTokenizerPath)
    ));

    let dir = Scratch::new("broken");
    std::fs::write(dir.0.join("tokenizer.json"), "{ not json").unwrap();
    let broken = Tokens::load(&model(&dir)).err().unwrap();
    assert!(matches!(broken, TokensError::Tokenizer { .. }), "{broken}");

    let dir = Scratch::new("template");
    let config = dir.0.join("tokenizer_config.json");
    std::fs::write(&config, r#"{"chat_template": "{% if %}"}"#).unwrap();
    let syntax = Tokens::load(&model(&dir)).err().unwrap();
    assert!(
        matches!(syntax, TokensError::TemplateSyntax { .. }),
        "{syntax}"
    );

    std::fs::write(&config, "{}").unwrap();
    let bare = Tokens::load(&model(&dir)).unwrap();
    assert!(matches!(
        bare.chat_ids(&[user("x")]),
        Err(TokensError::NoTemplate)
    ));
}

#[test]
fn streamed_ids_decode_whole_characters_and_skip_special_tokens() {
    let dir = Scratch::new("decode");
    let tokens = Tokens::load(&model(&dir)).unwrap();
    let vocab = Vocab::new();
    let mut decoder = tokens.detokenizer(vec![]);
    let check = tokens.prompt_ids(" ✓").unwrap();
    assert_eq!(check.len(), 4, "a space and three bytes");
    let pieces: Vec<String> = check
        .iter()
        .map(|id| decoder.push(*id).unwrap().text)
        .collect();
    assert_eq!(pieces.concat(), " ✓");
    assert!(
        pieces.iter().all(|p| p.is_empty() || p == " " || p == "✓"),
        "never half a character: {pieces:?}"
    );
    assert_eq!(decoder.push(vocab.eos()).unwrap().text, "");
    assert_eq!(decoder.finish(), "");
}

#[test]
fn a_stop_sequence_ends_the_answer_before_it_and_a_near_miss_is_released() {
    let dir = Scratch::new("stop");
    let tokens = Tokens::load(&model(&dir)).unwrap();
    let vocab = Vocab::new();
    let words: Vec<u32> = (0..6).map(|i| vocab.answer_token(0, i)).collect();
    // " the engine answers with simulated tokens"
    let mut decoder = tokens.detokenizer(vec![" with sim".into()]);
    let mut out = String::new();
    let mut stopped = None;
    for id in &words {
        let decoded = decoder.push(*id).unwrap();
        out.push_str(&decoded.text);
        if decoded.stopped.is_some() {
            stopped = decoded.stopped;
            break;
        }
    }
    assert_eq!(out, " the engine answers");
    assert_eq!(stopped.as_deref(), Some(" with sim"));
    assert_eq!(decoder.push(words[0]).unwrap(), Decoded::default());

    let mut decoder = tokens.detokenizer(vec![" engine room".into()]);
    let first = decoder.push(words[0]).unwrap().text;
    let held = decoder.push(words[1]).unwrap().text;
    assert_eq!(
        (first.as_str(), held.as_str()),
        (" the", ""),
        "' engine' may start the stop"
    );
    assert_eq!(decoder.finish(), " engine", "released at the end");
}
