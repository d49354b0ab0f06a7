//! `noisy-tenant`: two tenants of equal weight in the same tier, each entitled to half of C;
//! tenant A offers ten times its share, tenant B half of its own. A gateway that is fair between
//! tenants keeps B within its objectives and gives A what is left; one that sheds blindly refuses
//! B as often as A.

use std::path::Path;
use std::time::Duration;

use super::tiered::{classes_at, queue_config, TieredReport, ADMISSION_QUEUE};
use super::{ScenarioError, ScenarioPlan};
use crate::goodput::{Slo, Tier};
use crate::overhead::Template;

/// What each tenant offers, in shares of its half of C.
const NOISY: f64 = 10.0;
const QUIET: f64 = 0.5;

/// The two tenants as classes of requests, each naming itself in SMG's tenant header (as behind
/// an authenticating proxy); the agent tier's objectives (their tier, the default), in engine
/// time.
pub fn two_tenants() -> Vec<Tier> {
    let tenant = |name: &str, offers: f64| Tier {
        name: name.into(),
        share: offers / (NOISY + QUIET),
        tenant: Some(name.into()),
        slo: Slo {
            ttft: Some(Duration::from_secs(5)),
            tpot: Some(Duration::from_millis(100)),
            deadline: None,
        },
    };
    vec![tenant("tenant-a", NOISY), tenant("tenant-b", QUIET)]
}

/// The gateway queue sizes sluice-tenants is measured at by default: one the waits by tier
/// never fill, and one the noisy tenant fills, where what a full queue keeps decides.
pub const QUEUE_SIZES: [usize; 2] = [ADMISSION_QUEUE, 64];

/// sluice trusting the tenant header (each tenant then weight 1 at the default tier), with a
/// gateway queue of `queue_size` and shedding: `sluice-tenants`, or `sluice-tenants-q<size>`
/// for a queue of other than the admission configurations' size.
pub fn tenants_config(exe: &Path, time_scale: f64, queue_size: usize) -> Template {
    let name = if queue_size == ADMISSION_QUEUE {
        "sluice-tenants".to_string()
    } else {
        format!("sluice-tenants-q{queue_size}")
    };
    queue_config(
        &name,
        exe,
        time_scale,
        queue_size,
        &["--trust-tenant-header"],
    )
}

/// Every configuration at (10 + 0.5) / 2 x C: A's ten shares and B's half, each share half of C.
pub async fn noisy_tenant(plan: &ScenarioPlan) -> Result<TieredReport, ScenarioError> {
    classes_at(plan, vec![(NOISY + QUIET) / 2.0]).await
}
