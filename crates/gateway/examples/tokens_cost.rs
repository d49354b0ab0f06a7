//! What tokens cost the gateway per request on a `grpc://` worker: the chat template applied and
//! the prompt tokenized (before sending), and each answer token detokenized (while relaying), for
//! prompts of several sizes, with the model files given.
//!
//! ```sh
//! cargo run --release -p sluice-gateway --example tokens_cost -- /path/to/model-dir
//! ```
//!
//! One thread, each measurement repeated until it has run for a second; the figures are the
//! median per operation in microseconds of that thread's time, so they depend on the processor
//! (name it beside them) and on the tokenizer: a real model's vocabulary (100k+ tokens, hundreds
//! of thousands of merges) costs more per byte than a small one.

// Functions stay under 60 lines (clippy.toml), test code excepted: `cargo clippy` holds it.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

use std::time::Duration;

use tokio::time::Instant;

use sluice_gateway::tokens::{ChatMessage, ModelFiles, Tokens};

/// English prose, repeated to the prompt's size: real words exercise a real vocabulary's merges.
const PROSE: &str = "The gateway keeps a fleet of inference engines out of overload collapse: \
it steers or sheds the work they cannot serve in time, takes wedged, dead and sick workers out \
of rotation before requests fail on them, and stops the engines from decoding for clients that \
already left. Each request is admitted, routed, forwarded and streamed back, and every stage \
reads facts that one loop owns. ";

fn prompt_of(bytes: usize) -> String {
    PROSE.repeat(bytes / PROSE.len() + 1)[..bytes].to_string()
}

/// Runs `op` until a second has passed; the median of its runs.
fn median(mut op: impl FnMut()) -> Duration {
    let mut runs = Vec::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(1) || runs.len() < 5 {
        let t = Instant::now();
        op();
        runs.push(t.elapsed());
    }
    runs.sort_unstable();
    runs[runs.len() / 2]
}

fn main() {
    let Some(dir) = std::env::args().nth(1) else {
        eprintln!("usage: tokens_cost MODEL_DIR");
        std::process::exit(2);
    };
    let files = ModelFiles {
        model_path: Some(dir.into()),
        ..ModelFiles::default()
    };
    let load = Instant::now();
    let tokens = Tokens::load(&files).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(1)
    });
    println!(
        "tokenizer: {} ids, loaded in {:.0} ms",
        tokens.vocab_size(),
        load.elapsed().as_secs_f64() * 1e3
    );
    println!("| prompt bytes | prompt tokens | template + tokenize, µs | µs per 1k tokens |");
    println!("| ---: | ---: | ---: | ---: |");
    for bytes in [400, 4_000, 40_000, 400_000] {
        let chat = [
            ChatMessage {
                role: "system".into(),
                content: "You are a helpful assistant.".into(),
            },
            ChatMessage {
                role: "user".into(),
                content: prompt_of(bytes),
            },
        ];
        let ids = tokens.chat_ids(&chat).expect("the chat tokenizes");
        let took = median(|| {
            std::hint::black_box(tokens.chat_ids(&chat).expect("the chat tokenizes"));
        });
        let micros = took.as_secs_f64() * 1e6;
        println!(
            "| {bytes} | {} | {micros:.1} | {:.1} |",
            ids.len(),
            micros * 1000.0 / ids.len() as f64
        );
    }
    let answer = tokens
        .prompt_ids(&prompt_of(40_000))
        .expect("the answer tokenizes");
    let took = median(|| {
        let mut decoder = tokens.detokenizer(vec!["</stop>".into()]);
        for id in &answer {
            std::hint::black_box(decoder.push(*id).expect("the ids decode"));
        }
        std::hint::black_box(decoder.finish());
    });
    println!(
        "detokenize with a stop sequence: {:.2} µs per answer token ({} tokens)",
        took.as_secs_f64() * 1e6 / answer.len() as f64,
        answer.len()
    );
}
