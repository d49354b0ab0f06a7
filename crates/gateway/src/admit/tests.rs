use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue};
use prometheus_client::registry::Registry;
use sluice_core::admission::Tier;
use tokio::time::Instant;

use super::*;
use crate::context::{Accounts, InFlight, Usage};
use crate::metrics::Metrics;

fn accounts() -> Accounts {
    Accounts {
        metrics: Metrics::register(&mut Registry::default()),
        access_log: None,
        tracing: None,
        in_flight: Arc::new(InFlight::default()),
    }
}

fn tenant(name: &str, tier: Tier) -> TenantConfig {
    TenantConfig {
        id: sluice_core::TenantId::new(name),
        api_keys: vec![],
        tier,
        weight: 1.0,
        tokens_per_minute: None,
        requests_per_minute: None,
        max_concurrent: None,
    }
}

fn config(tenants: Vec<TenantConfig>) -> AdmissionConfig {
    AdmissionConfig {
        tenants,
        tenant_header: None,
        default_tier: Tier::Agent,
        default_max_tokens: 100,
        max_concurrent: None,
        request_rate: None,
        tier_deadlines: [None; 3],
        queue: None,
        request_timeout: Duration::from_secs(600),
        aliases: Default::default(),
    }
}

fn admit(config: &AdmissionConfig) -> Admit {
    Admit::new(config, &mut Registry::default(), None)
}

fn asking(headers: &HeaderMap, owner: KeyOwner) -> Asking<'_> {
    Asking {
        headers,
        owner,
        prompt_tokens: 10,
        max_tokens: Some(40),
        n: 1,
    }
}

fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
    pairs
        .iter()
        .map(|(k, v)| {
            (
                axum::http::HeaderName::from_static(k),
                HeaderValue::from_static(v),
            )
        })
        .collect()
}

fn context(a: &Accounts) -> RequestContext {
    RequestContext::new(a, HeaderValue::from_static("r"), "/x", Instant::now())
}

/// Admits `asking` for `ctx`, which keeps what admission took (as the front stage has it keep
/// them); the terms it was admitted on.
async fn admit_into(
    stage: &Admit,
    ctx: &mut RequestContext,
    asking: &Asking<'_>,
) -> Result<Terms, AdmitError> {
    let mut decided = stage.admit(ctx, asking).await?;
    ctx.keep(decided.grants.take());
    Ok(decided.terms())
}

