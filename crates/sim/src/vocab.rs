//! The simulated model's tokenizer and chat template, as a model directory's files.
//!
//! A gRPC worker takes token ids, so whoever talks to one — sluice's gateway, real SMG — needs
//! the model's tokenizer and chat template, and the engine's answers must be ids that tokenizer
//! decodes. No real model's files can be downloaded here, so the simulated model has its own:
//! a byte-level BPE in Hugging Face's `tokenizer.json` format (GPT-2's byte alphabet, so any
//! text tokenizes and decodes losslessly, multi-byte characters split across tokens as a real
//! tokenizer splits them), with merges that make each word the simulated model says one token,
//! special tokens in Llama 3's style, and a Llama 3-style chat template in
//! `tokenizer_config.json`. `write_model_dir` writes both files where a model's files would be,
//! so a gateway's `--tokenizer-path` points at them as at a real model's.
//!
//! The words it says (`token_text`) are what the HTTP engine writes too, one per token.
//!
//! Every word the benchmarks' prompts are made of (a space and three lowercase letters) is one
//! token too, so a benchmark's prompt is as long on a gRPC engine as on an HTTP one (4 bytes a
//! token); a vocabulary of 18,565 ids.
//!
//! Ids: 0-255 are the 256 bytes (id = byte value), then every prefix of a word the model says
//! (the merges' results), then every prefix of a prompt word not already there, then the special
//! tokens.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Value};

/// Words the simulated model says, one per token.
const WORDS: [&str; 16] = [
    " the",
    " engine",
    " answers",
    " with",
    " simulated",
    " tokens",
    " while",
    " its",
    " batch",
    " grows",
    " and",
    " the",
    " cache",
    " fills",
    " up",
    ".",
];

/// The text of the `index`-th token of a choice.
pub fn token_text(choice: u32, index: u32) -> &'static str {
    WORDS[word_index(choice, index)]
}

/// Which of `WORDS` the `index`-th token of a choice is.
fn word_index(choice: u32, index: u32) -> usize {
    ((choice as usize) * 7 + index as usize) % WORDS.len()
}

/// The words benchmark prompts are made of (`sluice bench`: three lowercase letters after a
/// space, 4 bytes a token): each is one token, so a prompt is as many tokens here as the HTTP
/// engine counts at 4 bytes a token.
fn prompt_words() -> impl Iterator<Item = String> {
    let letters = || (b'a'..=b'z').map(char::from);
    letters().flat_map(move |a| {
        letters().flat_map(move |b| letters().map(move |c| format!(" {a}{b}{c}")))
    })
}

/// The special tokens, in id order after the merged tokens.
pub const BEGIN_OF_TEXT: &str = "<|begin_of_text|>";
pub const START_HEADER: &str = "<|start_header_id|>";
pub const END_HEADER: &str = "<|end_header_id|>";
/// End of a turn: the model's end-of-sequence token.
pub const END_OF_TURN: &str = "<|eot_id|>";
const SPECIALS: [&str; 4] = [BEGIN_OF_TEXT, START_HEADER, END_HEADER, END_OF_TURN];

/// Llama 3's chat template, reduced to text content: each message as a header and its content,
/// then the assistant's header when a reply is wanted.
pub const CHAT_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}\
<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n\
{{ message['content'] | trim }}<|eot_id|>{% endfor %}\
{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}";

/// The longest prompt plus answer the simulated model's files declare.
const MODEL_MAX_LENGTH: u32 = 131_072;

/// The simulated model's vocabulary: the files, and the ids the engine answers with.
#[derive(Debug, Clone)]
pub struct Vocab {
    /// Token text (in the byte alphabet) by id, specials last.
    tokens: Vec<String>,
    merges: Vec<(String, String)>,
    /// The id of each of `WORDS`.
    word_ids: Vec<u32>,
}

impl Default for Vocab {
    fn default() -> Self {
        Self::new()
    }
}

