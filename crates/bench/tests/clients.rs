#![allow(clippy::unwrap_used)] // test support: a failed step is the test failing
//! Clients as they behave, against simulated engines on loopback: timeouts before and inside an
//! answer, the SDK's retries, deadlines, readers who leave, closed loops.

use std::time::Duration;

use sluice_bench::client::{self, Api, Behaviour, ClientKind, Job, Patience};
use sluice_bench::prompts::{Part, Prompt, Role};
use sluice_sim::testkit::{fleet, instant, timed};
use sluice_sim::{Fault, Flavor, WedgedPolls};
use tokio::time::Instant;

fn job(output_tokens: u32) -> Job {
    Job {
        model: None,
        due: Duration::ZERO,
        tier: 0,
        prompt_tokens: 16,
        output_tokens,
        prompt: Prompt {
            parts: vec![Part {
                role: Role::User,
                seed: 1,
                tokens: 16,
            }],
            conversation: 1,
        },
        tenant: 0,
        priority: 0,
        headers: Vec::new(),
    }
}

fn http() -> client::HttpClient {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http()
}

fn patient(stream: bool) -> Behaviour {
    Behaviour {
        stream,
        ..Behaviour::default()
    }
}

/// The SDK's client with a timeout of `ms` milliseconds.
fn sdk(ms: u64, stream: bool) -> Behaviour {
    Behaviour {
        retries: ClientKind::Sdk,
        patience: Patience {
            idle: Some(Duration::from_millis(ms)),
            ..Patience::default()
        },
        stream,
    }
}

async fn wedge(slot: &sluice_sim::EngineSlot) {
    slot.fault(Fault::Wedge {
        polls: WedgedPolls::Stale,
    })
    .await
    .unwrap();
}

async fn send(url: &str, job: &Job, behaviour: Behaviour) -> sluice_bench::goodput::Outcome {
    let url = format!("{url}/v1/completions");
    client::run(
        &http(),
        &url,
        (Api::Completions, "test-model"),
        job,
        behaviour,
        Instant::now(),
    )
    .await
}

#[tokio::test]
async fn a_patient_client_reads_a_stream_or_a_whole_answer_to_its_end() {
    let sims = fleet(instant(Flavor::Vllm)).await;
    let url = sims.urls()[0].clone();
    for stream in [true, false] {
        let outcome = send(&url, &job(8), patient(stream)).await;
        assert_eq!((outcome.status, outcome.completed), (200, true), "{stream}");
        assert_eq!(outcome.output_tokens, 8);
        assert_eq!(outcome.attempts, 1);
        assert!(outcome.ttft.is_some());
    }
}

#[tokio::test]
async fn the_sdk_retries_a_timeout_before_the_head_and_then_gives_up() {
    let sims = fleet(instant(Flavor::Vllm)).await;
    let slot = sims.engine(0).unwrap();
    slot.fault(Fault::Hang).await.unwrap();
    let outcome = send(&slot.url(), &job(8), sdk(100, true)).await;
    assert_eq!(outcome.status, 0);
    assert_eq!(outcome.code.as_deref(), Some(client::IDLE_TIMEOUT));
    assert_eq!(outcome.attempts, 3, "two retries, as the SDK");
    let state = slot.until(|s| s.requests_received == 3).await;
    assert_eq!(state.finished, 0);
}

#[tokio::test]
async fn a_timeout_inside_a_stream_is_not_retried() {
    let sims = fleet(instant(Flavor::Vllm)).await;
    let slot = sims.engine(0).unwrap();
    wedge(slot).await;
    let outcome = send(&slot.url(), &job(8), sdk(100, true)).await;
    assert_eq!(outcome.status, 200, "a wedged vLLM sends the stream's head");
    assert!(!outcome.completed);
    assert_eq!(outcome.code.as_deref(), Some(client::IDLE_TIMEOUT));
    assert_eq!(outcome.attempts, 1, "the SDK raises it to the caller");
    // A whole answer's head never comes: that timeout is retried.
    let whole = send(&slot.url(), &job(8), sdk(100, false)).await;
    assert_eq!((whole.status, whole.attempts), (0, 3));
}

#[tokio::test]
async fn a_deadline_is_sent_and_kept_by_the_client() {
    let sims = fleet(instant(Flavor::Vllm)).await;
    let slot = sims.engine(0).unwrap();
    wedge(slot).await;
    let behaviour = Behaviour {
        patience: Patience {
            deadline: Some(Duration::from_millis(200)),
            ..Patience::default()
        },
        ..patient(false)
    };
    let sent = Instant::now();
    let outcome = send(&slot.url(), &job(8), behaviour).await;
    assert_eq!(outcome.code.as_deref(), Some(client::CLIENT_TIMEOUT));
    assert!(sent.elapsed() >= Duration::from_millis(200));
    let body = job(8).body(Api::Completions, "m", false);
    assert!(!body.contains("stream_options"), "{body}");
}

#[tokio::test]
async fn a_reader_who_leaves_closes_the_stream_and_the_engine_aborts() {
    let sims = fleet(timed(Flavor::Vllm, 1.0)).await;
    let slot = sims.engine(0).unwrap();
    let behaviour = Behaviour {
        patience: Patience {
            leave_after: Some(3),
            ..Patience::default()
        },
        ..patient(true)
    };
    let outcome = send(&slot.url(), &job(400), behaviour).await;
    assert_eq!((outcome.status, outcome.completed), (200, true));
    assert_eq!(outcome.code.as_deref(), Some(client::LEFT));
    assert_eq!(outcome.output_tokens, 3);
    let state = slot.until(|s| s.aborted == 1).await;
    assert!(state.tokens_generated < 400, "the engine stopped");
}

#[tokio::test]
async fn closed_loop_clients_each_send_the_next_request_when_the_last_ended() {
    use sluice_bench::arrivals::{Process, Schedule};
    use sluice_bench::run::{default_tiers, execute, Mix, RunPlan};
    let sims = fleet(instant(Flavor::Vllm)).await;
    let slot = sims.engine(0).unwrap();
    let plan = RunPlan {
        adapters: None,
        url: format!("{}/v1/completions", slot.url()),
        model: "test-model".into(),
        schedule: Schedule::constant(1.0),
        process: Process::Poisson,
        seed: 3,
        max_requests: 60,
        duration: Duration::from_secs(30),
        mix: Mix::Short,
        tiers: default_tiers(),
        tenants: 2,
        tenant_keys: Vec::new(),
        client: ClientKind::None,
        patience: Patience::default(),
        stream: true,
        closed_loop: Some(3),
        request_timeout: Duration::from_secs(30),
        starts_at: None,
        api: Api::Completions,
    };
    let (outcomes, _) = execute(&plan).await.unwrap();
    assert_eq!(outcomes.len(), 60, "stopped at the plan's most");
    assert!(outcomes.iter().all(|o| o.status == 200 && o.completed));
    assert!(outcomes
        .iter()
        .all(|o| (16..=48).contains(&o.output_tokens)));
    assert_eq!(slot.state().requests_received, 60);
}
