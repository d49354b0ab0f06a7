//! How a request's worker is chosen: the policy and its cache-aware thresholds, the routing key,
//! the model aliases. They build the route stage's `RouteConfig` (with the pair's policies and
//! shedding, read from their own sections), the prefix index's size the fleet keeps, and the
//! aliases the admit stage resolves.

use std::collections::HashMap;

use clap::Args;
use serde::{Deserialize, Serialize};
use sluice_core::policy::{CacheAware, Policy};
use sluice_core::slo::Slos;
use sluice_core::ModelName;

use super::checks::{at_least, fraction, invalid};
use super::pd::PdSettings;
use super::{header_names, ConfigError};
use crate::route::{RouteConfig, Shedding};

/// Characters of prompt per prefix block of the cache-aware index (`route`'s block size).
const PREFIX_BLOCK_CHARS: usize = 64;

/// The routing flags (`sluice serve --help`, "Routing policy").
#[derive(Debug, Clone, Args, Serialize, Deserialize, PartialEq)]
pub struct RoutingSettings {
    /// Load-balancing policy: round_robin, random, least_load, power_of_two, cache_aware,
    /// consistent_hash, predicted (where the request's tier objectives are predicted to be met
    /// with the most headroom, from each worker's learned prefill rate and step times and the
    /// prompt's cached prefix; cache_aware, with its thresholds, until a worker is learned).
    #[arg(long, default_value = "cache_aware")]
    #[arg(help_heading = "Routing policy")]
    pub(crate) policy: String,

    /// cache_aware: share of the prompt's prefix a worker must hold to be preferred.
    #[arg(long, visible_alias = "cache-match-threshold", default_value_t = 0.3)]
    #[arg(help_heading = "Routing policy")]
    pub(crate) cache_threshold: f64,

    /// cache_aware's spill gate, as in SMG 1.13: the worker holding the prompt's prefix gives
    /// way to the least loaded one when its load exceeds the pool's mean by this many requests
    /// (capped at two standard deviations of an in-flight count at that mean, at least 4)...
    #[arg(long, visible_alias = "spill-abs-threshold", default_value_t = 64)]
    #[arg(help_heading = "Routing policy")]
    pub(crate) balance_abs_threshold: u64,

    /// ...and exceeds the mean times this.
    #[arg(long, visible_alias = "spill-rel-threshold", default_value_t = 1.5)]
    #[arg(help_heading = "Routing policy")]
    pub(crate) balance_rel_threshold: f64,

    /// cache_aware: how much prompt text the prefix index remembers per model, in characters as
    /// in SMG; held as 64-byte blocks (about 100 bytes of memory each), the least recently used
    /// forgotten first. 2^24 (SMG's default is 2^26, which would let the index reach ~100 MB).
    #[arg(long, default_value_t = 1 << 24)]
    #[arg(help_heading = "Routing policy")]
    pub(crate) max_tree_size: usize,

    /// consistent_hash and cache_aware: request headers whose value is the routing key, the first
    /// present one winning (the body's `user` field is used when none is). Several after one
    /// flag (SMG's way), comma-separated or repeated; `--routing-key-header` is the same flag.
    #[arg(
        long = "routing-key-headers",
        alias = "routing-key-header",
        value_delimiter = ',',
        num_args = 1..,
        default_values_t = ["x-session-id".to_string()]
    )]
    #[arg(help_heading = "Routing policy")]
    pub routing_key_headers: Vec<String>,

    /// Route requests naming a LoRA adapter by the policy alone, blind to where the adapter runs
    /// (by default they go where it runs, then where an adapter slot is free, then where they
    /// would wait for one, the policy choosing within the first of these that has a worker).
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Routing policy")]
    pub(crate) disable_adapter_routing: bool,

    /// Accepted for SMG command lines (its multi-model mode): sluice always routes each request
    /// by its model.
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Routing policy")]
    pub(crate) enable_igw: bool,

    /// An extra client-facing model name for a served model, `ALIAS=MODEL` (repeatable; SMG's
    /// flag). A request naming the alias is served by MODEL's workers, which are sent MODEL;
    /// `/v1/models` lists the alias too. Matching is case-sensitive.
    #[arg(long = "model-alias", value_name = "ALIAS=MODEL")]
    #[arg(help_heading = "Routing policy")]
    #[serde(default)]
    pub(crate) model_aliases: Vec<String>,
}

