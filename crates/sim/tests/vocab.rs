//! The simulated model's files load where a real model's would: Hugging Face's `tokenizers`
//! reads its `tokenizer.json`, a Jinja engine renders its chat template, and the ids the engine
//! answers with decode to the words the HTTP engine says.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use sluice_sim::vocab::{token_text, Vocab, CHAT_TEMPLATE};
use tokenizers::Tokenizer;

/// A fresh directory for one test's files, removed when dropped.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("sluice-vocab-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tokenizer(name: &str) -> (Scratch, Tokenizer) {
    let dir = Scratch::new(name);
    Vocab::new().write_model_dir(&dir.0, "test-model").unwrap();
    let tokenizer = Tokenizer::from_file(dir.0.join("tokenizer.json")).unwrap();
    (dir, tokenizer)
}

#[test]
fn any_text_round_trips_and_the_models_words_are_single_tokens() {
    let (_dir, tokenizer) = tokenizer("roundtrip");
    let vocab = Vocab::new();
    assert_eq!(tokenizer.get_vocab_size(true) as u32, vocab.size());
    for text in [
        "Hello, world!",
        "héllo ✓ 日本語",
        " the engine answers",
        "a\nb\tc",
    ] {
        let ids = tokenizer.encode(text, false).unwrap().get_ids().to_vec();
        assert_eq!(tokenizer.decode(&ids, false).unwrap(), text);
    }
    let words = tokenizer.encode(" the engine", false).unwrap();
    assert_eq!(
        words.get_ids(),
        [vocab.answer_token(0, 0), vocab.answer_token(0, 1)]
    );
    // The ids an answer is made of decode to the words the HTTP engine writes.
    let ids: Vec<u32> = (0..20).map(|i| vocab.answer_token(1, i)).collect();
    let said: String = (0..20).map(|i| token_text(1, i)).collect();
    assert_eq!(tokenizer.decode(&ids, false).unwrap(), said);
    // A benchmark prompt is a token a word, as the HTTP engine counts it at 4 bytes a token.
    let prompt = " qxz abc zzz the eng";
    assert_eq!(tokenizer.encode(prompt, false).unwrap().get_ids().len(), 5);
    // A multi-byte character spans tokens, so a streaming decoder must wait for its last byte.
    let check = tokenizer.encode("✓", false).unwrap();
    assert_eq!(check.get_ids().len(), 3);
}

#[test]
fn the_chat_template_renders_with_the_special_tokens_the_tokenizer_knows() {
    let (dir, tokenizer) = tokenizer("template");
    let vocab = Vocab::new();
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.0.join("tokenizer_config.json")).unwrap())
            .unwrap();
    assert_eq!(config["chat_template"], CHAT_TEMPLATE);
    let mut env = minijinja::Environment::new();
    env.add_template("chat", CHAT_TEMPLATE).unwrap();
    let rendered = env
        .get_template("chat")
        .unwrap()
        .render(minijinja::context! {
            messages => vec![
                minijinja::context! { role => "system", content => "Be brief." },
                minijinja::context! { role => "user", content => " Hi " },
            ],
            bos_token => "<|begin_of_text|>",
            add_generation_prompt => true,
        })
        .unwrap();
    assert_eq!(
        rendered,
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>\
         <|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\n"
    );
    let ids = tokenizer.encode(rendered.as_str(), false).unwrap();
    assert_eq!(ids.get_ids()[0], vocab.bos());
    assert_eq!(
        ids.get_ids()
            .iter()
            .filter(|id| **id == vocab.eos())
            .count(),
        2
    );
    let text = tokenizer.decode(ids.get_ids(), true).unwrap();
    assert!(!text.contains("<|"), "special tokens are skipped: {text}");
}
