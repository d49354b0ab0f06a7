//! `HealthCheck`, `GetModelInfo` and `GetServerInfo`, as smg-grpc-servicer 0.14.1 answers them
//! (`sglang/servicer.py`; the probe's wait in `health_probe.py`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use prost_types::value::Kind;
use sluice_proto::sglang_scheduler::{
    GetModelInfoResponse, GetServerInfoResponse, HealthCheckResponse,
};
use tokio::time::Instant;

use crate::api::load::{SGLANG_HEALTH_TIMEOUT, SGLANG_VERSION};
use crate::api::ApiState;
use crate::engine::{EventKind, SeqSpec};
use crate::pd::PdRole;
use crate::scheduler::FinishReason;
use crate::vocab::Vocab;

/// How often the probe's wait reads whether the engine produced anything (`PROBE_STEP_SECS`).
const PROBE_STEP: Duration = Duration::from_millis(500);

fn answer(healthy: bool, message: &str) -> HealthCheckResponse {
    HealthCheckResponse {
        healthy,
        message: message.into(),
    }
}

/// A one-token generation from token 0: healthy once the engine produces anything after the
/// probe started (a busy engine's output counts before the probe's own turn comes, and a full
/// queue's refusal is the scheduler answering), unhealthy when the probe cannot be submitted at
/// all, and after SGLang's 20 s (engine time) without output.
pub(super) async fn health(st: &ApiState) -> HealthCheckResponse {
    let engine = &st.engine;
    if engine.starting() {
        return answer(false, "Server is starting");
    }
    let started = Instant::now();
    let timeout = SGLANG_HEALTH_TIMEOUT.div_f64(engine.config().time_scale);
    let probe = [SeqSpec {
        prompt: Arc::from([0u32]),
        prompt_tokens: 1,
        output_tokens: 1,
        finish: FinishReason::Length,
        preloaded: 0,
        adapter: None,
    }];
    let mut submission = match engine.submit(&probe) {
        Ok(submission) => submission,
        // The scheduler answered, with an abort: that is a push, and a push is health.
        Err(crate::engine::SubmitError::QueueFull { .. }) => {
            return answer(true, "Health check passed")
        }
        Err(crate::engine::SubmitError::ShutDown) => {
            return answer(false, "Health check probe failed")
        }
    };
    let deadline = started + timeout;
    loop {
        tokio::select! {
            event = submission.events.recv() => match event {
                Some(e) if e.kind == EventKind::Token => return answer(true, "Health check passed"),
                Some(_) => {}
                None => return answer(false, "Health check probe failed"),
            },
            () = tokio::time::sleep(PROBE_STEP) => {
                if engine.last_progress() > started {
                    return answer(true, "Health check passed");
                }
            }
            () = tokio::time::sleep_until(deadline) => {
                let secs = SGLANG_HEALTH_TIMEOUT.as_secs();
                return answer(false, &format!("Health check timeout after {secs}s"));
            }
        }
    }
}

/// The simulated model: its name, context, vocabulary and special ids.
pub(super) fn model_info(st: &ApiState, vocab: &Vocab) -> GetModelInfoResponse {
    let cfg = st.engine.config();
    GetModelInfoResponse {
        model_path: cfg.model.clone(),
        is_generation: true,
        served_model_name: cfg.model.clone(),
        max_context_length: cfg.max_model_len as i32,
        vocab_size: vocab.size() as i32,
        model_type: "llama".into(),
        eos_token_ids: vec![vocab.eos() as i32],
        bos_token_id: vocab.bos() as i32,
        max_req_input_len: cfg.max_model_len.saturating_sub(1) as i32,
        architectures: vec!["LlamaForCausalLM".into()],
        default_sampling_params_json: "{}".into(),
        preferred_sampling_params: String::new(),
        ..Default::default()
    }
}

fn number(v: f64) -> prost_types::Value {
    prost_types::Value {
        kind: Some(Kind::NumberValue(v)),
    }
}

fn text(v: &str) -> prost_types::Value {
    prost_types::Value {
        kind: Some(Kind::StringValue(v.into())),
    }
}

/// `server_args.disaggregation_mode`, as SGLang spells its `DisaggregationMode`.
fn disaggregation_mode(role: Option<PdRole>) -> &'static str {
    match role {
        None => "null",
        Some(PdRole::Prefill) => "prefill",
        Some(PdRole::Decode) => "decode",
    }
}

/// The engine's settings as SGLang's `server_args` name them.
pub(super) fn server_info(st: &ApiState, active: usize) -> GetServerInfoResponse {
    let engine = &st.engine;
    let cfg = engine.config();
    let total_tokens = u64::from(cfg.num_gpu_blocks) * u64::from(cfg.block_size);
    let args: BTreeMap<String, prost_types::Value> = [
        ("model_path", text(&cfg.model)),
        ("served_model_name", text(&cfg.model)),
        ("context_length", number(cfg.max_model_len.into())),
        ("max_running_requests", number(cfg.max_num_seqs.into())),
        (
            "chunked_prefill_size",
            number(cfg.max_num_batched_tokens.into()),
        ),
        ("page_size", number(cfg.block_size.into())),
        ("dp_size", number(cfg.dp_size.into())),
        ("schedule_policy", text("fcfs")),
        (
            "disaggregation_mode",
            text(disaggregation_mode(cfg.pd_role)),
        ),
    ]
    .into_iter()
    .chain(
        st.bootstrap()
            .map(|at| ("disaggregation_bootstrap_port", number(at.port().into()))),
    )
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let uptime = now.as_secs_f64() - st.created as f64;
    GetServerInfoResponse {
        server_args: Some(prost_types::Struct { fields: args }),
        scheduler_info: Some(prost_types::Struct {
            fields: [(
                "max_total_num_tokens".to_string(),
                number(total_tokens as f64),
            )]
            .into_iter()
            .collect(),
        }),
        active_requests: active as i32,
        is_paused: engine.faults().asleep.is_some(),
        last_receive_timestamp: now.as_secs_f64(),
        uptime_seconds: uptime.max(0.0),
        sglang_version: SGLANG_VERSION.into(),
        server_type: "grpc".into(),
        start_time: Some(prost_types::Timestamp {
            seconds: st.created as i64,
            nanos: 0,
        }),
        max_total_num_tokens: i32::try_from(total_tokens).unwrap_or(i32::MAX),
    }
}