impl RoutingSettings {
    /// The route stage's config: the policies (a pair's sides from `pd`), the routing key,
    /// shedding.
    pub(super) fn route(
        &self,
        pd: &PdSettings,
        shedding: Shedding,
        slos: Slos,
    ) -> Result<RouteConfig, ConfigError> {
        let side = |flag, name: &Option<String>| match name {
            Some(name) => self.policy_named(flag, name),
            None => self.policy(),
        };
        Ok(RouteConfig {
            policy: self.policy()?,
            prefill_policy: side("prefill-policy", &pd.prefill_policy)?,
            decode_policy: side("decode-policy", &pd.decode_policy)?,
            routing_key_headers: header_names("routing-key-headers", &self.routing_key_headers)?,
            shedding,
            by_adapter: !self.disable_adapter_routing,
            slos,
        })
    }

    /// `--max-tree-size` in the index's blocks.
    pub(super) fn prefix_capacity(&self) -> usize {
        (self.max_tree_size / PREFIX_BLOCK_CHARS).max(1)
    }

    /// Whether `--policy predicted` places requests (the queue then waits for predicted room).
    pub(super) fn predicts(&self) -> bool {
        self.policy == "predicted"
    }

    pub(super) fn policy(&self) -> Result<Policy, ConfigError> {
        self.policy_named("policy", &self.policy)
    }

    /// The policy called `name`, with the cache_aware thresholds; `flag` names it in errors.
    fn policy_named(&self, flag: &'static str, name: &str) -> Result<Policy, ConfigError> {
        Ok(match name {
            "round_robin" => Policy::RoundRobin,
            "random" => Policy::Random,
            "least_load" => Policy::LeastLoad,
            "power_of_two" => Policy::PowerOfTwo,
            // SMG's name for the same rule.
            "consistent_hash" | "consistent_hashing" => Policy::ConsistentHash,
            "prefix_hash" => {
                return Err(invalid(
                    flag,
                    "prefix_hash (SMG) is not supported: use cache_aware, which sends a prompt \
                     where its prefix was sent and balances load",
                ))
            }
            "passthrough" | "manual" => {
                return Err(invalid(
                    flag,
                    format!(
                        "{} (SMG) is not supported: use consistent_hash with \
                         --routing-key-header to pin a client's requests to one worker",
                        name
                    ),
                ))
            }
            "cache_aware" => Policy::CacheAware(self.cache_aware()?),
            "predicted" => Policy::Predicted(self.cache_aware()?),
            other => {
                return Err(invalid(
                    flag,
                    format!(
                        "unknown policy '{other}' (round_robin, random, least_load, power_of_two, \
                         cache_aware, consistent_hash, predicted)"
                    ),
                ))
            }
        })
    }

    /// The cache-aware thresholds, checked (`predicted` falls back on them too).
    fn cache_aware(&self) -> Result<CacheAware, ConfigError> {
        Ok(CacheAware {
            cache_threshold: fraction("cache-threshold", self.cache_threshold)?,
            balance_abs_threshold: self.balance_abs_threshold,
            balance_rel_threshold: at_least(
                "balance-rel-threshold",
                self.balance_rel_threshold,
                1.0,
            )?,
        })
    }

    /// `--model-alias ALIAS=MODEL` pairs, checked: both named, an alias once, not a model itself.
    pub(super) fn model_aliases(&self) -> Result<HashMap<String, ModelName>, ConfigError> {
        let mut aliases = HashMap::new();
        for pair in &self.model_aliases {
            let Some((alias, model)) = pair
                .split_once('=')
                .map(|(a, m)| (a.trim(), m.trim()))
                .filter(|(a, m)| !a.is_empty() && !m.is_empty() && a != m)
            else {
                return Err(invalid(
                    "model-alias",
                    format!("'{pair}' is not ALIAS=MODEL with two different names"),
                ));
            };
            if aliases
                .insert(alias.to_string(), ModelName::new(model))
                .is_some()
            {
                return Err(invalid("model-alias", format!("'{alias}' is given twice")));
            }
        }
        Ok(aliases)
    }
}
