//! `degradation`: a reasoning 70B model on the plan's engines and an 8B model on as many more,
//! every request a chat for the 70B answered at the model's own length, in three tiers, at 1x to
//! 4x C. The ladder on (`sluice-ladder`: reasoning off, the agent and batch tiers cascaded to the
//! 8B, their answers clamped, tiers shed last) against the same gateway without it
//! (`sluice-tiers`), direct and SMG — whether shortening requests before refusing them serves
//! more of them within their objectives.

use std::path::Path;

use super::tiered::{admission_config, classes_at, TieredReport};
use super::{FleetShape, ScenarioError, ScenarioPlan};
use crate::client::Api;
use crate::overhead::Template;

/// The models: the one asked for, and the one the ladder cascades to.
pub const BIG: &str = "llama-3.3-70b";
pub const SMALL: &str = "llama-3.1-8b";
/// The 70B's median thinking, in tokens, and the requests' output cap.
const THINKING_MEDIAN: &str = "400";
const MAX_TOKENS: u32 = 2048;
/// The ladder's output cap for the agent and batch tiers.
const CLAMP: u32 = 512;

/// The fleet: `engines` 70B engines that reason, and as many 8B ones.
pub fn shape(engines: usize) -> FleetShape {
    FleetShape {
        model: BIG.into(),
        profile: "llama3-70b-h100-tp4".into(),
        extra: ["--reasoning", "--reasoning-median-tokens", THINKING_MEDIAN]
            .map(String::from)
            .to_vec(),
        also: Some((engines, SMALL.into(), "llama3-8b-h100".into())),
        kv_events: false,
    }
}

/// Chats answered at the model's length, up to 2,048 tokens.
pub fn api() -> Api {
    Api::Chat {
        max_tokens: MAX_TOKENS,
    }
}

/// The ladder's configuration file.
fn ladder_toml() -> String {
    format!(
        "[degradation]\nshed = true\n\n\
         [[degradation.reasoning]]\nmodel = \"{BIG}\"\nswitch = \"disable\"\n\n\
         [[cascade]]\nfrom = \"{BIG}\"\nto = \"{SMALL}\"\ntiers = [1, 2]\n\n\
         [[degradation.clamp]]\ntiers = [1, 2]\nmax_tokens = {CLAMP}\n"
    )
}

/// The two sluice configurations: the gateway queue with tiers and CoDel, without and with the
/// ladder (whose file is written to `out_dir`).
pub fn configs(exe: &Path, time_scale: f64, out_dir: &Path) -> std::io::Result<Vec<Template>> {
    std::fs::create_dir_all(out_dir)?;
    let file = out_dir.join("ladder.toml");
    std::fs::write(&file, ladder_toml())?;
    let codel = super::codel_flags(time_scale);
    let mut common: Vec<&str> = vec!["--default-priority", "0"];
    common.extend(codel.iter().map(String::as_str));
    let off = admission_config("sluice-tiers", exe, time_scale, &common);
    let path = file.display().to_string();
    let mut with_ladder = common.clone();
    with_ladder.extend(["--config", path.as_str()]);
    let on = admission_config("sluice-ladder", exe, time_scale, &with_ladder);
    Ok(vec![off, on])
}

/// Every configuration at 1x .. 4x C (1x and 3x with `--quick`).
pub async fn degradation(plan: &ScenarioPlan) -> Result<TieredReport, ScenarioError> {
    let levels = if plan.quick {
        vec![1.0, 3.0]
    } else {
        vec![1.0, 2.0, 3.0, 4.0]
    };
    classes_at(plan, levels).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ladder_file_loads_as_the_gateway_reads_it() {
        let text = ladder_toml();
        let table: toml::Table = toml::from_str(&text).unwrap();
        assert_eq!(table["cascade"][0]["to"].as_str(), Some(SMALL));
        assert_eq!(table["degradation"]["shed"].as_bool(), Some(true));
        assert_eq!(super::super::codel_flags(4.0)[1], "50,250,7500");
    }
}