impl Vocab {
    pub fn new() -> Self {
        let alphabet = byte_alphabet();
        let mut tokens: Vec<String> = alphabet.iter().map(char::to_string).collect();
        let mut ids: BTreeMap<String, u32> = tokens
            .iter()
            .enumerate()
            .map(|(id, t)| (t.clone(), id as u32))
            .collect();
        let mut merges = Vec::new();
        // Each word merges left to right from its first byte, so words sharing a beginning
        // share its merges and no merge can split another word's path.
        let mut merge = |word: &str| {
            let chars: Vec<char> = word.bytes().map(|b| alphabet[b as usize]).collect();
            let mut merged = chars[0].to_string();
            for next in &chars[1..] {
                let joined = format!("{merged}{next}");
                if !ids.contains_key(&joined) {
                    ids.insert(joined.clone(), tokens.len() as u32);
                    tokens.push(joined.clone());
                    merges.push((merged.clone(), next.to_string()));
                }
                merged = joined;
            }
            ids[&merged]
        };
        let word_ids = WORDS.iter().map(|w| merge(w)).collect();
        for word in prompt_words() {
            merge(&word);
        }
        tokens.extend(SPECIALS.iter().map(|s| s.to_string()));
        Self {
            tokens,
            merges,
            word_ids,
        }
    }

    /// Every id the tokenizer knows.
    pub fn size(&self) -> u32 {
        self.tokens.len() as u32
    }

    /// The id of a special token.
    pub fn special(&self, token: &str) -> Option<u32> {
        let first = self.tokens.len() - SPECIALS.len();
        SPECIALS
            .iter()
            .position(|s| *s == token)
            .map(|i| (first + i) as u32)
    }

    /// The end-of-sequence id the engine stops on.
    pub fn eos(&self) -> u32 {
        self.special(END_OF_TURN).unwrap_or(0)
    }

    /// The beginning-of-text id.
    pub fn bos(&self) -> u32 {
        self.special(BEGIN_OF_TEXT).unwrap_or(0)
    }

    /// The id of the `index`-th token a choice says: the word `token_text` names.
    pub fn answer_token(&self, choice: u32, index: u32) -> u32 {
        let i = word_index(choice, index);
        self.word_ids[i]
    }

    /// `tokenizer.json`, as Hugging Face's `tokenizers` reads it.
    pub fn tokenizer_json(&self) -> Value {
        let first_special = self.tokens.len() - SPECIALS.len();
        let vocab: serde_json::Map<String, Value> = self.tokens[..first_special]
            .iter()
            .enumerate()
            .map(|(id, t)| (t.clone(), json!(id)))
            .collect();
        let added: Vec<Value> = SPECIALS
            .iter()
            .enumerate()
            .map(|(i, content)| {
                json!({
                    "id": first_special + i, "content": content, "single_word": false,
                    "lstrip": false, "rstrip": false, "normalized": false, "special": true,
                })
            })
            .collect();
        let merges: Vec<String> = self
            .merges
            .iter()
            .map(|(a, b)| format!("{a} {b}"))
            .collect();
        json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": {
                "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                "use_regex": true,
            },
            "post_processor": null,
            "decoder": {
                "type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
                "use_regex": true,
            },
            "model": {
                "type": "BPE", "dropout": null, "unk_token": null,
                "continuing_subword_prefix": null, "end_of_word_suffix": null,
                "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                "vocab": vocab, "merges": merges,
            },
        })
    }

    /// `tokenizer_config.json`: the special tokens' roles and the chat template.
    pub fn tokenizer_config_json(&self) -> Value {
        json!({
            "bos_token": BEGIN_OF_TEXT,
            "eos_token": END_OF_TURN,
            "add_bos_token": false,
            "clean_up_tokenization_spaces": false,
            "model_max_length": MODEL_MAX_LENGTH,
            "tokenizer_class": "PreTrainedTokenizerFast",
            "chat_template": CHAT_TEMPLATE,
        })
    }

    /// `config.json`: what a model directory says of the model (its vocabulary and special ids).
    pub fn model_config_json(&self, model: &str) -> Value {
        json!({
            "_name_or_path": model,
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.size(),
            "bos_token_id": self.bos(),
            "eos_token_id": self.eos(),
            "max_position_embeddings": MODEL_MAX_LENGTH,
        })
    }

    /// The model directory's files, by name.
    fn files(&self, model: &str) -> std::io::Result<Vec<(&'static str, String)>> {
        let files = [
            ("tokenizer.json", self.tokenizer_json()),
            ("tokenizer_config.json", self.tokenizer_config_json()),
            ("config.json", self.model_config_json(model)),
        ];
        files
            .into_iter()
            .map(|(name, value)| {
                let text = serde_json::to_string_pretty(&value).map_err(std::io::Error::other)?;
                Ok((name, text))
            })
            .collect()
    }

    /// The files as one zip archive and its SHA-256 (hex), as a servicer hands its model's
    /// tokenizer to a gateway (`GetTokenizer`; smg-grpc-servicer's `tokenizer_bundle.py`).
    pub fn bundle(&self, model: &str) -> std::io::Result<(Vec<u8>, String)> {
        use sha2::Digest;
        use std::io::Write;
        let mut archive = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored);
        for (name, text) in self.files(model)? {
            archive
                .start_file(name, options)
                .map_err(std::io::Error::other)?;
            archive.write_all(text.as_bytes())?;
        }
        let bytes = archive
            .finish()
            .map_err(std::io::Error::other)?
            .into_inner();
        let digest = sha2::Sha256::digest(&bytes);
        let hex = digest.iter().map(|b| format!("{b:02x}")).collect();
        Ok((bytes, hex))
    }

    /// Writes the model directory's files (`tokenizer.json`, `tokenizer_config.json`,
    /// `config.json`) into `dir`, creating it.
    pub fn write_model_dir(&self, dir: &Path, model: &str) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        for (name, text) in self.files(model)? {
            std::fs::write(dir.join(name), text)?;
        }
        Ok(())
    }
}

