//! One answer's token ids back into text, as they stream: Hugging Face's incremental decoding
//! (`tokenizers`' `step_decode_stream`, which waits for a multi-byte character's last byte and
//! keeps the spaces a word's context decides), special tokens skipped, then the request's stop
//! sequences: text that may be the start of a stop sequence is held back until it is not, and
//! the answer ends before the first one that appears.

use std::sync::Arc;

use super::TokensError;

/// The text one more token made ready.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decoded {
    /// Text to send now (possibly empty).
    pub(crate) text: String,
    /// The stop sequence that ended the answer, when one did.
    pub(crate) stopped: Option<String>,
}

/// The decoder of one answer.
pub struct Detokenizer {
    tokenizer: Arc<tokenizers::Tokenizer>,
    ids: Vec<u32>,
    prefix: String,
    prefix_index: usize,
    stop: Vec<String>,
    held: String,
    done: bool,
}

impl Detokenizer {
    pub(super) fn new(tokenizer: Arc<tokenizers::Tokenizer>, stop: Vec<String>) -> Self {
        Self {
            tokenizer,
            ids: Vec::new(),
            prefix: String::new(),
            prefix_index: 0,
            stop: stop.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
            done: false,
        }
    }

    /// Decodes one more id. After a stop sequence, nothing more comes out.
    pub fn push(&mut self, id: u32) -> Result<Decoded, TokensError> {
        if self.done {
            return Ok(Decoded::default());
        }
        let piece = tokenizers::tokenizer::step_decode_stream(
            &self.tokenizer,
            vec![id],
            true,
            &mut self.ids,
            &mut self.prefix,
            &mut self.prefix_index,
        )
        .map_err(|e| TokensError::Encode(e.to_string()))?;
        if let Some(piece) = piece {
            self.held.push_str(&piece);
        }
        Ok(self.release())
    }

    /// What is still held when the answer ends without a stop sequence.
    pub fn finish(&mut self) -> String {
        self.done = true;
        std::mem::take(&mut self.held)
    }

    /// The held text up to a stop sequence, or up to what could still become one.
    fn release(&mut self) -> Decoded {
        let first = self
            .stop
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|(at, _)| *at);
        if let Some((at, stop)) = first {
            let stop = stop.clone();
            let mut text = std::mem::take(&mut self.held);
            text.truncate(at);
            self.done = true;
            return Decoded {
                text,
                stopped: Some(stop),
            };
        }
        let keep = self
            .stop
            .iter()
            .map(|s| partial_suffix(&self.held, s))
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let rest = self.held.split_off(cut);
        let text = std::mem::replace(&mut self.held, rest);
        Decoded {
            text,
            stopped: None,
        }
    }
}

/// The length of the longest end of `text` that begins `stop` without being all of it.
fn partial_suffix(text: &str, stop: &str) -> usize {
    stop.char_indices()
        .map(|(at, _)| at)
        .filter(|&len| len > 0 && text.ends_with(&stop[..len]))
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partial_stop_sequence_is_held_back_only_while_it_could_complete() {
        assert_eq!(partial_suffix("hello wor", "world"), 3);
        assert_eq!(partial_suffix("hello", "world"), 0);
        assert_eq!(partial_suffix("ab✓", "✓x"), "✓".len());
    }
}