#[tokio::test(start_paused = true)]
async fn the_deadline_is_the_request_timeout_from_arrival_or_the_clients_if_earlier() {
    let a = accounts();
    let stage = admit(&config(vec![]));
    let mut ctx = context(&a);
    let arrived = ctx.started;
    tokio::time::advance(Duration::from_secs(3)).await;
    let terms = admit_into(
        &stage,
        &mut ctx,
        &asking(&HeaderMap::new(), KeyOwner::Anyone),
    )
    .await
    .expect("admitted");
    assert_eq!(
        terms.deadline,
        arrived + Duration::from_secs(600),
        "from arrival"
    );
    assert_eq!(
        ctx.admission.tenant.as_ref().map(|t| t.as_str()),
        Some("default")
    );

    let mut ctx = context(&a);
    let h = headers(&[("x-request-deadline-ms", "5000")]);
    let terms = admit_into(&stage, &mut ctx, &asking(&h, KeyOwner::Anyone))
        .await
        .expect("admitted");
    assert_eq!(terms.deadline, ctx.started + Duration::from_secs(5));
    assert!(terms.cut_by_client());

    let mut late = context(&a);
    tokio::time::advance(Duration::from_millis(20)).await;
    let h = headers(&[("x-request-deadline-ms", "10")]);
    assert!(matches!(
        admit_into(&stage, &mut late, &asking(&h, KeyOwner::Anyone)).await,
        Err(AdmitError::Expired(Expired::DeadlineExceeded { .. }))
    ));
    let bad = headers(&[("x-request-deadline-ms", "soon")]);
    assert!(matches!(
        admit_into(&stage, &mut context(&a), &asking(&bad, KeyOwner::Anyone)).await,
        Err(AdmitError::InvalidHeader { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn a_request_gets_its_tenants_tier_or_a_less_urgent_one() {
    let a = accounts();
    let stage = admit(&config(vec![
        tenant("chat", Tier::Interactive),
        tenant("jobs", Tier::Batch),
    ]));
    let tier_of = async |h: HeaderMap, owner| {
        let mut ctx = context(&a);
        admit_into(&stage, &mut ctx, &asking(&h, owner))
            .await
            .map(|terms| terms.tier)
    };
    assert_eq!(
        tier_of(HeaderMap::new(), KeyOwner::Tenant(0)).await,
        Ok(Tier::Interactive)
    );
    assert_eq!(
        tier_of(
            headers(&[("x-sluice-priority", "batch")]),
            KeyOwner::Tenant(0)
        )
        .await,
        Ok(Tier::Batch)
    );
    assert_eq!(
        tier_of(headers(&[("x-sluice-priority", "0")]), KeyOwner::Tenant(1)).await,
        Ok(Tier::Batch),
        "clamped to the tenant's"
    );
    assert_eq!(
        tier_of(headers(&[("x-smg-priority", "bulk")]), KeyOwner::Anyone).await,
        Ok(Tier::Batch)
    );
    assert!(matches!(
        tier_of(
            headers(&[("x-sluice-priority", "urgent")]),
            KeyOwner::Anyone
        )
        .await,
        Err(AdmitError::InvalidHeader {
            header: "x-sluice-priority",
            ..
        })
    ));
}

#[tokio::test(start_paused = true)]
async fn budgets_refuse_with_when_to_retry_and_settle_at_the_end() {
    let a = accounts();
    let mut limited = tenant("t", Tier::Agent);
    limited.tokens_per_minute = Some(120);
    limited.requests_per_minute = Some(60);
    let stage = admit(&config(vec![limited]));
    let h = HeaderMap::new();

    // 10 prompt + 40 out = 50 reserved of 120.
    let mut first = context(&a);
    admit_into(&stage, &mut first, &asking(&h, KeyOwner::Tenant(0)))
        .await
        .expect("admitted");
    let rate = first.admission.rate_headers.clone().unwrap();
    assert_eq!(rate["x-ratelimit-limit-tokens"], "120");
    assert_eq!(rate["x-ratelimit-remaining-tokens"], "70");
    assert_eq!(rate["x-ratelimit-remaining-requests"], "59");
    let mut second = context(&a);
    admit_into(&stage, &mut second, &asking(&h, KeyOwner::Tenant(0)))
        .await
        .expect("admitted");
    let mut third = context(&a);
    match admit_into(&stage, &mut third, &asking(&h, KeyOwner::Tenant(0))).await {
        // 20 left, 50 needed: 30 tokens at 2 a second.
        Err(AdmitError::RateLimited {
            what: "tokens",
            retry_after,
            ..
        }) => {
            assert_eq!(retry_after, Duration::from_secs(15))
        }
        other => panic!("{other:?}"),
    }
    drop(third);

    // The first used 12 of its 50: 38 come back.
    first.attempt(&sluice_core::WorkerId::new("w"));
    first.metered(
        Some(Usage {
            prompt: 4,
            completion: 8,
        }),
        0,
    );
    drop(first);
    let level = Tenant::level(
        &stage.tenants().all().next().unwrap().tokens,
        Instant::now(),
    )
    .unwrap();
    assert_eq!(level.remaining, 58);

    let mut huge = context(&a);
    let mut big = asking(&h, KeyOwner::Tenant(0));
    big.max_tokens = Some(1000);
    assert!(matches!(
        admit_into(&stage, &mut huge, &big).await,
        Err(AdmitError::RequestTooLarge {
            needs: 1010,
            limit: 120,
            ..
        })
    ));
}

#[tokio::test(start_paused = true)]
async fn concurrency_is_capped_per_tenant_and_gateway_wide_and_given_back() {
    let a = accounts();
    let mut two = tenant("t", Tier::Agent);
    two.max_concurrent = Some(2);
    let mut cfg = config(vec![two]);
    cfg.max_concurrent = Some(3);
    let stage = admit(&cfg);
    let h = HeaderMap::new();
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut ctx = context(&a);
        admit_into(&stage, &mut ctx, &asking(&h, KeyOwner::Tenant(0)))
            .await
            .expect("admitted");
        held.push(ctx);
    }
    let mut over = context(&a);
    assert!(matches!(
        admit_into(&stage, &mut over, &asking(&h, KeyOwner::Tenant(0))).await,
        Err(AdmitError::TenantConcurrency { limit: 2, .. })
    ));
    drop(over);
    let mut other = context(&a);
    admit_into(&stage, &mut other, &asking(&h, KeyOwner::Anyone))
        .await
        .expect("admitted");
    let mut full = context(&a);
    assert!(matches!(
        admit_into(&stage, &mut full, &asking(&h, KeyOwner::Anyone)).await,
        Err(AdmitError::GatewayFull { .. })
    ));
    drop(full);
    held.clear();
    let mut again = context(&a);
    admit_into(&stage, &mut again, &asking(&h, KeyOwner::Tenant(0)))
        .await
        .expect("slots came back");
}

#[test]
fn every_refusal_of_admission_has_its_reason_series() {
    use crate::metrics::admission::REASONS;
    let refusals = [
        AdmitError::InvalidHeader {
            header: "x",
            detail: String::new(),
        },
        AdmitError::Expired(Expired::DeadlineExceeded {
            budget: Duration::ZERO,
        }),
        AdmitError::GatewayFull {
            why: "",
            retry_after: Duration::ZERO,
        },
        AdmitError::TenantConcurrency {
            tenant: String::new(),
            limit: 1,
        },
        AdmitError::RateLimited {
            tenant: String::new(),
            what: "tokens",
            retry_after: Duration::ZERO,
        },
        AdmitError::RequestTooLarge {
            tenant: String::new(),
            needs: 2,
            limit: 1,
        },
    ];
    for refusal in refusals {
        assert!(REASONS.contains(&refusal.code()), "{}", refusal.code());
    }
}

#[tokio::test(start_paused = true)]
async fn a_tier_without_a_client_deadline_gets_its_default_one() {
    let a = accounts();
    let mut cfg = config(vec![]);
    cfg.tier_deadlines = [Some(Duration::from_secs(5)), None, None];
    let stage = admit(&cfg);
    let mut chat = context(&a);
    let h = headers(&[("x-sluice-priority", "agent")]);
    let terms = admit_into(&stage, &mut chat, &asking(&h, KeyOwner::Anyone))
        .await
        .expect("admitted");
    assert_eq!(terms.client_deadline, None, "no default for the agent tier");
    cfg.default_tier = Tier::Interactive;
    let stage = admit(&cfg);
    let mut urgent = context(&a);
    let terms = admit_into(
        &stage,
        &mut urgent,
        &asking(&HeaderMap::new(), KeyOwner::Anyone),
    )
    .await
    .expect("admitted");
    assert_eq!(
        terms.client_deadline,
        Some(urgent.started + Duration::from_secs(5))
    );
    let mut own = context(&a);
    let h = headers(&[("x-request-deadline-ms", "9000")]);
    let terms = admit_into(&stage, &mut own, &asking(&h, KeyOwner::Anyone))
        .await
        .expect("admitted");
    assert_eq!(
        terms.client_deadline,
        Some(own.started + Duration::from_secs(9)),
        "the client's own wins"
    );
}