/// GPT-2's byte alphabet: each byte as a printable character (printable Latin-1 bytes as
/// themselves, the others shifted past 255), so byte-level BPE tokens are plain strings.
fn byte_alphabet() -> Vec<char> {
    let printable = |b: u32| (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    let mut shifted = 0u32;
    (0u32..256)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap_or('?')
            } else {
                shifted += 1;
                char::from_u32(255 + shifted).unwrap_or('?')
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_word_the_model_says_is_one_token_and_ids_are_stable() {
        let vocab = Vocab::new();
        let ids: Vec<u32> = (0..16).map(|i| vocab.answer_token(0, i)).collect();
        // Words of several bytes are merged tokens; "." is its byte.
        assert!(ids[..15]
            .iter()
            .all(|id| *id >= 256 && *id < vocab.size() - 4));
        assert_eq!(ids[15], u32::from(b'.'));
        // " the" appears twice in the words and is one token both times.
        assert_eq!(ids[0], ids[11]);
        assert_eq!(vocab.special(END_OF_TURN), Some(vocab.size() - 1));
        assert_eq!(vocab.eos(), vocab.size() - 1);
        assert_eq!(vocab.bos(), vocab.size() - 4);
        // Space is shifted to 'Ġ' (U+0120) as in GPT-2.
        assert_eq!(byte_alphabet()[b' ' as usize], '\u{120}');
        assert_eq!(byte_alphabet()[b'a' as usize], 'a');
    }

    #[test]
    fn every_prompt_word_is_one_token() {
        let vocab = Vocab::new();
        assert_eq!(vocab.size(), 18_565);
        let ids: Vec<u32> = [" abc", " zzz", " the", " eng"]
            .iter()
            .map(|w| {
                let text: String = w.bytes().map(|b| byte_alphabet()[b as usize]).collect();
                vocab.tokens.iter().position(|t| *t == text).unwrap() as u32
            })
            .collect();
        assert!(ids.iter().all(|id| *id >= 256), "{ids:?}");
        // " the" is the model's own word, whatever else shares its letters.
        assert_eq!(ids[2], vocab.answer_token(0, 0));
    }

    #[test]
    fn the_files_name_every_token_once() {
        let vocab = Vocab::new();
        let json = vocab.tokenizer_json();
        let model_vocab = json["model"]["vocab"].as_object().map(|m| m.len());
        assert_eq!(model_vocab, Some(vocab.size() as usize - SPECIALS.len()));
        let merges = json["model"]["merges"].as_array().map(Vec::len);
        assert_eq!(merges, Some(vocab.size() as usize - 256 - SPECIALS.len()));
        assert_eq!(
            vocab.tokenizer_config_json()["chat_template"],
            json!(CHAT_TEMPLATE)
        );
    }
}
