//! Service-level objectives: every answer that completes is judged against its tier's objectives
//! (`--slo-ttft-ms-by-tier`, `--slo-tpot-ms-by-tier`) and counted in
//! `sluice_slo_attained_total{tier}` or `sluice_slo_missed_total{tier}`; the client's time to
//! first byte goes to `sluice_request_ttft_seconds{tier}`.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use sluice_core::admission::Tier;
use sluice_core::slo::{Slo, Slos};

/// A gateway whose requests may ask for any tier (no request is more urgent than its tenant:
/// said here, not left to `--default-priority`'s default).
fn any_tier(config: &mut Config) {
    config.admission.default_tier = Tier::Interactive;
}

async fn chat_as(s: &Setup, tier: &str, stream: bool) -> Answer {
    let answer = send(
        &s.client,
        "POST",
        &s.url("/v1/chat/completions"),
        Some(&chat_body("test-model", "hello there", 8, stream)),
        &[("x-sluice-priority", tier)],
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    answer
}

async fn counts(s: &Setup, tier: &str) -> (f64, f64) {
    let attained = s
        .metric(&format!("sluice_slo_attained_total{{tier=\"{tier}\"}}"))
        .await
        .unwrap();
    let missed = s
        .metric(&format!("sluice_slo_missed_total{{tier=\"{tier}\"}}"))
        .await
        .unwrap();
    (attained, missed)
}

#[tokio::test]
async fn quick_answers_attain_their_tiers_objectives_and_every_tier_is_counted_from_startup() {
    let s = start(1, instant(Flavor::Vllm), any_tier).await;
    for tier in ["interactive", "agent", "batch"] {
        assert_eq!(counts(&s, tier).await, (0.0, 0.0), "{tier} from startup");
    }
    chat_as(&s, "interactive", true).await;
    chat_as(&s, "interactive", false).await;
    chat_as(&s, "batch", true).await;
    assert_eq!(counts(&s, "interactive").await, (2.0, 0.0));
    assert_eq!(counts(&s, "batch").await, (1.0, 0.0));
    assert_eq!(counts(&s, "agent").await, (0.0, 0.0));
    let ttfts = s
        .metric("sluice_request_ttft_seconds_count{tier=\"interactive\"}")
        .await;
    assert_eq!(ttfts, Some(2.0));
}

#[tokio::test]
async fn an_answer_outside_an_objective_is_missed_and_tpot_is_judged_on_streams() {
    // Engines at real step times (sped up 4x): a first token takes milliseconds, and so does
    // each token after it.
    let s = start(1, timed(Flavor::Vllm, 4.0), |config| {
        any_tier(config);
        config.telemetry.slos = Slos::new([
            Slo {
                ttft: Some(Duration::from_nanos(1)),
                tpot: None,
            },
            Slo {
                ttft: None,
                tpot: Some(Duration::from_nanos(1)),
            },
            Slo::default(),
        ]);
    })
    .await;
    chat_as(&s, "interactive", false).await;
    assert_eq!(
        counts(&s, "interactive").await,
        (0.0, 1.0),
        "a late first byte"
    );
    chat_as(&s, "agent", true).await;
    assert_eq!(counts(&s, "agent").await, (0.0, 1.0), "slow tokens");
    chat_as(&s, "agent", false).await;
    assert_eq!(
        counts(&s, "agent").await,
        (1.0, 1.0),
        "a whole body's tokens are not seen arriving: only its first byte is judged"
    );
}

#[tokio::test]
async fn refusals_and_failures_are_not_judged() {
    let s = start(1, instant(Flavor::Vllm), |_| {}).await;
    let refused = send(
        &s.client,
        "POST",
        &s.url("/v1/chat/completions"),
        Some(&chat_body("no-such-model", "hi", 4, true)),
        &[("x-sluice-priority", "interactive")],
    )
    .await;
    assert_eq!(refused.status, 404, "{}", refused.text());
    assert_eq!(counts(&s, "interactive").await, (0.0, 0.0));
}
