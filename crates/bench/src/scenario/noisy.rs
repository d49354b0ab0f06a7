//! `noisy-tenant`: two tenants of equal weight in the same tier, each entitled to half of C;
//! tenant A offers ten times its share, tenant B half of its own. A gateway that is fair between
//! tenants keeps B within its objectives and gives A what is left; one that sheds blindly refuses
//! B as often as A.

use std::path::Path;
use std::time::Duration;

use super::tiered::{admission_config, classes_at, TieredReport};
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

/// sluice trusting the tenant header (each tenant then weight 1 at the default tier), with the
/// gateway queue and shedding.
pub fn tenants_config(exe: &Path, time_scale: f64) -> Template {
    admission_config(
        "sluice-tenants",
        exe,
        time_scale,
        &["--trust-tenant-header"],
    )
}

/// Every configuration at (10 + 0.5) / 2 x C: A's ten shares and B's half, each share half of C.
pub async fn noisy_tenant(plan: &ScenarioPlan) -> Result<TieredReport, ScenarioError> {
    classes_at(plan, vec![(NOISY + QUIET) / 2.0]).await
}
