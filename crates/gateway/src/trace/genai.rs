//! GenAI attribute names, as OpenTelemetry's semantic conventions 1.42.0 list them (experimental):
//! written here because the `opentelemetry-semantic-conventions` crate deprecates its copies,
//! the GenAI conventions having moved to their own repository (semantic-conventions-genai).

/// `chat`, `text_completion`, `embeddings`.
pub(crate) const OPERATION_NAME: &str = "gen_ai.operation.name";
pub(crate) const REQUEST_MODEL: &str = "gen_ai.request.model";
pub(crate) const REQUEST_STREAM: &str = "gen_ai.request.stream";
pub(crate) const USAGE_INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
pub(crate) const USAGE_OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
/// Seconds from the request to the answer's first chunk.
pub(crate) const RESPONSE_TIME_TO_FIRST_CHUNK: &str = "gen_ai.response.time_to_first_chunk";
